internal import CLinux
import KeychainCore
import KeychainFS
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// `keychainfs watch` without a mount: the device's events as `.events`
/// lines (``DeviceEvent/eventLine``) on the socket connection that asked
/// for them, until its client closes it.
///
/// The device's observers run on the thread that made the change, holding
/// its locks: they only queue a line and wake the connection's own thread,
/// which writes without blocking. A client that stops reading gets the
/// `overflow` line, as a mount's `.events` reader does, and holds up nothing.
final class SocketEventStream: Sendable {
    private let client: BorrowedDescriptor
    private let wake: FileDescriptor
    private let device: Device
    /// Who asked: the item changes of a group with an entitlement policy
    /// reach only programs it admits, as through `.events`.
    private let reader: ProgramIdentity?
    private let queue = Mutex(EventQueue())
    private let observer = Mutex<Int?>(nil)

    /// Starts listening now (the `ok` reply follows), with the state line first.
    init?(client: BorrowedDescriptor, device: Device, reader: ProgramIdentity?) {
        guard let wake = FileDescriptor(eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK))) else { return nil }
        self.client = client
        self.wake = wake
        self.device = device
        self.reader = reader
        let locked = device.isLocked
        deliver(locked ? .locked : .unlocked)
        let token = device.addObserver { [weak self] event in self?.deliver(event) }
        observer.withLock { $0 = token }
        // Said again if it changed before the observer was listening.
        if device.isLocked != locked { deliver(locked ? .unlocked : .locked) }
    }

    private func deliver(_ event: DeviceEvent) {
        let (text, group) = event.eventLine
        if let group, (try? device.checkEntitlement(group, program: { reader })) == nil { return }
        guard queue.withLock({ $0.append(Array(text.utf8)) }) else { return }
        var one: UInt64 = 1
        _ = write(wake.raw, &one, 8)
    }

    deinit {
        if let token = observer.withLock({ $0 }) { device.removeObserver(token) }
    }

    /// Writes the lines as they come; returns when the client has closed
    /// its end (it sends nothing after its request) or the connection failed.
    func run() {
        var pending: [UInt8] = []
        while true {
            if pending.isEmpty { pending = queue.withLock { $0.take(upTo: 64 << 10) } }
            let clientEvents = CLinux_POLLRDHUP | Int16(POLLIN) | (pending.isEmpty ? 0 : Int16(POLLOUT))
            var fds = [
                pollfd(fd: wake.raw, events: Int16(POLLIN), revents: 0),
                pollfd(fd: client.raw, events: clientEvents, revents: 0)
            ]
            guard (try? valueOrErrno({ poll(&fds, 2, -1) })) != nil else { return }
            if fds[1].revents & (CLinux_POLLRDHUP | Int16(POLLIN) | Int16(POLLHUP) | Int16(POLLERR)) != 0 { return }
            if fds[0].revents != 0 {
                var count: UInt64 = 0
                _ = read(wake.raw, &count, 8)
            }
            if fds[1].revents & Int16(POLLOUT) != 0 && !pending.isEmpty {
                let sent = pending.withUnsafeBytes {
                    send(client.raw, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT))
                }
                if sent > 0 {
                    pending.removeFirst(sent)
                } else if ![EAGAIN, EINTR].contains(Errno.current.rawValue) {
                    return
                }
            }
        }
    }
}

/// What goes back with a reply besides its frame.
struct ReplyAttachments: ~Copyable {
    /// A descriptor passed with the reply (nil: none); closed with the attachments, after sending.
    var descriptor: FileDescriptor? = nil
    /// Events that follow the reply on the same connection (`watch`).
    var events: SocketEventStream?
}
