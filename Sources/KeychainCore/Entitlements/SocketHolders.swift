internal import CLinux
#if canImport(Glibc)
import Glibc
#endif

/// Which processes hold a connection: what the device asks before it
/// believes that a bus message came from the process the bus daemon names.
/// The daemon names the process that connected; any process that holds
/// the same socket (a child forked after connecting, whose parent then
/// exec'd a granted program; a process it was passed to) can send on it
/// (docs/SECURITY.md, "Service mode under attack"). The kernel tells what a
/// socket is connected to (sock_diag, `UNIX_DIAG_PEER`), and `/proc/PID/fd` who
/// holds it, as `ss -xp` does.
package enum SocketHolders {
    /// The address of the socket that `fd`'s socket is connected to (the
    /// listener's path or abstract name, as the kernel gives it); nil when
    /// that cannot be told.
    package static func peerAddress(of fd: BorrowedDescriptor) -> [UInt8]? {
        var info = stat()
        guard fstat(fd.raw, &info) == 0, info.st_mode & S_IFMT == S_IFSOCK, let netlink = diagnosticSocket() else {
            return nil
        }
        return peerAddress(ofSocket: UInt32(truncatingIfNeeded: info.st_ino), netlink.borrowed)
    }

    /// Why the connection of `pid` to the socket bound at `address` may
    /// carry another process's messages: it holds no such connection, or
    /// another process holds one of them too. nil when `pid` alone holds
    /// its connections there. A process whose descriptors this process may
    /// not read (another user's, or one that made itself non-dumpable) is
    /// not seen (docs/SECURITY.md, "Known limits").
    package static func sharing(of pid: Int32, connectedTo address: [UInt8]) -> String? {
        guard let netlink = diagnosticSocket() else { return "its connection cannot be examined (sock_diag)" }
        guard let proc = FileDescriptor(open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) else {
            return "its connection cannot be examined (/proc)"
        }
        let connections = Set(
            socketInodes(of: String(pid), in: proc.borrowed).filter {
                peerAddress(ofSocket: $0, netlink.borrowed) == address
            })
        guard !connections.isEmpty else { return "it holds no connection to the bus" }
        return otherHolder(of: connections, besides: pid, in: proc.borrowed, connection: "bus connection")
    }

    /// Why the device's end `client` of a socket connection may carry
    /// another program's words than those of `pid`, the process that
    /// connected (docs/SECURITY.md, "An application's secrets on every door"):
    /// another process holds the other end too (a child forked after
    /// connecting, a process it was passed to), or `pid` holds it without
    /// close-on-exec, so that the program it runs next inherits it (a granted
    /// `cat` that relays what its parent wrote, and the reply to whoever reads
    /// the other copy). A client of ours opens its connection with SOCK_CLOEXEC
    /// and keeps it to itself; an exec closes such a connection, so whatever
    /// the process runs after one can neither finish a request nor read its
    /// reply. nil when `pid` alone holds the connection, close-on-exec.
    package static func relayProblem(of pid: Int32, connection client: BorrowedDescriptor) -> String? {
        var info = stat()
        guard fstat(client.raw, &info) == 0, let netlink = diagnosticSocket() else {
            return "its connection cannot be examined (sock_diag)"
        }
        guard let own = query(netlink.borrowed, UInt32(truncatingIfNeeded: info.st_ino)), own.peer != 0 else {
            return "its connection cannot be examined (sock_diag)"
        }
        guard let proc = FileDescriptor(open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) else {
            return "its connection cannot be examined (/proc)"
        }
        let held = descriptors(of: String(pid), in: proc.borrowed).filter { $0.inode == own.peer }
        guard !held.isEmpty else { return "it holds no connection to the device (it may have run another program)" }
        if let inherited = held.first(where: {
            DescriptorInfo(String(pid), descriptor: String($0.number), in: proc.borrowed)?.closesOnExec != true
        }) {
            return "its connection (descriptor \(inherited.number)) would pass to the next program it runs "
                + "(no close-on-exec)"
        }
        return otherHolder(of: [own.peer], besides: pid, in: proc.borrowed, connection: "connection")
    }

    /// The first process of `pid`'s user but `pid` that holds one of
    /// `connections`, as a reason; nil when none does.
    private static func otherHolder(
        of connections: Set<UInt32>, besides pid: Int32, in proc: BorrowedDescriptor, connection: String
    ) -> String? {
        // Processes of other users are passed over: a program of this user
        // does not run them (it could only hand them the descriptor), and a
        // per-user device could not read their descriptors anyway.
        var owner = stat()
        guard fstatat(proc.raw, String(pid), &owner, 0) == 0 else { return "it is gone" }
        guard let processes = FileDescriptor(dup(proc.raw))?.directoryStream() else {
            // Not looked at is not alone: refused, as any doubt is.
            return "the processes holding its connection cannot be listed"
        }
        defer { closedir(processes) }
        var info = stat()
        while let entry = readdir(processes) {
            let name = entry.name
            guard let other = pid_t(name), other != pid, fstatat(proc.raw, name, &info, 0) == 0,
                info.st_uid == owner.st_uid,
                !connections.isDisjoint(with: socketInodes(of: name, in: proc))
            else { continue }
            let executable = ProgramIdentities.linkTarget("/proc/\(other)/exe") ?? "?"
            return "its \(connection) is shared with pid \(other) (\(executable))"
        }
        return nil
    }

    /// What `/proc/NAME/fdinfo/N` says of a descriptor (proc(5)): its
    /// open flags (octal), the mount and inode of its file. A process that
    /// serves other users reads it with CAP_SYS_PTRACE (the kernel asks
    /// for ptrace access), where `/proc/PID/fd` would need
    /// CAP_DAC_READ_SEARCH, which reads every file.
    private struct DescriptorInfo {
        var flags: Int32?
        var mountID: Int?
        var inode: UInt64?

        init?(_ name: String, descriptor: String, in proc: BorrowedDescriptor) {
            guard let fd = FileDescriptor(openat(proc.raw, "\(name)/fdinfo/\(descriptor)", O_RDONLY | O_CLOEXEC)) else {
                return nil
            }
            guard let text = try? fd.borrowed.readAll(limit: 4096) else { return nil }
            for line in String(decoding: text, as: UTF8.self).split(separator: "\n") {
                let parts = line.split(separator: ":", maxSplits: 1)
                guard parts.count == 2 else { continue }
                let value = parts[1].trimmingPrefix { $0 == " " || $0 == "\t" }
                switch parts[0] {
                case "flags": flags = Int32(value, radix: 8)
                case "mnt_id": mountID = Int(value)
                case "ino": inode = UInt64(value)
                default: break
                }
            }
        }

        var closesOnExec: Bool { (flags ?? 0) & O_CLOEXEC != 0 }
    }

    /// The mount of every socket (sockfs), as fdinfo names it: that of a socket of our own.
    private static let socketMount: Int? = {
        guard let fd = FileDescriptor(socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0))
        else { return nil }
        guard let proc = FileDescriptor(open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) else { return nil }
        return DescriptorInfo("self", descriptor: String(fd.raw), in: proc.borrowed)?.mountID
    }()

    /// The inodes of the sockets among the descriptors of the process
    /// `/proc/NAME` (none when they cannot be read).
    private static func socketInodes(of name: String, in proc: BorrowedDescriptor) -> [UInt32] {
        descriptors(of: name, in: proc).map(\.inode)
    }

    /// The socket descriptors of the process `/proc/NAME`, with their
    /// sockets' inodes: a stat of each `fd/N` (the socket itself), one
    /// call, rather than its link's text; where `fd` is closed to us
    /// (another user's process, to the service), each `fdinfo/N`.
    private static func descriptors(of name: String, in proc: BorrowedDescriptor) -> [(number: Int32, inode: UInt32)] {
        var sockets: [(number: Int32, inode: UInt32)] = []
        var info = stat()
        let opened = listing(name + "/fd", in: proc) { directory, entry in
            let found = withUnsafePointer(to: entry.pointee.d_name) {
                $0.withMemoryRebound(to: CChar.self, capacity: 256) {
                    $0.pointee != 0x2E && fstatat(directory, $0, &info, 0) == 0
                }
            }
            if found, info.st_mode & S_IFMT == S_IFSOCK, let number = Int32(entry.name) {
                sockets.append((number, UInt32(truncatingIfNeeded: info.st_ino)))
            }
        }
        guard !opened, let socketMount else { return sockets }
        _ = listing(name + "/fdinfo", in: proc) { _, entry in
            let descriptor = entry.name
            guard let number = Int32(descriptor),
                let described = DescriptorInfo(name, descriptor: descriptor, in: proc),
                described.mountID == socketMount, let inode = described.inode
            else { return }
            sockets.append((number, UInt32(truncatingIfNeeded: inode)))
        }
        return sockets
    }

    /// Calls `body` with each entry of the directory `path` under `proc`;
    /// false when it cannot be opened.
    private static func listing(
        _ path: String, in proc: BorrowedDescriptor, _ body: (Int32, UnsafeMutablePointer<dirent>) -> Void
    ) -> Bool {
        guard
            let entries = FileDescriptor(openat(proc.raw, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC))?.directoryStream()
        else { return false }
        defer { closedir(entries) }
        let directory = dirfd(entries)
        while let entry = readdir(entries) { body(directory, entry) }
        return true
    }

    /// The address the socket `inode` is connected to (its peer's bound name).
    private static func peerAddress(ofSocket inode: UInt32, _ netlink: BorrowedDescriptor) -> [UInt8]? {
        guard let own = query(netlink, inode), own.peer != 0 else { return nil }
        return query(netlink, own.peer)?.address
    }

    /// The inode of the listening socket bound to the file at `path` (nil:
    /// none listens there, or it cannot be told): the one a connection to
    /// `path` reaches. By the file, not by the path a listener shows, which
    /// an older socket whose file was replaced shows too.
    package static func listener(boundAt path: String) -> UInt32? {
        var info = stat()
        guard stat(path, &info) == 0, info.st_mode & S_IFMT == S_IFSOCK, let netlink = diagnosticSocket() else {
            return nil
        }
        var found: UInt32 = 0
        guard
            (try? nothingOrErrno({
                CLinux_unix_listener_of_file(netlink.raw, UInt64(info.st_dev), UInt64(info.st_ino), &found)
            }))
                != nil, found != 0
        else { return nil }
        return found
    }

    /// Passes `socket` to `verifier` (pam_keychainfs, as root) with one
    /// byte, and reads its verdict: one byte, 1 for yes.
    package static func askRoot(_ verifier: BorrowedDescriptor, about socket: BorrowedDescriptor) -> Bool {
        var asked: UInt8 = 1
        guard CLinux_send_with_descriptor(verifier.raw, &asked, 1, socket.raw) == 1 else { return false }
        var verdict: UInt8 = 0
        let read = try? valueOrErrno(retryOnInterrupt: true) { recv(verifier.raw, &verdict, 1, 0) }
        return read == 1 && verdict == 1
    }

    private static func diagnosticSocket() -> FileDescriptor? {
        FileDescriptor(
            socket(AF_NETLINK, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), Int32(NETLINK_SOCK_DIAG)))
    }

    private static func query(_ netlink: BorrowedDescriptor, _ inode: UInt32) -> (peer: UInt32, address: [UInt8])? {
        var peer: UInt32 = 0, length = 0
        var name = [CChar](repeating: 0, count: 128)
        guard
            (try? nothingOrErrno({ CLinux_unix_socket_peer(netlink.raw, inode, &peer, &name, name.count, &length) }))
                != nil
        else {
            return nil
        }
        return (peer, name.prefix(length).map { UInt8(bitPattern: $0) })
    }
}
