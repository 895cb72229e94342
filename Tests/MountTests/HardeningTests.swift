import KeychainCore
import Foundation
import Testing
import TestSupport

extension SerialTests {
    /// The holes an attacker's review found, each tried again through a real mount.
    @Suite struct HardeningTests {
        @Test func namesWithControlCharactersAreRefusedAndCannotForgeStatusLines() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            for name in ["new\nline", "tab\there", "esc\u{1B}[31m", "c1\u{85}x"] {
                #expect(mkdir(mnt + "/" + name, 0o700) == -1 && errno == EINVAL, "\(name.debugDescription)")
                #expect(open(mnt + "/default/" + name, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600) == -1 && errno == EINVAL)
            }
            #expect(harness.sh("ls -A \"$1\"", arguments: [mnt]).stdout == ".control\n.events\ndefault\n")
            // A keychain path with a newline is printed escaped, and unmount still finds it.
            let odd = harness.root + "/odd\nkeychain: elsewhere"
            #expect(harness.sh("\"$K\" init --keychain \"$1\" --no-passcode", arguments: [odd]).succeeded)
            let oddMount = try harness.prepareMountpoint("oddmnt")
            #expect(harness.sh("\"$K\" mount \"$1\" --keychain \"$2\"", arguments: [oddMount, odd]).succeeded)
            let status = readFile(oddMount + "/.control") ?? ""
            #expect(status.contains("keychain: " + harness.root + "/odd\\nkeychain: elsewhere\n"), "\(status)")
            #expect(!status.contains("\nkeychain: elsewhere"))
            let unmounted = harness.sh("\"$K\" unmount \"$1\"", arguments: [oddMount])
            #expect(unmounted.succeeded, "\(unmounted)")
            #expect(!harness.isMounted(oddMount))
        }

