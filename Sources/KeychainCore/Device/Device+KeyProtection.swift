import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// How the keychain's keys are kept, as `status` and `.control` say it.
public struct KeyProtectionStatus: Sendable, Equatable {
    public var protection: KeyProtection
    /// The TPM's dictionary-attack counter (wrong passcodes it counts), the
    /// count at which it locks out, and the seconds after which it forgets
    /// one; nil without a TPM, or when it does not answer.
    public var tpmFailures: UInt32?
    public var tpmMaximumFailures: UInt32?
    public var tpmRecoverySeconds: UInt32?
    /// Whether the TPM's lockout hierarchy has an auth: without one, anyone
    /// who reaches the TPM can clear its count or stop its counting.
    public var tpmLockoutAuthSet: Bool?
    /// The rollback counter's value the keychain's state is bound to.
    public var rollbackCounter: UInt64?
    /// The fewest wrong passcodes the TPM can count now if nobody reset its
    /// count since this keychain last saw it (``TPMFailuresSeen``); nil: never seen.
    public var tpmFailuresExpected: UInt32?
    /// Whether the keychain is bound to its passcode (``PasscodeBinding``);
    /// nil: it has no passcode, so nothing can be.
    public var passcodeBound: Bool?
    /// The TCTI the device reaches its TPM at: the machine's
    /// (``TrustedPlatformModule/machineTCTI``) or one `$TPM2TOOLS_TCTI`
    /// named; nil when the keys are in a file or the service reaches the
    /// TPM (``KeyProtection/tpm2Service``).
    public var tcti: String?

    public init(
        protection: KeyProtection, tpmFailures: UInt32? = nil, tpmMaximumFailures: UInt32? = nil,
        tpmRecoverySeconds: UInt32? = nil, tpmLockoutAuthSet: Bool? = nil, rollbackCounter: UInt64? = nil,
        tpmFailuresExpected: UInt32? = nil, passcodeBound: Bool? = nil, tcti: String? = nil
    ) {
        self.protection = protection
        self.tpmFailures = tpmFailures
        self.tpmMaximumFailures = tpmMaximumFailures
        self.tpmRecoverySeconds = tpmRecoverySeconds
        self.tpmLockoutAuthSet = tpmLockoutAuthSet
        self.rollbackCounter = rollbackCounter
        self.tpmFailuresExpected = tpmFailuresExpected
        self.passcodeBound = passcodeBound
        self.tcti = tcti
    }

    /// Whether the TPM counts fewer wrong passcodes than it can have
    /// forgotten since this keychain saw its count: someone reset it.
    public var tpmLockoutWasReset: Bool {
        guard let tpmFailures, let tpmFailuresExpected else { return false }
        return tpmFailures < tpmFailuresExpected
    }

    /// The TPM's lockout as far as it is known.
    var tpmLockout: TPMLockoutState? {
        guard let tpmFailures, let tpmMaximumFailures, let tpmRecoverySeconds, let tpmLockoutAuthSet else { return nil }
        return TPMLockoutState(
            failures: tpmFailures, maximum: tpmMaximumFailures, recoverySeconds: tpmRecoverySeconds,
            lockoutAuthSet: tpmLockoutAuthSet)
    }

