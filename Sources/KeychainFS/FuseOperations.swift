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
/// which libfuse's high-level API keeps (FIELD-NOTES).
enum FuseOperations {
    static func table() -> fuse_lowlevel_ops {
        var ops = fuse_lowlevel_ops()
        ops.`init` = { _, conn in
            if let conn { CFuse_configure_connection(conn) }
        }
        ops.lookup = { req, parent, name in
            serve(req) { fs throws(Errno) in
                let node = try fs.child(of: try fs.node(parent), named: try cString(name))
                try fs.requireEntitlement(toItem: node, caller: caller(req), operation: "lookup")
                var entry = try fs.entry(for: node)
                fuse_reply_entry(req, &entry)
            }
        }
        ops.forget = { req, inode, count in
            if let req, let userdata = fuse_req_userdata(req) {
                let fs = Unmanaged<FileSystem>.fromOpaque(userdata).takeUnretainedValue()
                fs.nodes.forget(inode, count: count, by: fs.kernelCache)
            }
            fuse_reply_none(req)
        }
        ops.forget_multi = { req, count, forgets in
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
        ops.getattr = { req, inode, fi in
            serve(req) { fs throws(Errno) in
                if let node = fs.nodes.node(for: inode) {
                    try fs.requireEntitlement(toItem: node, caller: caller(req), operation: "stat")
                }
                var info = try fs.attributes(ofInode: inode, file: fi.flatMap { NodeTable.file($0.pointee.fh) },
                                             caller: caller(req))
                fuse_reply_attr(req, &info, fs.attributeTimeout(ofInode: inode))
            }
        }
        ops.setattr = { req, inode, attr, toSet, fi in
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
        ops.access = { req, inode, mask in
            serve(req) { fs throws(Errno) in
                // Answered by the real modes (items 0600, directories 0700,
                // all the owner's): nothing here is executable.
                let node = try fs.node(inode)
                try fs.requireEntitlement(toItem: node, caller: caller(req), operation: "access")
                if mask & X_OK != 0, node == .control || node == .events || { if case .item = node { return true } else { return false } }() {
                    throw Errno(EACCES)
                }
                fuse_reply_err(req, 0)
            }
        }
        ops.readlink = { req, _ in fuse_reply_err(req, EINVAL) }
        ops.mknod = { req, _, _, _, _ in fuse_reply_err(req, EPERM) }
        ops.symlink = { req, _, _, _ in fuse_reply_err(req, EPERM) }
        ops.link = { req, _, _, _ in fuse_reply_err(req, EPERM) }
        ops.mkdir = { req, parent, name, _ in
            serve(req) { fs throws(Errno) in
                let node = try fs.makeDirectory(parent: try fs.node(parent), name: try cString(name))
                var entry = try fs.entry(for: node)
                fuse_reply_entry(req, &entry)
            }
        }
        ops.unlink = { req, parent, name in
            serve(req) { fs throws(Errno) in
                try fs.unlink(parent: try fs.node(parent), name: try cString(name), caller: caller(req))
                fuse_reply_err(req, 0)
            }
        }
        ops.rmdir = { req, parent, name in
            serve(req) { fs throws(Errno) in
                try fs.removeDirectory(parent: try fs.node(parent), name: try cString(name), caller: caller(req))
                fuse_reply_err(req, 0)
            }
        }
        ops.rename = { req, parent, name, newParent, newName, flags in
            serve(req) { fs throws(Errno) in
                try fs.rename(parent: try fs.node(parent), name: try cString(name),
                              newParent: try fs.node(newParent), newName: try cString(newName), flags: UInt32(flags),
                              caller: caller(req))
                fuse_reply_err(req, 0)
            }
        }
        ops.open = { req, inode, fi in
            serve(req) { fs throws(Errno) in
                guard let fi else { throw Errno(EINVAL) }
                let node = try fs.node(inode)
                fi.pointee.direct_io = 1
                fi.pointee.keep_cache = 0
                switch node {
                case .control:
                    let control = ControlFile(status: fs.statusText())
                    fi.pointee.fh = FuseHandle.make(control)
                case .events:
                    guard fi.pointee.flags & O_ACCMODE == O_RDONLY else { throw Errno(EACCES) }
                    // Who reads decides which item changes it may see (entitlements).
                    let stream = EventStream(reader: caller(req).program)
                    // The first line is the state now: a reader needs no other call to know
                    // where it starts, and knows its descriptor is listening once it reads it.
                    // Said again if it changed before the stream was listening (a repeated
                    // state line is harmless, a wrong last one is not).
                    let device = fs.manager.localDevice
                    func stateLine(_ locked: Bool) -> [UInt8] { Array((locked ? DeviceEvent.locked : .unlocked).eventLine.text.utf8) }
                    let locked = device.isLocked
                    stream.deliver(stateLine(locked))
                    fs.eventStreams.add(stream)
                    if device.isLocked != locked { stream.deliver(stateLine(!locked)) }
                    fi.pointee.fh = FuseHandle.make(stream)
                    fi.pointee.nonseekable = 1
                case .item(let group, let identifier):
                    let file = try fs.openItem(group: group, identifier: identifier, inode: inode,
                                               flags: fi.pointee.flags, opener: caller(req))
                    // Read-only descriptors have nothing to commit: no FLUSH round trip on close.
                    fi.pointee.noflush = file.writable ? 0 : 1
                    fi.pointee.fh = try fs.nodes.add(file)
                default:
                    throw Errno(EISDIR)
                }
                fuse_reply_open(req, fi)
            }
        }
        ops.create = { req, parent, name, mode, fi in
            serve(req) { fs throws(Errno) in
                guard let fi else { throw Errno(EINVAL) }
                guard mode & S_IFMT == S_IFREG || mode & S_IFMT == 0 else { throw Errno(EPERM) }
                let name = try cString(name)
                let parentNode = try fs.node(parent)
                if parentNode == .root && FileSystem.specialFiles[name] != nil { throw Errno(EEXIST) }
                guard let group = fs.itemGroup(of: parentNode) else { throw Errno(EPERM) }
                let file = try fs.createItem(group: group, identifier: name, flags: fi.pointee.flags, opener: caller(req))
                // The entry first: once a handle is registered, the reply must not fail.
                var entry = try fs.entry(for: .item(group: group, identifier: name))
                fi.pointee.direct_io = 1
                fi.pointee.fh = try fs.nodes.add(file)
                fuse_reply_create(req, &entry, fi)
            }
        }
        ops.read = { req, inode, size, offset, fi in
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
                    guard let req, let stream = FuseHandle.object(fi.pointee.fh, as: EventStream.self) else { throw Errno(EBADF) }
                    return stream.read(req, size: size, nonblocking: fi.pointee.flags & O_NONBLOCK != 0)
                }
                guard let file = NodeTable.file(fi.pointee.fh) else { throw Errno(EBADF) }
                try fs.read(file, offset: Int(offset), size: size) { bytes in
                    fuse_reply_buf(req, bytes.baseAddress, bytes.count)
                }
            }
        }
        ops.write = { req, inode, buf, size, offset, fi in
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
        ops.flush = { req, inode, fi in
            serve(req) { fs throws(Errno) in
                if !NodeTable.isSpecial(inode), let fi, let file = NodeTable.file(fi.pointee.fh) {
                    try fs.commit(file, final: false)
                }
                fuse_reply_err(req, 0)
            }
        }
        ops.fsync = { req, inode, _, fi in
            serve(req) { fs throws(Errno) in
                if !NodeTable.isSpecial(inode), let fi, let file = NodeTable.file(fi.pointee.fh) {
                    try fs.commit(file, final: false)
                }
                try core { () throws(KeychainError) in try fs.manager.sync() }
                fuse_reply_err(req, 0)
            }
        }
        ops.release = { req, inode, fi in
            serve(req) { fs throws(Errno) in
                guard let fi else { throw Errno(EBADF) }
                if inode == NodeTable.controlInode {
                    FuseHandle.take(fi.pointee.fh, as: ControlFile.self)
                } else if inode == NodeTable.eventsInode {
                    if let stream = FuseHandle.take(fi.pointee.fh, as: EventStream.self) {
                        stream.close()
                        fs.eventStreams.remove(stream)
                    }
                } else if let file = NodeTable.file(fi.pointee.fh) {
                    // A commit failing here has no one to report to: the
                    // flush before it already did (close returns its result).
                    do throws(Errno) { try fs.commit(file, final: true) } catch {
                        Diagnostics.log("release of inode \(inode) could not commit: errno \(error.rawValue)")
                    }
                    fs.nodes.remove(fi.pointee.fh)
                }
                fuse_reply_err(req, 0)
            }
        }
        ops.opendir = { req, inode, fi in
            serve(req) { fs throws(Errno) in
                guard let fi else { throw Errno(EINVAL) }
                // One listing per opendir: a directory read in several
                // chunks neither re-queries the store nor skips or repeats
                // entries when items change meanwhile.
                let changeCount = fs.nodes.changeCount  // before the listing's query
                let node = try fs.node(inode)
                try fs.requireEntitlement(inDirectory: node, caller: caller(req), operation: "list")
                let listing = DirectoryListing(try fs.listing(of: node), changeCount: changeCount)
                fi.pointee.fh = FuseHandle.make(listing)
                fuse_reply_open(req, fi)
            }
        }
        ops.releasedir = { req, _, fi in
            if let fi { FuseHandle.take(fi.pointee.fh, as: DirectoryListing.self) }
            fuse_reply_err(req, 0)
        }
        ops.readdir = { req, _, size, offset, fi in
            replyListing(req, fi, size: size, offset: offset) { fs, _, listed, room, roomSize, next in
                var info = stat()
                info.st_ino = ino_t(fs.nodes.inode(for: listed.node))
                info.st_mode = listed.mode
                return fuse_add_direntry(req, room, roomSize, listed.name, &info, next)
            }
        }
        ops.readdirplus = { req, _, size, offset, fi in
            replyListing(req, fi, size: size, offset: offset) { fs, listing, listed, room, roomSize, next in
                // An entry without a number (ino 0) is a bare name: the
                // kernel takes no reference and keeps what it has. So are
                // `.` and `..`, and nodes this kernel already holds, whose
                // cached attributes are exact and would be replaced by the
                // listing's, kept for less long.
                var entry = fuse_entry_param()
                entry.attr.st_mode = listed.mode
                if let known = fs.nodes.existingInode(for: listed.node),
                   listed.name == "." || listed.name == ".." || fs.kernelCache.knows(known) {
                    entry.attr.st_ino = ino_t(known)
                } else {
                    entry = fs.entry(listed: listed, current: fs.nodes.changeCount == listing.changeCount)
                }
                let needed = fuse_add_direntry_plus(req, room, roomSize, listed.name, &entry, next)
                if needed > roomSize && entry.ino != 0 {
                    fs.nodes.forget(UInt64(entry.ino), count: 1, by: fs.kernelCache)  // not sent
                }
                return needed
            }
        }
        ops.statfs = { req, _ in
            serve(req) { fs throws(Errno) in
                var info = try fs.statistics()
                fuse_reply_statfs(req, &info)
            }
        }
        ops.setxattr = { req, inode, name, value, size, flags in
            serve(req) { fs throws(Errno) in
                let bytes = UnsafeRawBufferPointer(start: value, count: size)
                guard let text = String(validating: bytes, as: UTF8.self) else { throw Errno(EINVAL) }
                let node = try fs.entitledNode(inode, caller: caller(req), operation: "xattr")
                let name = try cString(name)
                guard case .item(let group, let identifier) = node else {
                    return try fs.setExtendedAttribute(name, value: text, flags: flags, of: node)
                }
                // Setting an attribute gives the item another class: a change worth recording.
                try fs.audited("set-class", group: group, identifier: identifier, detail: name + "=" + text,
                               caller: caller(req)) { () throws(Errno) in
                    try fs.setExtendedAttribute(name, value: text, flags: flags, of: node)
                }
                fuse_reply_err(req, 0)
            }
        }
        ops.getxattr = { req, inode, name, size in
            serve(req) { fs throws(Errno) in
                let value = Array(try fs.extendedAttribute(try cString(name), of: try fs.entitledNode(inode, caller: caller(req), operation: "xattr")).utf8)
                try replyXattr(req, value, size: size)
            }
        }
        ops.listxattr = { req, inode, size in
            serve(req) { fs throws(Errno) in
                let names = fs.extendedAttributeNames(of: try fs.entitledNode(inode, caller: caller(req), operation: "xattr")).flatMap { Array($0.utf8) + [UInt8(0)] }
                try replyXattr(req, names, size: size)
            }
        }
        ops.removexattr = { req, inode, name in
            serve(req) { fs throws(Errno) in
                try fs.removeExtendedAttribute(try cString(name), of: try fs.entitledNode(inode, caller: caller(req), operation: "xattr"))
            }
        }
        ops.fallocate = { req, _, _, _, _, _ in fuse_reply_err(req, EOPNOTSUPP) }
        ops.poll = { req, inode, fi, handle in
            if inode == NodeTable.eventsInode, let req, let fi,
               let stream = FuseHandle.object(fi.pointee.fh, as: EventStream.self) {
                return stream.poll(req, handle: handle)
            }
            // Everything else is always ready, as a regular file is (an
            // ENOSYS here would make the kernel treat `.events` so too).
            if let handle { fuse_pollhandle_destroy(handle) }
            fuse_reply_poll(req, UInt32(POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM))
        }
        return ops
    }

}

/// Runs `body` with the request's filesystem; a thrown errno becomes the reply.
/// (Free functions: a C callback may not capture even the enum's metatype.)
private func serve(_ req: fuse_req_t?, _ body: (FileSystem) throws(Errno) -> Void) {
    guard let req, let userdata = fuse_req_userdata(req) else { return }
    let fs = Unmanaged<FileSystem>.fromOpaque(userdata).takeUnretainedValue()
    do {
        try body(fs)
    } catch {
        fuse_reply_err(req, error.rawValue)
    }
}

/// The thread that made the request (the kernel reports the thread, not its process).
private func caller(_ req: fuse_req_t?) -> ProcessIdentity {
    let context = fuse_req_ctx(req).pointee
    return ProcessIdentity(thread: context.pid, uid: context.uid)
}

/// Replies to READDIR or READDIRPLUS from the listing taken at opendir:
/// the entries from `offset` on that fit in `size` bytes. `add` writes one
/// entry (the filesystem, the listing, the entry, the room left and its
/// size, the entry's next offset) and returns the bytes it needs; more than
/// the room means it did not fit, and the reply ends before it.
private func replyListing(_ req: fuse_req_t?, _ fi: UnsafeMutablePointer<fuse_file_info>?, size: Int, offset: off_t,
                          add: (FileSystem, DirectoryListing, DirectoryListing.Entry, UnsafeMutablePointer<CChar>, Int, off_t) -> Int) {
    serve(req) { fs throws(Errno) in
        guard let fi, let listing = FuseHandle.object(fi.pointee.fh, as: DirectoryListing.self) else {
            throw Errno(EBADF)
        }
        let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: size)
        defer { buffer.deallocate() }
        var used = 0
        var index = Int(offset)
        while index < listing.entries.count {
            let needed = add(fs, listing, listing.entries[index], buffer + used, size - used, off_t(index + 1))
            if needed > size - used { break }
            used += needed
            index += 1
        }
        fuse_reply_buf(req, buffer, used)
    }
}

