internal import CFuse
internal import CLinux
import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The one process that holds a keychain's keys and serves every FUSE
/// session of it (SPEC, "The device process"). Later `mount`s join it over
/// a UNIX socket; it exits when its last mount goes away, or on SIGTERM,
/// SIGINT or SIGHUP after unmounting everything.
public final class DeviceProcess: Sendable {
    /// The manager every mount of this keychain shares: one lock state.
    public let manager: PasswordManager
    /// Where later mounts reach this process.
    public let socketPath: String
    private let mounts = Mutex<[String: FuseMount]>([:])
    /// One inode table for every mount: a removal through one mount detaches
    /// the inode that a descriptor of another mount holds.
    private let nodes = NodeTable()
    /// Signalled whenever a mount's session ends or a request is answered.
    private let mountEnded: Int32
    /// Requests being answered: the process must not exit under one (an
    /// `unmount` of the last mount is answered after that mount has ended).
    private let requestsInFlight = Mutex(0)

    /// Boots the device of `keychain`: locked, before first unlock.
    public init(keychain: KeychainDirectory) throws(MountError) {
        do {
            manager = PasswordManager(device: try Device(directory: keychain))
        } catch {
            throw MountError(keychain.sentence(for: error))
        }
        do {
            socketPath = try RuntimePaths.socketPath(for: keychain.path)
        } catch {
            throw MountError(error.description)
        }
        mountEnded = eventfd(0, Int32(EFD_CLOEXEC))
    }

    // MARK: Mounts

    /// Whether some mount serves `group` as its root (which then cannot be removed).
    private func isGroupMounted(_ group: String) -> Bool {
        mounts.withLock { $0.values.contains { $0.fileSystem.scope == .group(group) } }
    }

    /// Mounts the keychain (or one of its groups) at `mountpoint`, an absolute path.
    public func mount(_ mountpoint: String, group: String?) throws(MountError) {
        if let problem = MountTable.emptyDirectoryProblem(mountpoint) { throw MountError(problem) }
        guard access("/dev/fuse", R_OK | W_OK) == 0 else {
            throw MountError("/dev/fuse is missing or not usable: load the fuse module (modprobe fuse)")
        }
        let fileSystem: FileSystem
        do {
            fileSystem = try FileSystem(manager: manager, group: group, nodes: nodes) { [weak self] candidate in
                self?.isGroupMounted(candidate) ?? false
            }
        } catch .itemNotFound {
            throw MountError("no access group \(group ?? "") in this keychain; create it with mkdir in a whole-keychain mount")
        } catch {
            throw MountError("cannot mount group \(group ?? ""): \(error)")
        }
        let ended = mountEnded
        let mount = try FuseMount(fileSystem: fileSystem, mountpoint: mountpoint) { [weak self] finished in
            _ = self?.mounts.withLock { $0.removeValue(forKey: finished.mountpoint) }
            var one: UInt64 = 1
            _ = write(ended, &one, 8)
        }
        mounts.withLock { $0[mountpoint] = mount }
    }

    /// Unmounts one of our mounts and waits until its session has ended.
    /// Returns whether it was the last one.
    func unmount(_ mountpoint: String) throws(Errno) -> Bool {
        guard let mount = mounts.withLock({ $0[mountpoint] }) else { throw Errno(ENOENT) }
        let result = mount.unmount(lazy: false)
        guard result == 0 else { throw Errno(result) }
        mount.join()
        return mounts.withLock { $0.isEmpty }
    }

    // MARK: Running

    /// Runs the device: mounts `mountpoint`, reports through `ready`, then
    /// serves until the last mount is gone or a signal asks it to stop.
    /// Returns the process exit status.
    public func run(mountpoint: String, group: String?, ready: (MountError?) -> Void) -> Int32 {
        // Last, once every session has ended: a cleanly stopped device leaves
        // the keychain as one file (no -wal beside it).
        defer { manager.localDevice.shutDown() }
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
        // with `&` by a shell inherits SIGINT as ignored (FIELD-NOTES).
        var stopping = sigset_t()
        sigemptyset(&stopping)
        for signal in [SIGTERM, SIGINT, SIGHUP] {
            Glibc.signal(signal, SIG_DFL)
            sigaddset(&stopping, signal)
        }
        Glibc.signal(SIGPIPE, SIG_IGN)
        pthread_sigmask(SIG_BLOCK, &stopping, nil)
        let signals = signalfd(-1, &stopping, Int32(SFD_CLOEXEC))

        // We hold the keychain's flock, so a socket file left there is stale.
        let listener: Int32
        do throws(Errno) {
            listener = try UnixSocket.listen(at: socketPath)
        } catch {
            ready(MountError("cannot listen on \(socketPath): \(error)"))
            return 1
        }
        defer {
            close(listener)
            unlink(socketPath)
        }
        do {
            try mount(mountpoint, group: group)
        } catch {
            ready(error)
            return 1
        }
        startServing(listener)
        ready(nil)

        var fds = [pollfd(fd: signals, events: Int16(POLLIN), revents: 0),
                   pollfd(fd: mountEnded, events: Int16(POLLIN), revents: 0)]
        while true {
            if poll(&fds, 2, -1) < 0 {
                if errno == EINTR { continue }
                break
            }
            if fds[0].revents != 0 {
                var info = signalfd_siginfo()
                _ = read(signals, &info, MemoryLayout<signalfd_siginfo>.size)
                stopAll()
                return 0
            }
            if fds[1].revents != 0 {
                var count: UInt64 = 0
                _ = read(mountEnded, &count, 8)
                if mounts.withLock({ $0.isEmpty }) && requestsInFlight.withLock({ $0 == 0 }) { return 0 }
            }
        }
        stopAll()
        return 1
    }