    /// As `status` and `.control` show it: `key-protection`, then what it
    /// protects against (`key-protection-limits`), the TPM's lockout, what
    /// holds it (`tpm-lockout-guard`) and the rollback counter. Said where
    /// a user looks, not only in the docs, and only what holds now: a TPM
    /// whose counting is switched off is not said to limit guesses.
    public var entries: [StatusEntry] {
        var entries = [StatusEntry("key-protection", protection.rawValue)]
        switch protection {
        case .file:
            entries.append(
                StatusEntry(
                    "key-protection-limits",
                    "the device secret is a file beside the database: with a copy of both, "
                        + "a passcode can be guessed offline at Argon2id's pace (65 to 90 ms a guess on one core): "
                        + "every 4-digit passcode within 15 minutes, every 6-digit one within a day; choose a long "
                        + "passcode, or seal the keys to a TPM (`keychainfs passcode --tpm`)"))
        case .tpm2, .tpm2Service:
            let guesses: String
            switch tpmLockout {
            case .some where tpmLockoutWasReset:
                guesses =
                    "passcode guesses go through the TPM, but its count of wrong ones was reset since this keychain "
                    + "saw it: whoever did so can guess on without the lockout stopping them"
            case .some(let lockout) where !lockout.limitsGuesses:
                guesses =
                    "passcode guesses go through the TPM, but its lockout is switched off (\(lockout.maximum) tries, "
                    + "\(lockout.recoverySeconds) s to forget one): they are limited only by its speed"
            case .some(let lockout) where !lockout.lockoutAuthSet:
                guesses =
                    "passcode guesses go through the TPM and its lockout, which anyone who reaches the TPM "
                    + "can reset (its lockout auth is empty: `sudo keychainfs tpm take-lockout`)"
            case .some: guesses = "passcode guesses go through the TPM and its lockout"
            case .none: guesses = "passcode guesses go through the TPM (which does not answer now)"
            }
            let sealer =
                protection == .tpm2Service
                ? ", which the keychainfs service reaches for you (you cannot yourself) and binds to your uid: "
                    + "no other user opens them through it, and it passes only your share of the lockout's wrong "
                    + "passcodes to the TPM" : ""
            entries.append(
                StatusEntry(
                    "key-protection-limits",
                    "the keys are sealed by this machine's TPM\(sealer): a copy of the files opens "
                        + "nowhere else, \(guesses); an older copy put back is refused, except for writes of "
                        + "the last \(RollbackRecord.idleBindSeconds) s (\(RollbackRecord.maximumWindowSeconds) s "
                        + "while writes go on), which are bound to the counter after that and at every lock; "
                        + "root on this machine can still ask the TPM"))
            entries.append(StatusEntry("tpm", reachedTPM))
            if let failures = tpmFailures, let maximum = tpmMaximumFailures {
                entries.append(StatusEntry("tpm-lockout", "\(failures) of \(maximum)"))
            }
            if let seconds = tpmRecoverySeconds { entries.append(StatusEntry("tpm-lockout-recovery", number: seconds)) }
            if let set = tpmLockoutAuthSet { entries.append(StatusEntry("tpm-lockout-auth", set ? "set" : "empty")) }
            if tpmLockoutWasReset, let failures = tpmFailures, let expected = tpmFailuresExpected {
                entries.append(
                    StatusEntry(
                        "tpm-lockout-reset",
                        "the TPM counts \(failures) wrong passcodes, but after those this keychain saw "
                            + "it cannot have forgotten more than down to \(expected): its count was reset "
                            + "(TPM2_DictionaryAttackLockReset, which its lockout auth guards: `sudo keychainfs tpm take-lockout`)"
                    ))
            }
            if let counter = rollbackCounter { entries.append(StatusEntry("rollback-counter", number: counter)) }
            let binding: String
            switch passcodeBound {
            case true?:
                binding =
                    "on: an older copy re-signed by whoever reaches the TPM is refused at the unlock; "
                    + "its `always` items are what they can read"
            case false?: binding = "from the next unlock"
            case nil: binding = "off: the keychain has no passcode, so whoever reaches the TPM opens it"
            }
            entries.append(StatusEntry("passcode-binding", binding))
        }
        return entries
    }

    /// Which TPM the device reaches, and why that one: the machine's, one
    /// named, or the service's. Never tpm2-tss's default list, whose
    /// `localhost:2321` any local user can listen on (docs/SECURITY.md).
    var reachedTPM: String {
        switch (protection, tcti) {
        case (.tpm2Service, _):
            return "the keychainfs service's, which reaches this machine's TPM for you (\(KeyProtection.whyNotYours()))"
        case (_, KeyProtection.machineTCTI?), (_, nil):
            return "\(KeyProtection.machineTCTI) (this machine's, through the kernel's resource manager)"
        case (_, let named?):
            return "\(named) (named by $TPM2TOOLS_TCTI where the device started, not this machine's /dev/tpmrm0)"
        }
    }

    /// ``entries`` as `key: value` lines.
    public var lines: [String] { entries.map(\.line) }
}

/// Where a test can have the process killed (SIGKILL, as `kill -9`) on the
/// way through a change of several steps, to check that every prefix of
/// it boots (`KEYCHAINFS_CRASH_AT=<name>`; unset in normal use, and
/// nothing is read from it but the name).
enum CrashPoint {
    private static let chosen: String? = getenv("KEYCHAINFS_CRASH_AT").map { String(cString: $0) }

