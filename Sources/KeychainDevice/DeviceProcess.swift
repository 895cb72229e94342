internal import CLinux
import KeychainCore
import KeychainProtocol
import KeychainFS
import SecretService
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The one process that holds keychains' keys and serves every FUSE
/// session of them (docs/FILESYSTEM.md, "The device process"), reached over a UNIX socket.
///
/// Two ways to run (docs/SECURITY.md, "Two modes"):
/// - **per user**: the process of one user, serving that user's one
///   keychain; later `mount`s join it; it exits when its last mount goes
///   away, or on SIGTERM, SIGINT or SIGHUP after unmounting everything.
/// - **service**: the system account's process, serving every user's
///   keychain under a state directory only it can read; each peer reaches
///   only its own (by `SO_PEERCRED`). It runs until SIGTERM.
public final class DeviceProcess: Sendable {
    /// Where the clients reach this process.
    public let socketPath: String
    private let keychains: ServedKeychains
    /// Signalled whenever a mount's session ends or a request is answered
    /// (an eventfd; nil when none could be made, and nothing waits on it).
    private let mountEnded: FileDescriptor?
    /// Requests being answered: the process must not exit under one (an
    /// `unmount` of the last mount is answered after that mount has ended).
    private let requestsInFlight = Mutex(0)
    /// Started without a mount: it outlives its mounts (until stopped).
    private let headless = Mutex(false)
    /// The Secret Service this device serves, if any.
    private let secretService = Mutex<SecretServiceProvider?>(nil)
    /// The login sessions it follows (docs/FILESYSTEM.md, "`.control`"), when
    /// logind runs.
    private let loginSessions = Mutex<LoginSessions?>(nil)
    /// The socket connections being served, and their limits.
    private let connections: ConnectionTable
    /// Each person's large requests at once, in the service.
    private let largeRequests: LockedMemoryShares

    /// The keychain a per-user device serves, or every user's, in the service.
    private enum ServedKeychains: Sendable {
        case perUser(ServedKeychain)
        case service(ServiceKeychains)
    }

    /// The per-user device of `keychain`: booted, locked, before first unlock.
    public init(keychain: KeychainDirectory) throws(MountError) {
        do {
            socketPath = try RuntimePaths.socketPath(for: keychain.path)
        } catch {
            throw MountError(error.description)
        }
        let made = FileDescriptor(eventfd(0, Int32(EFD_CLOEXEC)))
        let ended = made.borrowed
        mountEnded = made
        // Every connection is the user's own: no limit but the deadline.
        connections = ConnectionTable(perUser: nil, deadline: Self.connectionDeadline * 1000)
        largeRequests = LockedMemoryShares(perPerson: .max)  // one person: not asked (service mode only)
        keychains = .perUser(
            try ServedKeychain(keychain: keychain, owner: (getuid(), getgid())) {
                Self.signal(ended)
            })
    }

    /// The service of every user's keychain under `stateDirectory`
    /// (`UID/` each), listening at `socketPath`.
    public init(serviceOf stateDirectory: String, socketPath: String, limits: ServiceLimits = ServiceLimits()) {
        self.socketPath = socketPath
        let made = FileDescriptor(eventfd(0, Int32(EFD_CLOEXEC)))
        let ended = made.borrowed
        mountEnded = made
        connections = ConnectionTable(perUser: limits.connectionsPerUser, deadline: Self.connectionDeadline * 1000)
        let shares = LockedMemoryShares(lockedMemory: LockedMemoryShares.lockedMemoryLimit)
        largeRequests = shares
        // The mounts' buffers count in the same shares as the socket's bodies.
        LockedMemoryShares.serving.withLock { $0 = shares }
        keychains = .service(ServiceKeychains(stateDirectory: stateDirectory, limits: limits) { Self.signal(ended) })
    }

    /// The manager of the per-user device's keychain.
    public var manager: PasswordManager {
        guard case .perUser(let keychain) = keychains else { preconditionFailure("the service serves many keychains") }
        return keychain.manager
    }

