import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The simulated device of one keychain: the lock state machine and the class
/// keys. It boots locked and before first unlock; only the `always` keys are
/// in memory until a passcode unwraps the others. Locking drops the
/// `whenUnlocked` keys, so availability is the presence of a key, not a flag.
///
/// One Device per keychain at a time, across processes: it holds an exclusive
/// `flock` on the keychain's lock file until it is deinitialised.
public final class Device: Sendable {
    /// The keychain's files.
    public let directory: KeychainDirectory
    let store: ItemStore
    let secret: DeviceSecret
    private let secretService = Mutex<String?>(nil)
    /// Holds the keychain's `flock`: closed with the device, which frees the keychain.
    let lockFile: FileDescriptor
    /// The keychain's files cannot be written: it is read, every change is
    /// refused with ``KeychainError/readOnly``, and wrong passcodes are
    /// counted in memory (docs/FILESYSTEM.md, "A read-only keychain").
    public var isReadOnly: Bool { store.isReadOnly }
    /// A read-only keychain's lockout record, kept here since it cannot be saved (nil: the stored one holds).
    let unsavedLockout = Mutex<LockoutRecord?>(nil)
    /// The process that made each item no program could be identified for
    /// (``ItemMakers``), by `group NUL identifier`, while the device runs.
    let unidentifiedMakers = Mutex<[String: DevicePeerAdmission.Process]>([:])
    let policy: LockoutPolicy
    let clock: @Sendable () -> Int64
    /// The wrapped class keys; a passcode change replaces it.
    let currentKeybag: Mutex<Keybag>
    var keybag: Keybag { currentKeybag.withLock { $0 } }
    /// Every item access, denial, lock, unlock, grant and revoke.
    public let audit: AuditLog
    /// The groups' entitlement policies, as last stored.
    let entitlements: Mutex<EntitlementPolicy>

    struct State {
        var keys: [ProtectionClass: GuardedKey] = [:]
        var isLocked = true
        var hasUnlockedSinceBoot = false
        /// Bumped on every lock, so that work begun before a lock can tell.
        var epoch: UInt64 = 0
        var observers: [Int: @Sendable (DeviceEvent) -> Void] = [:]
        var nextObserver = 0
    }
    let state = Mutex(State())
    /// ``addCommitObserver(_:)``'s, by token.
    private let commitObservers = Mutex<[(token: Int, handler: @Sendable (ItemChange) -> Void)]>([])
    /// Auto-lock: seconds without an item access before the device locks
    /// (0: never) and the grace between `will-lock` and the lock.
    let autoLockSettings = Mutex<(after: Int, grace: Int)>((0, 10))
    /// When an item was last read or written (or the device unlocked), monotonic ms.
    let lastAccess = Atomic<Int64>(0)
    /// Started with the first auto-lock setting; woken when the settings or the lock state change.
    let autoLockThread = Mutex<WakeableThread?>(nil)
    /// Bumped by every session lock and its cancel: a pending lock is made only if it is still the latest.
    let sessionLockGeneration = Atomic<UInt64>(0)
    /// Held across one unlock attempt: the lockout check, the derivation and
    /// the record of its outcome are one step, so concurrent attempts cannot
    /// all pass the check before any failure is counted.
    let unlockAttempt = Mutex(())
    /// Where this device finds a TPM (the one that seals its keys, one to
    /// move them to), as whoever built it handed in (``KeyProtectors``).
    let keyProtectors: any KeyProtectors
    /// The TPM that seals the keychain's keys (nil: kept in a file).
    let sealingTPM = Mutex<(any KeyProtector)?>(nil)
    /// The rollback counter (nil: none).
    let rollbackCounter = Mutex<CounterReference?>(nil)
    /// Whether the TPM's counter is at the keychain's epoch, as the boot's
    /// check and each bump's increment left it (a bump reads it only when not).
    let counterMatchesEpoch = Atomic<Bool>(true)
    /// The first and the last write not yet bound to the rollback counter,
    /// monotonic ms (nil: none), and the thread that binds them
    /// (``noteWriteForRollback()``).
    let unboundWrites = Mutex<(first: Int64, last: Int64)?>(nil)
    let rollbackThread = Mutex<WakeableThread?>(nil)
    /// Held across a write of a record bound to the rollback counter
    /// (policy, audit anchor, keybag, lockout) and across a bump, which
    /// rebinds them: a record MACed for the old epoch never lands after the
    /// bump, and one read is checked against the epoch it was written for.
    let boundWrites = Mutex(())

