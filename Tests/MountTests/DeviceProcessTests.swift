import KeychainCore
import Foundation
import KeychainFS
import Testing

/// One device process per keychain, shared by every mount (SPEC, "The device process").
@Suite struct DeviceProcessTests {
    @Test func groupMountsShareOneDeviceAndOneLock() throws {
        let harness = try MountHarness()
        let whole = try harness.mount("whole")
        try harness.unlock(whole)
        #expect(harness.sh("mkdir \"$1/TEAMID.com.example.shared\" && printf pw > \"$1/TEAMID.com.example.shared/db\" && printf other > \"$1/default/x\"",
                           arguments: [whole]).succeeded)
        let shared = try harness.mount("shared", group: "TEAMID.com.example.shared")
        #expect(MountHarness.devicePid(whole) == MountHarness.devicePid(shared))
        // Only that group is reachable, its items at the root.
        #expect(harness.sh("ls -A \"$1\"", arguments: [shared]).stdout == ".control\n.events\ndb\n")
        #expect(harness.sh("cat \"$1/db\"", arguments: [shared]).stdout == "pw")
        #expect(openErrno(shared + "/default", O_RDONLY) == ENOENT)
        #expect(mkdir(shared + "/sub", 0o700) == -1 && errno == EPERM)
        // Locking through one mount locks them all.
        #expect(harness.sh("\"$K\" lock \"$1\"", arguments: [shared]).succeeded)
        #expect(openErrno(whole + "/default/x", O_RDONLY) == EACCES)
        #expect(harness.status(whole)["state"] == "locked")
        try harness.unlock(whole)
        #expect(harness.sh("cat \"$1/db\"", arguments: [shared]).stdout == "pw")
        // A group that is the root of a mount cannot be removed from under it.
        #expect(harness.sh("rm \"$1/db\"", arguments: [shared]).succeeded)
        #expect(rmdir(whole + "/TEAMID.com.example.shared") == -1 && errno == EBUSY)
        #expect(harness.sh("\"$K\" unmount \"$1\" && rmdir \"$2/TEAMID.com.example.shared\"", arguments: [shared, whole]).succeeded)
    }

    @Test func theDeviceExitsWithItsLastMountAndUnmountWaitsForIt() throws {
        let harness = try MountHarness()
        let first = try harness.mount("first")
        let second = try harness.mount("second")
        let pid = try #require(MountHarness.devicePid(first))
        #expect(harness.sh("\"$K\" unmount \"$1\"", arguments: [first]).succeeded)
        #expect(!harness.isMounted(first))
        #expect(isRunning(pid))
        #expect(harness.sh("\"$K\" unmount \"$1\"", arguments: [second]).succeeded)
        #expect(!harness.isMounted(second))
        // unmount returned only after the device exited: no process, no socket.
        #expect(!isRunning(pid))
        #expect(try FileManager.default.contentsOfDirectory(atPath: harness.runtime + "/keychainfs").isEmpty)
        // The next mount is a reboot: locked, before first unlock.
        let again = try harness.mount("first")
        #expect(MountHarness.devicePid(again) != pid)
        #expect(harness.status(again)["first-unlock"] == "no")
    }

    /// SPEC: acknowledged writes survive kill -9, and the killed device leaves
    /// nothing that blocks the next mount.
    @Test func acknowledgedWritesSurviveKill9AndTheNextMountJustWorks() throws {
        let harness = try MountHarness()
        let pid = try harness.mountForeground()
        let mnt = harness.root + "/mnt"
        try harness.unlock(mnt)
        for index in 0..<20 {
            #expect(harness.sh("printf \"value-$2\" > \"$1/default/item-$2\"", arguments: [mnt, String(index)]).succeeded)
        }
        #expect(kill(pid, SIGKILL) == 0)
        _ = Spawn.wait(pid)
        #expect(MountTable.isDeadMount(mnt))
        try harness.mount()
        try harness.unlock(mnt)
        for index in 0..<20 {
            #expect(harness.sh("cat \"$1/default/item-$2\"", arguments: [mnt, String(index)]).stdout == "value-\(index)")
        }
    }

    @Test func sigtermUnmountsAndEndsAForegroundDevice() throws {
        let harness = try MountHarness()
        let pid = try harness.mountForeground()
        let mnt = harness.root + "/mnt"
        #expect(harness.isMounted(mnt))
        #expect(kill(pid, SIGTERM) == 0)
        #expect(Spawn.wait(pid) == 0)
        #expect(!harness.isMounted(mnt))
    }

    /// Right after a `kill -9`, the kernel still answers `stat` of the mount
    /// point from its attribute cache (1 s): `mount` and `unmount` must see
    /// the dead mount at once anyway.
    @Test(arguments: ["mount", "unmount"])
    func aDeadMountIsClearedAtOnceAfterKill9(_ command: String) throws {
        let harness = try MountHarness()
        let pid = try harness.mountForeground()
        let mnt = harness.root + "/mnt"
        var info = stat()
        #expect(stat(mnt, &info) == 0)  // caches the root's attributes
        #expect(kill(pid, SIGKILL) == 0)
        _ = Spawn.wait(pid)
        let result = command == "mount"
            ? harness.sh("\"$K\" mount \"$1\" --keychain \"$KC\" && cat \"$1/.control\" >/dev/null", arguments: [mnt])
            : harness.sh("\"$K\" unmount \"$1\"", arguments: [mnt])
        #expect(result.succeeded, "\(result)")
        #expect(harness.isMounted(mnt) == (command == "mount"))
    }

    @Test func unmountClearsADeadMount() throws {
        let harness = try MountHarness()
        let pid = try harness.mountForeground()
        let mnt = harness.root + "/mnt"
        kill(pid, SIGKILL)
        _ = Spawn.wait(pid)
        let status = harness.sh("\"$K\" status \"$1\"", arguments: [mnt])
        #expect(status.status == 1)
        #expect(status.stderr.contains("has died"))
        #expect(harness.sh("\"$K\" unmount \"$1\"", arguments: [mnt]).succeeded)
        #expect(!harness.isMounted(mnt))
    }

    @Test func mountOutputCanBeCapturedWithoutHanging() throws {
        let harness = try MountHarness()
        let mountpoint = try harness.prepareMountpoint("mnt")
        // The detached device must not hold the caller's stdout open.
        let result = harness.sh("out=$(\"$K\" mount \"$1\" --keychain \"$KC\") && echo captured", arguments: [mountpoint])
        #expect(result.stdout == "captured\n")
    }
}

