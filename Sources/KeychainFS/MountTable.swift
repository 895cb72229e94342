#if canImport(Glibc)
import Glibc
#endif

/// Facts about mount points and how to remove one, as root or not.
public enum MountTable {
    /// Whether `path` is the root of a mount (its device differs from its parent's,
    /// or it is a dead FUSE mount that stat cannot enter).
    public static func isMountPoint(_ path: String) -> Bool {
        if isDeadMount(path) { return true }
        var own = stat()
        var parent = stat()
        guard stat(path, &own) == 0, stat(path + "/..", &parent) == 0 else { return false }
        return own.st_dev != parent.st_dev || own.st_ino == parent.st_ino
    }

    /// A FUSE mount whose server died: "Transport endpoint is not connected".
    public static func isDeadMount(_ path: String) -> Bool {
        var info = stat()
        return stat(path, &info) != 0 && errno == ENOTCONN
    }

    /// Unmounts `path`: umount2 as root, `fusermount3 -u` otherwise. Returns 0 or an errno.
    public static func unmount(_ path: String, lazy: Bool) -> Int32 {
        if geteuid() == 0 {
            return umount2(path, lazy ? Int32(MNT_DETACH) : 0) == 0 ? 0 : errno
        }
        let status = Spawn.run(["/bin/fusermount3", "-u", "-q"] + (lazy ? ["-z"] : []) + [path])
        return status == 0 ? 0 : EBUSY
    }

    /// Whether the directory exists and holds nothing (FUSE would hide its contents).
    public static func emptyDirectoryProblem(_ path: String) -> String? {
        var info = stat()
        guard stat(path, &info) == 0 else {
            return errno == ENOENT ? "mount point \(path) does not exist" : "cannot use mount point \(path): \(String(cString: strerror(errno)))"
        }
        guard info.st_mode & S_IFMT == S_IFDIR else { return "mount point \(path) is not a directory" }
        guard let dir = opendir(path) else { return "cannot read mount point \(path)" }
        defer { closedir(dir) }
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name != "." && name != ".." { return "mount point \(path) is not empty" }
        }
        return nil
    }
}