    private static func signal(_ eventfd: BorrowedDescriptor?) {
        guard let eventfd else { return }
        var one: UInt64 = 1
        _ = write(eventfd.raw, &one, 8)
    }

    /// Mounts the per-user device's keychain (or one of its groups) at `mountpoint`, an absolute path.
    public func mount(_ mountpoint: String, group: String?) throws(MountError) {
        guard case .perUser(let keychain) = keychains else { throw MountError("the service mounts nothing itself") }
        try keychain.mount(mountpoint, group: group)
    }

    // MARK: Running

    /// Where a per-user device started in the background reports when no
    /// journald listens (docs/SECURITY.md, "Bound to this machine, against
    /// whoever holds the files and the TPM"): beside its socket.
    public static func logPath(socket: String) -> String { socket + ".log" }

    private static func removeLogIfEmpty(_ path: String) {
        var info = stat()
        if lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFREG, info.st_size == 0 { unlink(path) }
    }

    /// Runs the per-user device: mounts `mountpoint`, reports through
    /// `ready`, then serves until the last mount is gone or a signal (or a
    /// `stop` request) asks it to stop. Without a mount point the device
    /// runs headless, for clients of its socket (`keychainfs get`, the
    /// helpers, `unlock`), and keeps running, as gpg-agent does, until it
    /// is stopped; mounts may join and leave it meanwhile. With
    /// `secretService` it also serves the Secret Service on the session bus
    /// (true: taking the name over from another provider). Returns the
    /// process exit status.
    public func run(
        mountpoint: String?, group: String?, secretService: Bool? = nil,
        ready: (MountError?) -> Void
    ) -> Int32 {
        guard case .perUser(let keychain) = keychains else { preconditionFailure("the service mounts nothing itself") }
        // Nobody chooses the device's judge (docs/SECRET-SERVICE.md, "The
        // device's judge"): a caller's loader variables would run its code
        // where every secret is.
        if let problem = DeviceJudge.startProblem() {
            ready(MountError(problem))
            return 1
        }
        // Read now, while the process that started the device waits for `ready`.
        let judge = DeviceJudge.current
        // After everything else, which may still report: an empty log is not left behind.
        defer { Self.removeLogIfEmpty(Self.logPath(socket: socketPath)) }
        // Last, once every session has ended: a cleanly stopped device leaves
        // the keychain as one file (no -wal beside it).
        defer { keychain.manager.localDevice.shutDown() }
        let signals = Self.prepareProcess()
        // We hold the keychain's flock, so a socket file left there is stale.
        var listening: FileDescriptor?
        do throws(Errno) {
            listening = try UnixSocket.listen(at: socketPath)
        } catch {
            ready(MountError("cannot listen on \(socketPath): \(error)"))
            return 1
        }
        let listener = listening.borrowed!  // set just above
        defer {
            listening = nil  // closed: the accepting thread sees it and ends
            unlink(socketPath)
        }
        headless.withLock { $0 = mountpoint == nil }
        if let mountpoint {
            do {
                try keychain.mount(mountpoint, group: group)
            } catch {
                ready(error)
                return 1
            }
        }
        startServing(listener)
        if let replace = secretService {
            do {
                let provider = try SecretServiceProvider(store: keychain, replace: replace)
                self.secretService.withLock { $0 = provider }
            } catch {
                keychain.unmountAll()
                ready(MountError("cannot serve the Secret Service: \(error.message)"))
                return 1
            }
        }
        ready(nil)
        recordLifecycle(keychain, "device-start", judge.auditDetail + (secretService != nil ? "; serves the bus" : ""))
        followLoginSessions(of: getuid(), keychains: { _ in [keychain] }) { [self] sentence in
            recordLifecycle(keychain, "session", sentence)
        }
        let stopped = waitForTheEnd(signals.borrowed) { mountpoint != nil && !keychain.hasMounts }
        // No question outlives the device that would read its answer.
        Pinentry.endAll()
        self.secretService.withLock { provider in
            provider?.stop()
            provider = nil
        }
        loginSessions.withLock { $0 = nil }
        keychain.unmountAll()
        recordLifecycle(keychain, "device-stop", stopped ? "stopped" : "ended by an error")
        return stopped ? 0 : 1
    }