    static func reach(_ name: String) {
        if chosen == name { kill(getpid(), SIGKILL) }
    }
}

extension Device {
    // MARK: Boot

    /// The keychain's rollback counter checked against the TPM at boot
    /// (``RollbackRecord``): returns the TPM and the counter (nil, nil for
    /// a keychain kept in a file). A keychain sealed by a TPM must have the
    /// record: one removed to escape the check is tampering. A version-1
    /// keychain gets a counter of its own (``upgradeCounter(_:secret:from:tpm:)``).
    static func checkRollback(
        _ directory: KeychainDirectory, store: ItemStore, secret: DeviceSecret,
        sealedBy: (any KeyProtector)?, tcti: String?, keyProtectors: any KeyProtectors
    ) throws(KeychainError) -> ((any KeyProtector)?, CounterReference?) {
        guard let raw = try store.metadata(RollbackRecord.recordKey) else {
            guard sealedBy == nil else {
                Diagnostics.log("the keychain is sealed by a TPM, but its rollback record is missing")
                throw .decode
            }
            return (nil, nil)
        }
        let record = try decodeRollbackRecord(raw, secret: secret)
        var tpm = sealedBy ?? keyProtectors.protector(tcti: tcti)
        try record.check(against: tpm, secret: secret)
        secret.epoch.state = (record.epoch, !record.isLegacy)
        if sealedBy == nil {
            // A move to the TPM committed in the database before its
            // device-secret file was replaced: finish it.
            let plain = try directory.readDeviceSecret(tcti: tcti, keyProtectors: keyProtectors)
            let sealed = try tpm.sealDeviceSecret(plain)
            try directory.writeDeviceSecret(sealed.file)
            tpm.storageKey = sealed.storageKey
        }
        guard record.isLegacy else { return (tpm, record.counter(secret: secret)) }
        return (tpm, try upgradeCounter(store, secret: secret, from: record, tpm: tpm))
    }

    static func decodeRollbackRecord(_ raw: [UInt8], secret: DeviceSecret) throws(KeychainError) -> RollbackRecord {
        do throws(KeychainError) {
            return try RollbackRecord(decoding: raw, secret: secret)
        } catch {
            Diagnostics.log("the rollback record failed authentication")
            throw error
        }
    }

    /// Gives a keychain whose rollback record is version 1 (docs/FORMAT.md,
    /// "Keys sealed by a TPM") a counter only its device reads and moves,
    /// recorded by name, and binds its keybag, lockout and recovery records to
    /// it, in one transaction from `record`'s epoch. The old counter is then
    /// moved on once, so that every copy from before is behind it even where it
    /// cannot be freed, and freed. Returns the new counter.
    static func upgradeCounter(
        _ store: ItemStore, secret: DeviceSecret, from record: RollbackRecord, tpm: any KeyProtector
    )
        throws(KeychainError) -> CounterReference
    {
        let (counter, value) = try tpm.defineCounter(auth: secret.counterAuth)
        try store.rebind(
            secret: secret, from: record.epoch, to: value,
            writing: [
                (RollbackRecord.recordKey, RollbackRecord(counter: counter, epoch: value).encoded(secret: secret))
            ])
        try store.sync()
        let old = record.counter(secret: secret)
        do throws(KeychainError) {
            try tpm.increment(old)
        } catch {
            Diagnostics.log("could not move the older rollback counter on: \(error)")
        }
        tpm.release(old)
        return counter
    }

    // MARK: Status

    /// How the keys are kept, with the TPM's lockout and the rollback counter.
    public var keyProtection: KeyProtectionStatus {
        guard let tpm = sealingTPM.withLock({ $0 }) else { return KeyProtectionStatus(protection: .file) }
        let lockout = tpm.lockout()
        let seen = try? tpmFailuresSeen()
        return KeyProtectionStatus(
            protection: tpm.protection, tpmFailures: lockout?.failures, tpmMaximumFailures: lockout?.maximum,
            tpmRecoverySeconds: lockout?.recoverySeconds, tpmLockoutAuthSet: lockout?.lockoutAuthSet,
            rollbackCounter: secret.epoch.value, tpmFailuresExpected: seen?.fewestFailures(at: clock()),
            passcodeBound: keybag.hasPasscode ? keybag.isPasscodeBound : nil,
            tcti: tpm.throughService ? nil : tpm.tcti ?? KeyProtection.machineTCTI)
    }

