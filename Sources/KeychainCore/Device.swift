import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// What the device reports about itself (the `.control` status).
public struct DeviceStatus: Sendable, Equatable {
    /// Whether the `whenUnlocked` class keys are absent.
    public var isLocked: Bool
    /// Whether the device has been unlocked since it booted (`afterFirstUnlock` keys present).
    public var hasUnlockedSinceBoot: Bool
    /// Seconds until the next unlock attempt is allowed; 0 when none is pending.
    public var retryAfter: Int64
    /// Consecutive wrong passcodes.
    public var failedAttempts: UInt64
    /// Whether unlocking needs a passcode.
    public var hasPasscode: Bool
}

/// A change of the device's lock state or of its items, for observers
/// (cache purge, open files, the kernel caches of the mounts).
public enum DeviceEvent: Sendable, Equatable {
    case locked
    case unlocked
    /// A committed change of the store (never a value).
    case changed(ItemChange)
    /// A group's entitlement policy was granted, changed or removed.
    case entitlementsChanged(group: String)
    /// The device locks in `grace` seconds (iOS
    /// `UIApplicationProtectedDataWillBecomeUnavailable`): purge copies now.
    case willLock(grace: Int)
}

/// What a committed transaction changed in the store: names only.
public enum ItemChange: Sendable, Equatable {
    /// Created, rewritten, reverted or given another class.
    case written(group: String, identifier: String)
    case removed(group: String, identifier: String)
    /// An item at `to` is replaced by it.
    case renamed(group: String, from: String, to: String)
    case groupCreated(String)
    case groupRemoved(String)
}

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
    private let secret: DeviceSecret
    private let lockFile: Int32
    private let policy: LockoutPolicy
    private let clock: @Sendable () -> Int64
    /// The wrapped class keys; a passcode change replaces it.
    private let currentKeybag: Mutex<Keybag>
    private var keybag: Keybag { currentKeybag.withLock { $0 } }
    /// Every item access, denial, lock, unlock, grant and revoke.
    public let audit: AuditLog
    /// The groups' entitlement policies, as last stored.
    private let entitlements: Mutex<EntitlementPolicy>

    private struct State {
        var keys: [ProtectionClass: GuardedKey] = [:]
        var isLocked = true
        var hasUnlockedSinceBoot = false
        /// Bumped on every lock, so that work begun before a lock can tell.
        var epoch: UInt64 = 0
        var observers: [Int: @Sendable (DeviceEvent) -> Void] = [:]
        var nextObserver = 0
    }
    private let state = Mutex(State())
    /// Auto-lock: seconds without an item access before the device locks
    /// (0: never) and the grace between `will-lock` and the lock.
    private let autoLockSettings = Mutex<(after: Int, grace: Int)>((0, 10))
    /// When an item was last read or written (or the device unlocked), monotonic ms.
    private let lastAccess = Atomic<Int64>(0)
    /// Started with the first auto-lock setting; woken when the settings or the lock state change.
    private let autoLockThread = Mutex<WakeableThread?>(nil)
    /// Held across one unlock attempt: the lockout check, the derivation and
    /// the record of its outcome are one step, so concurrent attempts cannot
    /// all pass the check before any failure is counted.
    private let unlockAttempt = Mutex(())

    /// Creates a new keychain at `directory`: device secret, class keys, empty store.
    /// `passcode` nil creates one whose `unlock` needs no passcode.
    public static func createKeychain(at directory: KeychainDirectory, passcode: SecureBytes?,
                                      kdf: KDFParameters = .interactive) throws(KeychainError) {
        Sodium.ensureInitialized()
        if let passcode, passcode.count == 0 { throw .param }
        try directory.prepareForCreation()
        let secretBytes = SecureBytes.random(count: Crypto.keySize)
        let secret = DeviceSecret(secret: secretBytes)
        let bag = try SecretThread.run { () throws(KeychainError) in
            try Keybag.create(secret: secret, passcode: passcode, kdf: kdf)
        }
        // The database is the marker of a finished keychain (`exists`), so it
        // is created last: a failure before leaves no half keychain behind.
        try directory.writeDeviceSecret(secretBytes)
        let temporary = directory.databasePath + ".new"
        unlink(temporary)
        do {
            let store = try ItemStore(path: temporary, create: true, state: ItemSetState(secret: secret))
            try store.setMetadata(Keybag.recordKey, bag.encoded(secret: secret))
            try store.setMetadata(LockoutRecord.recordKey, LockoutRecord().encoded(secret: secret))
            try store.setMetadata(EntitlementPolicy.recordKey, EntitlementPolicy().encoded(secret: secret))
            try store.sync()
        }
        unlink(temporary + "-wal")
        unlink(temporary + "-shm")
        // sqlite creates files with the umask's mode; the SPEC wants them private
        // (sqlite gives the -wal and -shm files the database file's mode).
        guard chmod(temporary, 0o600) == 0 else { throw fileFailure("make private (chmod 600)", temporary) }
        guard rename(temporary, directory.databasePath) == 0 else { throw fileFailure("rename into place", directory.databasePath) }
    }

    /// Boots the device of an existing keychain: locked, before first unlock.
    /// - Parameters:
    ///   - policy: lockout delays after wrong passcodes.
    ///   - clock: wall-clock seconds; the lockout deadline is persisted in it,
    ///     so that restarting the process does not reset it.
    public init(directory: KeychainDirectory, policy: LockoutPolicy = .iOS,
                clock: @escaping @Sendable () -> Int64 = { Int64(time(nil)) }) throws(KeychainError) {
        Sodium.ensureInitialized()
        guard directory.exists else { throw .noSuchKeychain }
        if let problem = directory.permissionProblem() {
            Diagnostics.log(problem)
            throw .insecurePermissions
        }
        let fd = open(directory.lockFilePath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw fileFailure("open", directory.lockFilePath) }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            close(fd)
            throw .keychainInUse
        }
        do throws(KeychainError) {
            let secret = DeviceSecret(secret: try directory.readDeviceSecret())
            let store = try ItemStore(path: directory.databasePath, create: false, state: ItemSetState(secret: secret))
            guard let record = try store.metadata(Keybag.recordKey) else { throw .decode }
            let bag = try Keybag(decoding: record, secret: secret)
            try store.verifyItemSet(legacy: bag.formatVersion < Keybag.stateVersion)
            if bag.formatVersion < Keybag.version {
                // An older format: give it the records the current one
                // requires, then mark it current (last, so an interrupted
                // upgrade is redone).
                if try store.metadata(LockoutRecord.recordKey) == nil {
                    try store.setMetadata(LockoutRecord.recordKey, LockoutRecord().encoded(secret: secret))
                }
                if try store.metadata(EntitlementPolicy.recordKey) == nil {
                    try store.setMetadata(EntitlementPolicy.recordKey, EntitlementPolicy().encoded(secret: secret))
                }
                try store.setMetadata(Keybag.recordKey, bag.encoded(secret: secret))
            }
            guard let entitlementRecord = try store.metadata(EntitlementPolicy.recordKey) else {
                // Deleting it would open every group to every program.
                Diagnostics.log("the entitlement record is missing")
                throw .decode
            }
            do throws(KeychainError) {
                entitlements = Mutex(try EntitlementPolicy(decoding: entitlementRecord, secret: secret))
            } catch {
                Diagnostics.log("the entitlement record failed authentication")
                throw error
            }
            let anchor: AuditLog.Anchor?
            do throws(KeychainError) {
                anchor = try store.metadata(AuditLog.anchorKey).map { (raw) throws(KeychainError) in
                    try AuditLog.Anchor(decoding: raw, secret: secret)
                }
            } catch {
                Diagnostics.log("the audit log's anchor record failed authentication")
                throw error
            }
            audit = try AuditLog(directory: directory, key: secret.auditKey, anchor: anchor)
            var keys: [ProtectionClass: GuardedKey] = [:]
            for protectionClass in ProtectionClass.allCases where protectionClass.mode == .always {
                keys[protectionClass] = try bag.unwrap(protectionClass, secret: secret, passcodeKey: nil)
            }
            self.store = store
            self.secret = secret
            self.currentKeybag = Mutex(bag)
            self.directory = directory
            self.lockFile = fd
            self.policy = policy
            self.clock = clock
            state.withLock { $0.keys = keys }
            store.onChange { [weak self] change in self?.notify(.changed(change)) }
            // Reading it now reports a tampered lockout record at boot.
            _ = try lockoutRecord()
            try store.startWriteAheadLog()
        } catch {
            close(fd)
            throw error
        }
    }

    deinit {
        // Closing the descriptor releases the flock: the keychain is free.
        close(lockFile)
    }

    // MARK: Status

    /// The current lock state and lockout.
    public var status: DeviceStatus {
        let record = (try? lockoutRecord()) ?? LockoutRecord()
        return state.withLock { state in
            DeviceStatus(isLocked: state.isLocked, hasUnlockedSinceBoot: state.hasUnlockedSinceBoot,
                         retryAfter: max(0, record.deadline - clock()), failedAttempts: record.failures,
                         hasPasscode: keybag.hasPasscode)
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

    private func unlockKeys(passcode: SecureBytes?) throws(KeychainError) {
        try unlockAttempt.withLock { _ throws(KeychainError) in
            let now = clock()
            if try lockoutRecord().deadline > now { throw .authFailed }
            let unwrapped: [ProtectionClass: GuardedKey]
            do throws(KeychainError) {
                unwrapped = try unwrapPasscodeClasses(passcode)
            } catch .decode, .authFailed {
                // The keybag record is authenticated at boot, so a key that does
                // not unwrap means the passcode was wrong.
                try recordFailure(now: now)
                throw .authFailed
            }
            try resetFailures()
            state.withLock { state in
                state.keys.merge(unwrapped) { _, new in new }
                state.isLocked = false
                state.hasUnlockedSinceBoot = true
            }
        }
        noteAccess()
        wakeAutoLock()
    }

    /// Runs `body` and records its outcome in the audit log.
    private func audited<R>(_ operation: String, group: String? = nil, detail: String? = nil, by subject: AuditSubject?,
                            _ body: () throws(KeychainError) -> R) throws(KeychainError) -> R {
        do throws(KeychainError) {
            let result = try body()
            audit.record(AuditEvent(operation: operation, result: "ok", group: group, subject: subject, detail: detail))
            return result
        } catch {
            audit.record(AuditEvent(operation: operation, result: AuditEvent.result(of: error), group: group,
                                    subject: subject, detail: detail))
            throw error
        }
    }

    /// Changes the passcode: `old` is the current one (nil for a keychain
    /// without one), `new` the next (nil: none from now on). Needs no
    /// unlock, only the current passcode; a wrong one is a failed attempt
    /// like a wrong unlock (``KeychainError/authFailed``, counted, and
    /// refused during a lockout). The class keys are wrapped again under the
    /// new passcode and the keybag record replaced in one transaction: after
    /// a crash at any point, either the old or the new passcode works.
    public func changePasscode(from old: SecureBytes?, to new: SecureBytes?) throws(KeychainError) {
        if let new, new.count == 0 { throw .param }
        try unlockAttempt.withLock { _ throws(KeychainError) in
            let now = clock()
            if try lockoutRecord().deadline > now { throw .authFailed }
            let bag = keybag, secret = secret
            let changed: Keybag
            do throws(KeychainError) {
                changed = try SecretThread.run { () throws(KeychainError) -> Keybag in
                    try bag.rewrapped(secret: secret, oldPasscode: old, newPasscode: new)
                }
            } catch .decode, .authFailed {
                try recordFailure(now: now)
                throw .authFailed
            }
            try resetFailures()
            try store.setMetadata(Keybag.recordKey, changed.encoded(secret: secret))
            currentKeybag.withLock { $0 = changed }
        }
    }

    /// Runs `body` if `passcode` is the keychain's (nil for one without a
    /// passcode): a wrong one is a failed attempt like a wrong unlock
    /// (``KeychainError/authFailed``, counted, refused during a lockout).
    private func withPasscode<R>(_ passcode: SecureBytes?, _ body: () throws(KeychainError) -> R) throws(KeychainError) -> R {
        try unlockAttempt.withLock { _ throws(KeychainError) -> R in
            let now = clock()
            if try lockoutRecord().deadline > now { throw .authFailed }
            do throws(KeychainError) {
                _ = try unwrapPasscodeClasses(passcode)
            } catch .decode, .authFailed {
                try recordFailure(now: now)
                throw .authFailed
            }
            try resetFailures()
            return try body()
        }
    }

    /// The class keys a passcode unwraps. Derived on a ``SecretThread``: no
    /// copy of the stretched passcode or of the keys stays on any stack.
    private func unwrapPasscodeClasses(_ passcode: SecureBytes?) throws(KeychainError) -> [ProtectionClass: GuardedKey] {
        let bag = keybag, secret = secret
        return try SecretThread.run { () throws(KeychainError) -> [ProtectionClass: GuardedKey] in
            let passcodeKey = try bag.passcodeKey(secret: secret, passcode: passcode)
            var keys: [ProtectionClass: GuardedKey] = [:]
            for protectionClass in ProtectionClass.allCases where protectionClass.mode != .always {
                keys[protectionClass] = try bag.unwrap(protectionClass, secret: secret, passcodeKey: passcodeKey)
            }
            return keys
        }
    }

    /// Locks: drops the `whenUnlocked` class keys (the `afterFirstUnlock`
    /// keys stay until the process ends, as on iOS).
    public func lock(by subject: AuditSubject? = nil) {
        // `lock` has no grace: the notice comes right before the lock.
        notify(.willLock(grace: 0))
        lockNow(by: subject, detail: nil)
    }

    private func lockNow(by subject: AuditSubject?, detail: String?) {
        audit.record(AuditEvent(operation: "lock", result: "ok", subject: subject, detail: detail))
        saveAuditAnchor()
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

    private func notify(_ event: DeviceEvent) {
        let observers = state.withLock { Array($0.observers.values) }
        for observer in observers { observer(event) }
    }

    // MARK: Entitlements

    /// The programs allowed to use `group`; nil when the group has no
    /// policy (every program of the user may use it).
    public func entitlementRules(forGroup group: String) -> [EntitlementRule]? {
        entitlements.withLock { $0.groups[group] }
    }

    /// Whether `group` has a policy (its items are then checked per caller).
    public func hasEntitlementPolicy(_ group: String) -> Bool {
        entitlements.withLock { $0.groups[group] != nil }
    }

    /// Every group's rules.
    public var entitlementPolicies: [String: [EntitlementRule]] { entitlements.withLock { $0.groups } }

    /// ``KeychainError/missingEntitlement`` unless `program` may use
    /// `group`: the group has no policy, or one of its rules admits the
    /// program. `program` nil (it could not be identified) is admitted
    /// only by a group without a policy.
    public func checkEntitlement(_ group: String, program: () -> ProgramIdentity?) throws(KeychainError) {
        guard let rules = entitlementRules(forGroup: group) else { return }
        guard let program = program(), rules.contains(where: { $0.admits(program) }) else { throw .missingEntitlement }
    }

    /// Allows the program of `rule` to use `group` (giving the group a
    /// policy if it had none). Needs the passcode, as changing a macOS
    /// keychain's access control needs the keychain password: a program
    /// running as the user cannot grant itself. Granting a rule the group
    /// already has changes nothing.
    public func grant(_ rule: EntitlementRule, toGroup group: String, passcode: SecureBytes?,
                      by subject: AuditSubject? = nil) throws(KeychainError) {
        try ItemLimits.validate(name: group)
        guard rule.digest.count == ExecutableDigest.size, rule.executable.hasPrefix("/") else { throw .param }
        let detail = rule.executable + " sha256=" + rule.digestHex + (rule.unit.map { " unit=" + $0 } ?? "")
            + (rule.uid.map { " uid=\($0)" } ?? "")
        _ = try audited("grant", group: group, detail: detail, by: subject) { () throws(KeychainError) in
            try changeEntitlements(group, passcode: passcode) { policy in
            var rules = policy.groups[group] ?? []
            // A new grant of the same program (a rebuilt binary) replaces its digest.
            rules.removeAll { $0.namesSameProgram(as: rule) }
            rules.append(rule)
            policy.groups[group] = rules
            return 1
            }
        }
    }

    /// Removes the rules of `group` that name `executable` (and `unit` and
    /// `uid`, when given); `all` removes the group's policy itself, which
    /// opens the group to every program again. Removing the last rule
    /// leaves a policy that admits no program. Needs the passcode. Returns
    /// how many rules were removed.
    @discardableResult
    public func revoke(group: String, executable: String?, unit: String?, uid: UInt32?, all: Bool,
                       passcode: SecureBytes?, by subject: AuditSubject? = nil) throws(KeychainError) -> Int {
        let detail = all ? "all" : [executable, unit.map { "unit=" + $0 }, uid.map { "uid=\($0)" }].compactMap { $0 }
            .joined(separator: " ")
        return try audited("revoke", group: group, detail: detail, by: subject) { () throws(KeychainError) -> Int in
            try changeEntitlements(group, passcode: passcode) { policy throws(KeychainError) -> Int in
            guard let rules = policy.groups[group] else { throw .itemNotFound }
            if all {
                policy.groups[group] = nil
                return rules.count
            }
            let kept = rules.filter { !$0.matches(executable: executable, unit: unit, uid: uid) }
            guard kept.count < rules.count else { throw .itemNotFound }
            policy.groups[group] = kept
            return rules.count - kept.count
            }
        }
    }

    private func changeEntitlements(_ group: String, passcode: SecureBytes?,
                                    _ change: (inout EntitlementPolicy) throws(KeychainError) -> Int) throws(KeychainError) -> Int {
        let count = try withPasscode(passcode) { () throws(KeychainError) -> Int in
            var policy = entitlements.withLock { $0 }
            let count = try change(&policy)
            try store.setMetadata(EntitlementPolicy.recordKey, policy.encoded(secret: secret))
            saveAuditAnchor()
            entitlements.withLock { $0 = policy }
            return count
        }
        notify(.entitlementsChanged(group: group))
        return count
    }

    // MARK: Auto-lock

    /// Locks the device after `seconds` without an item read or write (0:
    /// never), as iOS does after its auto-lock delay: observers get
    /// ``DeviceEvent/willLock(grace:)`` first, then `grace` seconds to purge
    /// their copies, then the lock.
    public func setAutoLock(after seconds: Int, grace: Int) {
        precondition(seconds >= 0 && grace >= 0)
        autoLockSettings.withLock { $0 = (seconds, grace) }
        noteAccess()  // the delay counts from now
        startAutoLockThread()
        wakeAutoLock()
    }

    /// The largest auto-lock delay or grace accepted: a week.
    public static let maximumAutoLockSeconds = 7 * 24 * 3600

    /// The auto-lock delay and grace, in seconds.
    public var autoLock: (after: Int, grace: Int) { autoLockSettings.withLock { $0 } }

    private func noteAccess() { lastAccess.store(MonotonicClock.milliseconds(), ordering: .relaxed) }

    private func wakeAutoLock() {
        autoLockThread.withLock { $0 }?.wake()
    }

    /// One thread per device, started with the first setting: it sleeps
    /// until the idle delay could have passed (or a wake-up), and never
    /// holds the device between waits.
    private func startAutoLockThread() {
        autoLockThread.withLock { thread in
            guard thread == nil else { return }
            thread = WakeableThread("auto-lock") { [weak self] in
                guard let device = self else { return .stop }
                return device.autoLockStep()
            }
        }
    }

    /// Locks if the device has been idle long enough; returns when to look again.
    private func autoLockStep() -> WakeableThread.Next {
        let (after, grace) = autoLock
        guard after > 0, !isLocked else { return .whenWoken }
        let idle = MonotonicClock.milliseconds() - lastAccess.load(ordering: .relaxed)
        let remaining = Int64(after) * 1000 - idle
        guard remaining <= 0 else { return .after(milliseconds: Int32(clamping: remaining)) }
        notify(.willLock(grace: grace))
        if grace > 0 {
            // The grace is not cut short (iOS locks at its end whatever
            // happens meanwhile); this thread only sleeps through it.
            var left = timespec(tv_sec: grace, tv_nsec: 0)
            var rest = timespec()
            while nanosleep(&left, &rest) != 0 && errno == EINTR { left = rest }
        }
        guard autoLock.after > 0, !isLocked else { return .whenWoken }
        lockNow(by: nil, detail: "auto-lock after \(after) s idle")
        return .whenWoken
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

    // MARK: Lockout persistence

    private func lockoutRecord() throws(KeychainError) -> LockoutRecord {
        guard let raw = try store.metadata(LockoutRecord.recordKey) else {
            // Deleting it would reset the count of wrong passcodes.
            Diagnostics.log("the lockout record is missing")
            throw .decode
        }
        do throws(KeychainError) {
            return try LockoutRecord(decoding: raw, secret: secret)
        } catch {
            Diagnostics.log("the lockout record failed authentication")
            throw error
        }
    }

    private func recordFailure(now: Int64) throws(KeychainError) {
        var record = try lockoutRecord()
        record.failures += 1
        record.deadline = now + policy.delay(afterFailures: record.failures)
        try store.setMetadata(LockoutRecord.recordKey, record.encoded(secret: secret))
    }

    private func resetFailures() throws(KeychainError) {
        guard try lockoutRecord() != LockoutRecord() else { return }
        try store.setMetadata(LockoutRecord.recordKey, LockoutRecord().encoded(secret: secret))
    }

    /// Keeps the audit log's newest line in the keychain, so that a log cut
    /// short of it is detected (``AuditLog/verify(directory:)``).
    private func saveAuditAnchor() {
        do throws(KeychainError) {
            try store.setMetadata(AuditLog.anchorKey, audit.head.encoded(secret: secret))
        } catch {
            Diagnostics.log("could not record the audit log's newest line in the keychain: \(error)")
        }
    }

    /// Makes every acknowledged write durable against power loss.
    public func sync() throws(KeychainError) {
        try store.sync()
    }

    /// For a process about to exit: moves every commit into the database
    /// file and removes the write-ahead log, so that the keychain at rest is
    /// one file that can be copied alone. The device stays usable (later
    /// writes use a rollback journal).
    public func shutDown() {
        saveAuditAnchor()
        do throws(KeychainError) {
            try store.closeLog()
        } catch {
            Diagnostics.log("could not fold the write-ahead log into the keychain: \(error)")
        }
    }
}

