import KeychainCore
internal import CLinux
#if canImport(Glibc)
import Glibc
#endif

/// The UNIX socket by which clients (later `mount`s, `unmount`, `passcode`)
/// reach the device process of a keychain; the requests and replies are
/// ``DeviceProtocol`` frames.
package enum UnixSocket {
    /// The longest path a sockaddr_un holds (108 bytes with the NUL).
    package static let maximumPathLength = MemoryLayout.size(ofValue: sockaddr_un().sun_path) - 1

    private static func address(_ path: String) throws(Errno) -> sockaddr_un {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count <= maximumPathLength else { throw .nameTooLong }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        return address
    }

    /// A stream socket that no child inherits.
    private static func streamSocket() throws(Errno) -> FileDescriptor {
        guard let fd = FileDescriptor(socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0))
        else { throw Errno.current }
        return fd
    }

    /// Calls `body` with `address` as the `sockaddr` that bind and connect take.
    private static func withSocketAddress(_ address: sockaddr_un, _ body: (UnsafePointer<sockaddr>, socklen_t) -> Int32)
        -> Int32
    {
        withUnsafePointer(to: address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
    }

    /// A listening socket at `path` (mode 0600, or 0666 for `everyone`:
    /// the service, which tells its peers apart itself), replacing a stale
    /// file there, that receives its peers' credentials with every message.
    package static func listen(at path: String, everyone: Bool = false) throws(Errno) -> FileDescriptor {
        let address = try address(path)
        let fd = try streamSocket()  // closed if anything below fails
        unlink(path)
        let previous = umask(everyone ? 0 : 0o077)
        defer { umask(previous) }
        // Every accepted connection inherits SO_PASSCRED: the kernel
        // names the sender of each message (DeviceProtocol.receive(from:sentBy:)).
        var on: Int32 = 1
        try nothingOrErrno { setsockopt(fd.raw, SOL_SOCKET, SO_PASSCRED, &on, socklen_t(MemoryLayout<Int32>.size)) }
        try nothingOrErrno { withSocketAddress(address) { bind(fd.raw, $0, $1) } }
        try nothingOrErrno { Glibc.listen(fd.raw, SOMAXCONN) }
        // Lent to the thread that accepts on it: its owner closes it to stop that thread.
        return fd
    }

    /// The listening socket systemd passed (socket activation,
    /// sd_listen_fds(3): `$LISTEN_PID` is us, `$LISTEN_FDS` at least 1,
    /// the first at descriptor 3), made to pass credentials; nil without one.
    package static func activated() throws(Errno) -> FileDescriptor? {
        guard let pid = getenv("LISTEN_PID").flatMap({ Int32(String(cString: $0)) }), pid == getpid(),
            let count = getenv("LISTEN_FDS").flatMap({ Int(String(cString: $0)) }), count >= 1
        else { return nil }
        // Ours from here: systemd passed it for this process alone.
        guard let fd = FileDescriptor(3) else { return nil }
        unsetenv("LISTEN_PID")
        unsetenv("LISTEN_FDS")
        unsetenv("LISTEN_FDNAMES")
        _ = fcntl(fd.raw, F_SETFD, FD_CLOEXEC)
        var on: Int32 = 1
        try nothingOrErrno { setsockopt(fd.raw, SOL_SOCKET, SO_PASSCRED, &on, socklen_t(MemoryLayout<Int32>.size)) }
        return fd
    }

    /// A socket connected to `path`; ENOENT or ECONNREFUSED when nobody listens there.
    package static func connect(to path: String) throws(Errno) -> FileDescriptor {
        let address = try address(path)
        let fd = try streamSocket()
        try nothingOrErrno { withSocketAddress(address) { Glibc.connect(fd.raw, $0, $1) } }
        return fd
    }
}

/// The client side of the device's protocol (``DeviceProtocol``).
public enum DeviceClient {
    /// Whether a device answers at `socketPath`.
    public static func isServing(_ socketPath: String) -> Bool {
        if case .success? = send(.ping, to: socketPath) { return true }
        return false
    }

    /// Sends one call to the device listening at `socketPath` and waits
    /// for its answer; nil when no device listens or it went away unanswered.
    public static func send<Result>(
        _ call: DeviceCall<Result>, to socketPath: String, passing descriptor: BorrowedDescriptor? = nil
    )
        -> DeviceOutcome<Result>?
    {
        var received: FileDescriptor?  // none is wanted: closed here if one came
        return exchange(call, with: socketPath, passing: descriptor, receiving: &received)
    }

