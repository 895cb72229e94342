/// Whether a request read from a FUSE connection is whole: every length and
/// count in it within the bytes read, every name ended by a NUL inside
/// them. libfuse 3.14 trusts the kernel on this (fuse_lowlevel.c reads a
/// SETXATTR's value and a BATCH_FORGET's entries by the sizes the request
/// states), and so did this device until a forged request over a socket
/// pair crashed the service (docs/SECURITY.md, "Service mode under attack").
/// The device now serves only connections the kernel writes, and still checks
/// each request before libfuse parses it (``FuseSessionLoop``).
///
/// Layouts and sizes are the kernel's (include/uapi/linux/fuse.h, protocol
/// 7.31 and later, as this kernel sends them).
enum FuseRequestCheck {
    /// `struct fuse_in_header`: len u32, opcode u32, unique u64, nodeid u64,
    /// uid, gid, pid u32, total_extlen u16, padding u16.
    static let headerSize = 40

    /// The fixed argument of each opcode libfuse parses (bytes after the
    /// header), and the NUL-ended names that follow it.
    private static let layouts: [UInt32: (fixed: Int, names: Int)] = [
        1: (0, 1),  // LOOKUP: name
        2: (8, 0),  // FORGET: fuse_forget_in
        3: (16, 0),  // GETATTR: fuse_getattr_in
        4: (88, 0),  // SETATTR: fuse_setattr_in
        5: (0, 0),  // READLINK
        6: (0, 2),  // SYMLINK: name, target
        8: (16, 1),  // MKNOD: fuse_mknod_in, name
        9: (8, 1),  // MKDIR: fuse_mkdir_in, name
        10: (0, 1),  // UNLINK: name
        11: (0, 1),  // RMDIR: name
        12: (8, 2),  // RENAME: fuse_rename_in, name, new name
        13: (8, 1),  // LINK: fuse_link_in, name
        14: (8, 0),  // OPEN: fuse_open_in
        15: (40, 0),  // READ: fuse_read_in
        16: (40, 0),  // WRITE: fuse_write_in, then `size` bytes (below)
        17: (0, 0),  // STATFS
        18: (24, 0),  // RELEASE: fuse_release_in
        20: (16, 0),  // FSYNC: fuse_fsync_in
        21: (8, 1),  // SETXATTR: fuse_setxattr_in (without the extension), name, then `size` bytes (below)
        22: (8, 1),  // GETXATTR: fuse_getxattr_in, name
        23: (8, 0),  // LISTXATTR: fuse_getxattr_in
        24: (0, 1),  // REMOVEXATTR: name
        25: (24, 0),  // FLUSH: fuse_flush_in
        26: (16, 0),  // INIT: fuse_init_in up to flags (flags2 below)
        27: (8, 0),  // OPENDIR: fuse_open_in
        28: (40, 0),  // READDIR: fuse_read_in
        29: (24, 0),  // RELEASEDIR: fuse_release_in
        30: (16, 0),  // FSYNCDIR: fuse_fsync_in
        31: (48, 0),  // GETLK: fuse_lk_in
        32: (48, 0),  // SETLK
        33: (48, 0),  // SETLKW
        34: (8, 0),  // ACCESS: fuse_access_in
        35: (16, 1),  // CREATE: fuse_create_in, name
        36: (8, 0),  // INTERRUPT: fuse_interrupt_in
        37: (16, 0),  // BMAP: fuse_bmap_in
        38: (0, 0),  // DESTROY
        39: (32, 0),  // IOCTL: fuse_ioctl_in, then `in_size` bytes (below)
        40: (24, 0),  // POLL: fuse_poll_in
        41: (40, 0),  // NOTIFY_REPLY: fuse_notify_retrieve_in's layout, then `size` bytes (below)
        42: (8, 0),  // BATCH_FORGET: fuse_batch_forget_in, then `count` fuse_forget_one (below)
        43: (32, 0),  // FALLOCATE: fuse_fallocate_in
        44: (40, 0),  // READDIRPLUS: fuse_read_in
        45: (16, 2),  // RENAME2: fuse_rename2_in, name, new name
        46: (24, 0),  // LSEEK: fuse_lseek_in
        47: (56, 0)  // COPY_FILE_RANGE: fuse_copy_file_range_in
    ]

    /// Why `request` (the bytes one read returned) must not be handed to
    /// libfuse; nil when it is whole. Opcodes libfuse does not know are
    /// whole once their header is: it answers them ENOSYS unread.
    static func problem(in request: UnsafeRawBufferPointer) -> String? {
        guard request.count >= headerSize else { return "shorter than a request header" }
        let length = Int(request.loadUnaligned(fromByteOffset: 0, as: UInt32.self))
        guard length == request.count else { return "its header says \(length) bytes, \(request.count) came" }
        let opcode = request.loadUnaligned(fromByteOffset: 4, as: UInt32.self)
        guard let layout = layouts[opcode] else { return nil }
        let argument = UnsafeRawBufferPointer(rebasing: request[headerSize...])
        guard argument.count >= layout.fixed else { return "opcode \(opcode): its argument is cut short" }
        var offset = layout.fixed
        for _ in 0..<layout.names {
            guard let end = argument[offset...].firstIndex(of: 0) else {
                return "opcode \(opcode): a name is not ended"
            }
            offset = end + 1
        }
        let rest = argument.count - offset
        func field(_ at: Int) -> Int { Int(argument.loadUnaligned(fromByteOffset: at, as: UInt32.self)) }
        switch opcode {
        case 16 where field(16) > rest:  // WRITE: size at offset 16
            return "a write of \(field(16)) bytes carries \(rest)"
        case 21 where field(0) > rest:  // SETXATTR: size at offset 0, the value after the name
            return "an extended attribute of \(field(0)) bytes carries \(rest)"
        case 21 where argument.count < 16:  // libfuse's own fuse_setxattr_in is 16 bytes
            return "a SETXATTR argument is cut short"
        case 39 where field(24) > rest:  // IOCTL: in_size at offset 24
            return "an ioctl of \(field(24)) bytes carries \(rest)"
        case 41 where field(16) > rest:  // NOTIFY_REPLY: size at offset 16
            return "a notify reply of \(field(16)) bytes carries \(rest)"
        case 42 where field(0) * 16 > rest:  // BATCH_FORGET: count at offset 0, 16 bytes each
            return "a batch of \(field(0)) forgets carries \(rest) bytes"
        case 26 where field(12) & (1 << 30) != 0 && argument.count < 24:  // INIT with FUSE_INIT_EXT reads flags2
            return "an INIT argument is cut short"
        default:
            return nil
        }
    }
}