    /// Login sessions as the lock screen (docs/FILESYSTEM.md, "`.control`"):
    /// those of `uid` (a per-user device), or of every user (the service), each
    /// locking the keychains `keychains` gives for its user (nil: the machine's
    /// sleep, every keychain): after the grace when a session locks, at once
    /// when one ends or the machine sleeps. Followed from a thread of its own,
    /// since reaching the system bus may take a moment, and only where
    /// logind runs: `report` gets the sentence that says which.
    private func followLoginSessions(
        of uid: UInt32?, keychains: @escaping @Sendable (UInt32?) -> [ServedKeychain],
        report: @escaping @Sendable (String) -> Void
    ) {
        let actions = LoginSessions.Actions(
            lock: { uid, reason, afterGrace in
                for served in keychains(uid) {
                    served.manager.localDevice.lockForSession(reason: reason, grace: afterGrace ? nil : 0)
                }
            },
            cancelLock: { uid in
                for served in keychains(uid) { served.manager.localDevice.cancelSessionLock() }
            })
        guard
            let started = Threads.start(
                blockingSignals: true,
                { [self] in
                    do throws(BusError) {
                        let sessions = try LoginSessions(uid: uid, actions: actions)
                        loginSessions.withLock { $0 = sessions }
                        report("follows the login sessions of " + (uid.map { "uid \($0)" } ?? "every user"))
                    } catch {
                        report("follows no login session: \(error.message)")
                    }
                })
        else { return }
        pthread_detach(started)
    }

    /// A start, stop or bus of the device in its audit log, with the
    /// device's own process as the subject (nothing else records them:
    /// docs/SECRET-SERVICE.md, "The device's judge").
    private func recordLifecycle(
        _ keychain: ServedKeychain, _ operation: String, _ detail: String, by subject: AuditSubject? = nil
    ) {
        keychain.manager.localDevice.audit.record(
            AuditEvent(
                operation: operation, result: "ok",
                subject: subject ?? ProgramIdentities.subject(process: getpid(), uid: getuid()), detail: detail))
    }

    /// Serves the Secret Service on the bus at `address` from now on (a
    /// device started by a client, before any program asked for the bus):
    /// done when it serves that bus already; refused while it serves
    /// another session's, which stays its own until it goes away.
    private func serveBus(_ keychain: ServedKeychain, address: String, replace: Bool) -> DeviceReply {
        secretService.withLock { current in
            if let serving = current, serving.isServing {
                let servedAddress = serving.address ?? getenv("DBUS_SESSION_BUS_ADDRESS").map { String(cString: $0) }
                return servedAddress == address
                    ? Done().reply
                    : .systemError(
                        EBUSY,
                        "the device serves the Secret Service on another session's bus: stop it first (keychainfs stop)"
                    )
            }
            current?.stop()
            current = nil
            do throws(BusError) {
                current = try SecretServiceProvider(store: keychain, replace: replace, address: address)
                return Done().reply
            } catch {
                return .systemError(EEXIST, "cannot serve the Secret Service: \(error.message)")
            }
        }
    }

    /// Runs the service on `listener` (its own, or systemd's) until a
    /// signal asks it to stop. Returns the process exit status.
    public func runService(listener: BorrowedDescriptor, ready: () -> Void) -> Int32 {
        guard case .service(let all) = keychains else { preconditionFailure("not a service") }
        if let problem = ExecutableImage.servingProblem {
            Diagnostics.log("keychainfs service: " + problem)
            return 1
        }
        let signals = Self.prepareProcess()
        startServing(listener)
        ready()
        // Said in the journal (or the daemon's log): the service has no audit log of its own.
        followLoginSessions(of: nil, keychains: all.opened) { Diagnostics.log($0) }
        let stopped = waitForTheEnd(signals.borrowed) { false }
        loginSessions.withLock { $0 = nil }
        // The mounts are their users' (the service cannot unmount them):
        // their connections close with this process, and `keychainfs mount`
        // clears such a dead mount. Every acknowledged write is committed.
        all.stop()
        return stopped ? 0 : 1
    }

