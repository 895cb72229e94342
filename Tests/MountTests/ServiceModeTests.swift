import Foundation
import KeychainCore
import KeychainProtocol
import Testing
import TestSupport

extension SerialTests {
    /// Service mode (docs/SECURITY.md, "Two modes"): the device runs as its
    /// own system account and holds every user's keychain where only it can
    /// read. Each attack here runs as an ordinary user the test creates,
    /// against their own keychain: what the per-user device cannot stop
    /// (reading the files, cutting the log, tracing the device) the service
    /// must.
    @Suite struct ServiceModeTests {
        /// An ordinary user's keychain in a service, mounted and unlocked, with `default/token`.
        static func userOfAService(_ service: ServiceHarness) throws -> (MountHarness, String) {
            let harness = try MountHarness(as: try OrdinaryUser(), service: service)
            let mnt = try harness.mount()
            try harness.unlock(mnt)
            let written = harness.sh("printf s3cret > \"$1/default/token\"", arguments: [mnt])
            guard written.succeeded else { throw HarnessError("write failed: \(written)") }
            return (harness, mnt)
        }

        @Test func aUserReachesTheirKeychainOnlyThroughTheService() throws {
            let service = try ServiceHarness()
            let (harness, mnt) = try Self.userOfAService(service)
            #expect(harness.sh("cat \"$1/default/token\"", arguments: [mnt]).stdout == "s3cret")
            #expect(harness.sh("\"$K\" get default/token").stdout == "s3cret")
            // The mount and its files are the user's; the device is not.
            let owner = harness.sh("stat -c '%U' \"$1\" \"$1/default/token\"", arguments: [mnt]).stdout
            #expect(owner == "\(harness.user!.name)\n\(harness.user!.name)\n")
            let status = harness.status(mnt)
            #expect(status["mode"] == "service")
            #expect(status["mode-limits"]?.contains("service's account") == true)
            // The files themselves: neither readable nor writable nor listable.
            let keychain = service.keychain(of: harness.user!)
            for file in ["keychain.db", "device-secret", "audit.log"] {
                let read = harness.sh("cat \"$1/\(file)\"", arguments: [keychain])
                #expect(!read.succeeded && read.stderr.contains("Permission denied"), "\(file): \(read)")
                let cut = harness.sh(": > \"$1/\(file)\"", arguments: [keychain])
                #expect(!cut.succeeded && cut.stderr.contains("Permission denied"), "\(file): \(cut)")
            }
            let list = harness.sh("ls \"$1\"", arguments: [service.stateDirectory])
            #expect(!list.succeeded && list.stderr.contains("Permission denied"), "\(list)")
            // The user still reads their own log, and it is whole.
            #expect(harness.sh("\"$K\" log").stdout.contains("create ok default/token"))
            let verified = harness.sh("\"$K\" log --verify")
            #expect(verified.succeeded && verified.stdout.contains("intact"), "\(verified)")
        }

        /// A user who had a keychain of their own before the service came
        /// is told where it went, and how to name it (`get` said only "you
        /// have no keychain in the keychainfs service").
        @Test func aUsersOwnKeychainIsNamedWhenTheServiceHasNone() throws {
            let service = try ServiceHarness()
            let harness = try MountHarness(as: try OrdinaryUser(), service: service, creating: false)
            let own = harness.sh(
                """
                export XDG_DATA_HOME="$R/data"
                printf '1234\\n1234\\n' | KEYCHAINFS_SERVICE= "$K" init --keychain "$XDG_DATA_HOME/keychainfs" > /dev/null
                "$K" get default/token; echo "get $?"
                """)
            #expect(
                own.stderr.contains("you have no keychain in the keychainfs service")
                    && own.stderr.contains(
                        "your own keychain at \(harness.root)/data/keychainfs is used only when named: --keychain "),
                "\(own)")
            #expect(own.stdout == "get 2\n", "\(own)")
        }