/// A name from the kernel; names that are not UTF-8 cannot be items.
private func cString(_ name: UnsafePointer<CChar>?) throws(Errno) -> String {
    guard let name, let string = String(validatingCString: name) else { throw Errno(EINVAL) }
    return string
}

/// getxattr/listxattr: size 0 asks for the length; too small a buffer is ERANGE.
private func replyXattr(_ req: fuse_req_t?, _ value: [UInt8], size: Int) throws(Errno) {
    if size == 0 {
        fuse_reply_xattr(req, value.count)
    } else if size < value.count {
        throw Errno(ERANGE)
    } else {
        value.withUnsafeBytes { _ = fuse_reply_buf(req, $0.baseAddress, $0.count) }
    }
}

extension FileSystem {
    /// A lookup, create or mkdir reply, handing the node's number to the kernel.
    func entry(for node: Node) throws(Errno) -> fuse_entry_param {
        let inode = nodes.lookedUp(node, by: kernelCache)
        do throws(Errno) {
            return entry(node: node, attributes: try attributes(of: node, inode: inode),
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
        return entry(node: listed.node, attributes: attributes(of: listed.node, inode: inode, size: listed.size),
                     attributeTimeout: current || listed.mode == S_IFDIR ? newInodeAttributeTimeout(for: listed.node, inode: inode) : 0)
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
