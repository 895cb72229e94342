import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// Facts about mount points and how to remove one, as root or not.
public enum MountTable {
    /// Whether `path` (canonical) is the root of a mount, as the kernel's
    /// mount table says; a dead FUSE mount counts.
    public static func isMountPoint(_ path: String) -> Bool {
        !fileSystemTypes(mountedAt: path).isEmpty
    }

    /// A FUSE mount whose server died ("Transport endpoint is not
    /// connected"). Decided from the mount table and a `statvfs`, which the
    /// kernel always sends to the server: a `stat` of the root would be
    /// answered from the attribute cache for a while after the death.
    public static func isDeadMount(_ path: String) -> Bool {
        guard fileSystemTypes(mountedAt: path).last?.hasPrefix("fuse") == true else { return false }
        var info = statvfs()  // statfs(2) underneath
        return statvfs(path, &info) != 0 && Errno.current.rawValue == ENOTCONN
    }

    /// The types of the filesystems mounted at `path`, oldest first
    /// (`/proc/self/mountinfo`, proc(5)).
    static func fileSystemTypes(mountedAt path: String) -> [String] {
        guard let fd = FileDescriptor(open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC)) else { return [] }
        let table = String(decoding: (try? fd.borrowed.readAll(limit: 16 << 20)) ?? [], as: UTF8.self)
        return table.split(separator: "\n").compactMap { line -> String? in
            let fields = line.split(separator: " ", omittingEmptySubsequences: false)
            // ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPEROPTIONS
            guard fields.count > 6, unescapeMountField(fields[4]) == path,
                let separator = fields.firstIndex(of: "-"), separator + 1 < fields.count
            else { return nil }
            return String(fields[separator + 1])
        }
    }

    /// Mount table fields escape space, tab, newline and backslash as `\ooo` octal.
    private static func unescapeMountField(_ field: Substring) -> String {
        var bytes: [UInt8] = []
        var utf8 = Array(field.utf8)[...]
        while let byte = utf8.popFirst() {
            if byte == UInt8(ascii: "\\"), utf8.count >= 3,
                let value = UInt8(String(decoding: utf8.prefix(3), as: UTF8.self), radix: 8)
            {
                bytes.append(value)
                utf8 = utf8.dropFirst(3)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// fusermount3, setuid root, where Debian's fuse3 installs it: how a user mounts and unmounts.
    public static let fusermount = "/bin/fusermount3"

    /// Unmounts `path`: umount2 as root, `fusermount3 -u` otherwise. Returns 0 or an errno.
    public static func unmount(_ path: String, lazy: Bool) -> Int32 {
        if geteuid() == 0 {
            return umount2(path, lazy ? Int32(MNT_DETACH) : 0) == 0 ? 0 : Errno.current.rawValue
        }
        let status = Spawn.run([fusermount, "-u", "-q"] + (lazy ? ["-z"] : []) + [path])
        return status == 0 ? 0 : EBUSY
    }

    /// Why nothing can be mounted at `path` (canonical) because something
    /// already is: a keychain (this one or another) or another filesystem.
    public static func alreadyMountedProblem(_ path: String) -> String? {
        guard let type = fileSystemTypes(mountedAt: path).last else { return nil }
        if type == "fuse.keychainfs" {
            return "a keychain is already mounted at \(path) (keychainfs status \(path) says which; unmount it first)"
        }
        return "\(path) is already a mount point (\(type)); choose an empty directory"
    }

    /// Whether the directory exists and holds nothing (FUSE would hide its contents).
    public static func emptyDirectoryProblem(_ path: String) -> String? {
        var info = stat()
        guard stat(path, &info) == 0 else {
            return Errno.current.rawValue == ENOENT
                ? "mount point \(path) does not exist" : "cannot use mount point \(path): \(Errno.current.description)"
        }
        guard info.st_mode & S_IFMT == S_IFDIR else { return "mount point \(path) is not a directory" }
        guard let dir = opendir(path) else { return "cannot read mount point \(path)" }
        defer { closedir(dir) }
        while let entry = readdir(dir) {
            let name = entry.name
            if name != "." && name != ".." { return "mount point \(path) is not empty" }
        }
        return nil
    }
}