    // MARK: The rollback counter

    /// Writes a record bound to the rollback counter (``boundWrites``).
    func writeBound(_ key: String, _ encode: () -> [UInt8]) throws(KeychainError) {
        try boundWrites.withLock { _ throws(KeychainError) in try store.setMetadata(key, encode()) }
    }

    /// Advances the TPM rollback counter by one, in the order that a crash
    /// at any step leaves a keychain that boots (``RollbackRecord``): the
    /// bound records and the record of the new epoch committed and synced,
    /// then the counter incremented. A failure is logged, never thrown: the
    /// lock, unmount or change that asked for it has happened.
    func bumpRollbackCounter(_ reason: String) {
        guard let tpm = sealingTPM.withLock({ $0 }), let counter = rollbackCounter.withLock({ $0 }) else {
            return
        }
        boundWrites.withLock { _ in
            // Every write committed so far is in the state this bump binds.
            unboundWrites.withLock { $0 = nil }
            do throws(KeychainError) {
                guard let epoch = secret.epoch.value else { return }
                // Read only when the last increment failed (or was never
                // seen to happen): otherwise the counter is at `epoch`.
                if !counterMatchesEpoch.load(ordering: .acquiring) {
                    // An earlier bump committed, but its increment failed.
                    if try tpm.value(of: counter) + 1 == epoch { try tpm.increment(counter) }
                    let counted = try tpm.value(of: counter)
                    guard counted == epoch else {
                        Diagnostics.log(
                            "the TPM's rollback counter (\(counted)) does not match the keychain's (\(epoch))")
                        return
                    }
                    counterMatchesEpoch.store(true, ordering: .releasing)
                }
                CrashPoint.reach("bump-begun")
                try store.rebind(
                    secret: secret, from: epoch, to: epoch + 1,
                    writing: [
                        (
                            RollbackRecord.recordKey,
                            RollbackRecord(counter: counter, epoch: epoch + 1).encoded(secret: secret)
                        )
                    ])
                try store.sync()
                counterMatchesEpoch.store(false, ordering: .releasing)
                CrashPoint.reach("bump-committed")
                try tpm.increment(counter)
                counterMatchesEpoch.store(true, ordering: .releasing)
                CrashPoint.reach("bump-counted")
                try moveBindingCounter(on: tpm)
            } catch {
                Diagnostics.log("could not advance the TPM rollback counter (\(reason)): \(error)")
            }
        }
    }

    /// After a committed write: the counter is bumped once writes pause
    /// for ``RollbackRecord/idleBindSeconds``, or once the first unbound
    /// write is ``RollbackRecord/maximumWindowSeconds`` old, by a thread of
    /// its own (not on every write: TPM NV memory wears, and real TPMs
    /// rate-limit NV writes; at most one bump a minute comes from writes).
    func noteWriteForRollback() {
        guard rollbackCounter.withLock({ $0 }) != nil else { return }
        let now = MonotonicClock.milliseconds()
        unboundWrites.withLock { $0 = ($0?.first ?? now, now) }
        let thread = rollbackThread.withLock { thread -> WakeableThread? in
            if thread == nil {
                thread = WakeableThread("rollback counter") { [weak self] in
                    guard let device = self else { return .stop }
                    return device.rollbackStep()
                }
            }
            return thread
        }
        thread?.wake()
    }

    /// Bumps the counter when the unbound writes are due; returns when to look again.
    func rollbackStep() -> WakeableThread.Next {
        guard let (first, last) = unboundWrites.withLock({ $0 }) else { return .whenWoken }
        let due = min(
            last + RollbackRecord.idleBindSeconds * 1000, first + RollbackRecord.maximumWindowSeconds * 1000)
        let remaining = due - MonotonicClock.milliseconds()
        guard remaining <= 0 else { return .after(milliseconds: Int32(clamping: remaining)) }
        bumpRollbackCounter("writes")
        return .after(milliseconds: 0)  // writes made during the bump are looked at again
    }

    // MARK: Recovery

