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
        var owner = stat()
        guard stat("/proc/\(pid)", &owner) == 0 else { return "it is gone" }
        for other in processes(of: owner.st_uid) where other != pid {
            if !connections.isDisjoint(with: socketInodes(of: other)) {
                let executable = ProgramIdentities.linkTarget("/proc/\(other)/exe") ?? "?"
                return "its bus connection is shared with pid \(other) (\(executable))"
            }
        }
        return nil
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

    /// The names in a directory (none when it cannot be read).
    private static func entries(of directory: String) -> [String] {
        guard let listing = opendir(directory) else { return [] }
        defer { closedir(listing) }
        var names: [String] = []
        while let entry = readdir(listing) {
            names.append(withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) })
        }
        return names
    }

    /// Every process (thread group) of `uid` now.
    private static func processes(of uid: uid_t) -> [pid_t] {
        var info = stat()
        return entries(of: "/proc").compactMap { name in
            guard let pid = pid_t(name), stat("/proc/" + name, &info) == 0, info.st_uid == uid else { return nil }
            return pid
        }
    }
}
