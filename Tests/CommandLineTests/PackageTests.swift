import Foundation
import KeychainCore
import KeychainProtocol
import Testing
import TestSupport

extension SerialTests {
    /// The Debian package (docs/INSTALL.md, "What the package holds"), as an
    /// administrator meets it: built by ./scripts/package (lintian clean),
    /// installed with dpkg on this machine, used as the README's quick start,
    /// removed and purged, and every keychain still in place. The machine is
    /// left as the test found it.
    @Suite(.serialized) struct PackageTests {
        static let repository = MachineFixtures.repository

        static func installed(_ harness: MountHarness) -> Bool {
            harness.sh("dpkg-query -W -f='${Status}' keychainfs 2>/dev/null | grep -q 'install ok installed'").succeeded
        }

        @Test func thePackageInstallsWorksAndRemovesCleanly() throws {
            let harness = try MountHarness(passcode: nil)
            try #require(
                !Self.installed(harness),
                "a keychainfs package is installed on this machine: this test installs and removes its own")
            let hadAccount = getpwnam("keychainfs") != nil
            let hadDeviceGroup = getgrnam("keychainfs-device") != nil
            let hadState = FileManager.default.fileExists(atPath: "/var/lib/keychainfs")
            defer {
                // Whatever the test got to: the package, then what it made.
                _ = harness.sh("dpkg --purge keychainfs >/dev/null 2>&1")
                if !hadAccount { _ = harness.sh("userdel keychainfs 2>/dev/null") }
                if !hadDeviceGroup { _ = harness.sh("groupdel keychainfs-device 2>/dev/null") }
                if !hadState { _ = harness.sh("rm -rf /var/lib/keychainfs") }
            }
            // Packaging took 72 s on a loaded two-core machine: the 30 s that guards a hung mount is not its limit.
            let built = harness.sh("cd \"$1\" && ./scripts/package 2>&1", arguments: [Self.repository], limit: 900)
            #expect(built.succeeded, "\(built)")
            let package = try #require(built.stdout.split(separator: "\n").last.map { Self.repository + "/" + $0 })
            let install = harness.sh("dpkg -i \"$1\" 2>&1", arguments: [package], limit: 300)
            try #require(install.succeeded, "\(install)")