    /// Boots the device of an existing keychain: locked, before first unlock.
    /// - Parameters:
    ///   - policy: lockout delays after wrong passcodes.
    ///   - clock: wall-clock seconds; the lockout deadline is persisted in it,
    ///     so that restarting the process does not reset it.
    ///   - tcti: the TPM of a TPM-sealed keychain (nil: the machine's, ``KeyProtection/machineTCTI``).
    ///   - keyProtectors: where a TPM is found (the KeychainTPM target's, as
    ///     its `Device(directory:policy:clock:tcti:)` hands in).
    package init(
        directory: KeychainDirectory, policy: LockoutPolicy = .iOS,
        clock: @escaping @Sendable () -> Int64 = { Int64(time(nil)) },
        tcti: String? = KeyProtection.configuredTCTI, keyProtectors: any KeyProtectors
    ) throws(KeychainError) {
        Sodium.ensureInitialized()
        guard directory.exists else { throw .noSuchKeychain }
        if let problem = directory.permissionProblem() {
            Diagnostics.log(problem)
            throw .insecurePermissions
        }
        let readOnly = directory.isReadOnly
        let lock = try Self.takeKeychainLock(directory, readOnly: readOnly)
        // A move to the TPM interrupted before or after its exchange
        // (docs/FORMAT.md, "Keys sealed by a TPM").
        if !readOnly { Self.destroyLeftover(of: directory) }
        // The device secret unsealed and the counter read in one TPM session.
        let (secret, store, tpm, counter) = try keyProtectors.sharingSession(tcti: tcti) {
            () throws(KeychainError) in
            let (secret, sealedBy) = try directory.openDeviceSecret(tcti: tcti, keyProtectors: keyProtectors)
            let store = try ItemStore(
                path: directory.databasePath, create: false, state: ItemSetState(secret: secret), readOnly: readOnly)
            let (tpm, counter) = try Self.checkRollback(
                directory, store: store, secret: secret, sealedBy: sealedBy, tcti: tcti, keyProtectors: keyProtectors)
            return (secret, store, tpm, counter)
        }
        let records = try BootRecords(store: store, secret: secret)
        audit = try AuditLog(
            directory: directory, key: secret.auditKey, anchor: records.auditAnchor, discarding: readOnly)
        var keys: [ProtectionClass: GuardedKey] = [:]
        for protectionClass in ProtectionClass.allCases where protectionClass.mode == .always {
            keys[protectionClass] = try records.keybag.unwrap(protectionClass, secret: secret, passcodeKey: nil)
        }
        self.store = store
        self.secret = secret
        self.currentKeybag = Mutex(records.keybag)
        self.entitlements = Mutex(records.entitlements)
        self.directory = directory
        self.lockFile = lock
        self.policy = policy
        self.clock = clock
        self.keyProtectors = keyProtectors
        state.withLock { $0.keys = keys }
        store.binding.withLock { $0.state = records.keybag.isPasscodeBound ? .awaitingKey : .none }
        sealingTPM.withLock { $0 = tpm }
        if let counter { rollbackCounter.withLock { $0 = counter } }
        store.onChange { [weak self] change in
            self?.forgetMaker(after: change)
            self?.notify(.changed(change))
            self?.noteWriteForRollback()
        }
        store.onCommit { [weak self] change in self?.notifyAtCommit(change) }
        // Reading it now reports a tampered lockout record at boot.
        _ = try lockoutRecord()
        if readOnly {
            Diagnostics.log(
                "the keychain at \(directory.path) cannot be written: it is read, every change is refused, "
                    + "and the audit log records nothing")
            return
        }
        try store.startWriteAheadLog()
        directory.keepSpaceReserve()
    }

