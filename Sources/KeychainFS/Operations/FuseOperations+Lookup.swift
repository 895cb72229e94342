internal import CFuse
internal import CLinux
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// Names and attributes: lookup, forget, getattr, setattr, access, statfs.
extension FuseOperations {
    static func lookup(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        serve(req) { fs throws(Errno) in
            let node = try fs.child(of: try fs.node(parent), named: try kernelName(name))
            try fs.requireEntitlement(toItem: node, caller: caller(req), operation: "lookup")
            var entry: fuse_entry_param
            do throws(Errno) {
                entry = try fs.entry(for: node)
            } catch {
                // No item of that name: a folder, if items sit below it (asked only then: a name that exists
                // costs nothing more).
                guard error == Errno(ENOENT), let folder = fs.folder(for: node) else { throw error }
                entry = try fs.entry(for: folder)
            }
            fuse_reply_entry(req, &entry)
        }
    }

    static func forget(_ req: fuse_req_t?, _ inode: fuse_ino_t, _ count: UInt64) {
        if let req, let userdata = fuse_req_userdata(req) {
            let fs = Unmanaged<FileSystem>.fromOpaque(userdata).takeUnretainedValue()
            fs.nodes.forget(inode, count: count, by: fs.kernelCache)
        }
        fuse_reply_none(req)
    }

    static func forgetMany(_ req: fuse_req_t?, _ count: Int, _ forgets: UnsafeMutablePointer<fuse_forget_data>?) {
        if let req, let userdata = fuse_req_userdata(req), let forgets {
            let fs = Unmanaged<FileSystem>.fromOpaque(userdata).takeUnretainedValue()
            for one in UnsafeBufferPointer(start: forgets, count: count) {
                fs.nodes.forget(one.ino, count: one.nlookup, by: fs.kernelCache)
            }
            // The kernel dropped many inodes at once (memory pressure,
            // drop_caches): give the freed table memory back.
            if count >= 1024 { CLinux_release_free_memory() }
        }
        fuse_reply_none(req)
    }

    static func getAttributes(_ req: fuse_req_t?, _ inode: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        serve(req) { fs throws(Errno) in
            if let node = fs.nodes.node(for: inode) {
                try fs.requireEntitlement(toItem: node, caller: caller(req), operation: "stat")
            }
            var info = try fs.attributes(
                ofInode: inode, file: fi.flatMap { NodeTable.file($0.pointee.fh) },
                caller: caller(req))
            fuse_reply_attr(req, &info, fs.attributeTimeout(ofInode: inode))
        }
    }

    static func setAttributes(
        _ req: fuse_req_t?, _ inode: fuse_ino_t, _ attr: UnsafeMutablePointer<stat>?, _ toSet: Int32,
        _ fi: UnsafeMutablePointer<fuse_file_info>?
    ) {
        serve(req) { fs throws(Errno) in
            guard let attr else { throw Errno(EINVAL) }
            let file = fi.flatMap { NodeTable.file($0.pointee.fh) }
            // A descriptor of a removed item may still be resized (its writes go nowhere).
            let node = file == nil ? try fs.node(inode) : fs.nodes.node(for: inode)
            if let node { try fs.requireEntitlement(toItem: node, caller: caller(req), operation: "setattr") }
            let current = try fs.attributes(ofInode: inode, file: file, caller: caller(req))
            try fs.checkOwnershipUnchanged(attr.pointee, toSet: toSet, current: current)
            // `.control` and `.events` have no content to cut.
            if toSet & FUSE_SET_ATTR_SIZE != 0 && node != .control && node != .events {
                let size = Int(attr.pointee.st_size)
                if let file {
                    try fs.truncate(file, to: size)
                } else if case .item(let group, let identifier)? = node {
                    try fs.truncate(group: group, identifier: identifier, to: size, caller: caller(req))
                } else {
                    throw Errno(EISDIR)
                }
            }
            // Times are accepted and not kept: items have no timestamps
            // (docs/FILESYSTEM.md), and `touch` must not fail.
            var info = try fs.attributes(ofInode: inode, file: file, caller: caller(req))
            fuse_reply_attr(req, &info, fs.attributeTimeout(ofInode: inode))
        }
    }

    static func access(_ req: fuse_req_t?, _ inode: fuse_ino_t, _ mask: Int32) {
        serve(req) { fs throws(Errno) in
            // Answered by the real modes (items 0600, directories 0700,
            // all the owner's): nothing here is executable.
            let node = try fs.node(inode)
            try fs.requireEntitlement(toItem: node, caller: caller(req), operation: "access")
            if mask & X_OK != 0,
                node == .control || node == .events || { if case .item = node { return true } else { return false } }()
            {
                throw Errno(EACCES)
            }
            fuse_reply_err(req, 0)
        }
    }

    static func statistics(_ req: fuse_req_t?, _: fuse_ino_t) {
        serve(req) { fs throws(Errno) in
            var info = try fs.statistics()
            fuse_reply_statfs(req, &info)
        }
    }
}
