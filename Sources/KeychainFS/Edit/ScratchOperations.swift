internal import CFuse
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// The low-level FUSE callbacks of a ``ScratchDirectory``: one flat
/// directory of regular files. Attributes and names are never cached by the
/// kernel (timeouts 0) and every file is `direct_io`, so nothing of a file
/// lives outside the process's locked memory.
enum ScratchOperations {
    static let rootInode: UInt64 = 1
    /// renameat2(2)'s RENAME_NOREPLACE (declared only under _GNU_SOURCE).
    private static let renameNoReplace: UInt32 = 1 << 0

    static func table() -> fuse_lowlevel_ops {
        var ops = fuse_lowlevel_ops()
        ops.`init` = { _, conn in
            if let conn { CFuse_configure_scratch_connection(conn) }
        }
        ops.lookup = { ScratchOperations.lookup($0, $1, $2) }
        ops.getattr = { req, inode, _ in ScratchOperations.getAttributes(req, inode) }
        ops.setattr = { req, inode, wanted, toSet, _ in ScratchOperations.setAttributes(req, inode, wanted, toSet) }
        ops.open = { ScratchOperations.open($0, $1, $2) }
        ops.create = { ScratchOperations.create($0, $1, $2, $3, $4) }
        ops.read = { req, inode, size, offset, _ in ScratchOperations.read(req, inode, size, offset) }
        ops.write = { req, inode, buffer, size, offset, _ in ScratchOperations.write(req, inode, buffer, size, offset) }
        ops.flush = { req, _, _ in fuse_reply_err(req, 0) }
        ops.fsync = { req, _, _, _ in fuse_reply_err(req, 0) }
        ops.release = { req, inode, _ in ScratchOperations.release(req, inode) }
        ops.unlink = { ScratchOperations.unlink($0, $1, $2) }
        ops.rename = { ScratchOperations.rename($0, $1, $2, $3, $4, $5) }
        ops.mkdir = { req, _, _, _ in fuse_reply_err(req, EPERM) }
        ops.rmdir = { req, _, _ in fuse_reply_err(req, ENOTDIR) }
        ops.mknod = { req, _, _, _, _ in fuse_reply_err(req, EPERM) }
        ops.symlink = { req, _, _, _ in fuse_reply_err(req, EPERM) }
        ops.link = { req, _, _, _ in fuse_reply_err(req, EPERM) }
        ops.opendir = { req, inode, fi in
            guard inode == ScratchOperations.rootInode else { fuse_reply_err(req, ENOTDIR); return }
            fuse_reply_open(req, fi)
        }
        ops.readdir = { req, inode, size, offset, _ in ScratchOperations.readDirectory(req, inode, size, offset) }
        return ops
    }

    static func lookup(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        serve(req) { files throws(Errno) in
            guard parent == rootInode else { throw Errno(ENOTDIR) }
            let name = try fileName(name)
            var entry = try files.withState { (state) throws(Errno) -> fuse_entry_param in
                guard let inode = state.byName[name] else { throw Errno(ENOENT) }
                var entry = fuse_entry_param()
                entry.ino = fuse_ino_t(inode)
                // Timeouts 0: the kernel asks again every time.
                entry.attr = try attributesOf(inode, in: state)
                return entry
            }
            fuse_reply_entry(req, &entry)
        }
    }

    static func getAttributes(_ req: fuse_req_t?, _ inode: fuse_ino_t) {
        serve(req) { files throws(Errno) in
            var attributes = try files.withState { (state) throws(Errno) -> stat in try attributesOf(inode, in: state) }
            fuse_reply_attr(req, &attributes, 0)
        }
    }