    /// One device per keychain across processes: an exclusive `flock` on
    /// its lock file, held until the device is deinitialised.
    /// flock(2) needs no write permission: a read-only keychain is held the same way.
    static func takeKeychainLock(_ directory: KeychainDirectory, readOnly: Bool = false) throws(KeychainError)
        -> FileDescriptor
    {
        let mode = readOnly ? O_RDONLY : O_RDWR | O_CREAT
        guard let fd = FileDescriptor(open(directory.lockFilePath, mode | O_CLOEXEC, 0o600)) else {
            throw fileFailure("open", directory.lockFilePath)
        }
        guard flock(fd.raw, LOCK_EX | LOCK_NB) == 0 else { throw .keychainInUse }
        return fd
    }

    // MARK: Status

    /// The current lock state and lockout.
    public var status: DeviceStatus {
        let record = (try? lockoutRecord()) ?? LockoutRecord()
        let (after, grace) = autoLock
        return state.withLock { state in
            DeviceStatus(
                isLocked: state.isLocked, hasUnlockedSinceBoot: state.hasUnlockedSinceBoot,
                retryAfter: max(0, record.deadline - clock()), failedAttempts: record.failures,
                hasPasscode: keybag.hasPasscode, autoLockAfter: after, autoLockGrace: grace)
        }
    }

    /// Whether the `whenUnlocked` keys are absent.
    public var isLocked: Bool { state.withLock { $0.isLocked } }

    // MARK: Lock and unlock

    /// Unlocks with `passcode` (nil for a keychain without one).
    /// Throws ``KeychainError/authFailed`` for a wrong passcode and, without
    /// trying the passcode, while a lockout from earlier failures lasts.
    /// `subject` is who asked, for the audit log.
    public func unlock(passcode: SecureBytes?, by subject: AuditSubject? = nil) throws(KeychainError) {
        try audited("unlock", by: subject) { () throws(KeychainError) in try unlockKeys(passcode: passcode) }
        notify(.unlocked)
    }

    func unlockKeys(passcode: SecureBytes?) throws(KeychainError) {
        try passcodeAttempt(
            { () throws(KeychainError) in try unwrapPasscodeClasses(passcode) },
            then: { (unwrapped) throws(KeychainError) in
                try keyPasscodeBinding(classKeys: unwrapped, passcode: passcode)
                state.withLock { state in
                    state.keys.merge(unwrapped) { _, new in new }
                    state.isLocked = false
                    state.hasUnlockedSinceBoot = true
                }
            })
        noteAccess()
        wakeAutoLock()
    }

    /// Locks: drops the `whenUnlocked` class keys (the `afterFirstUnlock`
    /// keys stay until the process ends, as on iOS).
    public func lock(by subject: AuditSubject? = nil) {
        // `lock` has no grace: the notice comes right before the lock.
        notify(.willLock(grace: 0))
        lockNow(by: subject, detail: nil)
    }

    func lockNow(by subject: AuditSubject?, detail: String?) {
        audit.record(AuditEvent(operation: "lock", result: "ok", subject: subject, detail: detail))
        saveAuditAnchor()
        bumpRollbackCounter("lock")
        state.withLock { state in
            for protectionClass in ProtectionClass.allCases where protectionClass.mode == .whenUnlocked {
                state.keys[protectionClass] = nil
            }
            state.isLocked = true
            state.epoch &+= 1
        }
        notify(.locked)
    }

    // MARK: Observers

    /// Calls `handler` after every lock and unlock and after every committed
    /// change of the store (on the thread that made it, which may hold the
    /// caller's locks: a handler must not wait for other requests); returns
    /// a token for ``removeObserver(_:)``.
    @discardableResult
    public func addObserver(_ handler: @escaping @Sendable (DeviceEvent) -> Void) -> Int {
        state.withLock { state in
            state.nextObserver += 1
            state.observers[state.nextObserver] = handler
            return state.nextObserver
        }
    }

    /// Stops calling an observer.
    public func removeObserver(_ token: Int) {
        _ = state.withLock { $0.observers.removeValue(forKey: token) }
    }