    /// Opens a TPM-sealed keychain with its recovery key, without the TPM
    /// that sealed it (cleared, replaced, another machine), and seals it to
    /// the TPM at `tcti` with `newPasscode` (nil: none), or keeps it in a
    /// file when `choice` is ``TPMChoice/declined`` (or no TPM answers and it
    /// is ``TPMChoice/whenPresent``). No device may hold the keychain. Then
    /// the keychain is made anew with new keys (``rekey(at:passcode:tpm:tcti:keyProtectors:)``):
    /// returns its new recovery key (nil: kept in a file); the old one opens
    /// nothing of it. ``KeychainError/authFailed``: not this keychain's recovery key.
    /// The KeychainTPM target's `recover(at:recoveryKey:newPasscode:tpm:kdf:tcti:)` is the public one.
    package static func recover(
        at directory: KeychainDirectory, recoveryKey: RecoveryKey, newPasscode: SecureBytes?,
        tpm choice: TPMChoice, kdf: KDFParameters, tcti: String?, keyProtectors: any KeyProtectors
    ) throws(KeychainError) -> RecoveryKey? {
        try reseal(
            at: directory, recoveryKey: recoveryKey, newPasscode: newPasscode, tpm: choice, kdf: kdf, tcti: tcti,
            keyProtectors: keyProtectors)
        try recordInLog(
            directory, tcti: tcti, keyProtectors: keyProtectors,
            AuditEvent(
                operation: "recover", result: "ok", subject: nil,
                detail: "with the recovery key"))
        // A move between protections makes new keys (docs/SECURITY.md, "Bound
        // to this machine, against whoever holds the files and the TPM"): a
        // copy of the files from before (on the old machine, with its TPM and
        // the old passcode) opens nothing written from now on.
        let sealed = try directory.keyProtection() != .file
        return try rekey(
            at: directory, passcode: newPasscode, tpm: sealed ? .required : .declined, tcti: tcti,
            keyProtectors: keyProtectors)
    }

    /// Records what a change made without a device did, through a device
    /// booted on the result (which checks it whole, as any boot does).
    private static func recordInLog(
        _ directory: KeychainDirectory, tcti: String?, keyProtectors: any KeyProtectors, _ event: AuditEvent
    ) throws(KeychainError) {
        let device = try Device(directory: directory, tcti: tcti, keyProtectors: keyProtectors)
        device.audit.record(event)
        device.shutDown()
    }