        /// `café` as U+00E9 and as `e` + U+0301 are two names to the kernel and
        /// one to Swift: the second spelling used to reach the first's inode
        /// and fail the write with EIO. Only NFC names exist (docs/FILESYSTEM.md).
        @Test func aNameNotInNFCIsRefusedAndItsTwinKeepsItsValue() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let nfc = "caf\u{E9}", nfd = "cafe\u{301}"
            #expect(harness.sh("printf one > \"$1\"", arguments: [mnt + "/default/" + nfc]).succeeded)
            let write = harness.sh("printf two > \"$1\"", arguments: [mnt + "/default/" + nfd])
            #expect(!write.succeeded && write.stderr.contains("Invalid argument"), "\(write)")
            #expect(openErrno(mnt + "/default/" + nfd, O_RDONLY) == EINVAL)
            #expect(mkdir(mnt + "/" + nfd, 0o700) == -1 && errno == EINVAL)
            #expect(rename(mnt + "/default/" + nfc, mnt + "/default/" + nfd) == -1 && errno == EINVAL)
            #expect(readFile(mnt + "/default/" + nfc) == "one")
            let listing = harness.sh("ls -A \"$1\" \"$2\"", arguments: [mnt, mnt + "/default"]).stdout
            #expect(
                Array(listing.utf8) == Array("\(mnt):\n.control\n.events\ndefault\n\n\(mnt)/default:\n\(nfc)\n".utf8),
                "\(listing)")
        }

        @Test func unsupportedRenameAndXattrFlagsAreRefused() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let item = mnt + "/default/item"
            #expect(harness.sh("printf v > \"$1\"", arguments: [item]).succeeded)
            let whiteout: UInt32 = 1 << 2
            #expect(renameat2(AT_FDCWD, item, AT_FDCWD, mnt + "/default/moved", whiteout) == -1 && errno == EINVAL)
            #expect(renameat2(AT_FDCWD, item, AT_FDCWD, mnt + "/default/moved", 1 << 7) == -1 && errno == EINVAL)
            #expect(readFile(item) == "v" && access(mnt + "/default/moved", F_OK) == -1)
            let name = "user.keychain.accessible", value = "always"
            let (xattrCreate, xattrReplace): (Int32, Int32) = (1, 2)
            #expect(setxattr(item, name, value, value.utf8.count, xattrCreate) == -1 && errno == EEXIST)
            #expect(harness.sh("getfattr --only-values -n \(name) \"$1\"", arguments: [item]).stdout == "whenUnlocked")
            #expect(setxattr(item, name, value, value.utf8.count, xattrReplace) == 0)
            #expect(harness.sh("getfattr --only-values -n \(name) \"$1\"", arguments: [item]).stdout == "always")
            #expect(setxattr(item, name, value, value.utf8.count, xattrCreate | xattrReplace) == -1 && errno == EINVAL)
        }

        @Test func looseKeychainsAreRefusedWithWhatToFix() throws {
            let harness = try MountHarness()
            let mountpoint = try harness.prepareMountpoint("mnt")
            let cases: [(path: String, mode: mode_t, fix: String)] = [
                (harness.keychain, 0o755, "chmod 700 \(harness.keychain)"),
                (harness.keychain + "/device-secret", 0o644, "chmod 600 \(harness.keychain)/device-secret"),
                (harness.keychain + "/keychain.db", 0o666, "chmod 600 \(harness.keychain)/keychain.db")
            ]
            for loose in cases {
                #expect(chmod(loose.path, loose.mode) == 0)
                let refused = harness.sh("\"$K\" mount \"$1\" --keychain \"$KC\"", arguments: [mountpoint])
                #expect(!refused.succeeded && refused.stderr.contains(loose.fix), "\(refused)")
                #expect(!harness.isMounted(mountpoint))
                #expect(chmod(loose.path, loose.path == harness.keychain ? 0o700 : 0o600) == 0)
            }
            #expect(harness.sh("\"$K\" mount \"$1\" --keychain \"$KC\"", arguments: [mountpoint]).succeeded)
        }

        @Test func aRuntimeDirectoryOthersCanWriteIsRefused() throws {
            let harness = try MountHarness()
            let mountpoint = try harness.prepareMountpoint("mnt")
            let open = harness.root + "/open-run"
            #expect(mkdir(open, 0o700) == 0 && chmod(open, 0o777) == 0)
            let refused = harness.sh(
                "XDG_RUNTIME_DIR=\"$2\" \"$K\" mount \"$1\" --keychain \"$KC\"", arguments: [mountpoint, open])
            #expect(!refused.succeeded && refused.stderr.contains("XDG_RUNTIME_DIR"), "\(refused)")
            #expect(!harness.isMounted(mountpoint))
        }

        /// After a clean unmount the keychain is one file: a copy of
        /// `keychain.db` alone (with its device secret) holds every write.
        @Test func aCleanlyUnmountedKeychainIsOneFile() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(
                harness.sh("printf first > \"$1/default/a\" && printf latest > \"$1/default/a\"", arguments: [mnt])
                    .succeeded)
            #expect(harness.sh("\"$K\" unmount \"$1\"", arguments: [mnt]).succeeded)
            #expect(access(harness.keychain + "/keychain.db-wal", F_OK) == -1)
            #expect(access(harness.keychain + "/keychain.db-shm", F_OK) == -1)
            let copy = harness.root + "/copy"
            #expect(
                harness.sh(
                    "mkdir -m 700 \"$1\" && cp \"$KC/keychain.db\" \"$KC/device-secret\" \"$1/\"", arguments: [copy]
                ).succeeded)
            let copied = try harness.prepareMountpoint("copied")
            #expect(harness.sh("\"$K\" mount \"$1\" --keychain \"$2\"", arguments: [copied, copy]).succeeded)
            try harness.unlock(copied)
            #expect(readFile(copied + "/default/a") == "latest")
        }

        /// A peer that connects to the device's socket and sends nothing must
        /// not stall anyone else's mount (the old server read it to the end first).
        @Test func aSilentClientDoesNotStallTheDevice() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let sockets = try FileManager.default.contentsOfDirectory(atPath: harness.runtime + "/keychainfs")
            let path = harness.runtime + "/keychainfs/" + (sockets.first { $0.hasSuffix(".sock") } ?? "")
            let silent = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            defer { close(silent) }
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8) + [0]) }
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(silent, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
                }
            }
            #expect(connected == 0)
            // While it stays silent, another mount joins the device and works.
            let second = try harness.mount("second")
            #expect(harness.status(second)["pid"] == harness.status(mnt)["pid"])
            #expect(harness.status(second)["state"] == "unlocked")
        }

        /// A write larger than one request reaches the device in pieces; the
        /// first piece's lines used to run before the bad line of the last was seen.
        @Test func aLargeControlWriteWithABadLineChangesNothing() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            // Page-aligned, so that the kernel cuts exactly after whole lines.
            let size = 1 << 20, line = Array("migrate no     \n".utf8)
            let buffer = UnsafeMutableRawBufferPointer(
                start: mmap(
                    nil, size + 4096, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), count: size + 4096)
            defer { munmap(buffer.baseAddress, buffer.count) }
            for offset in stride(from: 0, to: size, by: line.count) {
                UnsafeMutableRawBufferPointer(rebasing: buffer[offset..<offset + line.count]).copyBytes(from: line)
            }
            UnsafeMutableRawBufferPointer(rebasing: buffer[size..<size + 6]).copyBytes(from: Array("bogus\n".utf8))
            let fd = open(mnt + "/.control", O_WRONLY)
            defer { close(fd) }
            #expect(write(fd, buffer.baseAddress, size + 6) == -1 && errno == EINVAL)
            #expect(harness.status(mnt)["migrate"] == "yes")
            // A line longer than 4 KiB is refused too; short writes still work.
            #expect(writeErrno(mnt + "/.control", "unlock " + String(repeating: "x", count: 5000) + "\n") == EINVAL)
            #expect(harness.status(mnt)["failed-attempts"] == "0")
            #expect(writeErrno(mnt + "/.control", "migrate no\naccessmode always\n") == 0)
            #expect(harness.status(mnt)["migrate"] == "no" && harness.status(mnt)["accessmode"] == "always")
        }

        /// A rejected line that carried a passcode leaves no copy of it in the device.
        @Test func rejectedControlLinesLeaveNoPasscodeInTheDevice() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let passcode = (0..<256).map { _ in "abcdefghijklmnopqrstuvwxyz0123456789".randomElement()! }.map(
                String.init
            ).joined()
            for line in [
                " unlock \(passcode)", "UNLOCK \(passcode)", "unlock\t\(passcode)", "lock \(passcode)",
                "unlock \(passcode)\nbogus"
            ] {
                #expect(writeErrno(mnt + "/.control", line + "\n") == EINVAL, "\(line.prefix(8))")
            }
            let pid = try #require(MountHarness.devicePid(mnt))
            // The tail: the head of a freed heap block is overwritten by malloc's own bookkeeping.
            let tail = Array(passcode.utf8.suffix(64))
            let found = tail.withUnsafeBytes { MemoryScan.find([("passcode", $0)], in: pid) }
            #expect(found.isEmpty, "\(found)")
            withExtendedLifetime(harness) {}
        }
    }
}
