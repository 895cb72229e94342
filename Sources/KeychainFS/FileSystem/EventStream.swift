internal import CFuse
import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One open descriptor of a mount's `.events` file: the lines of device
/// events not read yet, and the reads and `poll` waiting for some.
///
/// A read with nothing queued is parked (no worker thread waits: the reply
/// comes from the thread that delivers the next event) unless the
/// descriptor is non-blocking (EAGAIN). A parked read that the reader
/// interrupts (a signal, `timeout`) is answered EINTR: once the daemon has
/// read a request, the kernel waits for its answer, so a read parked
/// without that would keep the reader unkillable until the next event.
final class EventStream: Sendable {
    /// Who opened it: the item changes of a group with an entitlement policy
    /// reach only readers the policy admits.
    let reader: ProgramIdentity?
    /// The key under which interrupts find it (``registry``).
    let id: UInt64
    /// A libfuse request or poll handle: used by one thread at a time, handed over under the lock.
    private struct Handle: @unchecked Sendable, Equatable {
        let raw: OpaquePointer
    }

    private struct State {
        var queue = EventQueue()
        var parked: [(request: Handle, size: Int)] = []
        /// Requests interrupted before they were parked.
        var interrupted: Set<UInt> = []
        var poll: Handle?
        var closed = false
        /// The device is stopping: reads see the end of the file.
        var ended = false
    }
    private let state = Mutex(State())

    private static let registry = Mutex<[UInt64: EventStream]>([:])
    private static let nextID = Atomic<UInt64>(1)

    init(reader: ProgramIdentity?) {
        self.reader = reader
        id = Self.nextID.add(1, ordering: .relaxed).newValue
        Self.registry.withLock { $0[id] = self }
    }

    /// The descriptor was closed: nothing waits on it any more.
    func close() {
        let poll = state.withLock { state -> Handle? in
            state.closed = true
            defer { state.poll = nil }
            return state.poll
        }
        if let poll { fuse_pollhandle_destroy(poll.raw) }
        _ = Self.registry.withLock { $0.removeValue(forKey: id) }
    }

    /// Queues one line and wakes what waits for it.
    func deliver(_ line: [UInt8]) {
        let (answers, poll) = state.withLock { state -> ([(Handle, [UInt8])], Handle?) in
            var answers: [(Handle, [UInt8])] = []
            guard !state.closed, state.queue.append(line) else { return ([], nil) }
            while !state.parked.isEmpty && !state.queue.isEmpty {
                let waiting = state.parked.removeFirst()
                answers.append((waiting.request, state.queue.take(upTo: waiting.size)))
            }
            defer { state.poll = nil }
            return (answers, state.poll)
        }
        for (request, bytes) in answers {
            bytes.withUnsafeBytes { _ = fuse_reply_buf(request.raw, $0.baseAddress, $0.count) }
        }
        if let poll {
            fuse_lowlevel_notify_poll(poll.raw)
            fuse_pollhandle_destroy(poll.raw)
        }
    }

    /// Answers a read now, or parks it until a line arrives.
    func read(_ request: OpaquePointer, size: Int, nonblocking: Bool) {
        // Registered before the request is parked, outside the lock: if the
        // interrupt came already, libfuse calls back at once.
        if !nonblocking {
            fuse_req_interrupt_func(
                request,
                { request, data in
                    guard let request,
                        let stream = EventStream.registry.withLock({ $0[UInt64(UInt(bitPattern: data))] })
                    else { return }
                    stream.interrupt(request)
                }, UnsafeMutableRawPointer(bitPattern: UInt(id)))
        }
        enum Answer { case bytes([UInt8]), error(Int32), parked }
        let answer = state.withLock { state -> Answer in
            let interrupted = state.interrupted.remove(UInt(bitPattern: request)) != nil
            if !state.queue.isEmpty { return .bytes(state.queue.take(upTo: size)) }
            if state.ended { return .bytes([]) }
            if nonblocking { return .error(EAGAIN) }
            if interrupted { return .error(EINTR) }
            state.parked.append((Handle(raw: request), size))
            return .parked
        }
        switch answer {
        case .bytes(let bytes): bytes.withUnsafeBytes { _ = fuse_reply_buf(request, $0.baseAddress, $0.count) }
        case .error(let code): fuse_reply_err(request, code)
        case .parked: break
        }
    }