    /// Calls `handler` with every change of the store as it commits, inside
    /// the store's write section (no other change commits until it returns),
    /// whoever made it: a mount, the socket, the bus, this library. For what
    /// must agree with the store at every instant (which inode a name holds:
    /// a descriptor of a removed item must never reach an item made later
    /// under its name). It runs under the store's lock: it may only update
    /// memory of its own, never call the store or the kernel, nor wait.
    package func addCommitObserver(_ handler: @escaping @Sendable (ItemChange) -> Void) -> Int {
        commitObservers.withLock { observers in
            let token = (observers.map(\.token).max() ?? 0) + 1
            observers.append((token, handler))
            return token
        }
    }

    /// On every commit: the array is copied out by reference, not rebuilt.
    private func notifyAtCommit(_ change: ItemChange) {
        for observer in commitObservers.withLock({ $0 }) { observer.handler(change) }
    }

    package func removeCommitObserver(_ token: Int) {
        commitObservers.withLock { $0.removeAll { $0.token == token } }
    }

    func notify(_ event: DeviceEvent) {
        let observers = state.withLock { Array($0.observers.values) }
        for observer in observers { observer(event) }
    }

    // MARK: Keys for the item layer

    /// The class key, or ``KeychainError/interactionNotAllowed`` when the
    /// device state has not made it available.
    func classKey(_ protectionClass: ProtectionClass) throws(KeychainError) -> GuardedKey {
        guard let key = state.withLock({ $0.keys[protectionClass] }) else { throw .interactionNotAllowed }
        noteAccess()
        return key
    }

    /// Whether the key of `protectionClass` is in memory now (reads and writes of its items can work).
    public func isAvailable(_ protectionClass: ProtectionClass) -> Bool {
        state.withLock { $0.keys[protectionClass] != nil }
    }

    /// Whether the keys of both classes (nil: none needed) are in memory,
    /// under one lock: a descriptor checks this on every read and write.
    public func areAvailable(_ first: ProtectionClass?, _ second: ProtectionClass?) -> Bool {
        state.withLock { state in
            (first.map { state.keys[$0] != nil } ?? true) && (second.map { state.keys[$0] != nil } ?? true)
        }
    }

    /// A counter bumped by every lock: work that read it before may keep
    /// plaintext only if it is unchanged after.
    var lockEpoch: UInt64 { state.withLock { $0.epoch } }

    /// Keeps the audit log's newest line in the keychain, so that a log cut
    /// short of it is detected (``AuditLog/verify(directory:keyProtectors:)``).
    func saveAuditAnchor() {
        // Denials counted but not yet written are written first: the anchor covers them.
        audit.flush()
        do throws(KeychainError) {
            try writeBound(AuditLog.anchorKey) { audit.head.encoded(secret: secret) }
        } catch {
            Diagnostics.log("could not record the audit log's newest line in the keychain: \(error)")
        }
    }

    /// What the Secret Service of this device is doing, in a few words
    /// (`serving`, or that the bus name was lost), as `.control` shows it;
    /// nil when the device serves no bus.
    public var secretServiceState: String? {
        get { secretService.withLock { $0 } }
        set { secretService.withLock { $0 = newValue } }
    }

    /// Holds the keychain to `quota` from now on (the service's share of
    /// one user): writes past it are ``KeychainError/quotaExceeded``.
    public func setQuota(_ quota: StoreQuota) throws(KeychainError) {
        try store.setQuota(quota)
    }

    /// What the keychain uses of its quota (nil: it has none).
    public var quotaUse: (items: Int, bytes: Int)? { store.quotaUse.map { ($0.items, $0.bytes) } }

    /// Makes every acknowledged write durable against power loss.
    public func sync() throws(KeychainError) {
        try store.sync()
    }

    /// For a process about to exit: moves every commit into the database
    /// file and removes the write-ahead log, so that the keychain at rest is
    /// one file that can be copied alone. The device stays usable (later
    /// writes use a rollback journal).
    public func shutDown() {
        guard !isReadOnly else { return }  // nothing was written
        saveAuditAnchor()
        bumpRollbackCounter("shutdown")
        do throws(KeychainError) {
            try store.closeLog()
        } catch {
            Diagnostics.log("could not fold the write-ahead log into the keychain: \(error)")
        }
    }
}
