import KeychainCore
import Foundation
import Testing
import TestSupport

extension SerialTests {
    /// cat, printf >, >>, truncate: byte-exact values, committed at close.
    @Suite struct ReadWriteTests {
        @Test func valuesAreByteExact() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(harness.sh("echo x > \"$1/default/echoed\"", arguments: [mnt]).succeeded)
            #expect(harness.sh("echo -n x > \"$1/default/bare\"", arguments: [mnt]).succeeded)
            #expect(
                harness.sh("stat -c %s \"$1/default/echoed\" \"$1/default/bare\"", arguments: [mnt]).stdout == "2\n1\n")
            #expect(
                harness.sh(
                    "head -c 300 /dev/urandom > \"$R/random\" && cp \"$R/random\" \"$1/default/binary\" && cmp \"$R/random\" \"$1/default/binary\"",
                    arguments: [mnt]
                ).succeeded)
        }

        @Test func appendTruncateAndEmptying() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let item = mnt + "/default/item"
            #expect(
                harness.sh("printf abc > \"$1\" && printf def >> \"$1\" && printf g >> \"$1\"", arguments: [item])
                    .succeeded)
            #expect(harness.sh("cat \"$1\"", arguments: [item]).stdout == "abcdefg")
            #expect(harness.sh("truncate -s 2 \"$1\"", arguments: [item]).succeeded)
            #expect(harness.sh("cat \"$1\"", arguments: [item]).stdout == "ab")
            #expect(
                harness.sh("truncate -s 4 \"$1\" && od -An -tx1 \"$1\"", arguments: [item]).stdout
                    .split(separator: " ").joined(separator: " ").trimmingCharacters(in: .whitespacesAndNewlines)
                    == "61 62 00 00")
            #expect(harness.sh(": > \"$1\"", arguments: [item]).succeeded)
            #expect(harness.sh("stat -c %s \"$1\"", arguments: [item]).stdout == "0\n")
            #expect(harness.sh("ls \"$1/default\"", arguments: [mnt]).stdout == "item\n")
        }

        /// docs/CONTRIBUTING.md, "Facts about this platform": `sh -c 'echo x > f'` flushes a duplicate descriptor before
        /// any data; that flush must not commit an empty value.
        @Test func shellRedirectionThroughDuplicatedDescriptorsKeepsTheValue() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(
                harness.sh(
                    "sh -c 'echo first > \"$1\"' sh \"$1\" && sh -c 'exec 3> \"$1\"; echo second >&3; exec 3>&-' sh \"$1\"",
                    arguments: [mnt + "/default/item"]
                ).succeeded)
            #expect(harness.sh("cat \"$1\"", arguments: [mnt + "/default/item"]).stdout == "second\n")
        }

        @Test func aReaderNeverSeesHalfAValue() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let item = mnt + "/default/item"
            #expect(harness.sh("printf old > \"$1\"", arguments: [item]).succeeded)
            let writer = open(item, O_WRONLY | O_TRUNC)
            #expect(write(writer, "new-val", 7) == 7)
            // Written but not closed: readers still get the committed value
            // (read in this process: a child would inherit and flush the writer).
            #expect(readFile(item) == "old")
            #expect(close(writer) == 0)
            #expect(harness.sh("cat \"$1\"", arguments: [item]).stdout == "new-val")
        }

        @Test func aValueOfOneMebibyteFitsAndALargerWriteFailsWithEFBIGKeepingTheOldValue() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let item = mnt + "/default/item"
            #expect(harness.sh("head -c 1048576 /dev/zero > \"$1/default/big\"", arguments: [mnt]).succeeded)
            #expect(harness.sh("stat -c %s \"$1/default/big\"", arguments: [mnt]).stdout == "1048576\n")
            #expect(harness.sh("printf small > \"$1\"", arguments: [item]).succeeded)
            let big = harness.sh("head -c 1048577 /dev/zero > \"$1\"", arguments: [item])
            #expect(!big.succeeded)
            #expect(big.stderr.contains("File too large"))
            #expect(harness.sh("cat \"$1\"", arguments: [item]).stdout == "small")
        }

        @Test func plaintextNeverEntersThePageCache() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(harness.sh("printf secret > \"$1/default/item\"", arguments: [mnt]).succeeded)
            // direct_io: the kernel cannot map the file, because it keeps no pages of it.
            let fd = open(mnt + "/default/item", O_RDONLY)
            defer { close(fd) }
            let mapped = mmap(nil, 6, PROT_READ, MAP_SHARED, fd, 0)
            #expect(mapped == MAP_FAILED && errno == ENODEV)
        }

        @Test func fsyncCommitsAndSyncs() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let fd = open(mnt + "/default/item", O_WRONLY | O_CREAT | O_TRUNC, 0o600)
            #expect(write(fd, "durable", 7) == 7)
            #expect(fsync(fd) == 0)
            #expect(harness.sh("cat \"$1/default/item\"", arguments: [mnt]).stdout == "durable")
            #expect(close(fd) == 0)
        }
    }
}

extension SerialTests.ReadWriteTests {
    /// POSIX: writing through a descriptor of a removed file must not bring it back.
    @Test func aCommitThroughADescriptorOfARemovedItemDoesNotResurrectIt() throws {
        let (harness, mnt) = try MountHarness.unlockedMount()
        #expect(harness.sh("printf old > \"$1/default/item\"", arguments: [mnt]).succeeded)
        let writer = open(mnt + "/default/item", O_WRONLY | O_TRUNC)
        #expect(write(writer, "new", 3) == 3)
        #expect(unlink(mnt + "/default/item") == 0)
        #expect(close(writer) == 0)
        #expect(openErrno(mnt + "/default/item", O_RDONLY) == ENOENT)
        #expect(harness.sh("ls \"$1/default\"", arguments: [mnt]).stdout == "")
    }

    /// A descriptor follows its file through a rename, as on any POSIX filesystem.
    @Test func aCommitAfterARenameLandsUnderTheNewName() throws {
        let (harness, mnt) = try MountHarness.unlockedMount()
        #expect(harness.sh("printf old > \"$1/default/a\"", arguments: [mnt]).succeeded)
        let writer = open(mnt + "/default/a", O_WRONLY | O_TRUNC)
        #expect(write(writer, "new", 3) == 3)
        #expect(rename(mnt + "/default/a", mnt + "/default/b") == 0)
        #expect(close(writer) == 0)
        #expect(harness.sh("ls \"$1/default\" && cat \"$1/default/b\"", arguments: [mnt]).stdout == "b\nnew")
    }
}
