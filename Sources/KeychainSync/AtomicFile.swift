import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// A file replaced whole or not at all: written beside, synced, renamed
/// over, and the directory synced (rename(2) is atomic; fsync makes it last).
enum AtomicFile {
    static func write(_ bytes: [UInt8], to path: String) throws(SyncFailure) {
        let temporary = path + ".new"
        do throws(Errno) {
            guard let fd = FileDescriptor(open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)) else {
                throw Errno.current
            }
            try fd.borrowed.writeAll(bytes)
            _ = try valueOrErrno { fsync(fd.raw) }
            _ = try valueOrErrno { rename(temporary, path) }
            let directory = String(path[..<(path.lastIndex(of: "/") ?? path.endIndex)])
            if let dir = FileDescriptor(open(directory.isEmpty ? "/" : directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
                _ = fsync(dir.raw)
            }
        } catch {
            unlink(temporary)
            if error.rawValue == ENOSPC {
                throw SyncFailure(.store(.diskFull), "no space left to save \(path)")
            }
            throw SyncFailure(.store(.io), "\(path) could not be written (\(error))")
        }
    }
}
