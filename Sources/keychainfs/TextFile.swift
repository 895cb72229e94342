import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// Small text files the command line keeps of its own: the desktop's
/// files (`desktop enable`), the login unlock's choice, the service's pid
/// file. Read whole (at most 64 KiB); written whole or not at all.
enum TextFile {
    /// The file's text; nil when it cannot be read (absent, a link, too large).
    static func read(_ path: String) -> String? {
        guard let fd = FileDescriptor(open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)) else { return nil }
        return (try? fd.borrowed.readAll(limit: 1 << 16)).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Written whole or not at all (a temporary file renamed over it).
    static func write(_ text: String, to path: String) throws {
        try makeDirectories(String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)]))
        let temporary = path + ".keychainfs-new"
        guard let fd = FileDescriptor(open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o644))
        else { throw fail("cannot write \(path): \(Errno.current)") }
        let written = (try? fd.borrowed.writeAll(Array(text.utf8))) != nil && fsync(fd.raw) == 0
        _ = fd.close()  // synced already
        guard written, rename(temporary, path) == 0 else {
            unlink(temporary)
            throw fail("cannot write \(path): \(Errno.current)")
        }
    }

    static func makeDirectories(_ path: String) throws {
        var built = ""
        for part in path.split(separator: "/") {
            built += "/" + part
            if mkdir(built, 0o755) != 0 && Errno.current.rawValue != EEXIST {
                throw fail("cannot make \(built): \(Errno.current)")
            }
        }
    }
}