        @Test func eachUserReachesOnlyTheirOwnKeychain() throws {
            let service = try ServiceHarness()
            let (first, mnt) = try Self.userOfAService(service)
            let second = try MountHarness(passcode: nil, as: try OrdinaryUser(), service: service)
            let other = try second.mount()
            // The second user's keychain is their own: a new one's empty default group.
            #expect(second.sh("ls -R \"$1\"", arguments: [other]).stdout == "\(other):\ndefault\n\n\(other)/default:\n")
            let get = second.sh("\"$K\" get default/token")
            #expect(get.status == 2 && !get.stdout.contains("s3cret"), "\(get)")
            // The first user's mount is theirs alone (FUSE without allow_other).
            let through = second.sh("cat \"$1/default/token\"", arguments: [mnt])
            #expect(!through.succeeded && through.stderr.contains("Permission denied"), "\(through)")
            #expect(first.sh("cat \"$1/default/token\"", arguments: [mnt]).stdout == "s3cret")
            // A second `init` of the same user changes nothing.
            let again = first.sh("\"$K\" init", stdin: "9999\n9999\n")
            #expect(!again.succeeded && again.stderr.contains("already"), "\(again)")
            #expect(first.sh("\"$K\" get default/token").stdout == "s3cret")
        }

        @Test func theUserCanNeitherTraceNorSignalNorReadTheService() throws {
            let service = try ServiceHarness()
            let (harness, _) = try Self.userOfAService(service)
            try CallerTrustTests.compile(
                harness, "attach",
                """
                #include <stdio.h>
                #include <stdlib.h>
                #include <sys/ptrace.h>
                int main(int argc, char **argv) {
                    if (ptrace(PTRACE_ATTACH, atoi(argv[1]), 0, 0) != 0) { perror("ptrace"); return 1; }
                    puts("attached");
                    return 0;
                }
                """)
            let pid = String(service.pid)
            let attach = harness.sh("\"$R/attach\" \"$1\"", arguments: [pid])
            #expect(!attach.succeeded && attach.stderr.contains("Operation not permitted"), "\(attach)")
            for file in ["mem", "maps", "environ"] {
                let read = harness.sh("cat /proc/\"$1\"/\(file)", arguments: [pid])
                #expect(!read.succeeded && read.stderr.contains("Permission denied"), "\(file): \(read)")
            }
            let signal = harness.sh("kill -9 \"$1\"", arguments: [pid])
            #expect(!signal.succeeded, "\(signal)")
            #expect(kill(service.pid, 0) == 0)
        }

        @Test func thePolicyOfAGroupHoldsForCallersTheServiceIdentifies() throws {
            let service = try ServiceHarness()
            let (harness, mnt) = try Self.userOfAService(service)
            let setup = harness.sh(
                """
                mkdir "$1/secure" && printf policed > "$1/secure/token" && cp /usr/bin/cat "$R/granted-cat"
                """, arguments: [mnt])
            #expect(setup.succeeded, "\(setup)")
            let granted = harness.grant("secure", exe: harness.root + "/granted-cat")
            #expect(granted.succeeded, "\(granted)")
            let allowed = harness.run("granted-cat", mnt + "/secure/token")
            #expect(allowed.stdout == "policed", "\(allowed) \(harness.sh("\"$K\" log").stdout)")
            let other = harness.sh("cat \"$1/secure/token\"", arguments: [mnt])
            #expect(!other.succeeded && other.stderr.contains("Operation not permitted"), "\(other)")
            let get = harness.sh("\"$K\" get secure/token")
            #expect(get.status == 4 && !get.stdout.contains("policed"), "\(get)")
            // What else the service sees in another user's /proc: CallerTrustTests(inService: true).
        }

        @Test func backupsAreWrittenAsTheUserNeverByTheService() throws {
            let service = try ServiceHarness()
            let (harness, mnt) = try Self.userOfAService(service)
            let backup = harness.sh("\"$K\" backup \"$R/b.kcbak\"", stdin: "backup pw\nbackup pw\n")
            #expect(backup.succeeded, "\(backup)")
            #expect(harness.sh("stat -c '%U %a' \"$R/b.kcbak\"").stdout == "\(harness.user!.name) 600\n")
            // Changed, then restored from the user's file.
            #expect(harness.sh("printf changed > \"$1/default/token\"", arguments: [mnt]).succeeded)
            let restore = harness.sh("\"$K\" restore --overwrite \"$R/b.kcbak\"", stdin: "backup pw\n")
            #expect(restore.succeeded && restore.stdout.contains("1 replaced"), "\(restore)")
            #expect(harness.sh("cat \"$1/default/token\"", arguments: [mnt]).stdout == "s3cret")
            // A path only the service could write is not written: the user makes the file.
            let keychain = service.keychain(of: harness.user!)
            let deputy = harness.sh(
                "\"$K\" backup \"$1/stolen\"", arguments: [keychain], stdin: "pw-12-backup\npw-12-backup\n")
            #expect(!deputy.succeeded && deputy.stderr.contains("Permission denied"), "\(deputy)")
            #expect(access(keychain + "/stolen", F_OK) != 0 && access(keychain + "/stolen.partial", F_OK) != 0)
        }