    private static func reseal(
        at directory: KeychainDirectory, recoveryKey: RecoveryKey, newPasscode: SecureBytes?,
        tpm choice: TPMChoice, kdf: KDFParameters, tcti: String?, keyProtectors: any KeyProtectors
    ) throws(KeychainError) {
        Sodium.ensureInitialized()
        if let newPasscode, newPasscode.count == 0 { throw .param }
        guard directory.exists else { throw .noSuchKeychain }
        let lock = try takeKeychainLock(directory)
        defer { extendLifetime(lock) }  // the keychain stays locked to here
        let recoveryRecord = try RawMetadata.read(directory, RecoveryKey.recordKey)
        guard let recoveryRecord else {
            Diagnostics.log("the keychain has no recovery record (only a keychain sealed by a TPM has one)")
            throw .badRequest
        }
        let (plain, classKeys) = try recoveryKey.openRecord(recoveryRecord)
        let secret = DeviceSecret(secret: plain)
        let store = try ItemStore(path: directory.databasePath, create: false, state: ItemSetState(secret: secret))
        let oldRecord = try store.metadata(RollbackRecord.recordKey).map { (raw) throws(KeychainError) in
            try decodeRollbackRecord(raw, secret: secret)
        }
        let oldEpoch = oldRecord?.epoch
        secret.epoch.state = (oldEpoch, !(oldRecord?.isLegacy ?? false))
        try verifyRecoveryBinding(recoveryRecord, secret: secret)
        let records = try BootRecords(store: store, secret: secret)
        var tpm = try keyProtectors.chosen(choice, tcti: tcti)
        let file: SecureBytes
        if let chosen = tpm {
            let sealed = try chosen.sealDeviceSecret(plain)
            tpm?.storageKey = sealed.storageKey
            file = sealed.file
        } else {
            file = plain
        }
        var base = records.keybag
        base.kdf = kdf
        let sealingTPM = tpm
        let bag = try SecretThread.run { () throws(KeychainError) -> Keybag in
            try base.rewrapped(secret: secret, classKeys: classKeys, newPasscode: newPasscode, sealingTPM: sealingTPM)
        }
        // A bound keybag keeps a binding: a new counter on the TPM found,
        // bound to what the keychain holds (as the new rollback counter is).
        var oldBindingCounter: CounterReference?
        if bag.isPasscodeBound, let tpm, let key = PasscodeBindingKey(classKeys: classKeys) {
            // The one the record names, else one the TPM holds for this key
            // (a copy from before its binding, accepted on purpose).
            oldBindingCounter = try store.metadata(PasscodeBinding.recordKey).flatMap {
                try? PasscodeBinding(decoding: $0, key: key).counter(key: key)
            }
            if oldBindingCounter == nil {
                oldBindingCounter = try tpm.bindingCounter(of: key)
            }
            let counter = try tpm.defineBindingCounter(of: key)
            // After a TPM clear the new counter may take the old one's index
            // (the key, and so its indexes, are the same): that is no old one to free.
            if oldBindingCounter?.index == counter.counter.index { oldBindingCounter = nil }
            try store.bind(
                key: key, counter: counter.counter, value: counter.value)
        }
        var writes: [(key: String, value: [UInt8]?)] = [
            (Keybag.recordKey, bag.encoded(secret: secret)),
            (LockoutRecord.recordKey, LockoutRecord().encoded(secret: secret))
        ]
        let newEpoch: UInt64?
        if let tpm {
            let counter = try tpm.defineCounter(auth: secret.counterAuth)
            newEpoch = counter.value
            writes.append(
                (
                    RollbackRecord.recordKey,
                    RollbackRecord(counter: counter.counter, epoch: counter.value).encoded(secret: secret)
                ))
        } else {
            newEpoch = nil
            writes.append((RollbackRecord.recordKey, nil))
        }
        // The database first: a crash before the file is replaced leaves a
        // keychain that `recover` opens again (its recovery record is unchanged).
        try store.rebind(secret: secret, from: oldEpoch, to: newEpoch, writing: writes)
        try store.sync()
        CrashPoint.reach("recover-committed")
        try directory.writeDeviceSecret(file)
        try store.closeLog()
        // The counter left behind is freed when this TPM still has it as it
        // was made (recovered on the same TPM: a forgotten passcode). One
        // recorded without a name is left: after a TPM clear its index may
        // be another program's now.
        if let oldRecord, !oldRecord.isLegacy, let tpm = tpm ?? keyProtectors.present(tcti: tcti) {
            tpm.release(oldRecord.counter(secret: secret))
            oldBindingCounter.map(tpm.release)
        }
    }

    /// Refuses a recovery record older than the records beside it: the
    /// recovery key of an older copy opens nothing here.
    static func verifyRecoveryBinding(_ record: [UInt8], secret: DeviceSecret) throws(KeychainError) {
        do throws(KeychainError) {
            try RecoveryKey.verifyBinding(record, secret: secret)
        } catch {
            Diagnostics.log("the recovery record failed authentication")
            throw error
        }
    }

    // MARK: Rollback on purpose

    /// Accepts a keychain put back from an older copy of its files on
    /// purpose (as `restore` puts back a backup): binds its state to the
    /// TPM's current counter, so that it boots. Needs the passcode, checked
    /// through the TPM (counted by its lockout). No device may hold it.
    /// ``KeychainError/badRequest`` when the keychain is not behind its counter.
    /// The KeychainTPM target's `acceptRollback(at:passcode:tcti:)` is the public one.
    package static func acceptRollback(
        at directory: KeychainDirectory, passcode: SecureBytes?, tcti: String?, keyProtectors: any KeyProtectors
    ) throws(KeychainError) {
        let (from, to) = try rebindToCounter(
            at: directory, passcode: passcode, tcti: tcti, keyProtectors: keyProtectors)
        try recordInLog(
            directory, tcti: tcti, keyProtectors: keyProtectors,
            AuditEvent(
                operation: "accept-rollback", result: "ok", subject: nil,
                detail: "state of counter \(from) accepted at \(to)"))
    }

