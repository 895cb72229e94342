internal import CFuse
internal import CLinux
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// The low-level FUSE callbacks: each finds its ``FileSystem`` through the
/// session's userdata, calls it, and replies. Built as a local table (Swift 6
/// rejects a global one holding C function pointers as shared mutable state).
/// The low-level API lets us wipe the request buffers that carried plaintext,
/// which libfuse's high-level API keeps (docs/CONTRIBUTING.md, "Facts about this platform").
enum FuseOperations {
    static func table() -> fuse_lowlevel_ops {
        var ops = fuse_lowlevel_ops()
        ops.`init` = { _, conn in
            if let conn { CFuse_configure_connection(conn) }
        }
        ops.lookup = { FuseOperations.lookup($0, $1, $2) }
        ops.forget = { FuseOperations.forget($0, $1, $2) }
        ops.forget_multi = { FuseOperations.forgetMany($0, $1, $2) }
        ops.getattr = { FuseOperations.getAttributes($0, $1, $2) }
        ops.setattr = { FuseOperations.setAttributes($0, $1, $2, $3, $4) }
        ops.access = { FuseOperations.access($0, $1, $2) }
        ops.readlink = { req, _ in fuse_reply_err(req, EINVAL) }
        ops.mknod = { req, _, _, _, _ in fuse_reply_err(req, EPERM) }
        ops.symlink = { req, _, _, _ in fuse_reply_err(req, EPERM) }
        ops.link = { req, _, _, _ in fuse_reply_err(req, EPERM) }
        ops.mkdir = { FuseOperations.makeDirectory($0, $1, $2, $3) }
        ops.unlink = { FuseOperations.unlink($0, $1, $2) }
        ops.rmdir = { FuseOperations.removeDirectory($0, $1, $2) }
        ops.rename = { FuseOperations.rename($0, $1, $2, $3, $4, $5) }
        ops.open = { FuseOperations.open($0, $1, $2) }
        ops.create = { FuseOperations.create($0, $1, $2, $3, $4) }
        ops.read = { FuseOperations.read($0, $1, $2, $3, $4) }
        ops.write = { FuseOperations.write($0, $1, $2, $3, $4, $5) }
        ops.flush = { FuseOperations.flush($0, $1, $2) }
        ops.fsync = { FuseOperations.fsync($0, $1, $2, $3) }
        ops.release = { FuseOperations.release($0, $1, $2) }
        ops.opendir = { FuseOperations.openDirectory($0, $1, $2) }
        ops.releasedir = { FuseOperations.releaseDirectory($0, $1, $2) }
        ops.readdir = { FuseOperations.readDirectory($0, $1, $2, $3, $4) }
        ops.readdirplus = { FuseOperations.readDirectoryPlus($0, $1, $2, $3, $4) }
        ops.statfs = { FuseOperations.statistics($0, $1) }
        ops.setxattr = { FuseOperations.setExtendedAttribute($0, $1, $2, $3, $4, $5) }
        ops.getxattr = { FuseOperations.getExtendedAttribute($0, $1, $2, $3) }
        ops.listxattr = { FuseOperations.listExtendedAttributes($0, $1, $2) }
        ops.removexattr = { FuseOperations.removeExtendedAttribute($0, $1, $2) }
        ops.fallocate = { req, _, _, _, _, _ in fuse_reply_err(req, EOPNOTSUPP) }
        ops.poll = { FuseOperations.poll($0, $1, $2, $3) }
        return ops
    }

    // MARK: Shared by the operations

    /// Runs `body` with the request's filesystem; a thrown errno becomes the reply.
    /// A request of another user than the keychain's is answered EACCES
    /// and audited: the kernel lets them in only through a mount made with
    /// `allow_other`, which the device never makes but a user passing a
    /// connection to the service could have. `anyCaller`: for the release
    /// of a descriptor, which the kernel sends with no credentials
    /// (fs/fuse/file.c, `nocreds`) and which must always free it.
    static func serve(_ req: fuse_req_t?, anyCaller: Bool = false, _ body: (FileSystem) throws(Errno) -> Void) {
        guard let req, let userdata = fuse_req_userdata(req) else { return }
        let fs = Unmanaged<FileSystem>.fromOpaque(userdata).takeUnretainedValue()
        do {
            if !anyCaller {
                let context = fuse_req_ctx(req).pointee
                try fs.requireOwner(uid: context.uid, pid: context.pid)
            }
            try body(fs)
        } catch {
            fuse_reply_err(req, error.rawValue)
        }
    }

    /// The thread that made the request (the kernel reports the thread, not its process).
    static func caller(_ req: fuse_req_t?) -> ProcessIdentity {
        let context = fuse_req_ctx(req).pointee
        return ProcessIdentity(thread: context.pid, uid: context.uid)
    }

    /// A name from the kernel; names that are not UTF-8 cannot be items.
    static func kernelName(_ name: UnsafePointer<CChar>?) throws(Errno) -> String {
        guard let name, let string = String(validatingCString: name) else { throw Errno(EINVAL) }
        return string
    }
}

extension FileSystem {
    /// A lookup, create or mkdir reply, handing the node's number to the kernel.
    func entry(for node: Node) throws(Errno) -> fuse_entry_param {
        let inode = nodes.lookedUp(node, by: kernelCache)
        do throws(Errno) {
            return entry(
                node: node, attributes: try attributes(of: node, inode: inode),
                attributeTimeout: newInodeAttributeTimeout(for: node, inode: inode))
        } catch {
            nodes.forget(inode, count: 1, by: kernelCache)  // no reply carries it
            throw error
        }
    }

    /// A readdirplus entry, from the listing taken at opendir. Its sizes
    /// are handed out for a while only if no change was committed since
    /// (`current`); otherwise for no time, and the kernel asks again.
    func entry(listed: DirectoryListing.Entry, current: Bool) -> fuse_entry_param {
        let inode = nodes.lookedUp(listed.node, by: kernelCache)
        return entry(
            node: listed.node, attributes: attributes(of: listed.node, inode: inode, size: listed.size),
            attributeTimeout: current || listed.mode == S_IFDIR
                ? newInodeAttributeTimeout(for: listed.node, inode: inode) : 0)
    }

    private func entry(node: Node, attributes: stat, attributeTimeout: Double) -> fuse_entry_param {
        var entry = fuse_entry_param()
        entry.attr = attributes
        entry.ino = fuse_ino_t(attributes.st_ino)
        entry.generation = 1
        entry.entry_timeout = isPoliced(node) ? 0 : FileSystem.entryTimeout
        entry.attr_timeout = attributeTimeout
        return entry
    }
}
