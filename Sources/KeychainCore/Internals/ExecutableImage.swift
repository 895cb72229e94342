internal import CLinux
#if canImport(Glibc)
import Glibc
#endif

/// This process's executable as the loader placed it in memory.
///
/// The release build is linked twice (scripts/build): `bin/keychainfs`
/// statically, at fixed addresses, which starts with no loader and
/// nothing to relocate, and `libexec/keychainfs/keychainfs`,
/// position-independent, which the kernel places at a random address
/// (ASLR). Only commands that ask a device and print its answer run in
/// the first; everything that serves runs in the second
/// (docs/SECURITY.md, "Two builds of one program").
package enum ExecutableImage {
    /// Whether the executable was placed at a random address: it is
    /// position-independent (ET_DYN), so its code is nowhere an attacker
    /// of a served request knows in advance.
    package static let isPositionIndependent: Bool = loadBias != 0

    /// How far the loader moved the executable from its link-time
    /// addresses: the program headers' address in memory (the auxiliary
    /// vector's AT_PHDR) less the address PT_PHDR gives them at link time
    /// (elf(5)). 0 for an executable linked at fixed addresses; 0 too when
    /// there is no PT_PHDR to tell, so that an executable nobody can
    /// vouch for counts as fixed.
    static var loadBias: UInt {
        let headers = getauxval(UInt(AT_PHDR)), count = Int(getauxval(UInt(AT_PHNUM)))
        guard let table = UnsafePointer<Elf64_Phdr>(bitPattern: headers) else { return 0 }
        for index in 0..<count where table[index].p_type == UInt32(PT_PHDR) {
            return headers &- UInt(table[index].p_vaddr)
        }
        return 0
    }

    /// Where the position-independent build of `executable` (the fixed
    /// one's path, links resolved) lies: `../libexec/keychainfs/keychainfs`
    /// from its directory, as /usr/bin/keychainfs has
    /// /usr/libexec/keychainfs/keychainfs.
    package static func positionIndependentBuild(of executable: String) -> String {
        let directory = executable.lastIndex(of: "/").map { String(executable[..<$0]) } ?? "."
        let parent = directory.lastIndex(of: "/").map { String(directory[..<$0]) } ?? directory + "/.."
        return parent + "/libexec/keychainfs/keychainfs"
    }

    /// Where the device build lies beside `executable` (either build's
    /// path, links resolved): `libexec/keychainfs/device/keychainfs`, as
    /// /usr/libexec/keychainfs/device/keychainfs is beside /usr/bin/keychainfs
    /// and /usr/libexec/keychainfs/keychainfs (named `keychainfs` too, so
    /// that `ps` and `pgrep -x keychainfs` find devices as before). It is
    /// the position-independent build again, installed setgid to a group
    /// that owns nothing, so that the kernel starts a device undumpable
    /// (docs/SECURITY.md, "A device undumpable from its first instruction").
    package static func deviceBuild(of executable: String) -> String {
        let directory = executable.lastIndex(of: "/").map { String(executable[..<$0]) } ?? "."
        if directory.hasSuffix("/libexec/keychainfs/device") { return executable }
        if directory.hasSuffix("/libexec/keychainfs") { return directory + "/device/keychainfs" }
        return String(positionIndependentBuild(of: executable).dropLast("keychainfs".count)) + "device/keychainfs"
    }

    /// Why this process must not serve (hold a keychain for clients, a
    /// mount, the bus); nil when it may.
    package static var servingProblem: String? {
        guard !isPositionIndependent else { return nil }
        return "this keychainfs is the build linked at fixed addresses, for the commands that only ask a device; "
            + "a device runs from the position-independent one (docs/SECURITY.md, \"Two builds of one program\")"
    }
}
