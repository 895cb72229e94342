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
    /// The rollback counter's value the keychain's state is bound to.
    public var rollbackCounter: UInt64?

    public init(
        protection: KeyProtection, tpmFailures: UInt32? = nil, tpmMaximumFailures: UInt32? = nil,
        tpmRecoverySeconds: UInt32? = nil, rollbackCounter: UInt64? = nil
    ) {
        self.protection = protection
        self.tpmFailures = tpmFailures
        self.tpmMaximumFailures = tpmMaximumFailures
        self.tpmRecoverySeconds = tpmRecoverySeconds
        self.rollbackCounter = rollbackCounter
    }

    /// As `status` and `.control` show it: `key-protection`, then what it
    /// protects against (`key-protection-limits`), the TPM's lockout and
    /// the rollback counter. Said where a user looks, not only in the docs.
    public var lines: [String] {
        var lines = ["key-protection: \(protection.rawValue)"]
        switch protection {
        case .file:
            lines.append(
                "key-protection-limits: the device secret is a file beside the database: with a copy of both, "
                    + "a passcode can be guessed offline at Argon2id's pace (65 to 90 ms a guess on one core): "
                    + "every 4-digit passcode within 15 minutes, every 6-digit one within a day; choose a long "
                    + "passcode, or seal the keys to a TPM (`keychainfs passcode --tpm`)")
        case .tpm2:
            lines.append(
                "key-protection-limits: the keys are sealed by this machine's TPM: a copy of the files opens "
                    + "nowhere else, passcode guesses go through the TPM and its lockout, an older copy put back "
                    + "is refused (writes of the last \(RollbackRecord.writeBumpInterval / 60) minutes before a lock "
                    + "aside); root on this machine can still ask the TPM")
            if let failures = tpmFailures, let maximum = tpmMaximumFailures {
                lines.append("tpm-lockout: \(failures) of \(maximum)")
            }
            if let seconds = tpmRecoverySeconds { lines.append("tpm-lockout-recovery: \(seconds)") }
            if let counter = rollbackCounter { lines.append("rollback-counter: \(counter)") }
        }
        return lines
    }
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
    /// (``RollbackRecord``): returns the TPM and the counter's NV index (nil,
    /// nil for a keychain kept in a file). A keychain sealed by a TPM must
    /// have the record: one removed to escape the check is tampering.
    static func checkRollback(
        _ directory: KeychainDirectory, store: ItemStore, secret: DeviceSecret,
        sealedBy: KeychainTPM?, tcti: String?
    ) throws(KeychainError) -> (KeychainTPM?, UInt32?) {
        guard let raw = try store.metadata(RollbackRecord.recordKey) else {
            guard sealedBy == nil else {
                Diagnostics.log("the keychain is sealed by a TPM, but its rollback record is missing")
                throw .decode
            }
            return (nil, nil)
        }
        let record: RollbackRecord
        do throws(KeychainError) {
            record = try RollbackRecord(decoding: raw, secret: secret)
        } catch {
            Diagnostics.log("the rollback record failed authentication")
            throw error
        }
        let tpm = sealedBy ?? KeychainTPM(tcti: tcti)
        try record.check(against: tpm)
        secret.epoch.value = record.epoch
        if sealedBy == nil {
            // A move to the TPM committed in the database before its
            // device-secret file was replaced: finish it.
            let plain = try directory.readDeviceSecret(tcti: tcti)
            try directory.writeDeviceSecret(
                try SecureBytes(DeviceSecretFile.encodeSealed(try tpm.sealDeviceSecret(plain))))
        }
        return (tpm, record.index)
    }

    // MARK: Status

    /// How the keys are kept, with the TPM's lockout and the rollback counter.
    public var keyProtection: KeyProtectionStatus {
        guard let tpm = sealingTPM.withLock({ $0 }) else { return KeyProtectionStatus(protection: .file) }
        let lockout = tpm.lockout()
        return KeyProtectionStatus(
            protection: .tpm2, tpmFailures: lockout?.failures, tpmMaximumFailures: lockout?.maximum,
            tpmRecoverySeconds: lockout?.recoverySeconds, rollbackCounter: secret.epoch.value)
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
        guard let tpm = sealingTPM.withLock({ $0 }), let index = rollbackCounter.withLock({ $0?.index }) else { return }
        boundWrites.withLock { _ in
            do throws(KeychainError) {
                guard let epoch = secret.epoch.value else { return }
                var counted = try tpm.counter(at: index)
                // An earlier bump committed, but its increment failed.
                if counted + 1 == epoch { counted = try tpm.increment(counter: index) }
                guard counted == epoch else {
                    Diagnostics.log("the TPM's rollback counter (\(counted)) does not match the keychain's (\(epoch))")
                    return
                }
                CrashPoint.reach("bump-begun")
                try store.rebind(
                    secret: secret, from: epoch, to: epoch + 1,
                    writing: [
                        (
                            RollbackRecord.recordKey,
                            RollbackRecord(index: index, epoch: epoch + 1).encoded(secret: secret)
                        )
                    ])
                try store.sync()
                CrashPoint.reach("bump-committed")
                try tpm.increment(counter: index)
                CrashPoint.reach("bump-counted")
                rollbackCounter.withLock { $0?.lastBump = clock() }
            } catch {
                Diagnostics.log("could not advance the TPM rollback counter (\(reason)): \(error)")
            }
        }
    }

    /// After a committed write: bumps the counter when the last bump is
    /// ``RollbackRecord/writeBumpInterval`` old (TPM NV memory wears, and
    /// real TPMs rate-limit NV writes, so not on every write).
    func noteWriteForRollback() {
        let now = clock()
        let due = rollbackCounter.withLock { counter -> Bool in
            guard let last = counter?.lastBump, now - last >= RollbackRecord.writeBumpInterval else { return false }
            counter?.lastBump = now  // claimed: concurrent writers do not bump too
            return true
        }
        if due { bumpRollbackCounter("writes") }
    }

    // MARK: Sealing an existing keychain

    /// Moves a keychain kept in a file to the TPM at `tcti` (`keychainfs
    /// passcode --tpm`): the device secret sealed by it, the passcode KEK
    /// entangled with it, a rollback counter defined, and a recovery key
    /// made, which is returned to be shown once. Needs the passcode (a wrong
    /// one is a failed attempt like a wrong unlock).
    public func moveToTPM(passcode: SecureBytes?, tcti: String? = TrustedPlatformModule.configuredTCTI)
        throws(KeychainError) -> RecoveryKey
    {
        guard sealingTPM.withLock({ $0 }) == nil else { throw .duplicateKeychain }
        guard let tpm = KeychainTPM.present(tcti: tcti) else { throw .tpmUnavailable }
        let plain = try directory.readDeviceSecret(tcti: tcti)
        let classKeys = try passcodeAttempt(
            { () throws(KeychainError) in try unwrapPasscodeClasses(passcode) },
            then: { (keys) throws(KeychainError) in keys })
        let bag = keybag, secret = secret
        let sealed = try SecretThread.run { () throws(KeychainError) -> Keybag in
            try bag.rewrapped(secret: secret, classKeys: classKeys, newPasscode: passcode, sealingTPM: tpm)
        }
        let recovery = RecoveryKey.generate()
        let recoveryRecord = try recovery.sealRecord(deviceSecret: plain, classKeys: classKeys)
        let sealedSecret = try tpm.sealDeviceSecret(plain)
        let counter = try tpm.defineCounter()
        try boundWrites.withLock { _ throws(KeychainError) in
            try store.rebind(
                secret: secret, from: nil, to: counter.value,
                writing: [
                    (Keybag.recordKey, sealed.encoded(secret: secret)),
                    (RecoveryKey.recordKey, recoveryRecord),
                    (
                        RollbackRecord.recordKey,
                        RollbackRecord(index: counter.index, epoch: counter.value).encoded(secret: secret)
                    )
                ])
            try store.sync()
            // Committed: a crash from here boots and finishes the move
            // (``checkRollback(_:store:secret:sealedBy:tcti:)``).
            CrashPoint.reach("seal-committed")
            try directory.writeDeviceSecret(try SecureBytes(DeviceSecretFile.encodeSealed(sealedSecret)))
        }
        currentKeybag.withLock { $0 = sealed }
        sealingTPM.withLock { $0 = tpm }
        rollbackCounter.withLock { $0 = (counter.index, clock()) }
        audit.record(AuditEvent(operation: "seal", result: "ok", subject: nil, detail: "tpm2"))
        return recovery
    }

    // MARK: Recovery

    /// Opens a TPM-sealed keychain with its recovery key, without the TPM
    /// that sealed it (cleared, replaced, another machine), and seals it to
    /// the TPM at `tcti` with `newPasscode` (nil: none), or keeps it in a
    /// file when `choice` is ``TPMChoice/declined`` (or no TPM answers and it
    /// is ``TPMChoice/whenPresent``). No device may hold the keychain. The
    /// recovery key stays the same (the class keys and the device secret do).
    /// ``KeychainError/authFailed``: not this keychain's recovery key.
    public static func recover(
        at directory: KeychainDirectory, recoveryKey: RecoveryKey, newPasscode: SecureBytes?,
        tpm choice: TPMChoice = .whenPresent, kdf: KDFParameters = .interactive,
        tcti: String? = TrustedPlatformModule.configuredTCTI
    ) throws(KeychainError) {
        try reseal(at: directory, recoveryKey: recoveryKey, newPasscode: newPasscode, tpm: choice, kdf: kdf, tcti: tcti)
        try recordInLog(
            directory, tcti: tcti,
            AuditEvent(
                operation: "recover", result: "ok", subject: nil,
                detail: "with the recovery key"))
    }

    /// Records what a change made without a device did, through a device
    /// booted on the result (which checks it whole, as any boot does).
    private static func recordInLog(_ directory: KeychainDirectory, tcti: String?, _ event: AuditEvent)
        throws(KeychainError)
    {
        let device = try Device(directory: directory, tcti: tcti)
        device.audit.record(event)
        device.shutDown()
    }

    private static func reseal(
        at directory: KeychainDirectory, recoveryKey: RecoveryKey, newPasscode: SecureBytes?,
        tpm choice: TPMChoice, kdf: KDFParameters, tcti: String?
    ) throws(KeychainError) {
        Sodium.ensureInitialized()
        if let newPasscode, newPasscode.count == 0 { throw .param }
        guard directory.exists else { throw .noSuchKeychain }
        let lock = try takeKeychainLock(directory)
        defer { close(lock) }
        let recoveryRecord = try RawMetadata.read(directory, RecoveryKey.recordKey)
        guard let recoveryRecord else {
            Diagnostics.log("the keychain has no recovery record (only a keychain sealed by a TPM has one)")
            throw .badRequest
        }
        let (plain, classKeys) = try recoveryKey.openRecord(recoveryRecord)
        let secret = DeviceSecret(secret: plain)
        let store = try ItemStore(path: directory.databasePath, create: false, state: ItemSetState(secret: secret))
        let oldEpoch = try store.metadata(RollbackRecord.recordKey).map { (raw) throws(KeychainError) in
            try RollbackRecord(decoding: raw, secret: secret).epoch
        }
        secret.epoch.value = oldEpoch
        let records = try BootRecords(store: store, secret: secret)
        let tpm = try KeychainTPM.chosen(choice, tcti: tcti)
        var base = records.keybag
        base.kdf = kdf
        let bag = try SecretThread.run { () throws(KeychainError) -> Keybag in
            try base.rewrapped(secret: secret, classKeys: classKeys, newPasscode: newPasscode, sealingTPM: tpm)
        }
        var writes: [(key: String, value: [UInt8]?)] = [
            (Keybag.recordKey, bag.encoded(secret: secret)),
            (LockoutRecord.recordKey, LockoutRecord().encoded(secret: secret))
        ]
        let file: SecureBytes
        let newEpoch: UInt64?
        if let tpm {
            let counter = try tpm.defineCounter()
            newEpoch = counter.value
            writes.append(
                (
                    RollbackRecord.recordKey,
                    RollbackRecord(index: counter.index, epoch: counter.value).encoded(secret: secret)
                ))
            file = try SecureBytes(DeviceSecretFile.encodeSealed(try tpm.sealDeviceSecret(plain)))
        } else {
            newEpoch = nil
            writes.append((RollbackRecord.recordKey, nil))
            file = plain
        }
        // The database first: a crash before the file is replaced leaves a
        // keychain that `recover` opens again (its recovery record is unchanged).
        try store.rebind(secret: secret, from: oldEpoch, to: newEpoch, writing: writes)
        try store.sync()
        CrashPoint.reach("recover-committed")
        try directory.writeDeviceSecret(file)
        try store.closeLog()
    }

    // MARK: Rollback on purpose

    /// Accepts a keychain put back from an older copy of its files on
    /// purpose (as `restore` puts back a backup): binds its state to the
    /// TPM's current counter, so that it boots. Needs the passcode, checked
    /// through the TPM (counted by its lockout). No device may hold it.
    /// ``KeychainError/badRequest`` when the keychain is not behind its counter.
    public static func acceptRollback(
        at directory: KeychainDirectory, passcode: SecureBytes?,
        tcti: String? = TrustedPlatformModule.configuredTCTI
    ) throws(KeychainError) {
        let (from, to) = try rebindToCounter(at: directory, passcode: passcode, tcti: tcti)
        try recordInLog(
            directory, tcti: tcti,
            AuditEvent(
                operation: "accept-rollback", result: "ok", subject: nil,
                detail: "state of counter \(from) accepted at \(to)"))
    }

    private static func rebindToCounter(
        at directory: KeychainDirectory, passcode: SecureBytes?,
        tcti: String?
    ) throws(KeychainError) -> (UInt64, UInt64) {
        Sodium.ensureInitialized()
        guard directory.exists else { throw .noSuchKeychain }
        let lock = try takeKeychainLock(directory)
        defer { close(lock) }
        let (secret, sealedBy) = try directory.openDeviceSecret(tcti: tcti)
        guard let tpm = sealedBy else { throw .badRequest }
        let store = try ItemStore(path: directory.databasePath, create: false, state: ItemSetState(secret: secret))
        guard let raw = try store.metadata(RollbackRecord.recordKey) else { throw .decode }
        let record = try RollbackRecord(decoding: raw, secret: secret)
        let counter = try tpm.counter(at: record.index)
        guard record.epoch < counter else { throw .badRequest }
        secret.epoch.value = record.epoch
        let records = try BootRecords(store: store, secret: secret)
        let bag = records.keybag
        _ = try SecretThread.run { () throws(KeychainError) in
            try bag.unwrapPasscodeClasses(secret: secret, passcode: passcode, tpm: tpm)
        }
        try store.rebind(
            secret: secret, from: record.epoch, to: counter,
            writing: [
                (RollbackRecord.recordKey, RollbackRecord(index: record.index, epoch: counter).encoded(secret: secret))
            ])
        try store.sync()
        try store.closeLog()
        return (record.epoch, counter)
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
