internal import CLinux
import KeychainCore
import KeychainProtocol
import KeychainTPM
import KeychainFS
import KeychainSync
import SecretService
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One keychain as the device process serves it: its manager (one lock
/// state), its mounts, and the answers to its owner's requests on the
/// socket. A per-user device serves one; the service serves one per user.
final class ServedKeychain: Sendable {
    /// The manager every mount of this keychain shares.
    let manager: PasswordManager
    /// Who the files of its mounts belong to: the keychain's user.
    let owner: (uid: uid_t, gid: gid_t)
    private let mounts = Mutex<[String: FuseMount]>([:])
    /// One inode table for every mount: a removal through one mount, the
    /// socket or the bus detaches the inode that a descriptor of any mount
    /// holds (the table follows the store's commits itself).
    private let nodes: NodeTable
    /// Called on a loop thread whenever one of its mounts has ended.
    private let mountEnded: @Sendable () -> Void
    /// What its user may hold of the service (nil: a per-user device's keychain).
    private let serviceLimits: ServiceLimits?
    /// Whether a restore of this keychain runs now: one at a time per
    /// person, so that one user's restores (each an Argon2id of up to
    /// 256 MiB, before the password is known to be right) cannot pile up
    /// in the service (docs/SECURITY.md, "What an ordinary user of the machine can try").
    private let restoring = Atomic<Bool>(false)
    /// Sync with the person's other devices: a per-user device's alone
    /// (git runs as the person), with its own schedule.
    let sync: KeychainSyncDoor?

    /// Boots the device of `keychain`: locked, before first unlock.
    init(
        keychain: KeychainDirectory, owner: (uid: uid_t, gid: gid_t), serviceLimits: ServiceLimits? = nil,
        mountEnded: @escaping @Sendable () -> Void
    ) throws(MountError) {
        do {
            manager = PasswordManager(device: try Device(directory: keychain))
        } catch {
            throw MountError(keychain.sentence(for: error))
        }
        nodes = NodeTable(following: manager.localDevice)
        self.owner = owner
        self.serviceLimits = serviceLimits
        if let quota = serviceLimits?.quota {
            do throws(KeychainError) {
                try manager.localDevice.setQuota(quota)
            } catch {
                throw MountError(keychain.sentence(for: error))
            }
        }
        self.mountEnded = mountEnded
        // A read-only keychain takes in no other machine's changes: its sync stays as it was.
        sync =
            serviceLimits == nil && !manager.localDevice.isReadOnly
            ? KeychainSyncDoor(manager: manager, keychainPath: keychain.path) : nil
    }

    var hasMounts: Bool { !mounts.withLock { $0.isEmpty } }

    // MARK: Mounts

    /// Whether some mount serves `group` as its root (which then cannot be removed).
    private func isGroupMounted(_ group: String) -> Bool {
        mounts.withLock { $0.values.contains { $0.fileSystem.scope == .group(group) } }
    }

    /// Mounts the keychain (or one of its groups) at `mountpoint`, an
    /// absolute path: the device mounts it itself, or, given `connection`,
    /// serves the `/dev/fuse` descriptor its user mounted there (and owns it).
    func mount(_ mountpoint: String, group: String?, connection: consuming FileDescriptor? = nil) throws(MountError) {
        // Ours (closed when the mount fails) until FuseMount takes it.
        if let passed = connection.borrowed, let problem = FuseConnection.problem(with: passed) {
            throw MountError(problem)
        }
        if let mountLimit = serviceLimits?.mountsPerUser, mounts.withLock({ $0.count }) >= mountLimit {
            throw MountError(
                "you have \(mountLimit) mounts of this keychain already, the most the service allows: "
                    + "unmount one first")
        }
        if connection.raw == nil {
            if let problem = MountTable.emptyDirectoryProblem(mountpoint) { throw MountError(problem) }
            guard access("/dev/fuse", R_OK | W_OK) == 0 else {
                throw MountError("/dev/fuse is missing or not usable: load the fuse module (modprobe fuse)")
            }
        }
        let fileSystem: FileSystem
        do {
            fileSystem = try FileSystem(manager: manager, group: group, nodes: nodes, owner: owner) {
                [weak self] candidate in
                self?.isGroupMounted(candidate) ?? false
            }
        } catch .itemNotFound {
            throw MountError(
                "no access group \(group ?? "") in this keychain; create it with mkdir in a whole-keychain mount")
        } catch {
            throw MountError("cannot mount group \(group ?? ""): \(error)")
        }
        let ended = mountEnded
        // FuseMount owns it from here, on failure too.
        let mount = try FuseMount(fileSystem: fileSystem, mountpoint: mountpoint, connection: connection.take()) {
            [weak self] finished in
            _ = self?.mounts.withLock { mounts in
                // A later mount at the same place (after a dead one) is not this one.
                if mounts[finished.mountpoint] === finished { mounts.removeValue(forKey: finished.mountpoint) }
            }
            ended()
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

    /// Unmounts everything, lazily (open files must not keep the device
    /// alive after SIGTERM), and waits for every session to end.
    func unmountAll() {
        let all = mounts.withLock { Array($0.values) }
        // Readers of `.events` wait in a read: give them the end of the file first.
        for mount in all { mount.fileSystem.eventStreams.endAll() }
        for mount in all {
            let result = mount.unmount(lazy: true)
            if result != 0 {
                Diagnostics.log("could not unmount \(mount.mountpoint): Errno.current.rawValue \(result)")
            }
        }
        for mount in all { mount.join() }
    }

    /// Ends every `.events` stream: the service stops, and its mounts'
    /// connections close with the process (their users unmount them).
    func endEventStreams() {
        for mount in mounts.withLock({ Array($0.values) }) { mount.fileSystem.eventStreams.endAll() }
    }

    // MARK: Requests

    /// Carries out one request of the keychain's owner, who connected on
    /// `client` (checked by the caller): each group of requests has its
    /// handler. `passed` is the descriptor that came with it, the caller's
    /// to close unless `attach` takes it (and sets it nil). A descriptor for
    /// the reply, or the events that follow it, go to `attachments`.
    func answer(
        _ request: DeviceRequest, client: BorrowedDescriptor, policedAtConnect: Bool, atConnect: ProgramIdentity?,
        passed: inout FileDescriptor?, attachments: inout ReplyAttachments
    ) -> DeviceReply {
        let subject = { ProgramIdentities.subject(ofPeer: client) }
        switch request {
        case .item(let item):
            // The peer is identified only when a group with a policy asks.
            let program = { () -> ProgramIdentity? in
                guard var now = ProgramIdentities.ofPeer(client) else { return nil }
                if policedAtConnect, now.distrust == nil, now != atConnect {
                    now.distrust = "it runs another program than the one that connected"
                }
                return now
            }
            // Whose an item is, is the Secret Service's to record, for the
            // program that made it over the bus: a client of the socket
            // names no owner (it could plant an item for another program).
            return answerAudited(
                item.withoutOwner, program: program, subject: subject,
                consent: ConsentCaller(
                    program: program, subject: subject, waiting: { ClientPresence.socketOpen(client) }),
                auditOK: true
            ).reply
        case .device(let state):
            return answer(state, subject: subject).reply
        case .policy(let policy):
            // The service's account opens no path on a user's word: it could
            // hash, or tell the existence of, what only it can read
            // (docs/SECURITY.md, "Service mode under attack").
            return manager.localDevice.answer(
                policyRequest: policy, by: subject(), executable: passed.borrowed,
                opensPaths: serviceLimits == nil
            ).reply
        case .mount(let mountRequest):
            return answer(mountRequest, passed: &passed)
        case .file(let file):
            return answer(file, client: client, passed: passed.borrowed, attachments: &attachments)
        case .process(let process):
            return answer(process, client: client, attachments: &attachments)
        case .tpm:
            // The service's broker answers these, before any keychain is looked up.
            return .systemError(EINVAL, "the TPM's requests are the service's, not a keychain's")
        case .sync(let request):
            guard let sync else {
                if manager.localDevice.isReadOnly {
                    return DeviceAnswer.failure(.keychain(.readOnly, sentence(for: .readOnly))).reply
                }
                return .systemError(EPERM, "the keychainfs service does not sync (docs/SYNC.md)")
            }
            return sync.answer(request).reply
        }
    }

    /// The device's lock and settings (``PasswordManager/answer(_:by:status:)``),
    /// with the status as the mount it is asked through shows it.
    func answer(_ request: DeviceStateRequest, subject: () -> AuditSubject?) -> DeviceAnswer {
        do throws(KeychainError) {
            return .success(
                try manager.answer(request, by: subject) { mountpoint in
                    // As the mount shows it (its group), when it is one of ours.
                    let group = mountpoint.flatMap { path in mounts.withLock { $0[path] }?.fileSystem.scope.group }
                    return manager.servedStatus(mode: ServingFacts.Mode(servingKeychainOf: owner.uid), group: group)
                })
        } catch {
            return .failure(.keychain(error, sentence(for: error)))
        }
    }

    /// Mounts: made by the device, or (`attach`) made by its user and passed.
    private func answer(_ request: MountRequest, passed: inout FileDescriptor?) -> DeviceReply {
        switch request {
        case .mount(let group, let mountpoint), .attach(let group, let mountpoint):
            if case .attach = request, passed.raw == nil {
                return .systemError(EINVAL, "no FUSE connection came with the request")
            }
            do {
                // The mount owns it from here, and closes it if it fails.
                try mount(mountpoint, group: group, connection: passed.take())
                return Done().reply
            } catch {
                return .systemError(EINVAL, error.description)
            }
        case .unmount(let mountpoint):
            do {
                return (try unmount(mountpoint) ? UnmountOutcome.last : .othersRemain).reply
            } catch {
                let reason =
                    error.rawValue == EBUSY
                    ? "mount point is busy (files are open in it)"
                    : error.rawValue == ENOENT
                        ? "not mounted by this device" : String(cString: strerror(error.rawValue))
                return .systemError(error.rawValue, reason)
            }
        }
    }

    /// Backups, whose file comes with the request, and the audit log, which goes with the reply.
    private func answer(
        _ request: FileRequest, client: BorrowedDescriptor, passed: BorrowedDescriptor?,
        attachments: inout ReplyAttachments
    ) -> DeviceReply {
        let subject = { ProgramIdentities.subject(ofPeer: client) }
        switch request {
        case .backup(let path, let password, let policedGroups, let passcode):
            guard let file = passed else { return .systemError(EINVAL, "no backup file came with the request") }
            // A backup holds a value at a time in secret memory (up to a
            // large slot, and the cache of the last access): in the service,
            // a large place of its person's share while it runs, so that one
            // user's backups side by side cannot take every other user's
            // locked memory (an outsider's attack).
            let shares = LockedMemoryShares.serving.withLock { $0 }
            let place = shares?.take(for: owner.uid)
            if let shares, place == nil { return .systemError(ENOMEM, shares.takenSentence) }
            defer { if let place { shares?.release(place) } }
            do throws(KeychainError) {
                let backup = try manager.backup(
                    password: password, policedGroups: policedGroups, passcode: passcode,
                    by: subject(), consent: peerConsent(client))
                try BackupFile.write(backup.bytes, to: file, name: path)
                return ReplyCount(backup.count).reply
            } catch {
                return .keychainError(error, sentence(for: error, about: .file(request)))
            }
        case .restore(let path, let password, let policy, let passcode):
            guard let file = passed else { return .systemError(EINVAL, "no backup file came with the request") }
            guard restoring.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
            else {
                return .keychainError(
                    .badRequest, "another restore into this keychain is running; run this one when it has ended")
            }
            defer { restoring.store(false, ordering: .releasing) }
            do throws(KeychainError) {
                let copy = try BackupFileCopy(
                    of: file, name: path, in: manager.localDevice.directory.path,
                    limit: serviceLimits?.restoreBytes)
                // Hashing for a client that hung up stops while it waits for room.
                let summary = try PasswordHashingBudget.forClient({ ClientPresence.socketOpen(client) }) {
                    () throws(KeychainError) in
                    try manager.restore(
                        copy, password: password,
                        policy: policy, passcode: passcode, by: subject(), consent: peerConsent(client))
                }
                guard summary.applied else {
                    return .keychainError(.duplicateItem, RestoreSummary.conflictMessage(summary.conflicts))
                }
                return summary.reply
            } catch {
                return .keychainError(error, sentence(for: error, about: .file(request)))
            }
        case .auditLog(let rotated):
            let name = rotated ? AuditLog.rotatedName : AuditLog.fileName
            guard
                let fd = FileDescriptor(
                    open(manager.localDevice.directory.path + "/" + name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW))
            else {
                return Errno.current.rawValue == ENOENT
                    ? AuditLogFile.absent.reply
                    : .systemError(Errno.current.rawValue, "cannot open the audit log: \(Errno.current.description)")
            }
            attachments.descriptor = .some(consume fd)
            return AuditLogFile.attached.reply
        case .verifyLog:
            do {
                let report = try AuditLog.verify(directory: manager.localDevice.directory)
                return report.reply
            } catch {
                return .systemError(EIO, "cannot verify the audit log: \(error)")
            }
        }
    }

    /// The device process itself, as the keychain sees it (a per-user
    /// device answers `stop`, `create` and `serveBus` before this).
    private func answer(
        _ request: ProcessRequest, client: BorrowedDescriptor, attachments: inout ReplyAttachments
    ) -> DeviceReply {
        switch request {
        case .ping:
            return Done().reply
        case .stop:
            return .systemError(EINVAL, "only a per-user device stops on request")
        case .serveBus:
            return .systemError(
                EINVAL,
                "the keychainfs service serves no session bus: --secret-service needs a per-user device (--keychain DIR)"
            )
        case .create:
            return .keychainError(.duplicateKeychain, "a keychain already exists for this user")
        case .watch:
            guard
                let stream = SocketEventStream(
                    client: client, device: manager.localDevice,
                    reader: ProgramIdentities.ofPeer(client))
            else {
                return .systemError(Errno.current.rawValue, "cannot follow the events: \(Errno.current.description)")
            }
            attachments.events = stream
            return Done().reply
        }
    }
}

extension ServedKeychain {
    /// The peer of `client` as the owner rule asks about it.
    func peerConsent(_ client: BorrowedDescriptor) -> ConsentCaller {
        ConsentCaller(
            program: { ProgramIdentities.ofPeer(client) }, subject: { ProgramIdentities.subject(ofPeer: client) },
            waiting: { ClientPresence.socketOpen(client) })
    }

    /// A core error in a sentence for the keychain's user: a quota says
    /// what it is and what is used of it.
    func sentence(for error: KeychainError, about request: DeviceRequest? = nil) -> String {
        if error == .ownerDenied, case .file(.backup)? = request {
            return "the keychain holds items other programs own, and the person did not allow this program to "
                + "back them up (or could not be asked): no backup was written"
        }
        if error == .ownerDenied, case .file(.restore)? = request {
            return "the backup would replace items other programs own, and the person did not allow this program "
                + "to (or could not be asked): nothing was restored"
        }
        if error == .ownerDenied, let item = request?.item, let group = item.group,
            let identifier = item.ownedIdentifiers.first,
            let owner = (try? manager.details(forIdentifier: identifier, inGroup: group))?.owner
        {
            return ItemConsent.deniedSentence(item: group + "/" + identifier, owner: owner)
        }
        if error == .diskFull {
            return "no space left on the device holding \(manager.localDevice.directory.path): free some space "
                + "there; nothing was changed"
        }
        guard error == .quotaExceeded, let limits = serviceLimits else { return error.description }
        let use = manager.localDevice.quotaUse
        let mebibytes = { (bytes: Int) -> String in
            let tenths = bytes * 10 / (1 << 20)
            return "\(tenths / 10).\(tenths % 10)"
        }
        return
            "your keychain in the service may hold \(limits.quota.items) items and \(mebibytes(limits.quota.bytes)) MiB "
            + "(it holds \(use?.items ?? 0) items, \(mebibytes(use?.bytes ?? 0)) MiB), and restore a backup of "
            + "\(mebibytes(limits.restoreBytes)) MiB at most: remove some items first, or restore a smaller backup"
    }

    /// Records an item request of a socket peer (lock, unlock and status are the device's own).
    /// `doubt`: why a program a rule names was refused all the same, when that was the reason.
    func audit(_ request: ItemRequest, result: String, subject: AuditSubject?, doubt: String? = nil) {
        guard let operation = request.auditOperation else { return }
        var group = request.group, detail: String?
        if case .createGroup(let name) = request { group = name }
        // A rename names where the item went.
        if case .rename(_, _, let to, _) = request { detail = to }
        manager.localDevice.audit.record(
            AuditEvent(
                operation: operation, result: result, group: group,
                identifier: request.identifier, subject: subject, detail: detail ?? doubt))
    }

    private func carryOut(_ request: ItemRequest) throws(KeychainError) -> any DeviceResult {
        switch request {
        case .get(let group, let identifier):
            let item = try manager.item(forIdentifier: identifier, inGroup: group)
            return ItemValue(value: item.value, protectionClass: item.protectionClass)
        case .set(let group, let identifier, let value, let protectionClass, let condition, let details):
            try manager.write(
                value, identifier: identifier, group: group,
                protectionClass: protectionClass ?? manager.classForNewWrites, condition: condition, details: details)
        case .details(let group, let identifier):
            let found: [(identifier: String, details: ItemDetails)]
            if let identifier {
                found = try manager.details(forIdentifier: identifier, inGroup: group).map { [(identifier, $0)] } ?? []
            } else {
                found = try manager.itemsWithDetails(inGroup: group)
            }
            return DetailsList(found)
        case .setDetails(let group, let identifier, let details):
            try manager.setDetails(details, forIdentifier: identifier, inGroup: group)
        case .remove(let group, let identifier):
            try manager.deleteKey(forIdentifier: identifier, inGroup: group)
        case .list(let group):
            guard let group else { return GroupList(try manager.groups()) }
            return ItemList(
                try manager.items(inGroup: group).map { ItemListing(identifier: $0.identifier, info: $0.info) })
        case .info(let group, let identifier):
            guard let info = try manager.info(forIdentifier: identifier, inGroup: group) else { throw .itemNotFound }
            return info
        case .setClass(let group, let identifier, let protectionClass):
            try manager.setProtectionClass(protectionClass, forIdentifier: identifier, inGroup: group)
        case .rename(let group, let from, let to, let replacing):
            try manager.renameKey(forIdentifier: from, to: to, inGroup: group, replacing: replacing)
        case .createGroup(let group):
            try manager.createGroup(group)
        case .removeGroup(let group):
            // As rmdir: not a group that a mount serves as its root.
            guard !isGroupMounted(group) else { throw .badRequest }
            try manager.removeGroup(group)
        }
        return Done()
    }
}

/// The Secret Service's requests are the device's, as the socket's are.
extension ServedKeychain: SecretStore {
    var isLocked: Bool { manager.localDevice.isLocked }
    func isAvailable(_ protectionClass: ProtectionClass) -> Bool { manager.localDevice.isAvailable(protectionClass) }
    func appsOwnItems(inGroup group: String) -> Bool { manager.localDevice.appsOwnItems(inGroup: group) }
    func policedGroups(admitting program: () -> ProgramIdentity?) -> Set<String> {
        manager.localDevice.policedGroups(admitting: program)
    }
    /// The provider's state, and an audit line each time the bus name is
    /// gained, lost to another program or released (who answers on the bus is
    /// part of who decides: docs/SECRET-SERVICE.md, "The device's judge").
    func setSecretServiceState(_ state: String?) {
        let device = manager.localDevice
        let before = device.secretServiceState
        device.secretServiceState = state
        let detail: String?
        switch (before, state) {
        case (let old, let new?) where old != new:
            detail = new.hasPrefix("lost: ") ? "lost \(SecretServiceProvider.busName) to another program" : new
        case (_?, nil):
            detail = "released \(SecretServiceProvider.busName)"
        default:
            detail = nil
        }
        guard let detail else { return }
        device.audit.record(
            AuditEvent(
                operation: "bus-name", result: "ok",
                subject: ProgramIdentities.subject(process: getpid(), uid: getuid()),
                detail: detail))
    }
    func addObserver(_ handler: @escaping @Sendable (DeviceEvent) -> Void) -> Int {
        manager.localDevice.addObserver(handler)
    }
    func removeObserver(_ token: Int) { manager.localDevice.removeObserver(token) }
    func answer(_ question: ConsentQuestion) -> ItemConsent.Answer { manager.answer(question) }
    func record(_ operation: String, result: String, subject: AuditSubject?, detail: String) {
        manager.localDevice.audit.record(
            AuditEvent(operation: operation, result: result, subject: subject, detail: detail))
    }
    func collectionLabels() -> [String: String] { manager.localDevice.directory.collectionLabels() }
    func setCollectionLabel(_ label: String?, of group: String) throws(KeychainError) {
        try manager.localDevice.directory.setCollectionLabel(label, of: group)
    }

    func noteMaker(ofUnidentified identifier: String, inGroup group: String, pid: pid_t) {
        manager.localDevice.noteMaker(ofUnidentified: identifier, inGroup: group, pid: pid)
    }

    func isMaker(_ pid: pid_t, of identifier: String, inGroup group: String) -> Bool {
        manager.localDevice.isMaker(pid, of: identifier, inGroup: group)
    }

    func itemNames() -> [String: [String]] {
        var names: [String: [String]] = [:]
        for group in (try? manager.groups()) ?? [] {
            names[group] = ((try? manager.items(inGroup: group)) ?? []).map(\.identifier)
        }
        return names
    }

    func perform<Result: DeviceResult>(
        _ call: DeviceCall<Result>, program: () -> ProgramIdentity?, subject: () -> AuditSubject?,
        audit policy: AuditPolicy
    ) -> DeviceOutcome<Result> {
        // The answer itself, never its fields: the provider is in this process.
        let answer: DeviceAnswer
        switch call.request {
        case .item(let item):
            answer = withoutActuallyEscaping(program) { program in
                withoutActuallyEscaping(subject) { subject in
                    answerAudited(item, program: program, subject: subject, consent: nil, auditOK: policy == .always)
                }
            }
        case .device(let state):
            answer = self.answer(state, subject: subject)
        // Nothing the provider asks: its calls are an item's or the lock's.
        case .policy, .mount, .file, .process, .tpm, .sync:
            answer = .failure(.keychain(.param, "not a request of the Secret Service"))
        }
        return answer.outcome(of: call)
    }
}

extension ServedKeychain {
    /// Answers an item request under the caller policy, which records it
    /// (``PasswordManager/policed(_:group:items:verb:recordingSuccess:_:)``):
    /// always when refused, when done only if `auditOK`. `consent` nil:
    /// no question (the Secret Service asked the person already). The
    /// requests of a ``PasswordManager`` that is a client of this device
    /// (and of `keychainfs get/set/rm/ls`) are the manager's own
    /// operations, with the filesystem's namespace rules (a removed or
    /// replaced item's inode is detached, writes are serialised with commits).
    func answerAudited(
        _ request: ItemRequest, program: @escaping () -> ProgramIdentity?, subject: @escaping () -> AuditSubject?,
        consent: ConsentCaller?, auditOK: Bool
    ) -> DeviceAnswer {
        let caller = PolicyCaller(program: program, consent: consent) { [self] result, doubt in
            audit(request, result: result, subject: subject(), doubt: doubt)
        }
        do throws(KeychainError) {
            return .success(
                try manager.policed(
                    caller, group: request.group, items: request.ownedIdentifiers, verb: request.consentVerb,
                    recordingSuccess: auditOK
                ) { () throws(KeychainError) in try carryOut(request) })
        } catch {
            return .failure(.keychain(error, sentence(for: error, about: .item(request))))
        }
    }
}
