internal import CSystemd
internal import CLinux
import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One connection to the session bus, served by a thread of its own: sd-bus
/// objects are not thread-safe, so every use of the bus (replies, signals)
/// happens on that thread; other threads hand it work (``perform(_:)``).
final class BusConnection: @unchecked Sendable {
    private let bus: OpaquePointer
    private let wake: FileDescriptor
    private let queued = Mutex<[@Sendable () -> Void]>([])
    private let stopping = Atomic<Bool>(false)
    /// False once the loop has ended: stopped, or the bus went away.
    private let serving = Atomic<Bool>(false)
    var isServing: Bool { serving.load(ordering: .sequentiallyConsistent) }
    private var slots: [OpaquePointer] = []
    /// Method calls under the registered prefix; returns whether it answered.
    private var handler: ((OpaquePointer) -> Bool)?
    private let thread = Mutex<pthread_t?>(nil)

    /// Connects to the session bus at `address`, else the one
    /// ``sessionBusAddress`` names.
    convenience init(address: String? = nil) throws(BusError) {
        try Self.requireLibrary()
        guard let address = address ?? Self.sessionBusAddress else {
            throw .failed(
                "cannot connect to the session bus: neither DBUS_SESSION_BUS_ADDRESS nor XDG_RUNTIME_DIR is set")
        }
        var bus: OpaquePointer?
        var result = CSystemd_sd_bus_new(&bus)
        if result >= 0, let made = bus {
            result = CSystemd_sd_bus_set_address(made, address)
            if result >= 0 { result = CSystemd_sd_bus_set_bus_client(made, 1) }
            if result >= 0 { result = CSystemd_sd_bus_start(made) }
            if result < 0 {
                _ = CSystemd_sd_bus_unref(made)
                bus = nil
            }
        }
        guard result >= 0, let bus else {
            throw .failed("cannot connect to the bus at \(address): " + String(cString: strerror(-result)))
        }
        try self.init(bus)
    }

    /// The session bus's address as sd_bus_open_user finds it:
    /// `$DBUS_SESSION_BUS_ADDRESS`, else `$XDG_RUNTIME_DIR/bus`. Read here,
    /// with getenv: sd-bus reads them with secure_getenv, which glibc
    /// blanks in a process started setgid, as the device build is
    /// (docs/SECURITY.md, "A device undumpable from its first instruction").
    static var sessionBusAddress: String? {
        if let named = getenv("DBUS_SESSION_BUS_ADDRESS").map({ String(cString: $0) }), !named.isEmpty { return named }
        guard let runtime = getenv("XDG_RUNTIME_DIR").map({ String(cString: $0) }), runtime.hasPrefix("/") else {
            return nil
        }
        // A D-Bus address escapes every byte but these (D-Bus specification, "Server Addresses").
        let plain = Set("-_/.\\*".utf8).union(UInt8(ascii: "0")...UInt8(ascii: "9"))
            .union(UInt8(ascii: "A")...UInt8(ascii: "Z")).union(UInt8(ascii: "a")...UInt8(ascii: "z"))
        let path = (runtime + "/bus").utf8.map { byte in
            plain.contains(byte) ? String(UnicodeScalar(byte)) : "%" + Hex.string([byte])
        }
        return "unix:path=" + path.joined()
    }

    /// One end of a direct connection, with no bus daemon between (D-Bus
    /// "peer-to-peer"): `serving`, it answers the other end's calls as a
    /// provider on a bus does. The tests run the provider's handlers in
    /// their own process this way (docs/CONTRIBUTING.md, "Where a new piece
    /// goes"). Calls on such a connection have no sender, and the sender's
    /// credentials are the socket's peer's.
    convenience init(peer end: consuming FileDescriptor, serving: Bool) throws(BusError) {
        try Self.requireLibrary()
        var bus: OpaquePointer?
        var result = CSystemd_sd_bus_new(&bus)
        guard result >= 0, let bus else {
            throw .failed("cannot make a connection: \(String(cString: strerror(-result)))")
        }
        let raw = end.release()
        result = CSystemd_sd_bus_set_fd(bus, raw, raw)  // the connection closes it from here
        if result >= 0, serving {
            // A server names itself with a 128-bit id, which clients may check; nobody here does.
            var id = sd_id128_t()
            withUnsafeMutableBytes(of: &id) { $0.copyBytes(from: Crypto.randomBytes(MemoryLayout<sd_id128_t>.size)) }
            result = CSystemd_sd_bus_set_server(bus, 1, id)
        }
        if result >= 0 { result = CSystemd_sd_bus_start(bus) }
        guard result >= 0 else {
            _ = CSystemd_sd_bus_flush_close_unref(bus)
            throw .failed("cannot start a direct connection: \(String(cString: strerror(-result)))")
        }
        try self.init(bus)
    }