        @Test func aStoppedServiceLeavesADeadMountThatTheNextMountClears() throws {
            let service = try ServiceHarness()
            let (harness, mnt) = try Self.userOfAService(service)
            service.stop()
            let dead = harness.sh("cat \"$1/default/token\"", arguments: [mnt])
            #expect(!dead.succeeded && dead.stderr.contains("Transport endpoint is not connected"), "\(dead)")
            try service.restart()
            let again = harness.sh("\"$K\" mount \"$1\"", arguments: [mnt])
            #expect(again.succeeded, "\(again)")
            try harness.unlock(mnt)
            // Every acknowledged write is there.
            #expect(harness.sh("cat \"$1/default/token\"", arguments: [mnt]).stdout == "s3cret")
        }

        /// The service never mounts on a path a client names (its account
        /// could mount over another user's keychain directory): only `attach`.
        @Test func theServiceMountsNothingOnAClientsWord() throws {
            let service = try ServiceHarness()
            let harness = try MountHarness(service: service)
            let target = service.stateDirectory + "/999999"
            let refusals = [
                DeviceClient.send(.mount(group: nil, mountpoint: target), to: service.socket).map(\.refusal),
                DeviceClient.send(.unmount(mountpoint: target), to: service.socket).map(\.refusal),
                DeviceClient.send(.stop, to: service.socket).map(\.refusal)
            ]
            for refusal in refusals {
                guard case .system(let code, _)?? = refusal else {
                    Issue.record("\(String(describing: refusal)) is no refusal")
                    continue
                }
                #expect(code == EPERM)
            }
            #expect(!harness.isMounted(target))
            #expect(kill(service.pid, 0) == 0)
        }

        @Test func theLibraryReachesTheServiceToo() throws {
            #expect(throws: KeychainError.notAvailable) { try PasswordManager.openService(at: "/nonexistent/socket") }
            let service = try ServiceHarness()
            let harness = try MountHarness(service: service)
            let manager = try PasswordManager.openService(at: service.socket)
            #expect(manager.isClientOfRunningDevice)
            #expect(throws: KeychainError.interactionNotAllowed) { try manager.register("v", forIdentifier: "lib") }
            try manager.unlock(passcode: try SecureBytes(MountHarness.passcode))
            try manager.register("from the library", forIdentifier: "lib")
            #expect(harness.sh("\"$K\" get default/lib").stdout == "from the library")
        }

        /// As systemd starts it (socket activation, sd_listen_fds(3)): the
        /// socket is bound before the service runs and comes as descriptor 3
        /// with `$LISTEN_PID` and `$LISTEN_FDS`; connections wait in its backlog.
        @Test func theServiceTakesTheSocketSystemdPasses() throws {
            let user = try OrdinaryUser()
            let service = try ServiceHarness(started: false)
            let listener = try UnixSocket.listen(at: service.socket, everyone: true)
            var options = Spawn.Options()
            options.descriptors = [(3, listener.raw)]
            options.nullStandardStreams = true
            let started = Spawn.start(
                [
                    "/bin/sh", "-c", "LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" service --state-directory \"$1\"",
                    service.binary, service.stateDirectory
                ], options: options)
            _ = listener.close()
            let pid = try #require(started)
            defer {
                kill(pid, SIGTERM)
                _ = Spawn.wait(pid)
            }
            let harness = try MountHarness(as: user, service: service)
            let mnt = try harness.mount()
            try harness.unlock(mnt)
            #expect(harness.sh("printf v > \"$1/default/k\" && cat \"$1/default/k\"", arguments: [mnt]).stdout == "v")
            #expect(harness.status(mnt)["mode"] == "service")
            #expect(harness.status(mnt)["pid"] == String(pid))
        }
    }
}
