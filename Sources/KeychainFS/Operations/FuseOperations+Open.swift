internal import CFuse
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// Descriptors: open, create, flush, fsync, release.
extension FuseOperations {
    static func open(_ req: fuse_req_t?, _ inode: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        serve(req) { fs throws(Errno) in
            guard let fi else { throw Errno(EINVAL) }
            // A detached item: the open raced the removal or replacement of its name (openDescriptor).
            guard let node = fs.nodes.node(for: inode) ?? fs.nodes.detachedItem(inode) else {
                throw Errno(ESTALE)
            }
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
                func stateLine(_ locked: Bool) -> [UInt8] {
                    Array((locked ? DeviceEvent.locked : .unlocked).eventLine.text.utf8)
                }
                let locked = device.isLocked
                stream.deliver(stateLine(locked))
                fs.eventStreams.add(stream)
                if device.isLocked != locked { stream.deliver(stateLine(!locked)) }
                fi.pointee.fh = FuseHandle.make(stream)
                fi.pointee.nonseekable = 1
            case .item:
                let (file, handle) = try fs.openDescriptor(inode: inode, flags: fi.pointee.flags, opener: caller(req))
                // Read-only descriptors have nothing to commit: no FLUSH round trip on close.
                fi.pointee.noflush = file.writable ? 0 : 1
                fi.pointee.fh = handle
            default:
                throw Errno(EISDIR)
            }
            fuse_reply_open(req, fi)
        }
    }

    static func create(
        _ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ mode: mode_t,
        _ fi: UnsafeMutablePointer<fuse_file_info>?
    ) {
        serve(req) { fs throws(Errno) in
            guard let fi else { throw Errno(EINVAL) }
            guard mode & S_IFMT == S_IFREG || mode & S_IFMT == 0 else { throw Errno(EPERM) }
            let name = try kernelName(name)
            let parentNode = try fs.node(parent)
            if parentNode == .root && FileSystem.specialFiles[name] != nil { throw Errno(EEXIST) }
            guard let (group, folder) = fs.itemDirectory(of: parentNode) else { throw Errno(EPERM) }
            let identifier = folder + name
            let file = try fs.createItem(
                group: group, identifier: identifier, flags: fi.pointee.flags, opener: caller(req))
            // The entry first: once a handle is registered, the reply must not fail.
            var entry = try fs.entry(for: .item(group: group, identifier: identifier))
            fi.pointee.direct_io = 1
            fi.pointee.fh = try fs.nodes.add(file)
            fuse_reply_create(req, &entry, fi)
        }
    }

    static func flush(_ req: fuse_req_t?, _ inode: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        serve(req) { fs throws(Errno) in
            if !NodeTable.isSpecial(inode), let fi, let file = NodeTable.file(fi.pointee.fh) {
                try fs.commit(file, final: false)
            }
            fuse_reply_err(req, 0)
        }
    }

    static func fsync(_ req: fuse_req_t?, _ inode: fuse_ino_t, _: Int32, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        serve(req) { fs throws(Errno) in
            if !NodeTable.isSpecial(inode), let fi, let file = NodeTable.file(fi.pointee.fh) {
                try fs.commit(file, final: false)
            }
            try core { () throws(KeychainError) in try fs.manager.sync() }
            fuse_reply_err(req, 0)
        }
    }

    static func release(_ req: fuse_req_t?, _ inode: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        serve(req, anyCaller: true) { fs throws(Errno) in
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
                fs.releaseLockedMemory(of: file)
                fs.nodes.remove(fi.pointee.fh)
            }
            fuse_reply_err(req, 0)
        }
    }
}
