internal import CFuse
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// Changes of the namespace: mkdir, unlink, rmdir, rename.
extension FuseOperations {
    static func makeDirectory(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _: mode_t) {
        serve(req) { fs throws(Errno) in
            let node = try fs.makeDirectory(parent: try fs.node(parent), name: try kernelName(name))
            var entry = try fs.entry(for: node)
            fuse_reply_entry(req, &entry)
        }
    }

    static func unlink(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        serve(req) { fs throws(Errno) in
            try fs.unlink(parent: try fs.node(parent), name: try kernelName(name), caller: caller(req))
            fuse_reply_err(req, 0)
        }
    }

    static func removeDirectory(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        serve(req) { fs throws(Errno) in
            try fs.removeDirectory(parent: try fs.node(parent), name: try kernelName(name), caller: caller(req))
            fuse_reply_err(req, 0)
        }
    }

    static func rename(
        _ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ newParent: fuse_ino_t,
        _ newName: UnsafePointer<CChar>?, _ flags: UInt32
    ) {
        serve(req) { fs throws(Errno) in
            try fs.rename(
                parent: try fs.node(parent), name: try kernelName(name),
                newParent: try fs.node(newParent), newName: try kernelName(newName), flags: UInt32(flags),
                caller: caller(req))
            fuse_reply_err(req, 0)
        }
    }
}