/// What the command line tells a user who got something wrong.
@Suite struct CommandLineTests {
    @Test func shellCompletionsKnowEveryCommand() throws {
        let harness = try MountHarness()
        for shell in ["bash", "zsh", "fish"] {
            let script = harness.sh("\"$K\" --generate-completion-script \(shell)")
            #expect(script.succeeded)
            for word in ["init", "mount", "unmount", "unlock", "status", "keychain", "foreground"] {
                #expect(script.stdout.contains(word), "\(shell) completion lacks \(word)")
            }
        }
    }

    /// A fresh account has no ~/.local/share: init creates what is missing
    /// (0700, only what it creates), and a failure names the path and the cause.
    @Test func initOnAFreshAccountCreatesTheMissingDirectories() throws {
        let harness = try MountHarness()
        let home = harness.root + "/home"
        #expect(mkdir(home, 0o755) == 0)
        let created = harness.sh("env -u XDG_DATA_HOME HOME=\"$1\" \"$K\" init", arguments: [home], stdin: "1234\n")
        #expect(created.succeeded, "\(created)")
        var info = stat()
        for (path, mode) in [(".local", 0o700), (".local/share", 0o700), (".local/share/keychainfs", 0o700)] {
            #expect(stat(home + "/" + path, &info) == 0 && info.st_mode & 0o777 == mode, "\(path)")
        }
        #expect(stat(home, &info) == 0 && info.st_mode & 0o777 == 0o755)  // not ours to change
        #expect(access(home + "/.local/share/keychainfs/keychain.db", F_OK) == 0)
        // A file where a directory must go: the message says which and why.
        #expect(harness.sh("printf x > \"$1/blocker\"", arguments: [home]).succeeded)
        let blocked = harness.sh("\"$K\" init --keychain \"$1/blocker/kc\"", arguments: [home], stdin: "1234\n")
        #expect(!blocked.succeeded)
        #expect(blocked.stderr.contains("cannot create the directory \(home)/blocker/kc: Not a directory"), "\(blocked)")
        #expect(!blocked.stderr.contains("could not be read or written"), "a generic sentence: \(blocked)")
    }

