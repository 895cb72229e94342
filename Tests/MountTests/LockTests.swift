import KeychainCore
import Foundation
import Testing
import TestSupport

extension SerialTests {
    /// The lock as a user meets it through a real mount: EACCES, never ENOENT.
    @Suite struct LockTests {
        /// The seed scenario: store "secret" for "manager", lock, read fails with
        /// EACCES; with access mode `always` the read succeeds while locked.
        @Test func seedScenarioThroughTheFilesystem() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(harness.sh("printf secret > \"$1/default/manager\"", arguments: [mnt]).succeeded)
            #expect(harness.sh("cat \"$1/default/manager\"", arguments: [mnt]).stdout == "secret")
            #expect(harness.sh("\"$K\" lock \"$1\"", arguments: [mnt]).succeeded)
            let locked = harness.sh("cat \"$1/default/manager\"", arguments: [mnt])
            #expect(!locked.succeeded)
            #expect(locked.stderr.contains("Permission denied"))
            #expect(openErrno(mnt + "/default/manager", O_RDONLY) == EACCES)

            #expect(harness.control(mnt, "accessmode always").succeeded)
            try harness.unlock(mnt)
            #expect(harness.sh("printf secret > \"$1/default/manager\"", arguments: [mnt]).succeeded)
            #expect(harness.sh("\"$K\" lock \"$1\"", arguments: [mnt]).succeeded)
            #expect(harness.sh("cat \"$1/default/manager\"", arguments: [mnt]).stdout == "secret")
            #expect(
                harness.sh(
                    "getfattr --only-values -n user.keychain.accessible \"$1/default/manager\"", arguments: [mnt]
                ).stdout == "always")
        }

        @Test func lockedIsEACCESAbsentIsENOENTAndListingAndStatStillWork() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(harness.sh("printf 12345 > \"$1/default/item\"", arguments: [mnt]).succeeded)
            #expect(harness.control(mnt, "lock").succeeded)
            #expect(openErrno(mnt + "/default/item", O_RDONLY) == EACCES)
            #expect(openErrno(mnt + "/default/absent", O_RDONLY) == ENOENT)
            #expect(harness.sh("ls \"$1/default\"", arguments: [mnt]).stdout == "item\n")
            #expect(harness.sh("stat -c %s \"$1/default/item\"", arguments: [mnt]).stdout == "5\n")
            #expect(
                harness.sh("getfattr --only-values -n user.keychain.migratable \"$1/default/item\"", arguments: [mnt])
                    .stdout == "yes")
        }

        /// SSKeychain's bug, through the filesystem: the failed write changes nothing.
        @Test func writeWhileLockedFailsWithEACCESAndKeepsTheOldValue() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(harness.sh("printf old > \"$1/default/item\"", arguments: [mnt]).succeeded)
            #expect(harness.control(mnt, "lock").succeeded)
            let write = harness.sh("printf new > \"$1/default/item\"", arguments: [mnt])
            #expect(!write.succeeded)
            #expect(write.stderr.contains("Permission denied"))
            #expect(
                harness.sh("printf new >> \"$1/default/item\"", arguments: [mnt]).stderr.contains("Permission denied"))
            #expect(openErrno(mnt + "/default/created-while-locked", O_WRONLY | O_CREAT) == EACCES)
            #expect(
                harness.sh("truncate -s 0 \"$1/default/item\"", arguments: [mnt]).stderr.contains("Permission denied"))
            // Writing needs the key of the item's current class too, not only of the class it would get.
            #expect(harness.control(mnt, "accessmode always").succeeded)
            #expect(
                harness.sh("printf new > \"$1/default/item\"", arguments: [mnt]).stderr.contains("Permission denied"))
            #expect(harness.sh("stat -c %s \"$1/default/item\"", arguments: [mnt]).stdout == "3\n")
            try harness.unlock(mnt)
            #expect(harness.sh("cat \"$1/default/item\"", arguments: [mnt]).stdout == "old")
            #expect(harness.sh("ls \"$1/default\"", arguments: [mnt]).stdout == "item\n")
        }

        /// docs/FILESYSTEM.md: a descriptor opened before the lock gets EACCES on its reads,
        /// its writes and its final commit.
        @Test func descriptorsOpenedBeforeTheLockAreRevoked() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(harness.sh("printf original > \"$1/default/item\"", arguments: [mnt]).succeeded)
            let reader = open(mnt + "/default/item", O_RDONLY)
            let writer = open(mnt + "/default/item", O_WRONLY | O_TRUNC)
            #expect(reader >= 0 && writer >= 0)
            #expect(write(writer, "changed", 7) == 7)
            // In this process, not through a child: a child would inherit the
            // dirty descriptor, and its exit would close (flush, commit) it.
            #expect(writeErrno(mnt + "/.control", "lock\n") == 0)
            var byte: UInt8 = 0
            #expect(read(reader, &byte, 1) == -1 && errno == EACCES)
            #expect(write(writer, "more", 4) == -1 && errno == EACCES)
            #expect(close(writer) == -1 && errno == EACCES)
            close(reader)
            try harness.unlock(mnt)
            #expect(harness.sh("cat \"$1/default/item\"", arguments: [mnt]).stdout == "original")
        }

        /// Every class across lock, remount (a reboot of the device) and unlock.
        @Test func everyClassAcrossLockAndRemount() throws {
            let classes = [
                "whenUnlocked", "afterFirstUnlock", "always",
                "whenUnlockedThisDeviceOnly", "afterFirstUnlockThisDeviceOnly", "alwaysThisDeviceOnly"
            ]
            let harness = try MountHarness()
            var mnt = try harness.mount()
            try harness.unlock(mnt)
            for name in classes {
                #expect(
                    harness.sh(
                        "printf %s \"$2\" > \"$1/default/$2\" && setfattr -n user.keychain.accessible -v \"$2\" \"$1/default/$2\"",
                        arguments: [mnt, name]
                    ).succeeded)
            }
            #expect(harness.control(mnt, "lock").succeeded)
            for name in classes {
                let readable = !name.hasPrefix("whenUnlocked")
                #expect(
                    harness.sh("cat \"$1/default/$2\"", arguments: [mnt, name]).succeeded == readable,
                    "\(name) after lock")
            }
            #expect(harness.sh("\"$K\" unmount \"$1\"", arguments: [mnt]).succeeded)
            mnt = try harness.mount()
            #expect(harness.status(mnt)["first-unlock"] == "no")
            for name in classes {
                let readable = name.hasPrefix("always")
                #expect(
                    harness.sh("cat \"$1/default/$2\"", arguments: [mnt, name]).succeeded == readable,
                    "\(name) after reboot")
                #expect(
                    harness.sh(
                        "getfattr --only-values -n user.keychain.accessible \"$1/default/$2\"",
                        arguments: [mnt, name]
                    ).stdout == name)
            }
            try harness.unlock(mnt)
            for name in classes {
                #expect(harness.sh("cat \"$1/default/$2\"", arguments: [mnt, name]).stdout == name)
            }
        }
    }
}
