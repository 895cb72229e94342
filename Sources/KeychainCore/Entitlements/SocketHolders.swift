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
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFSOCK, let netlink = diagnosticSocket() else {
            return nil
        }
        defer { close(netlink) }
        return peerAddress(ofSocket: UInt32(truncatingIfNeeded: info.st_ino), netlink)
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
        guard let proc = try? valueOrErrno({ open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC) }) else {
            return "its connection cannot be examined (/proc)"
        }
        defer { close(proc) }
        let connections = Set(
            socketInodes(of: String(pid), in: proc).filter { peerAddress(ofSocket: $0, netlink) == address })
        guard !connections.isEmpty else { return "it holds no connection to the bus" }
        // Processes of other users are passed over: a program of this user
        // does not run them (it could only hand them the descriptor), and a
        // per-user device could not read their descriptors anyway.
        var owner = stat()
        guard fstatat(proc, String(pid), &owner, 0) == 0 else { return "it is gone" }
        let listed = dup(proc)
        guard listed >= 0, let processes = fdopendir(listed) else {
            if listed >= 0 { close(listed) }
            // Not looked at is not alone: refused, as any doubt is.
            return "the processes holding its connection cannot be listed"
        }
        defer { closedir(processes) }
        var info = stat()
        while let entry = readdir(processes) {
            let name = entryName(entry)
            guard let other = pid_t(name), other != pid, fstatat(proc, name, &info, 0) == 0,
                info.st_uid == owner.st_uid,
                !connections.isDisjoint(with: socketInodes(of: name, in: proc))
            else { continue }
            let executable = ProgramIdentities.linkTarget("/proc/\(other)/exe") ?? "?"
            return "its bus connection is shared with pid \(other) (\(executable))"
        }
        return nil
    }

    /// The inodes of the sockets among the descriptors of the process
    /// `/proc/NAME` (none when they cannot be read): a stat of each
    /// `fd/N` (the socket itself), one call, rather than its link's text.
    private static func socketInodes(of name: String, in proc: Int32) -> [UInt32] {
        let descriptors = openat(proc, name + "/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard descriptors >= 0, let listing = fdopendir(descriptors) else {
            if descriptors >= 0 { close(descriptors) }
            return []
        }
        defer { closedir(listing) }
        var inodes: [UInt32] = []
        var info = stat()
        while let entry = readdir(listing) {
            let found = withUnsafePointer(to: entry.pointee.d_name) {
                $0.withMemoryRebound(to: CChar.self, capacity: 256) {
                    $0.pointee != 0x2E && fstatat(descriptors, $0, &info, 0) == 0
                }
            }
            if found, info.st_mode & S_IFMT == S_IFSOCK { inodes.append(UInt32(truncatingIfNeeded: info.st_ino)) }
        }
        return inodes
    }

    private static func entryName(_ entry: UnsafeMutablePointer<dirent>) -> String {
        withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
    }

    /// The address the socket `inode` is connected to (its peer's bound name).
    private static func peerAddress(ofSocket inode: UInt32, _ netlink: Int32) -> [UInt8]? {
        guard let own = query(netlink, inode), own.peer != 0 else { return nil }
        return query(netlink, own.peer)?.address
    }

    private static func diagnosticSocket() -> Int32? {
        try? valueOrErrno {
            socket(AF_NETLINK, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), Int32(NETLINK_SOCK_DIAG))
        }
    }

    private static func query(_ netlink: Int32, _ inode: UInt32) -> (peer: UInt32, address: [UInt8])? {
        var peer: UInt32 = 0, length = 0
        var name = [CChar](repeating: 0, count: 128)
        guard
            (try? nothingOrErrno({ CLinux_unix_socket_peer(netlink, inode, &peer, &name, name.count, &length) })) != nil
        else {
            return nil
        }
        return (peer, name.prefix(length).map { UInt8(bitPattern: $0) })
    }
}