    private static func requireLibrary() throws(BusError) {
        guard CSystemd_available() != 0 else {
            throw .failed("libsystemd is not installed (apt install libsystemd0)")
        }
    }

    /// Takes `bus`, started, and makes the descriptor that wakes its thread.
    private init(_ bus: OpaquePointer) throws(BusError) {
        guard let wake = FileDescriptor(eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK))) else {
            _ = CSystemd_sd_bus_flush_close_unref(bus)
            throw .failed("no eventfd: \(Errno.current.description)")
        }
        self.bus = bus
        self.wake = wake
    }

    /// The address the bus daemon listens at, as the kernel names the
    /// other end of this connection: every client's connection to the
    /// same bus ends at a socket of that address (nil: not told). Read at
    /// the first need, on the bus thread: sd-bus connects asynchronously,
    /// and until the daemon has accepted, the other end has no address.
    var peerAddress: [UInt8]? {
        if let known = knownPeerAddress { return known }
        // sd-bus owns its connection's descriptor for as long as the bus is ours.
        let fd = CSystemd_sd_bus_get_fd(bus)
        guard fd >= 0 else { return nil }
        knownPeerAddress = SocketHolders.peerAddress(of: BorrowedDescriptor(kept: fd))
        return knownPeerAddress
    }
    private var knownPeerAddress: [UInt8]?

    deinit {
        for slot in slots { _ = CSystemd_sd_bus_slot_unref(slot) }
        _ = CSystemd_sd_bus_flush_close_unref(bus)
    }

    /// Owns `name` on the bus; with `replace`, takes it from the current
    /// owner if that one allows it (gnome-keyring 42 does not). It never
    /// allows replacement itself: any program of the session could
    /// otherwise take the name with REPLACE_EXISTING and receive what
    /// clients store from then on (docs/SECURITY.md, "Service mode under
    /// attack").
    func requestName(_ name: String, replace: Bool) throws(BusError) {
        let flags = replace ? CSystemd_name_replace_existing : 0
        let result = CSystemd_sd_bus_request_name(bus, name, flags)
        guard result >= 0 else {
            guard result == -EEXIST else { throw .failed("cannot own \(name): \(String(cString: strerror(-result)))") }
            // Named, so that the advice fits the owner (the first refusal
            // suggested --replace, which gnome-keyring then refused;
            // docs/SECRET-SERVICE.md, "Running it").
            let owner = ownerProcess(of: name).flatMap { ProgramIdentities.linkTarget("/proc/\($0)/exe") }
            let who =
                owner.map { "\(name) is owned by \($0) on this bus" }
                ?? "\(name) is owned by another program on this bus"
            if owner?.hasSuffix("/gnome-keyring-daemon") == true {
                throw .failed(
                    who + ", which allows no replacement: stop gnome-keyring's secrets first "
                        + "(`systemctl --user mask --now gnome-keyring-daemon.service gnome-keyring-daemon.socket`; "
                        + "SECRET-SERVICE.md, \"Running it\")")
            }
            throw .failed(
                replace
                    ? who + ", which allows no replacement: stop it first"
                    : who + " (--replace takes it over where that program allows it)")
        }
    }

    /// Sends every method call to an object under `prefix` (and `prefix`
    /// itself) to `handler`, on the bus thread.
    func serve(prefix: String, _ handler: @escaping (OpaquePointer) -> Bool) throws(BusError) {
        self.handler = handler
        var slot: OpaquePointer?
        let userdata = Unmanaged.passUnretained(self).toOpaque()
        let callback: sd_bus_message_handler_t = { message, userdata, _ in
            guard let message, let userdata else { return 0 }
            let connection = Unmanaged<BusConnection>.fromOpaque(userdata).takeUnretainedValue()
            return connection.handler?(message) == true ? 1 : 0
        }
        for register in [CSystemd_sd_bus_add_object, CSystemd_sd_bus_add_fallback] {
            let result = register(bus, &slot, prefix, callback, userdata)
            guard result >= 0, let slot else {
                throw .failed("cannot serve \(prefix): \(String(cString: strerror(-result)))")
            }
            slots.append(slot)
        }
    }

    /// Calls `handler` with every signal matching `rule` (a D-Bus match rule).
    func watch(_ rule: String, _ handler: @escaping (OpaquePointer) -> Void) throws(BusError) {
        let box = Unmanaged.passRetained(SignalHandler(handler))
        var slot: OpaquePointer?
        let result = CSystemd_sd_bus_add_match(
            bus, &slot, rule,
            { message, userdata, _ in
                guard let message, let userdata else { return 0 }
                Unmanaged<SignalHandler>.fromOpaque(userdata).takeUnretainedValue().handler(message)
                return 0
            }, box.toOpaque())
        guard result >= 0, let slot else {
            box.release()
            throw .failed("cannot watch the bus: \(String(cString: strerror(-result)))")
        }
        slots.append(slot)
    }

    private final class SignalHandler {
        let handler: (OpaquePointer) -> Void
        init(_ handler: @escaping (OpaquePointer) -> Void) { self.handler = handler }
    }

    /// Serves the bus on a new thread until ``stop()`` or the bus goes away.
    func start() throws(BusError) {
        serving.store(true, ordering: .sequentiallyConsistent)
        guard let started = Threads.start({ [self] in loop() }) else { throw .failed("cannot start the bus thread") }
        thread.withLock { $0 = started }
    }

    func stop() {
        stopping.store(true, ordering: .sequentiallyConsistent)
        signalWake()
        if let running = thread.withLock({ value -> pthread_t? in
            defer { value = nil }
            return value
        }) {
            pthread_join(running, nil)
        }
    }

    /// Runs `work` on the bus thread (from any thread).
    func perform(_ work: @escaping @Sendable () -> Void) {
        queued.withLock { $0.append(work) }
        signalWake()
    }

    private func signalWake() {
        var one: UInt64 = 1
        _ = write(wake.raw, &one, 8)
    }

    private func loop() {
        defer { serving.store(false, ordering: .sequentiallyConsistent) }
        let fd = CSystemd_sd_bus_get_fd(bus)
        guard fd >= 0 else { return }
        while !stopping.load(ordering: .sequentiallyConsistent) {
            var result: Int32
            repeat { result = CSystemd_sd_bus_process(bus, nil) } while result > 0
            // The bus went away (its daemon ended): nothing more to serve.
            if result < 0 { return }
            for work in queued.withLock({ work in
                defer { work = [] }; return work
            }) { work() }
            var timeout: UInt64 = 0
            _ = CSystemd_sd_bus_get_timeout(bus, &timeout)
            let milliseconds: Int32 = timeout == UInt64.max ? -1 : Int32(clamping: timeout / 1000)
            var fds = [
                pollfd(fd: fd, events: Int16(truncatingIfNeeded: CSystemd_sd_bus_get_events(bus)), revents: 0),
                pollfd(fd: wake.raw, events: Int16(POLLIN), revents: 0)
            ]
            if poll(&fds, 2, milliseconds) < 0 && Errno.current.rawValue != EINTR { return }
            if fds[1].revents != 0 {
                var count: UInt64 = 0
                _ = read(wake.raw, &count, 8)
            }
        }
        _ = CSystemd_sd_bus_flush(bus)
    }

    // MARK: Calls (a client's, before any start())

    /// Calls a method and waits for its reply; an error reply is thrown as
    /// it came. `destination` nil: the other end of a direct connection.
    func call(
        _ destination: String?, _ path: String, _ interface: String, _ member: String,
        _ build: (BusMessageWriter) throws(BusError) -> Void = { _ throws(BusError) in }
    ) throws(BusError) -> BusReply {
        var call: OpaquePointer?
        guard CSystemd_sd_bus_message_new_method_call(bus, &call, destination, path, interface, member) >= 0, let call
        else {
            throw .failed("cannot build a call of \(member)")
        }
        defer { _ = CSystemd_sd_bus_message_unref(call) }
        try build(BusMessageWriter(message: call))
        var error = sd_bus_error()
        defer { CSystemd_sd_bus_error_free(&error) }
        var reply: OpaquePointer?
        let result = CSystemd_sd_bus_call(bus, call, 0, &error, &reply)
        guard result >= 0, let reply else {
            if let name = error.name {
                throw BusError(String(cString: name), error.message.map { String(cString: $0) } ?? "")
            }
            throw .failed("\(member) failed: \(String(cString: strerror(-result)))")
        }
        return BusReply(reply)
    }

    /// The process that owns `name` on the bus (nil: no one owns it).
    func ownerProcess(of name: String) -> pid_t? {
        var creds: OpaquePointer?
        guard CSystemd_sd_bus_get_name_creds(bus, name, CSystemd_creds_pid | CSystemd_creds_augment, &creds) >= 0,
            let creds
        else { return nil }
        defer { _ = CSystemd_sd_bus_creds_unref(creds) }
        var pid: pid_t = 0
        return CSystemd_sd_bus_creds_get_pid(creds, &pid) >= 0 ? pid : nil
    }

    // MARK: Replies and signals (on the bus thread)

    /// Replies to `call` with the arguments `build` appends.
    func reply(
        to call: OpaquePointer, sensitive: Bool = false,
        _ build: (BusMessageWriter) throws(BusError) -> Void
    ) throws(BusError) {
        var reply: OpaquePointer?
        let made = CSystemd_sd_bus_message_new_method_return(call, &reply)
        guard made >= 0, let reply else { throw .failed("cannot build a reply") }
        defer { _ = CSystemd_sd_bus_message_unref(reply) }
        // sd-bus then wipes the message's memory when it frees it.
        if sensitive { _ = CSystemd_sd_bus_message_sensitive(reply) }
        try build(BusMessageWriter(message: reply))
        _ = CSystemd_sd_bus_send(bus, reply, nil)
    }

    func reply(to call: OpaquePointer, error: BusError) {
        let sent = error.name.withCString { name in
            error.message.withCString { message in
                var busError = sd_bus_error(name: name, message: message, _need_free: 0)
                var reply: OpaquePointer?
                guard CSystemd_sd_bus_message_new_method_error(call, &reply, &busError) >= 0, let reply else {
                    return false
                }
                defer { _ = CSystemd_sd_bus_message_unref(reply) }
                return CSystemd_sd_bus_send(bus, reply, nil) >= 0
            }
        }
        if !sent { Diagnostics.log("could not send a D-Bus error reply (\(error.name))") }
    }

    func emit(path: String, interface: String, member: String, _ build: (BusMessageWriter) throws(BusError) -> Void) {
        var signal: OpaquePointer?
        guard CSystemd_sd_bus_message_new_signal(bus, &signal, path, interface, member) >= 0, let signal else { return }
        defer { _ = CSystemd_sd_bus_message_unref(signal) }
        guard (try? build(BusMessageWriter(message: signal))) != nil else { return }
        _ = CSystemd_sd_bus_send(bus, signal, nil)
    }

    /// The process behind a message's sender, as the bus daemon knows it
    /// (GetConnectionCredentials): its pid and uid.
    func senderProcess(of message: OpaquePointer) -> (pid: pid_t, uid: uid_t)? {
        var creds: OpaquePointer?
        guard
            CSystemd_sd_bus_query_sender_creds(
                message, CSystemd_creds_pid | CSystemd_creds_euid | CSystemd_creds_augment,
                &creds) >= 0, let creds
        else { return nil }
        defer { _ = CSystemd_sd_bus_creds_unref(creds) }
        var pid: pid_t = 0
        var uid: uid_t = 0
        guard CSystemd_sd_bus_creds_get_pid(creds, &pid) >= 0, CSystemd_sd_bus_creds_get_euid(creds, &uid) >= 0 else {
            return nil
        }
        return (pid, uid)
    }
}

