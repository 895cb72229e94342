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
            #expect(harness.sh("ls \"$1\"", arguments: [mnt]).stdout == "default\n")
        }

        /// pass's names (`email/work/imap`): the command line took only
        /// GROUP/NAME, and `import pass` kept a deeper `/` as `%2F`, which
        /// the user had to type. Now the part of a name before a `/` is a
        /// folder of the group: the same path on the command line and in
        /// the mount, where folders are listed, made, entered, emptied and
        /// removed as directories are, and an item and a folder never share
        /// a name.
        @Test func namesWithASlashAreFoldersOfTheirGroup() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let used = harness.sh(
                """
                k() { "$K" "$@" --keychain "$KC"; }
                printf imap-pw | k set email/work/imap && printf smtp-pw | k set email/work/smtp
                printf home-pw | k set email/home
                ls "$1/email"; ls "$1/email/work"; stat -c %F "$1/email/work"
                cat "$1/email/work/imap"; echo
                printf new > "$1/email/work/imap" && k get email/work/imap; echo
                mkdir -p "$1/email/deep/er" && printf deep > "$1/email/deep/er/x" && k get email/deep/er/x; echo
                k ls email
                mkdir "$1/email/work" 2>&1 | sed 's/.*: //'
                rmdir "$1/email/work" 2>&1 | sed 's/.*: //'
                # Emptied, a folder stays until rmdir, as a directory does (rm -r removes it last).
                rm "$1/email/work/imap" "$1/email/work/smtp" && ls -A "$1/email/work" && rmdir "$1/email/work"
                ls "$1/email"
                mv "$1/email/home" "$1/email/deep/home" && k get email/deep/home; echo
                # A folder moves as its items (rename(2) is EXDEV, and mv copies and removes).
                python3 -c 'import os, sys; os.rename(sys.argv[1] + "/email/deep", sys.argv[1] + "/email/moved")' "$1" \\
                    2>&1 | tail -1 | sed 's/.*Errno 18.*/EXDEV/'
                mv "$1/email/deep" "$1/email/moved" && k get email/moved/er/x; echo
                # An item and a folder never share a name.
                printf x | k set email/moved 2>&1; echo "set over a folder: $?"
                printf x | k set email/moved/home/y 2>&1; echo "set below an item: $?"
                python3 -c 'import errno, os, sys
                try: os.open(sys.argv[1] + "/email/moved/home/y", os.O_WRONLY | os.O_CREAT)
                except OSError as error: print(errno.errorcode[error.errno])' "$1"
                k get email/moved/er/../x 2>&1 | head -1 | sed 's/.*<item>.: //'
                """, arguments: [mnt])
            #expect(
                used.stdout == """
                    home
                    work
                    imap
                    smtp
                    directory
                    imap-pw
                    new
                    deep
                    deep/er/x
                    home
                    work/imap
                    work/smtp
                    File exists
                    Directory not empty
                    deep
                    home
                    home-pw
                    EXDEV
                    deep
                    keychainfs: email/moved: an item and a folder of items cannot have one name: the name holds \
                    items below it (NAME/...), or a part of it before a / is an item
                    set over a folder: 1
                    keychainfs: email/moved/home/y: an item and a folder of items cannot have one name: the name \
                    holds items below it (NAME/...), or a part of it before a / is an item
                    set below an item: 1
                    ENOTDIR
                    the name: a part of it, "..": .. is reserved (. .. .control .events)

                    """, "\(used)")
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