            // The command, its man page, its helper names.
            let version = harness.sh("\"$K\" --version").stdout
            #expect(
                harness.sh("keychainfs --version").stdout == version && version.hasPrefix("keychainfs "), "\(version)")
            #expect(
                harness.sh(
                    "for c in keychainfs git-credential-keychainfs docker-credential-keychainfs; do command -v $c; done"
                ).stdout
                    == "/usr/bin/keychainfs\n/usr/bin/git-credential-keychainfs\n/usr/bin/docker-credential-keychainfs\n"
            )
            #expect(harness.sh("man -w keychainfs").stdout == "/usr/share/man/man1/keychainfs.1.gz\n")
            let page = harness.sh("MANPAGER=cat MANWIDTH=80 man keychainfs 2>/dev/null | grep -c 'EXIT STATUS'")
            #expect(page.stdout == "1\n", "\(page)")
            // Its header is no BSD manual's, and the guides it names are installed.
            let header = harness.sh("MANPAGER=cat MANWIDTH=80 man keychainfs 2>/dev/null | head -1")
            #expect(header.stdout.contains("General Commands Manual") && !header.stdout.contains("BSD"), "\(header)")
            for guide in ["SECRET-SERVICE", "SECURITY", "FILESYSTEM", "DESKTOP"] {
                let path = "/usr/share/doc/keychainfs/\(guide).md.gz"
                #expect(
                    harness.sh("MANPAGER=cat man keychainfs 2>/dev/null | grep -c '\(guide).md.gz'").stdout != "0\n"
                        && harness.sh("zcat \(path) | head -1 | grep -q '^# '").succeeded, "\(path)")
            }

            // The service's units verify, and run the installed binary, root's
            // and writable by nobody else (the service trusts it), as the account.
            let units = "/usr/lib/systemd/system"
            let verified = harness.sh(
                "systemd-analyze verify --man=no \"$1/keychainfs.socket\" \"$1/keychainfs.service\"",
                arguments: [units])
            #expect(verified.succeeded && verified.stderr.isEmpty, "\(verified)")
            let service = try String(contentsOfFile: units + "/keychainfs.service", encoding: .utf8)
            #expect(service.contains("ExecStart=/usr/bin/keychainfs service\n"))
            var info = stat()
            let deviceBuild = "/usr/libexec/keychainfs/device/keychainfs"
            for program in ["/usr/bin/keychainfs", "/usr/libexec/keychainfs/keychainfs", deviceBuild] {
                #expect(stat(program, &info) == 0 && info.st_uid == 0 && info.st_mode & 0o022 == 0, "\(program)")
            }
            // The device build, setgid to a group of its own that nobody is a
            // member of (docs/SECURITY.md, "A device undumpable from its first
            // instruction"); the other two are not setgid.
            let deviceGroup = try #require(getgrnam("keychainfs-device"))
            #expect(deviceGroup.pointee.gr_mem[0] == nil)
            #expect(
                stat(deviceBuild, &info) == 0 && info.st_mode & 0o7777 == 0o2755
                    && info.st_gid == deviceGroup.pointee.gr_gid)
            #expect(stat("/usr/libexec/keychainfs/keychainfs", &info) == 0 && info.st_mode & 0o7777 == 0o755)
            #expect(harness.sh("cmp /usr/libexec/keychainfs/keychainfs \(deviceBuild)").succeeded)
            // The command starts fast (fixed addresses); its other half, where
            // every command that serves runs, is position-independent.
            #expect(
                MachineFixtures.elfType("/usr/bin/keychainfs") == MachineFixtures.fixedAddresses
                    && MachineFixtures.elfType("/usr/libexec/keychainfs/keychainfs")
                        == MachineFixtures.positionIndependent
            )
            for line in [
                "User=keychainfs", "AmbientCapabilities=CAP_SYS_PTRACE", "CapabilityBoundingSet=CAP_SYS_PTRACE",
                "NoNewPrivileges=yes", "StateDirectoryMode=0700", "LimitNOFILE=65536", "WatchdogSec=30s",
                "Restart=on-failure"
            ] {
                #expect(service.contains(line + "\n"), "\(line)")
            }
            let socket = try String(contentsOfFile: units + "/keychainfs.socket", encoding: .utf8)
            #expect(socket.contains("ListenStream=\(ServicePaths.defaultSocket)\n"))
            let userUnits = harness.sh(
                "grep -h '^ExecStart=' /usr/lib/systemd/user/keychainfs@.service /usr/lib/systemd/user/keychainfs-secrets.service"
            )
            #expect(
                userUnits.stdout == """
                    ExecStart=/usr/bin/keychainfs mount --foreground %f
                    ExecStart=/usr/bin/keychainfs start --foreground --secret-service

                    """, "\(userUnits)")

            // The account and the service's directory; nothing enabled or started.
            let account = try #require(getpwnam("keychainfs"))
            #expect(String(cString: account.pointee.pw_shell) == "/usr/sbin/nologin" && account.pointee.pw_uid < 1000)
            #expect(
                stat("/var/lib/keychainfs", &info) == 0 && info.st_mode & 0o777 == 0o700
                    && info.st_uid == account.pointee.pw_uid)
            // Enabled is a link in a .wants directory (systemctl enable makes one).
            #expect(
                harness.sh("find /etc/systemd -path '*.wants/keychainfs*' | grep -q .").status == 1,
                "a unit was enabled")
            #expect(!FileManager.default.fileExists(atPath: ServicePaths.defaultSocket))
            #expect(
                !FileManager.default.fileExists(atPath: "/usr/share/dbus-1/services/org.freedesktop.secrets.service")
                    || harness.sh("grep -q keychainfs /usr/share/dbus-1/services/org.freedesktop.secrets.service")
                        .status == 1
            )

            // The Secret portal's backend, where xdg-desktop-portal reads
            // backends: the same file its test ran Debian's portal with.
            #expect(
                (try? String(contentsOfFile: "/usr/share/xdg-desktop-portal/portals/keychainfs.portal", encoding: .utf8))
                    == (try? String(
                        contentsOfFile: Self.repository + "/scripts/xdg-desktop-portal/keychainfs.portal",
                        encoding: .utf8)))

            // A new user's quick start, with the installed binary.
            try QuickStartTests.runQuickStart(binary: "/usr/bin/keychainfs")

            // Removal leaves the keychains: a user's, and one of the service's.
            let kept = harness.root + "/kept"
            #expect(
                harness.sh(
                    "printf '1234\\n1234\\n' | keychainfs init --no-tpm --keychain \"$1\" >/dev/null 2>&1",
                    arguments: [kept]
                ).succeeded)
            // A device the installed command starts is the device build, its
            // saved group the build's, its real and effective ones the caller's.
            let device = harness.sh(
                "keychainfs start --keychain \"$1\" && pid=$(keychainfs status --keychain \"$1\" | sed -n 's/^pid: //p') "
                    + "&& readlink /proc/$pid/exe && grep '^Gid:' /proc/$pid/status | cut -f 2-4 "
                    + "&& keychainfs stop --keychain \"$1\"", arguments: [kept])
            #expect(
                device.stdout == "\(deviceBuild)\n0\t0\t\(deviceGroup.pointee.gr_gid)\n", "\(device)")
            #expect(
                harness.sh(
                    "install -d -o keychainfs -m 0700 /var/lib/keychainfs/4242 && touch /var/lib/keychainfs/4242/keychain.db"
                ).succeeded)
            // A user's desktop takes KeychainFS (docs/SECRET-SERVICE.md, "Running it"):
            // the session bus starts the installed binary for org.freedesktop.secrets;
            // once the package is removed, it starts gnome-keyring again.
            let user = try OrdinaryUser()
            // Who the session bus starts for org.freedesktop.secrets: its
            // command line (a device makes itself non-dumpable, so its
            // /proc/PID/exe is closed even to its own user).
            try """
            cd "$HOME" && dbus-run-session -- sh -c '
                gdbus call --session -d org.freedesktop.DBus -o /org/freedesktop/DBus \\
                    -m org.freedesktop.DBus.StartServiceByName org.freedesktop.secrets 0 > /dev/null
                pid=$(gdbus call --session -d org.freedesktop.DBus -o /org/freedesktop/DBus \\
                    -m org.freedesktop.DBus.GetConnectionUnixProcessID org.freedesktop.secrets | cut -d" " -f2 | tr -dc 0-9)
                ps -o args= -p "$pid" | cut -d" " -f1' 2> /dev/null
            [ -x /usr/bin/keychainfs ] && keychainfs stop
            pkill -u "$(id -u)" gnome-keyring
            exit 0
            """.write(toFile: user.home + "/provider", atomically: true, encoding: .utf8)
            #expect(mkdir(user.home + "/run", 0o700) == 0)
            try user.own(user.home + "/run")
            let asUser =
                "runuser -u \(user.name) -- env -u XDG_DATA_HOME -u XDG_CONFIG_HOME -u KEYCHAINFS_KEYCHAIN "
                + "-u KEYCHAINFS_SERVICE -u KEYCHAINFS_PINENTRY -u LD_LIBRARY_PATH -u LD_PRELOAD HOME=\(user.home) "
                + "XDG_RUNTIME_DIR=\(user.home)/run sh -c"
            let enabled = harness.sh(
                asUser + " 'printf \"1234\\n1234\\n\" | keychainfs init --no-tpm > /dev/null && "
                    + "keychainfs desktop enable > /dev/null && sh ~/provider'")
            #expect(enabled.stdout == "/usr/bin/keychainfs\n", "\(enabled)")
            // The PAM module (docs/DESKTOP.md, "The administrator's part"):
            // offered to pam-auth-update, off until turned on; on, Debian's
            // common stacks unlock the user's keychain with the login password;
            // gone from them with the package.
            #expect(harness.sh("grep -c pam_keychainfs /etc/pam.d/common-auth").stdout == "0\n")
            let stacks = "/etc/pam.d/common-auth /etc/pam.d/common-session /etc/pam.d/common-password"
            let turnedOn = harness.sh("pam-auth-update --enable keychainfs && grep -c pam_keychainfs.so \(stacks)")
            #expect(turnedOn.stdout.split(separator: "\n").allSatisfy { $0.hasSuffix(":1") }, "\(turnedOn)")
            let pamService = "kcfs-package-\(user.uid)"
            try "@include common-auth\n".write(toFile: "/etc/pam.d/" + pamService, atomically: true, encoding: .utf8)
            defer { unlink("/etc/pam.d/" + pamService) }
            let unlocked = harness.sh(
                """
                echo '\(user.name):1234' | chpasswd
                install -d -m 0700 -o \(user.name) -g \(user.name) /run/user/\(user.uid)
                as_user() { runuser -u \(user.name) -- env XDG_RUNTIME_DIR=/run/user/\(user.uid) keychainfs "$@"; }
                as_user login enable > /dev/null
                printf '1234\\n' | pamtester \(pamService) \(user.name) authenticate > /dev/null 2>&1
                as_user status | head -1
                """)
            #expect(unlocked.stdout == "state: unlocked\n", "\(unlocked)")
            defer { _ = Spawn.run(["/bin/rm", "-rf", "/run/user/\(user.uid)"]) }
            // Removed with the user's device running, unlocked: it ends with the package, and the removal says so.
            // Another program that is named keychainfs (a build of the user's own) is not the package's to stop.
            let namesake = harness.root + "/keychainfs"
            #expect(harness.sh("cp /bin/sleep \"$1\" && chmod 755 \"$1\" \"$R\"", arguments: [namesake]).succeeded)
            let other = try #require(
                Spawn.start(
                    ["/usr/sbin/runuser", "-u", user.name, "--", namesake, "300"],
                    options: {
                        var quiet = Spawn.Options()
                        quiet.nullStandardStreams = true
                        return quiet
                    }()))
            defer {
                kill(other, SIGKILL)
                _ = Spawn.wait(other)
            }
            let removed = harness.sh("dpkg -r keychainfs 2>&1", limit: 300)
            #expect(removed.stdout.contains("stopped every running keychainfs device"), "\(removed)")
            #expect(
                harness.sh("pgrep -u \(user.name) -x keychainfs").stdout.split(separator: "\n").count == 1,
                "a device outlived its package, or the user's namesake did not")
            #expect(harness.sh("grep -c pam_keychainfs \(stacks)").status == 1, "a PAM stack names the removed module")
            #expect(removed.succeeded, "\(removed)")
            #expect(removed.stdout.contains("\(user.name)'s desktop has its own Secret Service back"), "\(removed)")
            let after = harness.sh(asUser + " 'sh ~/provider'")
            #expect(after.stdout == "/usr/bin/gnome-keyring-daemon\n", "\(after)")
            #expect(!FileManager.default.fileExists(atPath: "/usr/bin/keychainfs"))
            #expect(!FileManager.default.fileExists(atPath: units + "/keychainfs.service"))
            let purged = harness.sh("dpkg --purge keychainfs")
            #expect(purged.succeeded && purged.stderr.contains("left in /var/lib/keychainfs"), "\(purged)")
            #expect(purged.stderr.contains("each user's own keychain (~/.local/share/keychainfs"), "\(purged)")
            #expect(FileManager.default.fileExists(atPath: "/var/lib/keychainfs/4242/keychain.db"))
            #expect(FileManager.default.fileExists(atPath: kept + "/keychain.db"))
            #expect(!Self.installed(harness))
        }
    }
}