    static func setAttributes(
        _ req: fuse_req_t?, _ inode: fuse_ino_t, _ wanted: UnsafeMutablePointer<stat>?, _ toSet: Int32
    ) {
        serve(req) { files throws(Errno) in
            guard let wanted else { throw Errno(EINVAL) }
            var attributes = try files.withState { (state) throws(Errno) -> stat in
                guard inode != rootInode else { throw Errno(EPERM) }
                guard var file = state.byInode[inode] else { throw Errno(ENOENT) }
                if toSet & FUSE_SET_ATTR_UID != 0 && wanted.pointee.st_uid != getuid() { throw Errno(EPERM) }
                if toSet & FUSE_SET_ATTR_GID != 0 && wanted.pointee.st_gid != getgid() { throw Errno(EPERM) }
                if toSet & FUSE_SET_ATTR_SIZE != 0 {
                    do throws(KeychainError) {
                        try file.bytes.resize(to: Int(wanted.pointee.st_size))
                    } catch {
                        throw Errno(error == .valueTooLarge ? EFBIG : EINVAL)
                    }
                    file.modified = ScratchFiles.now()
                }
                if toSet & FUSE_SET_ATTR_MODE != 0 { file.mode = wanted.pointee.st_mode & 0o7777 }
                if toSet & FUSE_SET_ATTR_MTIME != 0 { file.modified = wanted.pointee.st_mtim }
                if toSet & FUSE_SET_ATTR_MTIME_NOW != 0 { file.modified = ScratchFiles.now() }
                state.byInode[inode] = file
                return try attributesOf(inode, in: state)
            }
            fuse_reply_attr(req, &attributes, 0)
        }
    }

    static func open(_ req: fuse_req_t?, _ inode: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        serve(req) { files throws(Errno) in
            guard let fi else { throw Errno(EINVAL) }
            try files.withState { (state) throws(Errno) in
                guard inode != rootInode else { throw Errno(EISDIR) }
                guard var file = state.byInode[inode] else { throw Errno(ENOENT) }
                if fi.pointee.flags & O_TRUNC != 0 { file.bytes.wipe() }
                file.openCount += 1
                state.byInode[inode] = file
            }
            fi.pointee.direct_io = 1
            fuse_reply_open(req, fi)
        }
    }

    static func create(
        _ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ mode: mode_t,
        _ fi: UnsafeMutablePointer<fuse_file_info>?
    ) {
        serve(req) { files throws(Errno) in
            guard let fi else { throw Errno(EINVAL) }
            guard parent == rootInode else { throw Errno(ENOTDIR) }
            let name = try fileName(name)
            var entry = try files.withState { (state) throws(Errno) -> fuse_entry_param in
                // The kernel looks the name up first and sends CREATE only for a new one.
                guard state.byName[name] == nil else { throw Errno(EEXIST) }
                let inode = ScratchFiles.add(name, bytes: SecureBuffer(), mode: mode, to: &state)
                state.byInode[inode]?.openCount = 1
                var entry = fuse_entry_param()
                entry.ino = fuse_ino_t(inode)
                entry.attr = try attributesOf(inode, in: state)
                return entry
            }
            fi.pointee.direct_io = 1
            fuse_reply_create(req, &entry, fi)
        }
    }

    static func read(_ req: fuse_req_t?, _ inode: fuse_ino_t, _ size: Int, _ offset: off_t) {
        serve(req) { files throws(Errno) in
            try files.withState { (state) throws(Errno) in
                guard let file = state.byInode[inode] else { throw Errno(ENOENT) }
                file.bytes.withBytes(from: Int(offset), length: size) { bytes in
                    _ = fuse_reply_buf(req, bytes.baseAddress, bytes.count)
                }
            }
        }
    }

    static func write(
        _ req: fuse_req_t?, _ inode: fuse_ino_t, _ buffer: UnsafePointer<CChar>?, _ size: Int, _ offset: off_t
    ) {
        // The request buffer held plaintext: wipe it once copied.
        let request = UnsafeMutableRawBufferPointer(start: UnsafeMutableRawPointer(mutating: buffer), count: size)
        defer { wipeMemory(request) }
        serve(req) { files throws(Errno) in
            try files.withState { (state) throws(Errno) in
                guard var file = state.byInode[inode] else { throw Errno(ENOENT) }
                do throws(KeychainError) {
                    try file.bytes.write(UnsafeRawBufferPointer(request), at: Int(offset))
                } catch {
                    throw Errno(error == .valueTooLarge ? EFBIG : EINVAL)
                }
                file.modified = ScratchFiles.now()
                state.byInode[inode] = file
            }
            fuse_reply_write(req, size)
        }
    }

    static func release(_ req: fuse_req_t?, _ inode: fuse_ino_t) {
        serve(req) { files in
            files.withState { state in
                state.byInode[inode]?.openCount -= 1
                ScratchFiles.dropIfUnused(inode, in: &state)
            }
            fuse_reply_err(req, 0)
        }
    }