    /// Process-wide settings of a device; returns a signalfd of the
    /// signals that stop it.
    private static func prepareProcess() -> FileDescriptor? {
        if !disableCoreDumps() { Diagnostics.log("could not disable core dumps") }
        // glibc gives each of libfuse's worker threads a malloc arena of its
        // own; memory freed in one is not reused by the others, and a large
        // keychain's churn (100,000 creates, listings) left the device at
        // three times its live data. Two arenas suffice for two CPUs.
        CLinux_limit_malloc_arenas(2)
        // glibc raises its mmap threshold to the size of any mapped block
        // freed (up to 32 MB), after which the inode table's multi-megabyte
        // storage comes from the heap and stays resident once freed; fixed,
        // it is always mapped and given back when the table shrinks.
        CLinux_fix_mmap_threshold(128 << 10)
        // A daemon must not pin the directory it was started from (it could
        // not be unmounted); every path it uses is absolute.
        _ = chdir("/")
        // Every thread started from here on inherits this mask; the signals
        // arrive through the signalfd instead. Reset first: a process started
        // with `&` by a shell inherits SIGINT as ignored (docs/CONTRIBUTING.md).
        var stopping = sigset_t()
        sigemptyset(&stopping)
        for signal in [SIGTERM, SIGINT, SIGHUP] {
            Glibc.signal(signal, SIG_DFL)
            sigaddset(&stopping, signal)
        }
        Glibc.signal(SIGPIPE, SIG_IGN)
        pthread_sigmask(SIG_BLOCK, &stopping, nil)
        return FileDescriptor(signalfd(-1, &stopping, Int32(SFD_CLOEXEC)))
    }

    /// Waits for a stopping signal (true), or until `isIdle` holds with no
    /// request in flight (true), or an error of poll (false).
    private func waitForTheEnd(_ signals: BorrowedDescriptor?, isIdle: () -> Bool) -> Bool {
        var fds = [
            // Without a signalfd (none could be made), -1: poll(2) passes over a negative descriptor.
            pollfd(fd: signals?.raw ?? -1, events: Int16(POLLIN), revents: 0),
            pollfd(fd: mountEnded.raw ?? -1, events: Int16(POLLIN), revents: 0)
        ]
        while true {
            guard (try? valueOrErrno({ poll(&fds, 2, -1) })) != nil else { return false }
            if fds[0].revents != 0 {
                var info = signalfd_siginfo()
                _ = read(fds[0].fd, &info, MemoryLayout<signalfd_siginfo>.size)
                return true
            }
            if fds[1].revents != 0 {
                var count: UInt64 = 0
                _ = read(fds[1].fd, &count, 8)
                if isIdle() && requestsInFlight.withLock({ $0 == 0 }) { return true }
            }
        }
    }

    private func startServing(_ listener: BorrowedDescriptor) {
        if let thread = Threads.start({ [self] in acceptLoop(listener) }) { pthread_detach(thread) }
    }