    @Test func helpfulErrors() throws {
        let harness = try MountHarness()
        let mountpoint = try harness.prepareMountpoint("mnt")
        let noKeychain = harness.sh("\"$K\" mount \"$1\" --keychain \"$R/missing\"", arguments: [mountpoint])
        #expect(noKeychain.status == 1)
        #expect(noKeychain.stderr.contains("keychainfs init"))
        let notMounted = harness.sh("\"$K\" unmount \"$1\"", arguments: [mountpoint])
        #expect(notMounted.status == 1)
        #expect(notMounted.stderr.contains("not mounted"))
        #expect(harness.sh("touch \"$1/file\"", arguments: [mountpoint]).succeeded)
        let notEmpty = harness.sh("\"$K\" mount \"$1\" --keychain \"$KC\"", arguments: [mountpoint])
        #expect(notEmpty.stderr.contains("not empty"))
        let missingDirectory = harness.sh("\"$K\" mount \"$R/nowhere\" --keychain \"$KC\"")
        #expect(missingDirectory.stderr.contains("does not exist"))
        let again = harness.sh("\"$K\" init --keychain \"$KC\"", stdin: "x\n")
        #expect(again.stderr.contains("already exists"))
        let noGroup = harness.sh("mkdir \"$R/g\" && \"$K\" mount \"$R/g\" --group nope --keychain \"$KC\"")
        #expect(noGroup.stderr.contains("no access group nope"))
        #expect(harness.sh("\"$K\" mount \"$R/g\" --group a/b --keychain \"$KC\"").status == 64)
    }

    @Test func aMissingDevFuseIsReportedClearly() throws {
        let harness = try MountHarness()
        let mountpoint = try harness.prepareMountpoint("mnt")
        // A private mount namespace whose /dev lacks fuse.
        let result = harness.sh("unshare -m sh -c 'mount -t tmpfs none /dev && exec \"$K\" mount \"$1\" --foreground --keychain \"$KC\"' sh \"$1\"",
                                arguments: [mountpoint])
        #expect(result.status == 1)
        #expect(result.stderr.contains("/dev/fuse is missing"))
        #expect(!harness.isMounted(mountpoint))
    }

    @Test func wrongPasscodeSaysSoAndStatusPrintsTheControlFile() throws {
        let harness = try MountHarness()
        let mnt = try harness.mount()
        let wrong = harness.sh("\"$K\" unlock \"$1\"", arguments: [mnt], stdin: "nope\n")
        #expect(wrong.status == 1)
        #expect(wrong.stderr.contains("wrong passcode"))
        try harness.unlock(mnt)
        let status = harness.sh("\"$K\" status \"$1\"", arguments: [mnt])
        #expect(status.stdout.hasPrefix("state: unlocked\nfirst-unlock: yes\n"))
        #expect(harness.sh("\"$K\" lock \"$1\" && \"$K\" status \"$1\"", arguments: [mnt]).stdout.hasPrefix("state: locked\n"))
    }

    @Test func passcodesNeverAppearInArgv() throws {
        // There is no option that takes one: argument parsing refuses it.
        let harness = try MountHarness()
        let mnt = try harness.mount()
        #expect(harness.sh("\"$K\" unlock \"$1\" 1234", arguments: [mnt]).status == 64)
        #expect(harness.status(mnt)["state"] == "locked")
    }

    @Test func everyCommandHasHelp() throws {
        let harness = try MountHarness()
        for command in ["init", "mount", "unmount", "lock", "unlock", "status"] {
            let help = harness.sh("\"$K\" \"$1\" --help", arguments: [command])
            #expect(help.succeeded && help.stdout.contains("USAGE"), "\(command)")
        }
    }
}

extension DeviceProcessTests {
    /// SPEC: the mount is private to the user who mounted it.
    @Test func otherUsersCannotEnterTheMount() throws {
        let (harness, mnt) = try MountHarness.unlockedMount()
        #expect(harness.sh("printf v > \"$1/default/item\"", arguments: [mnt]).succeeded)
        // The temporary directory itself is private; let the other user reach the mount point.
        #expect(chmod(harness.root, 0o711) == 0)
        let other = harness.sh("setpriv --reuid=65534 --regid=65534 --clear-groups cat \"$1/default/item\"", arguments: [mnt])
        #expect(!other.succeeded)
        #expect(other.stderr.contains("Permission denied"))
        #expect(harness.sh("setpriv --reuid=65534 --regid=65534 --clear-groups ls \"$1\"", arguments: [mnt]).stderr
                .contains("Permission denied"))
    }

    /// With --foreground and a device already running, the mount joins it.
    @Test func aForegroundMountJoinsARunningDevice() throws {
        let harness = try MountHarness()
        let pid = try harness.mountForeground("first")
        let second = try harness.prepareMountpoint("second")
        #expect(harness.sh("\"$K\" mount \"$1\" --foreground --keychain \"$KC\"", arguments: [second]).succeeded)
        #expect(MountHarness.devicePid(second) == pid)
        #expect(harness.sh("\"$K\" unmount \"$1\" && \"$K\" unmount \"$R/first\"", arguments: [second]).succeeded)
        #expect(Spawn.wait(pid) == 0)
    }
}