    private static func rebindToCounter(
        at directory: KeychainDirectory, passcode: SecureBytes?,
        tcti: String?, keyProtectors: any KeyProtectors
    ) throws(KeychainError) -> (UInt64, UInt64) {
        Sodium.ensureInitialized()
        guard directory.exists else { throw .noSuchKeychain }
        let lock = try takeKeychainLock(directory)
        defer { extendLifetime(lock) }  // the keychain stays locked to here
        let (secret, sealedBy) = try directory.openDeviceSecret(tcti: tcti, keyProtectors: keyProtectors)
        guard let tpm = sealedBy else { throw .badRequest }
        let store = try ItemStore(path: directory.databasePath, create: false, state: ItemSetState(secret: secret))
        guard let raw = try store.metadata(RollbackRecord.recordKey) else { throw .decode }
        let record = try decodeRollbackRecord(raw, secret: secret)
        let counter = try tpm.value(of: record.counter(secret: secret))
        secret.epoch.state = (record.epoch, !record.isLegacy)
        let records = try BootRecords(store: store, secret: secret)
        let bag = records.keybag
        let classKeys = try SecretThread.run { () throws(KeychainError) in
            try bag.unwrapPasscodeClasses(secret: secret, passcode: passcode, tpm: tpm)
        }
        // Behind either counter: the rollback counter (an older copy put
        // back) or the passcode binding's (one re-signed without the passcode).
        var binding: (PasscodeBinding, PasscodeBindingKey, UInt64)?
        if bag.isPasscodeBound, let key = PasscodeBindingKey(classKeys: classKeys),
            let raw = try store.metadata(PasscodeBinding.recordKey)
        {
            let bound = try PasscodeBinding(decoding: raw, key: key)
            binding = (bound, key, try tpm.value(of: bound.counter(key: key)))
        }
        let bindingBehind = binding.map { $0.0.value < $0.2 } ?? false
        // A copy from before the keychain was bound, of one bound since: the
        // TPM holds the binding's counter (``Device/keyPasscodeBinding``).
        // Accepted by freeing it; the next unlock binds the copy afresh.
        var bindingSince: CounterReference?
        if !bag.isPasscodeBound, bag.isBindable,
            let key = PasscodeBindingKey(classKeys: classKeys)
        {
            bindingSince = try tpm.bindingCounter(of: key)
        }
        guard record.epoch < counter || bindingBehind || bindingSince != nil else { throw .badRequest }
        if let bindingSince { tpm.release(bindingSince) }
        if let (bound, key, value) = binding, bindingBehind {
            try store.bind(
                key: key, counter: bound.counter(key: key), value: value)
            try store.sync()
        }
        if record.epoch >= counter {
            // Only the binding was behind (a bump not yet counted is the boot's to complete).
        } else if record.isLegacy {
            // A counter of its own, as at any boot of a version-1 keychain.
            _ = try upgradeCounter(store, secret: secret, from: record, tpm: tpm)
        } else {
            try store.rebind(
                secret: secret, from: record.epoch, to: counter,
                writing: [
                    (
                        RollbackRecord.recordKey,
                        RollbackRecord(counter: record.counter(secret: secret), epoch: counter).encoded(secret: secret)
                    )
                ])
            try store.sync()
        }
        let accepted = secret.epoch.value ?? counter
        try store.closeLog()
        return (record.epoch, accepted)
    }
}

/// One metadata record read straight from a keychain's database, before
/// the keys that authenticate it are known (the recovery record).
enum RawMetadata {
    static func read(_ directory: KeychainDirectory, _ key: String) throws(KeychainError) -> [UInt8]? {
        let db = try SQLiteConnection(path: directory.databasePath, create: false)
        defer { db.finishStatements() }
        let query = try db.statement("SELECT value FROM meta WHERE key = ?").bind(1, key)
        return try query.step() ? query.blob(0) : nil
    }
}

extension Device {
    /// Makes this keychain's wrong passcodes use `person`'s share of the
    /// TPM's lockout, kept by the service's broker with the per-user
    /// devices' (KeychainTPM's `guessShares`): the service holds every
    /// user's keychain, and their guesses unsealed outside any share, so that
    /// three wrong passcodes of one user locked the TPM for everyone.
    package func countTPMGuesses(as person: UInt32) {
        sealingTPM.withLock { $0?.person = person }
    }
}
