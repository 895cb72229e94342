import KeychainCore
import Foundation
import Testing
import TestSupport

extension SerialTests {
    /// The kernel keeps names and attributes (`ls -l` of a large group was a
    /// round trip per name; docs/FILESYSTEM.md, "The device process"). Every
    /// change is told to every mount, so what it keeps stays exact.
    @Suite struct KernelCacheTests {
        /// Sizes that one mount's kernel holds follow commits through another
        /// mount and through the socket at once, and a removal elsewhere is
        /// ENOENT at once, not a stale `stat`.
        @Test func sizesHeldByOneMountFollowChangesMadeElsewhere() throws {
            let (harness, first) = try MountHarness.unlockedMount()
            let second = try harness.mount("second")
            let kc = "--keychain \"$KC\""
            func size(_ mount: String) -> String {
                harness.sh("stat -c %s \"$1/default/item\"", arguments: [mount]).stdout
            }
            #expect(harness.sh("printf abc > \"$1/default/item\"", arguments: [first]).succeeded)
            #expect(size(second) == "3\n")
            #expect(size(second) == "3\n")
            #expect(harness.sh("printf abcdef > \"$1/default/item\"", arguments: [first]).succeeded)
            #expect(size(second) == "6\n")
            #expect(size(first) == "6\n")
            #expect(harness.sh("printf 0123456789 | \"$K\" set default/item \(kc)").succeeded)
            #expect(size(first) == "10\n")
            #expect(size(second) == "10\n")
            #expect(harness.sh("cat \"$1/default/item\"", arguments: [second]).stdout == "0123456789")
            #expect(harness.sh("rm \"$1/default/item\"", arguments: [first]).succeeded)
            let gone = harness.sh("stat \"$1/default/item\"", arguments: [second])
            #expect(!gone.succeeded && gone.stderr.contains("No such file"))
        }

        /// Namespaces keychainfs does not keep answer ENOTSUP, so that `ls -l`
        /// and `cp -a` stop asking for every file; `user.` names it lacks are
        /// ENODATA as before.
        @Test func foreignAttributeNamespacesAreNotSupported() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(harness.sh("printf v > \"$1/default/item\"", arguments: [mnt]).succeeded)
            for name in ["security.selinux", "system.posix_acl_access", "trusted.x"] {
                let result = harness.sh("getfattr -n \"$2\" \"$1/default/item\"", arguments: [mnt, name])
                #expect(result.stderr.contains("Operation not supported"), "\(name): \(result)")
            }
            #expect(
                harness.sh("getfattr -n user.other \"$1/default/item\"", arguments: [mnt]).stderr.contains(
                    "No such attribute"))
            #expect(harness.sh("ls -l \"$1/default\"", arguments: [mnt]).stdout.contains("-rw------- 1"))
        }

        /// When the kernel forgets inodes (memory pressure; here drop_caches),
        /// the device forgets them too; names come back with their values, and a
        /// descriptor open across it keeps its file.
        @Test func forgottenInodesComeBackAndOpenDescriptorsKeepTheirs() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let script = """
                for i in $(seq 1 200); do printf "value-$i" > "$1/default/item-$i"; done
                ls -l "$1/default" > /dev/null
                exec 3< "$1/default/item-7"
                sync; echo 2 > /proc/sys/vm/drop_caches || exit 99
                printf '%s|' "$(cat <&3)"
                for i in 1 100 200; do printf '%s:%s|' "$(cat "$1/default/item-$i")" "$(stat -c %s "$1/default/item-$i")"; done
                ls "$1/default" | wc -l
                """
            let result = harness.sh(script, arguments: [mnt])
            try #require(result.status != 99, "needs root to drop the kernel's caches")
            #expect(result.stdout == "value-7|value-1:7|value-100:9|value-200:9|200\n", "\(result)")
        }
    }
}