extension CommandLineTests {
    /// At a terminal the passcode is asked for without echo (twice for init).
    @Test func passcodesAtATerminalAreNotEchoedAndInitAsksTwice() throws {
        let harness = try MountHarness()
        // Python's pty module plays the terminal: it types at each prompt and
        // collects what the terminal showed.
        let driver = """
            import os, pty, sys
            def run(argv, answers):
                pid, fd = pty.fork()
                if pid == 0:
                    os.execv(argv[0], argv)
                shown, pending = b"", list(answers)
                while True:
                    try:
                        chunk = os.read(fd, 1024)
                    except OSError:
                        break
                    if not chunk:
                        break
                    shown += chunk
                    if pending and shown.rstrip().endswith(b":"):
                        os.write(fd, pending.pop(0) + b"\\n")
                        shown += b"<typed>"
                _, status = os.waitpid(pid, 0)
                return os.waitstatus_to_exitcode(status), shown.decode(errors="replace")
            code, shown = run([sys.argv[1], "init", "--keychain", sys.argv[2]], [b"tty-secret", b"tty-secret"])
            print(code, "secret-echoed" if b"tty-secret" in shown.encode() else "not-echoed", shown.count("passcode"))
            """
        let result = harness.sh("python3 -c \"$1\" \"$K\" \"$R/tty-keychain\"", arguments: [driver])
        #expect(result.stdout == "0 not-echoed 2\n", "\(result)")
        let mismatch = harness.sh("python3 -c \"$(printf '%s' \"$1\" | sed 's/b\"tty-secret\", b\"tty-secret\"/b\"one\", b\"two\"/')\" \"$K\" \"$R/tty-keychain-2\"",
                                  arguments: [driver])
        #expect(mismatch.stdout.hasPrefix("1 "), "\(mismatch)")
        #expect(!FileManager.default.fileExists(atPath: harness.root + "/tty-keychain-2/keychain.db"))
    }
}

extension CommandLineTests {
    @Test func aTamperedKeychainIsRefusedWithAClearMessageAndLeftAsItWas() throws {
        let harness = try MountHarness()
        let mnt = try harness.mount()
        try harness.unlock(mnt)
        #expect(harness.sh("printf v > \"$1/default/item\" && \"$K\" unmount \"$1\"", arguments: [mnt]).succeeded)
        let tamper = """
            import sqlite3, sys
            db = sqlite3.connect(sys.argv[1])
            db.execute("UPDATE items SET generation = generation - 1")
            db.commit()
            """
        #expect(harness.sh("python3 -c \"$1\" \"$KC/keychain.db\" && sha256sum \"$KC/keychain.db\" > \"$R/before\"", arguments: [tamper]).succeeded)
        let refused = harness.sh("\"$K\" mount \"$1\" --keychain \"$KC\"", arguments: [mnt])
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("integrity check"))
        #expect(!harness.isMounted(mnt))
        #expect(harness.sh("sha256sum -c \"$R/before\"").succeeded)
    }
}

extension DeviceProcessTests {
    @Test func unmountWhileAFileIsOpenSaysBusyAndChangesNothing() throws {
        let (harness, mnt) = try MountHarness.unlockedMount()
        #expect(harness.sh("printf v > \"$1/default/item\"", arguments: [mnt]).succeeded)
        let holder = open(mnt + "/default/item", O_RDONLY | O_CLOEXEC)
        #expect(holder >= 0)
        let busy = harness.sh("\"$K\" unmount \"$1\"", arguments: [mnt])
        #expect(busy.status == 1)
        #expect(busy.stderr.contains("busy"))
        #expect(harness.isMounted(mnt))
        #expect(harness.status(mnt)["state"] == "unlocked")
        close(holder)
        #expect(harness.sh("\"$K\" unmount \"$1\"", arguments: [mnt]).succeeded)
        #expect(!harness.isMounted(mnt))
    }

    @Test func theDetachedDeviceDoesNotPinItsStartingDirectory() throws {
        let harness = try MountHarness()
        let mountpoint = try harness.prepareMountpoint("mnt")
        #expect(harness.sh("mkdir \"$R/start\" && cd \"$R/start\" && \"$K\" mount \"$1\" --keychain \"$KC\"", arguments: [mountpoint]).succeeded)
        let pid = try #require(MountHarness.devicePid(mountpoint))
        let cwd = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/cwd")
        #expect(cwd == "/")
    }
}