    /// Accepts connections until the listener is closed, each served on a
    /// thread of its own. It never gives up on a passing error: out of
    /// descriptors (EMFILE, ENFILE), it sheds the connections still waiting
    /// for their request and goes on (a flood of idle connections had ended
    /// this loop for good: docs/SECURITY.md, "Service mode under attack"). It
    /// also keeps the connections' deadlines and, under a unit with
    /// `WatchdogSec=`, tells systemd it is alive: a wedged loop gets the
    /// service restarted.
    private func acceptLoop(_ listener: BorrowedDescriptor) {
        // One descriptor kept for the moment there is none left (the
        // accept(2) man page's advice on EMFILE): freed, it lets the loop
        // take the waiting peer instead of spinning on it.
        var reserve = FileDescriptor(Glibc.open("/dev/null", O_RDONLY | O_CLOEXEC))
        let watchdog = SystemdNotify.watchdogInterval()
        var lastPing = MonotonicClock.milliseconds(), lastShedLog: Int64 = 0
        while true {
            let now = MonotonicClock.milliseconds()
            if let watchdog, now - lastPing >= watchdog {
                SystemdNotify.send("WATCHDOG=1")
                lastPing = now
            }
            var timeout = connections.expire(now: now).map { $0 - now } ?? -1
            if let watchdog {
                // Until the next ping is due, not a whole interval from now:
                // a wake-up just short of it would otherwise put the ping
                // off to almost twice the interval, systemd's whole WatchdogSec.
                let untilPing = lastPing + watchdog - now
                timeout = timeout < 0 ? untilPing : min(timeout, untilPing)
            }
            var waiting = pollfd(fd: listener.raw, events: Int16(POLLIN), revents: 0)
            let ready: Int32
            do throws(Errno) {
                ready = try valueOrErrno { poll(&waiting, 1, Int32(clamping: timeout)) }
            } catch {
                // EBADF, EINVAL: the listener is gone. Anything else (ENOMEM)
                // passes: wait a little and go on, never stop for good.
                if error.rawValue == EBADF || error.rawValue == EINVAL { return }
                usleep(50_000)
                continue
            }
            if ready == 0 { continue }
            if waiting.revents & Int16(POLLNVAL) != 0 { return }
            let accepted: Int32
            do throws(Errno) {
                accepted = try valueOrErrno { CLinux_accept_cloexec(listener.raw) }
            } catch {
                switch error.rawValue {
                case EMFILE, ENFILE, ENOBUFS, ENOMEM:
                    shedForRoom(listener, reserve: &reserve, lastLog: &lastShedLog)
                case EBADF, EINVAL, ENOTSOCK:
                    return  // the listener is closed: the device is stopping
                default:
                    continue  // ECONNABORTED, EINTR, EAGAIN (another took it), EPROTO...
                }
                continue
            }
            // Not -1: accept(2) succeeded.
            serveOnItsOwnThread(FileDescriptor(accepted)!)
        }
    }

    /// Out of descriptors: idle connections (accepted, their request not
    /// come) are shut down to make room, and the reserve's place takes the
    /// waiting peer; with none to shed, that peer is told to try again.
    /// Takes `reserve` anew (nil until a descriptor is free again).
    private func shedForRoom(_ listener: BorrowedDescriptor, reserve: inout FileDescriptor?, lastLog: inout Int64) {
        reserve = nil  // closed: its place takes the waiting peer
        let shed = connections.shedIdle(olderThan: 100)
        let now = MonotonicClock.milliseconds()
        if now - lastLog >= 10_000 {
            Diagnostics.log("out of descriptors with \(connections.count) connections open: shed \(shed) idle ones")
            lastLog = now
        }
        if let connection = FileDescriptor(CLinux_accept_cloexec(listener.raw)) {
            if shed > 0 {
                serveOnItsOwnThread(connection)
            } else {
                refuse(connection, DeviceReply.systemError(EAGAIN, "the device is out of descriptors: try again"))
            }
        }
        // Nothing freed: wait a little rather than spin on the backlog.
        if shed == 0 { usleep(50_000) }
        reserve = FileDescriptor(Glibc.open("/dev/null", O_RDONLY | O_CLOEXEC))
    }

    private func serveOnItsOwnThread(_ connection: consuming FileDescriptor) {
        let client = connection.borrowed
        // A user over their share of connections is told so at once: the
        // socket's buffer takes a reply this small without blocking.
        guard let credentials = ProgramIdentities.peerCredentials(client) else {
            refuse(connection, .systemError(EPERM, "the device cannot tell who connected"))
            return
        }
        guard connections.admit(client, uid: credentials.uid) else {
            refuse(
                connection,
                .systemError(
                    EAGAIN,
                    "too many connections of your user at once "
                        + "(\(connections.perUser ?? 0)): close some, then try again"))
            return
        }
        // Each connection on a thread of its own, with deadlines: a peer
        // that connects and sends nothing (or reads nothing) must not
        // stall the mounts and unmounts of everyone else.
        var deadline = timeval(tv_sec: Int(Self.connectionDeadline), tv_usec: 0)
        _ = setsockopt(client.raw, SOL_SOCKET, SO_RCVTIMEO, &deadline, socklen_t(MemoryLayout<timeval>.size))
        _ = setsockopt(client.raw, SOL_SOCKET, SO_SNDTIMEO, &deadline, socklen_t(MemoryLayout<timeval>.size))
        requestsInFlight.withLock { $0 += 1 }
        // Handed to the serving thread as its number, which serve() owns
        // again: a closure cannot take an owner that is not copyable.
        let handed = connection.release()
        if let served = Threads.start({ [self] in
            _ = CLinux_name_thread(Self.connectionThreadName)
            serve(handed, from: credentials)
        }) {
            pthread_detach(served)
        } else {
            serve(handed, from: credentials)
        }
    }

