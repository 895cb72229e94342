internal import CFuse
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// Data: read, write, poll.
extension FuseOperations {
    static func read(
        _ req: fuse_req_t?, _ inode: fuse_ino_t, _ size: Int, _ offset: off_t,
        _ fi: UnsafeMutablePointer<fuse_file_info>?
    ) {
        serve(req) { fs throws(Errno) in
            guard let fi else { throw Errno(EBADF) }
            if inode == NodeTable.controlInode {
                guard let control = FuseHandle.object(fi.pointee.fh, as: ControlFile.self) else { throw Errno(EBADF) }
                control.status.withUnsafeBytes { all in
                    let start = min(Int(offset), all.count)
                    let end = min(all.count, start + size)
                    fuse_reply_buf(req, all.baseAddress.map { $0 + start }, end - start)
                }
                return
            }
            if inode == NodeTable.eventsInode {
                guard let req, let stream = FuseHandle.object(fi.pointee.fh, as: EventStream.self) else {
                    throw Errno(EBADF)
                }
                return stream.read(req, size: size, nonblocking: fi.pointee.flags & O_NONBLOCK != 0)
            }
            guard let file = NodeTable.file(fi.pointee.fh) else { throw Errno(EBADF) }
            try fs.read(file, offset: Int(offset), size: size) { bytes in
                fuse_reply_buf(req, bytes.baseAddress, bytes.count)
            }
        }
    }

    static func write(
        _ req: fuse_req_t?, _ inode: fuse_ino_t, _ buf: UnsafePointer<CChar>?, _ size: Int, _ offset: off_t,
        _ fi: UnsafeMutablePointer<fuse_file_info>?
    ) {
        // The request buffer held plaintext (or a passcode): wipe it
        // whatever happens, once copied.
        let request = UnsafeMutableRawBufferPointer(start: UnsafeMutableRawPointer(mutating: buf), count: size)
        defer { wipeMemory(request) }
        serve(req) { fs throws(Errno) in
            guard let fi else { throw Errno(EBADF) }
            if inode == NodeTable.controlInode {
                try fs.control(request, caller: caller(req))
            } else {
                guard let file = NodeTable.file(fi.pointee.fh) else { throw Errno(EBADF) }
                try fs.write(file, bytes: UnsafeRawBufferPointer(request), offset: Int(offset))
            }
            fuse_reply_write(req, size)
        }
    }

    static func poll(
        _ req: fuse_req_t?, _ inode: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?, _ handle: OpaquePointer?
    ) {
        if inode == NodeTable.eventsInode, let req, let fi,
            let stream = FuseHandle.object(fi.pointee.fh, as: EventStream.self)
        {
            return stream.poll(req, handle: handle)
        }
        // Everything else is always ready, as a regular file is (an
        // ENOSYS here would make the kernel treat `.events` so too).
        if let handle { fuse_pollhandle_destroy(handle) }
        fuse_reply_poll(req, UInt32(POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM))
    }
}