    /// ``send(_:to:passing:)``, and in `received` the descriptor the device
    /// passed back with its answer (nil: none).
    public static func exchange<Result>(
        _ call: DeviceCall<Result>, with socketPath: String, passing descriptor: BorrowedDescriptor? = nil,
        receiving received: inout FileDescriptor?
    ) -> DeviceOutcome<Result>? {
        var listening = false
        return exchange(
            call.request, with: socketPath, passing: descriptor, receiving: &received, listening: &listening
        )
        .map(call.outcome(of:))
    }

    /// Whether a call reached a device: a client that starts the device
    /// on demand tries the call first and starts it only when nobody
    /// listens (no ping first: one connection per command, not two), and
    /// never resends a call a device received.
    public enum Delivery<Result: DeviceResult> {
        case notListening, unanswered, answered(DeviceOutcome<Result>)
    }

    public static func deliver<Result>(_ call: DeviceCall<Result>, to socketPath: String) -> Delivery<Result> {
        var received: FileDescriptor?  // none is wanted: closed here if one came
        var listening = false
        let reply = exchange(call.request, with: socketPath, passing: nil, receiving: &received, listening: &listening)
        return reply.map { .answered(call.outcome(of: $0)) } ?? (listening ? .unanswered : .notListening)
    }

    /// Sends `call` and returns the device's answer with the connection,
    /// which then carries what follows the answer (`watch`); the caller
    /// closes it. Nil when no device answered.
    public static func follow<Result>(_ call: DeviceCall<Result>, at socketPath: String) -> Followed<Result>? {
        var received: FileDescriptor?  // none is wanted: closed here if one came
        var listening = false
        guard
            let conversation = converse(
                call.request, with: socketPath, passing: nil, receiving: &received, listening: &listening)
        else { return nil }
        return Followed(outcome: call.outcome(of: conversation.reply), connection: conversation.connection)
    }

    /// A call's answer, and the connection that carries what follows it.
    public struct Followed<Result: DeviceResult>: ~Copyable {
        public let outcome: DeviceOutcome<Result>
        public let connection: FileDescriptor
    }

    /// One request on a connection of its own and the reply; the
    /// connection comes back with it, and carries what follows (`watch`).
    private struct Conversation: ~Copyable {
        let reply: DeviceReply
        let connection: FileDescriptor
    }

    private static func exchange(
        _ request: DeviceRequest, with socketPath: String, passing descriptor: BorrowedDescriptor?,
        receiving received: inout FileDescriptor?, listening: inout Bool
    ) -> DeviceReply? {
        converse(request, with: socketPath, passing: descriptor, receiving: &received, listening: &listening)?.reply
    }

    /// Connects to `socketPath` (`listening` says whether anyone did),
    /// sends `request` with `descriptor`, and reads the reply with the
    /// descriptor passed back in `received`.
    private static func converse(
        _ request: DeviceRequest, with socketPath: String, passing descriptor: BorrowedDescriptor?,
        receiving received: inout FileDescriptor?, listening: inout Bool
    ) -> Conversation? {
        received = nil
        guard let fd = try? UnixSocket.connect(to: socketPath) else { return nil }
        listening = true
        if let refusal = DevicePeerAdmission.refusal(of: fd.borrowed, connectedTo: socketPath) {
            Diagnostics.log(refusal)
            return nil
        }
        guard let frame = try? request.frame() else { return nil }
        // A device that refused the request before it was whole (no locked memory for its body)
        // replies, then closes: the send fails, and its reply is read all the same.
        _ = DeviceProtocol.send(frame, to: fd.borrowed, passing: descriptor)
        guard let body = DeviceProtocol.receive(from: fd.borrowed, sentBy: nil, descriptor: &received),
            let reply = body.withUnsafeBytes({ try? DeviceReply(body: $0) })
        else { return nil }
        return Conversation(reply: reply, connection: fd)
    }
}

/// Why the runtime directory cannot hold the device's socket.
public struct RuntimePathError: Error, CustomStringConvertible {
    public let description: String

    init(_ description: String) { self.description = description }
}

/// Where a keychain's device process listens: `$XDG_RUNTIME_DIR/keychainfs/`;
/// without it, `/run/user/UID/keychainfs/` where pam_systemd made that
/// directory for us, else `~/.local/state/keychainfs/run/` in the account's
/// own home: never a name in a directory every user may write, such as
/// `/tmp/keychainfs-UID`, which another user could create first and so
/// keep us from every device (docs/SECURITY.md, "A runtime directory
/// nobody else can take").
public enum RuntimePaths {
    /// The socket of the device of the keychain at `keychainPath` (creating the runtime directory).
    public static func socketPath(for keychainPath: String) throws(RuntimePathError) -> String {
        let directory = try runtimeDirectory()
        // FNV-1a of the keychain's path: a short, stable name (not a secret).
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in keychainPath.utf8 {
            hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3
        }
        let hex = String(hash, radix: 16)
        let path = directory + "/" + String(repeating: "0", count: 16 - hex.count) + hex + ".sock"
        guard path.utf8.count <= UnixSocket.maximumPathLength else {
            throw RuntimePathError(
                "the socket path \(path) is longer than 107 bytes; set XDG_RUNTIME_DIR to a shorter directory")
        }
        return path
    }

