import KeychainCore
import Foundation
import Testing
import TestSupport

extension SerialTests {
    /// What programs expect of the operations KeychainFS supports (POSIX, and
    /// the pjdfstest cases that concern them). Descriptors are opened in this
    /// process: a child would inherit them, and its exit would flush (commit).
    @Suite struct PosixSemanticsTests {
        /// The orders in which a descriptor left open on `u` meets the removal
        /// of `u` and the creation of a new `u` (issue: SSKeychain's kind of loss).
        enum StaleWriter: String, CaseIterable, CustomTestStringConvertible {
            case truncatedAndWritten, truncatedAndSilent, keptAndWritten, writtenAfterRecreation
            var testDescription: String { rawValue }
        }

        /// Where the removal and the re-creation come from.
        enum Remover: String, CaseIterable, CustomTestStringConvertible {
            /// The mount the descriptor is open in, or another mount of the device.
            case sameMount, otherMount
            /// `keychainfs rm` and `keychainfs set`: the socket, no mount at all
            /// (the inodes follow the store's commits).
            case socket
            var testDescription: String { rawValue }
        }

        @Test(arguments: StaleWriter.allCases, Remover.allCases)
        func aWriterLeftOpenOnARemovedItemNeverReachesTheNewItem(_ order: StaleWriter, remover: Remover) throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let other = remover == .otherMount ? try harness.mount("other") : mnt
            let stale = mnt + "/default/u", fresh = other + "/default/u"
            #expect(harness.sh("printf orig > \"$1\"", arguments: [stale]).succeeded)
            let fd = open(stale, order == .keptAndWritten ? O_WRONLY : O_WRONLY | O_TRUNC)
            #expect(fd >= 0)
            var openedInode = stat()
            #expect(fstat(fd, &openedInode) == 0)
            if order == .truncatedAndWritten || order == .keptAndWritten { #expect(write(fd, "stale", 5) == 5) }
            if remover == .socket {
                let replaced = harness.sh(
                    "\"$K\" rm --keychain \"$KC\" default/u && printf 'new secret' | \"$K\" set --keychain \"$KC\" default/u"
                )
                #expect(replaced.succeeded, "\(replaced)")
            } else {
                #expect(unlink(fresh) == 0)
                #expect(harness.sh("printf 'new secret' > \"$1\"", arguments: [fresh]).succeeded)
            }
            if order == .writtenAfterRecreation { #expect(write(fd, "stale", 5) == 5) }
            // POSIX: what is written to a removed file goes nowhere; close succeeds.
            #expect(close(fd) == 0)
            #expect(readFile(stale) == "new secret")
            #expect(readFile(fresh) == "new secret")
            // The new item is a new inode, not the number the open descriptor held.
            var recreated = stat()
            #expect(stat(stale, &recreated) == 0 && recreated.st_ino != openedInode.st_ino)
        }

        @Test func renamingOverAnItemDetachesItsOpenWriter() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let target = mnt + "/default/target"
            #expect(
                harness.sh(
                    "printf old > \"$1\" && printf replacement > \"$2\"",
                    arguments: [target, mnt + "/default/source"]
                ).succeeded)
            let fd = open(target, O_WRONLY | O_TRUNC)
            #expect(write(fd, "stale", 5) == 5)
            #expect(rename(mnt + "/default/source", target) == 0)
            #expect(close(fd) == 0)
            #expect(readFile(target) == "replacement")
        }