    /// Answers `connection` (accepted and never served) and closes it.
    private func refuse(_ connection: consuming FileDescriptor, _ reply: DeviceReply) {
        if let frame = try? reply.frame() { _ = DeviceProtocol.send(frame, to: connection.borrowed) }
        _ = connection.close()
    }

    /// The name of the threads that serve a socket connection (`/proc/PID/task/TID/comm`).
    public static let connectionThreadName = "kcfs-connection"

    /// Seconds a peer may take to send its whole request, and to read the whole reply.
    static let connectionDeadline: Int64 = 5

    /// Why a reply was not sent: its frame found no locked memory.
    private let noMemoryForTheReply =
        "no locked memory is left for a reply this large now (others hold it); nothing was changed: try again later"

    /// Serves the connection `handed` (this thread's from then on) and closes it.
    private func serve(_ handed: Int32, from credentials: PeerCredentials) {
        let connection = FileDescriptor(handed)!  // not -1: accept(2) gave it
        let client = connection.borrowed
        var attachments = ReplyAttachments()
        let reply = answer(client, from: credentials, attachments: &attachments)
        connections.enter(.replying, client)
        // A large reply (a value of up to 1 MiB) is held in locked memory
        // until the peer has read it, or its deadline ends: it takes a place
        // in its person's share too. A user's connections that asked for a
        // large item and never read the reply, again every 5 s, kept every
        // other user's large values out of the service (an outsider's attack).
        // A reply whose frame finds no locked memory says so: its client
        // once read the end of the connection and said the device went away.
        var frame = (try? reply.frame()) ?? (try? DeviceReply.systemError(ENOMEM, noMemoryForTheReply).frame())
        var replyHolder: LockedMemoryShares.Place?
        if case .service = keychains, let large = frame, large.count > LockedMemoryShares.largeBody {
            replyHolder = largeRequests.take(for: credentials.uid)
            if replyHolder == nil { frame = try? DeviceReply.systemError(ENOMEM, largeRequests.takenSentence).frame() }
        }
        defer { if let replyHolder { largeRequests.release(replyHolder) } }
        if let frame, DeviceProtocol.send(frame, to: client, passing: attachments.descriptor.borrowed) {
            // A watcher is a client: the device stays while it follows.
            if let events = attachments.events {
                connections.enter(.following, client)
                events.run()
            }
        }
        attachments.descriptor = nil
        connections.remove(client)
        _ = connection.close()
        requestsInFlight.withLock { $0 -= 1 }
        Self.signal(mountEnded.borrowed)
    }

