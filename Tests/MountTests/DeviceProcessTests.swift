import KeychainCore
import Foundation
import KeychainFS
import Testing
import TestSupport

extension SerialTests {
    /// One device process per keychain, shared by every mount (docs/FILESYSTEM.md, "The device process").
    @Suite struct DeviceProcessTests {
        @Test func groupMountsShareOneDeviceAndOneLock() throws {
            let harness = try MountHarness()
            let whole = try harness.mount("whole")
            try harness.unlock(whole)
            #expect(
                harness.sh(
                    "mkdir \"$1/TEAMID.com.example.shared\" && printf pw > \"$1/TEAMID.com.example.shared/db\" && printf other > \"$1/default/x\"",
                    arguments: [whole]
                ).succeeded)
            let shared = try harness.mount("shared", group: "TEAMID.com.example.shared")
            #expect(MountHarness.devicePid(whole) == MountHarness.devicePid(shared))
            // Only that group is reachable, its items at the root.
            #expect(harness.sh("ls -A \"$1\"", arguments: [shared]).stdout == ".control\n.events\ndb\n")
            #expect(harness.sh("cat \"$1/db\"", arguments: [shared]).stdout == "pw")
            #expect(openErrno(shared + "/default", O_RDONLY) == ENOENT)
            // A folder of the group (docs/FILESYSTEM.md, "Names with a /"), kept while it holds nothing.
            #expect(mkdir(shared + "/sub", 0o700) == 0 && rmdir(shared + "/sub") == 0)
            // Locking through one mount locks them all.
            #expect(harness.sh("\"$K\" lock \"$1\"", arguments: [shared]).succeeded)
            #expect(openErrno(whole + "/default/x", O_RDONLY) == EACCES)
            #expect(harness.status(whole)["state"] == "locked")
            try harness.unlock(whole)
            #expect(harness.sh("cat \"$1/db\"", arguments: [shared]).stdout == "pw")
            // A group that is the root of a mount cannot be removed from under it.
            #expect(harness.sh("rm \"$1/db\"", arguments: [shared]).succeeded)
            #expect(rmdir(whole + "/TEAMID.com.example.shared") == -1 && errno == EBUSY)
            #expect(
                harness.sh(
                    "\"$K\" unmount \"$1\" && rmdir \"$2/TEAMID.com.example.shared\"", arguments: [shared, whole]
                ).succeeded)
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

        /// docs/FILESYSTEM.md: acknowledged writes survive kill -9, and the killed device leaves
        /// nothing that blocks the next mount.
        @Test func acknowledgedWritesSurviveKill9AndTheNextMountJustWorks() throws {
            let harness = try MountHarness()
            let pid = try harness.mountForeground()
            let mnt = harness.root + "/mnt"
            try harness.unlock(mnt)
            for index in 0..<20 {
                #expect(
                    harness.sh("printf \"value-$2\" > \"$1/default/item-$2\"", arguments: [mnt, String(index)])
                        .succeeded)
            }

            #expect(kill(pid, SIGKILL) == 0)
            _ = Spawn.wait(pid)
            #expect(MountTable.isDeadMount(mnt))
            try harness.mount()
            try harness.unlock(mnt)
            for index in 0..<20 {
                #expect(
                    harness.sh("cat \"$1/default/item-$2\"", arguments: [mnt, String(index)]).stdout == "value-\(index)"
                )
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
            let result =
                command == "mount"
                ? harness.sh(
                    "\"$K\" mount \"$1\" --keychain \"$KC\" && cat \"$1/.control\" >/dev/null", arguments: [mnt])
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
            let result = harness.sh(
                "out=$(\"$K\" mount \"$1\" --keychain \"$KC\") && echo captured", arguments: [mountpoint])
            #expect(result.stdout == "captured\n")
        }

    }
}

extension SerialTests.DeviceProcessTests {
    /// docs/FILESYSTEM.md: the mount is private to the user who mounted it.
    @Test func otherUsersCannotEnterTheMount() throws {
        let (harness, mnt) = try MountHarness.unlockedMount()
        #expect(harness.sh("printf v > \"$1/default/item\"", arguments: [mnt]).succeeded)
        // The temporary directory itself is private; let the other user reach the mount point.
        #expect(chmod(harness.root, 0o711) == 0)
        let other = harness.sh(
            "setpriv --reuid=65534 --regid=65534 --clear-groups cat \"$1/default/item\"", arguments: [mnt])
        #expect(!other.succeeded)
        #expect(other.stderr.contains("Permission denied"))
        #expect(
            harness.sh("setpriv --reuid=65534 --regid=65534 --clear-groups ls \"$1\"", arguments: [mnt]).stderr
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

extension SerialTests.DeviceProcessTests {
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
        #expect(
            harness.sh(
                "mkdir \"$R/start\" && cd \"$R/start\" && \"$K\" mount \"$1\" --keychain \"$KC\"",
                arguments: [mountpoint]
            ).succeeded)
        let pid = try #require(MountHarness.devicePid(mountpoint))
        let cwd = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/cwd")
        #expect(cwd == "/")
    }

}