    /// Where the runtime directory is and why there, without making it.
    /// `inHome`: made with the directories above it.
    public static var chosen: (path: String, why: String, inHome: Bool, fromEnvironment: Bool) {
        if let runtime = getenv("XDG_RUNTIME_DIR").map({ String(cString: $0) }), runtime.hasPrefix("/") {
            return (runtime + "/keychainfs", "XDG_RUNTIME_DIR", false, true)
        }
        let session = "/run/user/\(getuid())"
        var info = stat()
        if lstat(session, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, info.st_uid == getuid(),
            info.st_mode & 0o077 == 0
        {
            return (session + "/keychainfs", "no XDG_RUNTIME_DIR: the login session's directory", false, false)
        }
        // $HOME, not the passwd entry: the commands that only ask a device
        // are linked statically and use no name service (docs/SECURITY.md,
        // "Two builds of one program"). It must be a directory of ours,
        // checked when the directory is made.
        let home = getenv("HOME").map { String(cString: $0) } ?? ""
        return (
            home + "/.local/state/keychainfs/run",
            "no XDG_RUNTIME_DIR and no /run/user/\(getuid()): in your home, where no other user can make it first",
            true, false
        )
    }

    /// The user's private runtime directory (created if need be): the
    /// device's sockets, and the scratch directories of `keychainfs edit`.
    public static func runtimeDirectory() throws(RuntimePathError) -> String {
        let place = chosen
        let base = place.path
        if let runtime = getenv("XDG_RUNTIME_DIR").map({ String(cString: $0) }), runtime.hasPrefix("/") {
            // XDG Base Directory spec: owned by the user, mode 0700. Another
            // user's, or one others can write, could hold a socket of theirs.
            var info = stat()
            guard stat(runtime, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, info.st_uid == getuid(),
                info.st_mode & 0o077 == 0
            else {
                throw RuntimePathError(
                    "XDG_RUNTIME_DIR (\(runtime)) is not a private directory of this user (it must be yours, mode 0700)"
                )
            }
        }
        if place.inHome {
            let home = String(base.dropLast("/.local/state/keychainfs/run".count))
            var info = stat()
            guard home.hasPrefix("/"), stat(home, &info) == 0, info.st_mode & S_IFMT == S_IFDIR,
                info.st_uid == getuid(), info.st_mode & 0o022 == 0
            else {
                throw RuntimePathError(
                    "no XDG_RUNTIME_DIR, no /run/user/\(getuid()), and HOME (\(home)) is not a directory of yours "
                        + "that only you can write: set XDG_RUNTIME_DIR to a private directory of yours")
            }
        }
        do {
            if place.inHome {
                // The directories above it in the home, as XDG's state directory is made (0700).
                var parent = ""
                for part in base.split(separator: "/").dropLast() {
                    parent += "/" + part
                    if access(parent, F_OK) != 0 { try makeDirectoryUnlessPresent(parent, mode: 0o700) }
                }
            }
            try makeDirectoryUnlessPresent(base, mode: 0o700)
        } catch {
            throw RuntimePathError("cannot create the runtime directory \(base): \(error)")
        }
        // Refuse a directory someone else made for us (e.g. in /tmp).
        var info = stat()
        guard lstat(base, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, info.st_uid == getuid(),
            info.st_mode & 0o077 == 0
        else {
            throw RuntimePathError("the runtime directory \(base) is not a private directory of this user")
        }
        return base
    }
}

/// Where the keychainfs service (one device for every user, run by its
/// own account) listens and keeps its keychains (docs/SECURITY.md, "Two modes").
public enum ServicePaths {
    /// The socket systemd's `keychainfs.socket` listens on.
    public static let defaultSocket = "/run/keychainfs/socket"
    /// The state directory (`UID/` per user), only the service can read.
    public static let defaultStateDirectory = "/var/lib/keychainfs"

    /// The service's socket when a service is to be used: `$KEYCHAINFS_SERVICE`
    /// when set (empty: never), else ``defaultSocket`` when it exists.
    public static func socket() -> String? {
        if let chosen = getenv("KEYCHAINFS_SERVICE").map({ String(cString: $0) }) {
            return chosen.isEmpty ? nil : chosen
        }
        return access(defaultSocket, F_OK) == 0 ? defaultSocket : nil
    }
}