    /// Unmounts everything, lazily (open files must not keep the device
    /// alive after SIGTERM), and waits for every session to end.
    private func stopAll() {
        let all = mounts.withLock { Array($0.values) }
        // Readers of `.events` wait in a read: give them the end of the file first.
        for mount in all { mount.fileSystem.eventStreams.endAll() }
        for mount in all {
            let result = mount.unmount(lazy: true)
            if result != 0 { Diagnostics.log("could not unmount \(mount.mountpoint): errno \(result)") }
        }
        for mount in all { mount.join() }
    }

    private func startServing(_ listener: Int32) {
        if let thread = Threads.start({ [self] in acceptLoop(listener) }) { pthread_detach(thread) }
    }

    private func acceptLoop(_ listener: Int32) {
        while true {
            let client = accept(listener, nil, nil)
            if client < 0 {
                if errno == EINTR || errno == ECONNABORTED { continue }
                return
            }
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            // Each connection on a thread of its own, with a deadline: a peer
            // that connects and sends nothing (or reads nothing) must not
            // stall the mounts and unmounts of everyone else.
            var deadline = timeval(tv_sec: Self.connectionDeadline, tv_usec: 0)
            _ = setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &deadline, socklen_t(MemoryLayout<timeval>.size))
            _ = setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &deadline, socklen_t(MemoryLayout<timeval>.size))
            requestsInFlight.withLock { $0 += 1 }
            let served = Threads.start { [self] in serve(client) }
            if let served {
                pthread_detach(served)
            } else {
                serve(client)
            }
        }
    }

    /// Seconds a peer may take to send its request or read the reply.
    static let connectionDeadline = 5

    private func serve(_ client: Int32) {
        if let frame = try? answer(client).frame() { _ = DeviceProtocol.send(frame, to: client) }
        close(client)
        requestsInFlight.withLock { $0 -= 1 }
        var one: UInt64 = 1
        _ = write(mountEnded, &one, 8)
    }

    /// Reads one request (its frame, which may hold passcodes, in secret
    /// memory) and carries it out.
    private func answer(_ client: Int32) -> DeviceReply {
        guard let credentials = ProgramIdentities.peerCredentials(client), credentials.uid == getuid() else {
            return .systemError(EPERM, "not the owner of this keychain")
        }
        // Who connected, read before its request arrives, when any group is
        // policed: the program that asks must be the one that connected (a
        // process that exec'd a granted binary in between is neither).
        let policedAtConnect = manager.localDevice.hasEntitlementPolicies
        let atConnect = policedAtConnect ? ProgramIdentities.ofPeer(client) : nil
        guard let body = DeviceProtocol.receive(from: client, sentBy: credentials.pid) else {
            return .systemError(EINVAL, "no whole request arrived within \(Self.connectionDeadline) s "
                                + "from the process that connected")
        }
        let request: DeviceRequest
        do {
            request = try body.withUnsafeBytes { (raw) throws(KeychainError) in try DeviceRequest(body: raw) }
        } catch {
            return .systemError(EINVAL, "malformed request (protocol version \(DeviceProtocol.version) expected)")
        }
        switch request {
        case .ping:
            return .ok([])
        case .mount(let group, let mountpoint):
            do {
                try mount(mountpoint, group: group)
                return .ok([])
            } catch {
                return .systemError(EINVAL, error.description)
            }
        case .unmount(let mountpoint):
            do {
                return .ok(try unmount(mountpoint) ? ["last"] : [])
            } catch {
                let reason = error.rawValue == EBUSY ? "mount point is busy (files are open in it)"
                    : error.rawValue == ENOENT ? "not mounted by this device" : String(cString: strerror(error.rawValue))
                return .systemError(error.rawValue, reason)
            }
        case .changePasscode(let old, let new):
            do throws(KeychainError) {
                try manager.localDevice.changePasscode(from: old, to: new)
                return .ok([])
            } catch {
                return .keychainError(error, error.description)
            }
        case .backup(let path, let password, let policedGroups, let passcode):
            do throws(KeychainError) {
                let backup = try manager.backup(password: password, policedGroups: policedGroups, passcode: passcode,
                                                by: ProgramIdentities.subject(ofPeer: client))
                try BackupFile.save(backup.bytes, to: path)
                return .ok([String(backup.count)])
            } catch {
                return .keychainError(error, error.description)
            }
        case .grant, .revoke, .policy:
            return manager.localDevice.answer(policyRequest: request, by: ProgramIdentities.subject(ofPeer: client))
        case .get, .set, .remove, .list, .info, .setClass, .rename, .createGroup, .removeGroup,
             .lock, .unlock, .status, .sync:
            do throws(KeychainError) {
                // The peer is identified only when a group with a policy asks.
                let reply = try answerItemRequest(request, program: {
                    let now = ProgramIdentities.ofPeer(client)
                    return !policedAtConnect || now == atConnect ? now : nil
                }, subject: { ProgramIdentities.subject(ofPeer: client) })
                audit(request, result: "ok", client: client)
                return reply
            } catch {
                audit(request, result: AuditEvent.result(of: error), client: client)
                return .keychainError(error, error.description)
            }
        case .restore(let path, let password, let policy, let passcode):
            do throws(KeychainError) {
                let summary = try manager.restore(try BackupFile.load(from: path), password: password, policy: policy,
                                                  passcode: passcode, by: ProgramIdentities.subject(ofPeer: client))
                guard summary.applied else {
                    return .keychainError(.duplicateItem, RestoreSummary.conflictMessage(summary.conflicts))
                }
                return .ok([summary.added, summary.replaced, summary.unchanged, summary.kept].map(String.init))
            } catch {
                return .keychainError(error, error.description)
            }
        }
    }
}