/// A method call kept past its handler (a reply that waits for the person
/// at a prompt): one more reference to the message, dropped with this.
final class RetainedCall {
    let call: BusCall

    init(_ call: BusCall) {
        _ = CSystemd_sd_bus_message_ref(call.message)
        self.call = call
    }

    deinit { _ = CSystemd_sd_bus_message_unref(call.message) }
}

/// A method's reply, owned until it is released; sensitive (sd-bus wipes
/// it when freed), since replies may carry secrets.
final class BusReply {
    let message: OpaquePointer

    init(_ message: OpaquePointer) {
        self.message = message
        _ = CSystemd_sd_bus_message_sensitive(message)
    }

    deinit { _ = CSystemd_sd_bus_message_unref(message) }

    var arguments: BusMessageReader { BusMessageReader(message: message, owner: self) }
    var signature: String { CSystemd_sd_bus_message_get_signature(message, 1).map { String(cString: $0) } ?? "" }
}

/// The header fields of a method call.
struct BusCall {
    let message: OpaquePointer
    let path: String
    let interface: String
    let member: String
    /// The caller's unique name on the bus; empty on a direct connection,
    /// whose one peer makes every call.
    let sender: String

    init?(_ message: OpaquePointer) {
        guard let path = CSystemd_sd_bus_message_get_path(message),
            let member = CSystemd_sd_bus_message_get_member(message)
        else { return nil }
        self.message = message
        self.path = String(cString: path)
        self.member = String(cString: member)
        sender = CSystemd_sd_bus_message_get_sender(message).map { String(cString: $0) } ?? ""
        interface = CSystemd_sd_bus_message_get_interface(message).map { String(cString: $0) } ?? ""
    }

    var arguments: BusMessageReader { BusMessageReader(message: message) }

    /// The full signature of the arguments.
    var signature: String { CSystemd_sd_bus_message_get_signature(message, 1).map { String(cString: $0) } ?? "" }
}
