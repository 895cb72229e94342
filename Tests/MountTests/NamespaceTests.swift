import KeychainCore
import Foundation
import Testing
import TestSupport

extension SerialTests {
    /// rm, mv, mkdir, rmdir and the operations a keychain does not offer.
    @Suite struct NamespaceTests {
        @Test func rmWorksWhileLocked() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(harness.sh("printf v > \"$1/default/item\"", arguments: [mnt]).succeeded)
            #expect(harness.control(mnt, "lock").succeeded)
            #expect(harness.sh("rm \"$1/default/item\"", arguments: [mnt]).succeeded)
            #expect(openErrno(mnt + "/default/item", O_RDONLY) == ENOENT)
            #expect(harness.sh("rm \"$1/default/item\"", arguments: [mnt]).stderr.contains("No such file"))
        }

        @Test func mvRenamesWithinAGroupAndNeedsTheKey() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(
                harness.sh("printf a > \"$1/default/a\" && printf b > \"$1/default/b\"", arguments: [mnt]).succeeded)
            #expect(harness.sh("mv \"$1/default/a\" \"$1/default/c\"", arguments: [mnt]).succeeded)
            #expect(harness.sh("ls \"$1/default\" && cat \"$1/default/c\"", arguments: [mnt]).stdout == "b\nc\na")
            // rename(2) replaces an existing target.
            #expect(harness.sh("mv \"$1/default/c\" \"$1/default/b\"", arguments: [mnt]).succeeded)
            #expect(harness.sh("ls \"$1/default\" && cat \"$1/default/b\"", arguments: [mnt]).stdout == "b\na")
            #expect(harness.control(mnt, "lock").succeeded)
            let locked = harness.sh("mv \"$1/default/b\" \"$1/default/d\"", arguments: [mnt])
            #expect(locked.stderr.contains("Permission denied"))
            #expect(harness.sh("ls \"$1/default\"", arguments: [mnt]).stdout == "b\n")
        }

        @Test func crossGroupRenameIsEXDEVSoMvCopies() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(harness.sh("mkdir \"$1/other\" && printf v > \"$1/default/item\"", arguments: [mnt]).succeeded)
            #expect(rename(mnt + "/default/item", mnt + "/other/item") == -1 && errno == EXDEV)
            #expect(
                harness.sh(
                    "mv \"$1/default/item\" \"$1/other/item\" && cat \"$1/other/item\" && ls \"$1/default\"",
                    arguments: [mnt]
                ).stdout == "v")
        }

        @Test func mkdirAndRmdirManageGroups() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(
                harness.sh("mkdir \"$1/TEAMID.com.example.shared\" && ls \"$1\"", arguments: [mnt]).stdout
                    == "TEAMID.com.example.shared\ndefault\n")
            #expect(
                harness.sh("mkdir \"$1/TEAMID.com.example.shared\"", arguments: [mnt]).stderr.contains("File exists"))
            #expect(harness.sh("printf v > \"$1/TEAMID.com.example.shared/item\"", arguments: [mnt]).succeeded)
            #expect(harness.sh("rmdir \"$1/TEAMID.com.example.shared\"", arguments: [mnt]).stderr.contains("not empty"))
            #expect(
                harness.sh(
                    "rm \"$1/TEAMID.com.example.shared/item\" && rmdir \"$1/TEAMID.com.example.shared\"",
                    arguments: [mnt]
                ).succeeded)
            #expect(rmdir(mnt + "/default") == -1 && errno == EBUSY)
            #expect(mkdir(mnt + "/default/nested", 0o700) == -1 && errno == EPERM)
            #expect(harness.sh("ls \"$1\"", arguments: [mnt]).stdout == "default\n")
        }

        @Test func unsupportedOperationsFailWithAFittingErrno() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(harness.sh("printf v > \"$1/default/item\"", arguments: [mnt]).succeeded)
            #expect(symlink("item", mnt + "/default/link") == -1 && errno == EPERM)
            #expect(link(mnt + "/default/item", mnt + "/default/hard") == -1 && errno == EPERM)
            #expect(mkfifo(mnt + "/default/fifo", 0o600) == -1 && errno == EPERM)
            #expect(chmod(mnt + "/default/item", 0o644) == -1 && errno == EPERM)
            #expect(chown(mnt + "/default/item", 65534, 65534) == -1 && errno == EPERM)
            #expect(open(mnt + "/newfile-at-root", O_WRONLY | O_CREAT | O_CLOEXEC, 0o600) == -1 && errno == EPERM)
            #expect(harness.sh("touch \"$1/default/item\"", arguments: [mnt]).succeeded)
            #expect(harness.sh("ls \"$1/default\"", arguments: [mnt]).stdout == "item\n")
        }

        @Test(arguments: [("a", Int32(0)), (String(repeating: "n", count: 256), ENAMETOOLONG)])
        func namesAreCheckedWhenCreating(_ name: String, _ expected: Int32) throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            withExtendedLifetime(harness) {
                #expect(openErrno(mnt + "/default/" + name, O_WRONLY | O_CREAT) == expected)
            }
        }

        @Test func controlFileCannotBeRemovedOrReplaced() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(unlink(mnt + "/.control") == -1 && errno == EPERM)
            #expect(harness.sh("printf v > \"$1/default/item\"", arguments: [mnt]).succeeded)
            #expect(rename(mnt + "/default/item", mnt + "/.control") == -1)
            #expect(harness.status(mnt)["state"] == "unlocked")
        }
    }
}

extension SerialTests.NamespaceTests {
    /// A listing longer than one readdir reply comes back whole, once each.
    @Test func largeGroupsListEveryItemOnce() throws {
        let (harness, mnt) = try MountHarness.unlockedMount()
        let made = harness.sh(
            "i=0; while [ $i -lt 600 ]; do printf v > \"$1/default/item-$i\" || exit 1; i=$((i+1)); done",
            arguments: [mnt])
        #expect(made.succeeded)
        let listing = harness.sh("ls \"$1/default\"", arguments: [mnt]).stdout.split(separator: "\n")
        #expect(listing.count == 600)
        #expect(Set(listing).count == 600)
        #expect(harness.sh("ls -a \"$1\"", arguments: [mnt]).stdout == ".\n..\n.control\n.events\ndefault\n")
    }
}