    /// Reads one request (its frame, which may hold passcodes, in secret
    /// memory) and has the peer's keychain carry it out. `credentials`
    /// are the peer's, as the kernel gave them when it was accepted.
    private func answer(
        _ client: BorrowedDescriptor, from credentials: PeerCredentials, attachments: inout ReplyAttachments
    )
        -> DeviceReply
    {
        if case .perUser = keychains, credentials.uid != getuid() {
            return .systemError(EPERM, "not the owner of this keychain")
        }
        // Who connected, read before its request arrives, when any group is
        // policed: the program that asks must be the one that connected (a
        // process that exec'd a granted binary in between is neither). Who
        // else holds the connection is not read here: a request's every
        // message must come from the process that connected (its
        // credentials, DeviceProtocol.receive), and the identity read to
        // answer a policed group checks the holders then, when it counts.
        let existing = keychain(of: credentials)
        let policedAtConnect = (try? existing.get())??.manager.localDevice.hasEntitlementPolicies ?? false
        let atConnect = policedAtConnect ? ProgramIdentities.ofPeer(client, checkingRelays: false) : nil
        // Ours to close, unless `attach` takes it.
        var passed: FileDescriptor?
        var refusedMemory = false
        // A large body's place, held until its request is answered (service mode).
        var largeHolder: LockedMemoryShares.Place?
        defer { if let largeHolder { largeRequests.release(largeHolder) } }
        var refusedShare = false
        guard
            let body = DeviceProtocol.receive(
                from: client, sentBy: credentials.pid, descriptor: &passed, refusedMemory: &refusedMemory,
                admittingLarge: { _ in
                    guard case .service = keychains else { return true }
                    largeHolder = largeRequests.take(for: credentials.uid)
                    refusedShare = largeHolder == nil
                    return !refusedShare
                })
        else {
            if refusedShare { return .systemError(ENOMEM, largeRequests.takenSentence) }
            if refusedMemory {
                return .systemError(
                    ENOMEM,
                    "no locked memory is left for a request this large now (others hold it); nothing was changed: "
                        + "try again in a moment")
            }
            return .systemError(
                EINVAL,
                "no whole request arrived within \(Self.connectionDeadline) s "
                    + "from the process that connected")
        }
        connections.enter(.answering, client)
        let request: DeviceRequest
        do {
            request = try body.withUnsafeBytes { (raw) throws(KeychainError) in try DeviceRequest(body: raw) }
        } catch .io {
            // Its value could not be given pinned memory (``SecretArena``): not the request's fault.
            return .systemError(
                ENOMEM,
                "no locked memory is left for a request this large now (others hold it); nothing was changed: "
                    + "try again in a moment")
        } catch {
            return .systemError(EINVAL, "malformed request (protocol version \(DeviceProtocol.version) expected)")
        }
        switch keychains {
        case .perUser(let keychain):
            switch request {
            case .process(.stop):
                // As SIGTERM: the main loop reads it from its signalfd (the
                // signal is blocked in every thread), unmounts and exits.
                kill(getpid(), SIGTERM)
                return Done().reply
            case .process(.create):
                return .keychainError(.duplicateKeychain, "this device's keychain exists already")
            case .tpm:
                return .systemError(EINVAL, "only the keychainfs service reaches the TPM for others")
            case .process(.serveBus(let address, let replace)):
                let reply = serveBus(keychain, address: address, replace: replace)
                recordLifecycle(
                    keychain, "serve-bus", reply == Done().reply ? "serves the session bus" : "refused",
                    by: ProgramIdentities.subject(ofPeer: client))
                return reply
            case .item, .device, .policy, .mount, .file, .process(.ping), .process(.watch), .sync:
                let reply = keychain.answer(
                    request, client: client, policedAtConnect: policedAtConnect, atConnect: atConnect,
                    passed: &passed, attachments: &attachments)
                // "last" tells the client to wait for the device's exit, which a headless device does not do.
                if case .mount(.unmount) = request, case .success(.last) = reply.outcome(UnmountOutcome.self),
                    headless.withLock({ $0 })
                {
                    return UnmountOutcome.othersRemain.reply
                }
                return reply
            }
        case .service(let all):
            return all.answer(
                request, from: credentials, existing: existing, client: client,
                policedAtConnect: policedAtConnect, atConnect: atConnect,
                passed: &passed, attachments: &attachments)
        }
    }

    /// The keychain a peer reaches (nil: it has none yet), opened on first
    /// use, or why it cannot be opened.
    private func keychain(of credentials: PeerCredentials) -> Result<ServedKeychain?, MountError> {
        switch keychains {
        case .perUser(let keychain): return .success(keychain)
        case .service(let all): return Result { () throws(MountError) in try all.keychain(of: credentials) }
        }
    }
}