        @Test func fstatOfARemovedItemSucceedsWithNoLinksAndReadsGoOn() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let item = mnt + "/default/item"
            #expect(harness.sh("printf secret > \"$1\"", arguments: [item]).succeeded)
            let reader = open(item, O_RDONLY)
            #expect(unlink(item) == 0)
            var info = stat()
            // pjdfstest unlink/14.t
            #expect(fstat(reader, &info) == 0)
            #expect(info.st_nlink == 0 && info.st_size == 6)
            var bytes = [UInt8](repeating: 0, count: 16)
            #expect(read(reader, &bytes, 16) == 6 && bytes.prefix(6) == Array("secret".utf8)[...])
            #expect(close(reader) == 0)
            #expect(stat(item, &info) == -1 && errno == ENOENT)
        }

        @Test func aWritingDescriptorSeesItsOwnLength() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let item = mnt + "/default/item"
            #expect(harness.sh("printf 0123456789abcdef > \"$1\"", arguments: [item]).succeeded)
            let fd = open(item, O_RDWR | O_TRUNC)
            var info = stat()
            #expect(fstat(fd, &info) == 0 && info.st_size == 0)
            #expect(write(fd, "hello world", 11) == 11)
            #expect(fstat(fd, &info) == 0 && info.st_size == 11)
            // Appending by SEEK_END on an O_RDWR descriptor must not overwrite its own data.
            #expect(lseek(fd, 0, SEEK_END) == 11)
            #expect(write(fd, "!", 1) == 1)
            #expect(lseek(fd, 0, SEEK_END) == 12)
            #expect(close(fd) == 0)
            #expect(readFile(item) == "hello world!")
        }

        /// The emptying of an O_TRUNC open that writes nothing is visible once
        /// `close` returns, even with a duplicate descriptor still open (so that
        /// no later RELEASE of the kernel's can be what makes it visible).
        @Test func emptyingByOTruncIsVisibleWhenCloseReturns() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let item = mnt + "/default/item"
            #expect(harness.sh("printf old > \"$1\"", arguments: [item]).succeeded)
            let fd = open(item, O_WRONLY | O_TRUNC)
            let duplicate = dup(fd)
            #expect(close(fd) == 0)
            #expect(harness.sh("stat -c %s \"$1\" && cat \"$1\"", arguments: [item]).stdout == "0\n")
            #expect(close(duplicate) == 0)
            // And as shells do it, many times over.
            let loop = harness.sh(
                """
                for i in $(seq 100); do
                    printf abc > "$1"; : > "$1"
                    [ "$(stat -c %s "$1")" = 0 ] || { echo "not empty at $i"; exit 1; }
                done
                """, arguments: [item])
            #expect(loop.succeeded, "\(loop)")
        }

        /// The kernel sends RELEASE after `close` has returned, later under
        /// load: an earlier descriptor of the same process, written and
        /// committed, may still be open to the device when the next O_TRUNC
        /// open empties the item. Its old length must not show over the
        /// emptying (docs/FILESYSTEM.md, "Emptying by `O_TRUNC`"; it showed 1 in
        /// 1,000 under load). A committed descriptor kept open (fsync) is that
        /// state, made deterministic.
        @Test func anEarlierCommittedDescriptorDoesNotHideALaterEmptying() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let item = mnt + "/default/item"
            #expect(harness.sh("printf old > \"$1\"", arguments: [item]).succeeded)
            let earlier = open(item, O_WRONLY | O_TRUNC)
            #expect(write(earlier, "abc", 3) == 3 && fsync(earlier) == 0)
            let emptying = open(item, O_WRONLY | O_TRUNC)
            #expect(emptying >= 0 && close(emptying) == 0)
            var info = stat()
            #expect(stat(item, &info) == 0 && info.st_size == 0)
            #expect(harness.sh("stat -c %s \"$1\"", arguments: [item]).stdout == "0\n")
            // Its own descriptor, written after the emptying, shows its own length again.
            #expect(write(earlier, "de", 2) == 2)
            #expect(stat(item, &info) == 0 && info.st_size == 5)
            #expect(close(earlier) == 0)
        }

        /// A shell's `printf x > item` empties at its first close (the
        /// duplicate); if the write then fails, the old value comes back,
        /// also when a label, a class or a name was given in between.
        @Test func anUpdateThatFailsAfterTheEmptyingRestoresTheOldValue() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let item = mnt + "/default/item"
            #expect(harness.sh("printf keep > \"$1\"", arguments: [item]).succeeded)
            // Too large: EFBIG at the write that crosses 1 MiB.
            let big = harness.sh("head -c 1048577 /dev/zero > \"$1\"", arguments: [item])
            #expect(!big.succeeded && big.stderr.contains("File too large"))
            #expect(readFile(item) == "keep")
            // A label, a class or a name given between the emptying and the
            // failing write (by anyone: the item is no program's) changed the
            // row, and the old value was once left behind (two outsiders'
            // attacks): it comes back, under the new label, class or name.
            func emptiedThenFailed(_ change: () -> Bool) -> Bool {
                let emptying = open(item, O_WRONLY | O_TRUNC)
                let kept = dup(emptying)
                guard close(emptying) == 0, readFile(item) == "", change() else { return false }
                let mebibyte = [UInt8](repeating: 0x79, count: 1 << 20)
                let failed = write(kept, mebibyte, mebibyte.count) == mebibyte.count && write(kept, "z", 1) == -1
                close(kept)
                return failed && errno == EFBIG
            }
            #expect(emptiedThenFailed { setxattr(item, "user.keychain.label", "Relabelled", 10, 0) == 0 })
            #expect(readFile(item) == "keep")
            #expect(
                harness.sh("getfattr --only-values -n user.keychain.label \"$1\"", arguments: [item]).stdout
                    == "Relabelled")
            #expect(emptiedThenFailed { setxattr(item, "user.keychain.accessible", "always", 6, 0) == 0 })
            #expect(readFile(item) == "keep")
            #expect(
                harness.sh("getfattr --only-values -n user.keychain.accessible \"$1\"", arguments: [item]).stdout
                    == "always")
            let moved = mnt + "/default/moved"
            #expect(emptiedThenFailed { rename(item, moved) == 0 })
            #expect(readFile(moved) == "keep" && access(item, F_OK) == -1)
            #expect(rename(moved, item) == 0)
            #expect(setxattr(item, "user.keychain.accessible", "whenUnlocked", 12, 0) == 0)
            // Locked between the emptying and the write: EACCES, old value back.
            let fd = open(item, O_WRONLY | O_TRUNC)
            let duplicate = dup(fd)
            #expect(close(fd) == 0)
            #expect(readFile(item) == "")
            #expect(harness.control(mnt, "lock").succeeded)
            #expect(write(duplicate, "new", 3) == -1 && errno == EACCES)
            #expect(close(duplicate) == -1 && errno == EACCES)
            try harness.unlock(mnt)
            #expect(readFile(item) == "keep")
        }

        @Test func nothingIsExecutable() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let item = mnt + "/default/item"
            #expect(harness.sh("printf x > \"$1\"", arguments: [item]).succeeded)
            #expect(access(item, X_OK) == -1 && errno == EACCES)
            #expect(access(mnt + "/.control", X_OK) == -1 && errno == EACCES)
            #expect(access(item, R_OK | W_OK) == 0)
            #expect(access(mnt + "/default", R_OK | W_OK | X_OK) == 0)
            #expect(harness.sh("[ -x \"$1\" ]", arguments: [item]).status == 1)
            #expect(harness.sh("find \"$1\" -type f -executable", arguments: [mnt]).stdout == "")
        }

        @Test func chmodAndChownThatChangeNothingSucceedAndRealChangesAreEPERM() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let item = mnt + "/default/item"
            #expect(harness.sh("printf x > \"$1\"", arguments: [item]).succeeded)
            #expect(chmod(item, 0o600) == 0)
            #expect(chmod(mnt + "/default", 0o700) == 0)
            #expect(chown(item, getuid(), getgid()) == 0)
            let fd = open(item, O_RDONLY)
            #expect(fchmod(fd, 0o600) == 0)
            close(fd)
            #expect(chmod(item, 0o644) == -1 && errno == EPERM)
            #expect(chmod(mnt + "/default", 0o755) == -1 && errno == EPERM)
            #expect(chown(item, 65534, 65534) == -1 && errno == EPERM)
        }

        /// Programs that copy files with their modes, through temporary files and renames.
        @Test func filePrograms() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let source = harness.root + "/source"
            let setup = harness.sh(
                """
                mkdir -m 700 "$1" && printf 'alpha\\n' > "$1/a" && head -c 2000 /dev/urandom > "$1/b" && chmod 600 "$1/a" "$1/b"
                """, arguments: [source])
            #expect(setup.succeeded, "\(setup)")
            let runs: [(String, String)] = [
                ("rsync", "rsync -a \"$1/\" \"$2/rsync/\""),
                ("cp -a", "cp -a \"$1/a\" \"$1/b\" \"$2/cp/\""),
                ("install", "install -m 600 \"$1/a\" \"$1/b\" \"$2/install/\""),
                ("tar", "tar -C \"$1\" -cf \"$1/../archive.tar\" a b && tar -C \"$2/tar\" -xf \"$1/../archive.tar\"")
            ]
            for (name, command) in runs {
                let group = mnt + "/" + (name == "cp -a" ? "cp" : name)
                #expect(mkdir(group, 0o700) == 0)
                let result = harness.sh(command, arguments: [source, mnt])
                #expect(result.succeeded && result.stderr.isEmpty, "\(name): \(result)")
                #expect(
                    harness.sh("cmp \"$1/a\" \"$2/a\" && cmp \"$1/b\" \"$2/b\"", arguments: [source, group]).succeeded,
                    "\(name)")
            }
            let edited = harness.sh("sed -i 's/alpha/beta/' \"$1/rsync/a\" && cat \"$1/rsync/a\"", arguments: [mnt])
            #expect(edited.succeeded && edited.stdout == "beta\n" && edited.stderr.isEmpty, "\(edited)")
            #expect(harness.sh("ls -A \"$1/rsync\"", arguments: [mnt]).stdout == "a\nb\n")
        }

        @Test func temporaryFilesAreNotSupported() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            defer { withExtendedLifetime(harness) {} }  // its deinit unmounts
            // O_TMPFILE (__O_TMPFILE | O_DIRECTORY): glibc defines it only with _GNU_SOURCE.
            let temporaryFile: Int32 = 0o20_000_000 | O_DIRECTORY
            let fd = open(mnt + "/default", temporaryFile | O_WRONLY, 0o600)
            let error = errno
            #expect(fd == -1 && error == EOPNOTSUPP, "errno \(error)")
        }
    }
}