    static func unlink(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        serve(req) { files throws(Errno) in
            guard parent == rootInode else { throw Errno(ENOTDIR) }
            let name = try fileName(name)
            try files.withState { (state) throws(Errno) in
                guard let inode = state.byName.removeValue(forKey: name) else { throw Errno(ENOENT) }
                state.byInode[inode]?.name = nil
                ScratchFiles.dropIfUnused(inode, in: &state)
            }
            fuse_reply_err(req, 0)
        }
    }

    static func rename(
        _ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ newParent: fuse_ino_t,
        _ newName: UnsafePointer<CChar>?, _ flags: UInt32
    ) {
        serve(req) { files throws(Errno) in
            guard parent == rootInode, newParent == rootInode else { throw Errno(ENOTDIR) }
            // RENAME_EXCHANGE and RENAME_WHITEOUT: nothing an editor needs.
            guard flags & ~renameNoReplace == 0 else { throw Errno(EINVAL) }
            let from = try fileName(name), to = try fileName(newName)
            try files.withState { (state) throws(Errno) in
                guard let inode = state.byName[from] else { throw Errno(ENOENT) }
                guard from != to else { return }
                if let replaced = state.byName[to] {
                    guard flags & renameNoReplace == 0 else { throw Errno(EEXIST) }
                    state.byInode[replaced]?.name = nil
                    ScratchFiles.dropIfUnused(replaced, in: &state)
                }
                state.byName[from] = nil
                state.byName[to] = inode
                state.byInode[inode]?.name = to
            }
            fuse_reply_err(req, 0)
        }
    }

    static func readDirectory(_ req: fuse_req_t?, _ inode: fuse_ino_t, _ size: Int, _ offset: off_t) {
        serve(req) { files throws(Errno) in
            guard inode == rootInode else { throw Errno(ENOTDIR) }
            let entries =
                [(".", rootInode), ("..", rootInode)] + files.withState { $0.byName.sorted { $0.key < $1.key } }
            var reply = [CChar](repeating: 0, count: size)
            var used = 0
            for index in min(Int(offset), entries.count)..<entries.count {
                var attributes = stat()
                // readdir(3) skips an entry whose inode is 0.
                attributes.st_ino = __ino_t(entries[index].1)
                attributes.st_mode = index < 2 ? S_IFDIR : S_IFREG
                let needed = reply.withUnsafeMutableBufferPointer { buffer in
                    fuse_add_direntry(
                        req, buffer.baseAddress! + used, size - used, entries[index].0, &attributes, off_t(index + 1))
                }
                if used + needed > size { break }
                used += needed
            }
            fuse_reply_buf(req, reply, used)
        }
    }

    /// Runs `body` with the request's files; a thrown errno becomes the reply.
    private static func serve(_ req: fuse_req_t?, _ body: (ScratchFiles) throws(Errno) -> Void) {
        guard let req, let userdata = fuse_req_userdata(req) else { return }
        let files = Unmanaged<ScratchFiles>.fromOpaque(userdata).takeUnretainedValue()
        do {
            try body(files)
        } catch {
            fuse_reply_err(req, error.rawValue)
        }
    }

    private static func fileName(_ name: UnsafePointer<CChar>?) throws(Errno) -> String {
        guard let name, let string = String(validatingCString: name), !string.isEmpty else { throw Errno(EINVAL) }
        guard string.utf8.count <= 255 else { throw Errno(ENAMETOOLONG) }
        return string
    }

    private static func attributesOf(_ inode: UInt64, in state: ScratchFiles.State) throws(Errno) -> stat {
        var attributes = stat()
        attributes.st_ino = __ino_t(inode)
        attributes.st_uid = getuid()
        attributes.st_gid = getgid()
        attributes.st_blksize = 4096
        if inode == rootInode {
            attributes.st_mode = S_IFDIR | 0o700
            attributes.st_nlink = 2
            attributes.st_mtim = ScratchFiles.now()
        } else {
            guard let file = state.byInode[inode] else { throw Errno(ENOENT) }
            attributes.st_mode = S_IFREG | file.mode
            attributes.st_nlink = file.name == nil ? 0 : 1
            attributes.st_size = off_t(file.bytes.count)
            attributes.st_mtim = file.modified
        }
        attributes.st_ctim = attributes.st_mtim
        attributes.st_atim = attributes.st_mtim
        return attributes
    }
}
