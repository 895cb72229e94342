internal import CLinux
#if canImport(Glibc)
import Glibc
#endif

/// Which processes hold a connection: what the device asks before it
/// believes that a bus message came from the process the bus daemon names.
/// The daemon names the process that connected; any process that holds
/// the same socket (a child forked after connecting, whose parent then
/// exec'd a granted program; a process it was passed to) can send on it
/// (issue 29). The kernel tells what a socket is connected to (sock_diag,
/// `UNIX_DIAG_PEER`), and `/proc/PID/fd` who holds it, as `ss -xp` does.
package enum SocketHolders {
    /// The address of the socket that `fd`'s socket is connected to (the
    /// listener's path or abstract name, as the kernel gives it); nil when
    /// that cannot be told.
    package static func peerAddress(of fd: Int32) -> [UInt8]? {
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFSOCK, let netlink = diagnosticSocket() else { return nil }
        defer { close(netlink) }
        guard let own = query(netlink, UInt32(truncatingIfNeeded: info.st_ino)), own.peer != 0 else { return nil }
        return query(netlink, own.peer)?.address
    }

    /// Why the connection of `pid` to the socket bound at `address` may
    /// carry another process's messages: it holds no such connection, or
    /// another process holds one of them too. nil when `pid` alone holds
    /// its connections there. A process whose descriptors this process may
    /// not read (another user's, or one that made itself non-dumpable) is
    /// not seen (docs/SECURITY.md, "Known limits").
    package static func sharing(of pid: Int32, connectedTo address: [UInt8]) -> String? {
        guard let netlink = diagnosticSocket() else { return "its connection cannot be examined (sock_diag)" }
        defer { close(netlink) }
        let connections = Set(socketInodes(of: pid).filter { inode in
            guard let own = query(netlink, inode), own.peer != 0 else { return false }
            return query(netlink, own.peer)?.address == address
        })
        guard !connections.isEmpty else { return "it holds no connection to the bus" }
        // Processes of other users are passed over: a program of this user
        // does not run them (it could only hand them the descriptor), and a
        // per-user device could not read their descriptors anyway.
        guard let proc = try? valueOrErrno({ open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC) }) else {
            return "its connection cannot be examined (/proc)"
        }
        defer { close(proc) }
        var owner = stat()
        guard fstatat(proc, String(pid), &owner, 0) == 0 else { return "it is gone" }
        switch holder(of: connections, in: proc, uid: owner.st_uid, besides: pid) {
        case .none:
            return nil
        case .process(let other):
            let executable = ProgramIdentities.linkTarget("/proc/\(other)/exe") ?? "?"
            return "its bus connection is shared with pid \(other) (\(executable))"
        case .unknown:
            // Not looked at is not alone: refused, as any doubt is.
            return "the processes holding its connection cannot be listed"
        }
    }

    private enum Holder {
        case none
        case process(pid_t)
        case unknown
    }

    /// A process of `uid` other than `pid` holding one of `inodes`, if any.
    /// Every call here is one system call on an open directory and a name
    /// in a buffer: this scan is what a policed request on the bus costs.
    private static func holder(of inodes: Set<UInt32>, in proc: Int32, uid: uid_t, besides pid: pid_t) -> Holder {
        let listed = dup(proc)
        guard listed >= 0, let processes = fdopendir(listed) else {
            if listed >= 0 { close(listed) }
            return .unknown
        }
        defer { closedir(processes) }
        var info = stat()
        let path = UnsafeMutableBufferPointer<CChar>.allocate(capacity: 32)
        defer { path.deallocate() }
        while let entry = readdir(processes) {
            guard let other = withUnsafeBytes(of: entry.pointee.d_name, { number(in: $0) }), other != pid,
                  fstatat(proc, decimal(other, into: path, suffix: ""), &info, 0) == 0, info.st_uid == uid else { continue }
            let descriptors = openat(proc, decimal(other, into: path, suffix: "/fd"), O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            guard descriptors >= 0, let listing = fdopendir(descriptors) else {
                if descriptors >= 0 { close(descriptors) }
                continue
            }
            defer { closedir(listing) }
            while let entry = readdir(listing) {
                let isDescriptor = withUnsafeBytes(of: entry.pointee.d_name) { $0.first.map { (0x30...0x39).contains($0) } ?? false }
                guard isDescriptor else { continue }
                let found = withUnsafePointer(to: entry.pointee.d_name) {
                    $0.withMemoryRebound(to: CChar.self, capacity: 256) { fstatat(descriptors, $0, &info, 0) == 0 }
                }
                if found, info.st_mode & S_IFMT == S_IFSOCK, inodes.contains(UInt32(truncatingIfNeeded: info.st_ino)) {
                    return .process(other)
                }
            }
        }
        return .none
    }

    /// The decimal number a directory entry's name is, if it is one.
    private static func number(in name: UnsafeRawBufferPointer) -> pid_t? {
        var value: pid_t = 0
        var digits = 0
        for byte in name {
            if byte == 0 { break }
            guard (0x30...0x39).contains(byte), value < pid_t.max / 10 else { return nil }
            value = value * 10 + pid_t(byte - 0x30)
            digits += 1
        }
        return digits > 0 ? value : nil
    }

    /// `value` in decimal, then `suffix`, as a C string in `buffer` (room for 32).
    private static func decimal(_ value: pid_t, into buffer: UnsafeMutableBufferPointer<CChar>,
                                suffix: StaticString) -> UnsafePointer<CChar> {
        var digits: [CChar] = []
        var rest = value
        repeat {
            digits.append(CChar(0x30 + rest % 10))
            rest /= 10
        } while rest > 0
        var index = 0
        for digit in digits.reversed() {
            buffer[index] = digit
            index += 1
        }
        suffix.withUTF8Buffer { for byte in $0 { buffer[index] = CChar(bitPattern: byte); index += 1 } }
        buffer[index] = 0
        return UnsafePointer(buffer.baseAddress!)
    }

    private static func diagnosticSocket() -> Int32? {
        try? valueOrErrno { socket(AF_NETLINK, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), Int32(NETLINK_SOCK_DIAG)) }
    }

    private static func query(_ netlink: Int32, _ inode: UInt32) -> (peer: UInt32, address: [UInt8])? {
        var peer: UInt32 = 0, length = 0
        var name = [CChar](repeating: 0, count: 128)
        guard (try? nothingOrErrno({ CLinux_unix_socket_peer(netlink, inode, &peer, &name, name.count, &length) })) != nil else {
            return nil
        }
        return (peer, name.prefix(length).map { UInt8(bitPattern: $0) })
    }

    /// The inodes of the sockets among `pid`'s descriptors (none when they
    /// cannot be read). A stat of each `/proc/PID/fd/N` (the socket itself)
    /// rather than its link's text: one call, no string.
    private static func socketInodes(of pid: pid_t) -> [UInt32] {
        guard let listing = opendir("/proc/\(pid)/fd") else { return [] }
        defer { closedir(listing) }
        let directory = dirfd(listing)
        var inodes: [UInt32] = []
        var info = stat()
        while let entry = readdir(listing) {
            let isDescriptor = withUnsafeBytes(of: entry.pointee.d_name) { $0.first.map { (0x30...0x39).contains($0) } ?? false }
            guard isDescriptor else { continue }
            let found = withUnsafePointer(to: entry.pointee.d_name) {
                $0.withMemoryRebound(to: CChar.self, capacity: 256) { fstatat(directory, $0, &info, 0) == 0 }
            }
            if found, info.st_mode & S_IFMT == S_IFSOCK { inodes.append(UInt32(truncatingIfNeeded: info.st_ino)) }
        }
        return inodes
    }
}
