import Foundation
import Testing

/// The holes an attacker's review found, each tried again through a real mount.
@Suite struct HardeningTests {
    @Test func namesWithControlCharactersAreRefusedAndCannotForgeStatusLines() throws {
        let (harness, mnt) = try MountHarness.unlockedMount()
        for name in ["new\nline", "tab\there", "esc\u{1B}[31m", "c1\u{85}x"] {
            #expect(mkdir(mnt + "/" + name, 0o700) == -1 && errno == EINVAL, "\(name.debugDescription)")
            #expect(open(mnt + "/default/" + name, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600) == -1 && errno == EINVAL)
        }
        #expect(harness.sh("ls -A \"$1\"", arguments: [mnt]).stdout == ".control\ndefault\n")
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
}