    /// POLLIN when lines are queued; otherwise the kernel is told when one arrives.
    func poll(_ request: OpaquePointer, handle: OpaquePointer?) {
        let offered = handle.map(Handle.init(raw:))
        let (ready, replaced) = state.withLock { state -> (Bool, Handle?) in
            if !state.queue.isEmpty || state.ended { return (true, offered) }
            defer { state.poll = offered }
            return (false, state.poll)
        }
        if let replaced, replaced != offered { fuse_pollhandle_destroy(replaced.raw) }
        fuse_reply_poll(request, ready ? UInt32(POLLIN | POLLRDNORM) : 0)
    }

    /// The device is stopping: waiting reads get the end of the file now,
    /// so that readers close their descriptors (a descriptor left open would
    /// keep the unmounted connection, and the device, alive).
    func end() {
        let (parked, poll) = state.withLock { state -> ([Handle], Handle?) in
            state.ended = true
            defer {
                state.parked = []
                state.poll = nil
            }
            return (state.parked.map(\.request), state.poll)
        }
        for request in parked { fuse_reply_buf(request.raw, nil, 0) }
        if let poll {
            fuse_lowlevel_notify_poll(poll.raw)
            fuse_pollhandle_destroy(poll.raw)
        }
    }

    private func interrupt(_ request: OpaquePointer) {
        let wasParked = state.withLock { state -> Bool in
            if let index = state.parked.firstIndex(where: { $0.request.raw == request }) {
                state.parked.remove(at: index)
                return true
            }
            state.interrupted.insert(UInt(bitPattern: request))
            return false
        }
        if wasParked { fuse_reply_err(request, EINTR) }
    }
}

/// The lines of device events a reader has not read yet. Past
/// ``maximumQueued`` bytes newer lines are dropped and one `overflow` line
/// says so, as inotify does (IN_Q_OVERFLOW): dropping costs nothing, while
/// 32 readers that never read used to cost every write a copy of each
/// one's full queue (0.3 to 10.6 ms).
package struct EventQueue {
    package init() {}

    static let maximumQueued = 256 << 10
    private static let overflowLine = Array("overflow\n".utf8)

    private var queued: [UInt8] = []
    /// Lines were dropped since the reader last emptied the queue: it ends
    /// with `overflow`, and nothing more is queued until it is read.
    private var overflowed = false

    var isEmpty: Bool { queued.isEmpty }

    /// Queues a line (or the overflow line); false when the queue takes no more.
    package mutating func append(_ line: [UInt8]) -> Bool {
        guard !overflowed else { return false }
        if queued.count + line.count > Self.maximumQueued {
            queued += Self.overflowLine
            overflowed = true
        } else {
            queued += line
        }
        return true
    }

    /// Up to `size` queued bytes, removed; a queue read to its end may overflow again.
    package mutating func take(upTo size: Int) -> [UInt8] {
        let count = min(size, queued.count)
        defer {
            queued.removeFirst(count)
            if queued.isEmpty { overflowed = false }
        }
        return Array(queued[..<count])
    }
}

extension DeviceEvent {
    /// The `.events` line of a device event (names escaped as status lines,
    /// fields separated by tabs), and the group it concerns.
    package var eventLine: (text: String, group: String?) {
        func line(_ fields: String...) -> String {
            fields.map { LineEscaping.escaped($0) }.joined(separator: "\t") + "\n"
        }
        switch self {
        case .locked: return (line("locked"), nil)
        case .unlocked: return (line("unlocked"), nil)
        case .willLock(let grace): return (line("will-lock", String(grace)), nil)
        case .entitlementsChanged(let group): return (line("policy", group), group)
        case .changed(let change):
            switch change {
            case .written(let group, let identifier): return (line("written", group, identifier), group)
            case .removed(let group, let identifier): return (line("removed", group, identifier), group)
            case .renamed(let group, let from, let to): return (line("renamed", group, from, to), group)
            case .groupCreated(let group): return (line("group-created", group), nil)
            case .groupRemoved(let group): return (line("group-removed", group), nil)
            }
        }
    }
}

/// The open `.events` descriptors of one mount.
package final class EventStreams: Sendable {
    private let streams = Mutex<[UInt64: EventStream]>([:])

    func add(_ stream: EventStream) { streams.withLock { $0[stream.id] = stream } }
    func remove(_ stream: EventStream) { _ = streams.withLock { $0.removeValue(forKey: stream.id) } }
    var all: [EventStream] { streams.withLock { Array($0.values) } }
    /// Ends every stream (``EventStream/end()``).
    package func endAll() { all.forEach { $0.end() } }
}