extension DeviceProcess {
    /// Records an item request of a socket peer (lock, unlock and status are the device's own).
    fileprivate func audit(_ request: DeviceRequest, result: String, client: Int32) {
        guard let operation = request.auditOperation else { return }
        var group = request.group, identifier: String?, detail: String?
        switch request {
        case .createGroup(let name):
            group = name
        case .get(_, let id), .set(_, let id, _, _, _), .remove(_, let id), .info(_, let id), .setClass(_, let id, _):
            identifier = id
        case .rename(_, let from, let to, _):
            identifier = from
            detail = to
        default:
            break
        }
        manager.localDevice.audit.record(AuditEvent(operation: operation, result: result, group: group,
                                                    identifier: identifier, subject: ProgramIdentities.subject(ofPeer: client),
                                                    detail: detail))
    }

    /// The requests of a ``PasswordManager`` that is a client of this
    /// device (and of `keychainfs get/set/rm/ls`): the manager's own
    /// operations, with the filesystem's namespace rules (a removed or
    /// replaced item's inode is detached, writes are serialised with commits).
    fileprivate func answerItemRequest(_ request: DeviceRequest, program: () -> ProgramIdentity?,
                                       subject: () -> AuditSubject?) throws(KeychainError) -> DeviceReply {
        // As through a mount: a group's policy decides per program (the peer),
        // when the request has arrived and again just before the reply.
        if let group = request.group { try manager.localDevice.checkEntitlement(group, program: program) }
        let reply = try carryOut(request, subject: subject)
        if let group = request.group { try manager.localDevice.checkEntitlement(group, program: program) }
        return reply
    }

    private func carryOut(_ request: DeviceRequest, subject: () -> AuditSubject?) throws(KeychainError) -> DeviceReply {
        switch request {
        case .get(let group, let identifier):
            let item = try manager.item(forIdentifier: identifier, inGroup: group)
            return .value(item.value, item.protectionClass)
        case .set(let group, let identifier, let value, let protectionClass, let condition):
            try nodes.namespace.withLock { () throws(KeychainError) in
                _ = try manager.write(value, identifier: identifier, group: group,
                                  protectionClass: protectionClass ?? manager.classForNewWrites, condition: condition)
            }
        case .remove(let group, let identifier):
            try nodes.removeItem(group: group, identifier: identifier, manager: manager)
            nodes.forgetNames([.item(group: group, identifier: identifier)], except: nil)
        case .list(let group):
            guard let group else { return .ok(try manager.groups()) }
            return .ok(try manager.items(inGroup: group).flatMap { [$0.identifier, $0.info.protectionClass.name, String($0.info.size)] })
        case .info(let group, let identifier):
            guard let info = try manager.info(forIdentifier: identifier, inGroup: group) else { throw .itemNotFound }
            return .ok([info.protectionClass.name, String(info.size)])
        case .setClass(let group, let identifier, let protectionClass):
            try manager.setProtectionClass(protectionClass, forIdentifier: identifier, inGroup: group)
        case .rename(let group, let from, let to, let replacing):
            try nodes.renameItem(group: group, from: from, to: to, replacing: replacing, manager: manager)
            nodes.forgetNames([.item(group: group, identifier: from), .item(group: group, identifier: to)], except: nil)
        case .createGroup(let group):
            try manager.createGroup(group)
        case .removeGroup(let group):
            // As rmdir: not a group that a mount serves as its root.
            guard !isGroupMounted(group) else { throw .badRequest }
            try manager.removeGroup(group)
            nodes.forgetNames([.group(group)], except: nil)
        case .lock:
            manager.localDevice.lock(by: subject())
        case .unlock(let passcode):
            try manager.localDevice.unlock(passcode: passcode, by: subject())
        case .status:
            return .ok(try manager.status.fields)
        case .sync:
            try manager.sync()
        default:
            throw .param
        }
        return .ok([])
    }
}
