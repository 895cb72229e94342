import Synchronization
#if canImport(Glibc)
import Glibc
#endif

extension Device {
    /// Creates a new keychain at `directory`: device secret, class keys, empty store.
    /// `passcode` nil creates one whose `unlock` needs no passcode. With a
    /// TPM (`tpm`, at `tcti`, found through `keyProtectors`), the device
    /// secret is sealed by it, the passcode entangled with it and a rollback
    /// counter defined: the recovery key is returned, to be shown once (nil:
    /// kept in a file). `counterIndexes`: the NV indexes its rollback counter
    /// may take (nil: chosen at random), for the test of an index that is taken.
    /// The KeychainTPM target's `createKeychain(at:passcode:kdf:tpm:tcti:)` is the public one.
    @discardableResult
    package static func createKeychain(
        at directory: KeychainDirectory, passcode: SecureBytes?, kdf: KDFParameters,
        tpm choice: TPMChoice, tcti: String?,
        counterIndexes: [UInt32]?, keyProtectors: any KeyProtectors
    ) throws(KeychainError) -> RecoveryKey? {
        Sodium.ensureInitialized()
        if let passcode, passcode.count == 0 { throw .param }
        if directory.exists { throw .duplicateKeychain }
        var tpm = try keyProtectors.chosen(choice, tcti: tcti)
        try directory.prepareForCreation()
        let secretBytes = SecureBytes.random(count: Crypto.keySize)
        let secret = DeviceSecret(secret: secretBytes)
        var fileContents = secretBytes
        if let chosen = tpm {
            // Sealed first: the storage key it is sealed under is pinned
            // before the passcode's object is sealed under it too.
            let sealed = try chosen.sealDeviceSecret(secretBytes)
            tpm?.storageKey = sealed.storageKey
            fileContents = sealed.file
        }
        let sealingTPM = tpm
        let (bag, classKeys) = try SecretThread.run { () throws(KeychainError) in
            try Keybag.create(secret: secret, passcode: passcode, kdf: kdf, tpm: sealingTPM)
        }
        var extraRecords: [(String, [UInt8])] = []
        var recovery: RecoveryKey?
        if let tpm {
            let counter = try tpm.defineCounter(auth: secret.counterAuth, candidates: counterIndexes)
            secret.epoch.value = counter.value
            if bag.isPasscodeBound, let key = PasscodeBindingKey(classKeys: classKeys) {
                // Bound to the passcode from the start: no copy of it is ever unbound.
                let bindingCounter = try tpm.defineBindingCounter(of: key)
                let policy = EntitlementPolicy().encoded(secret: secret)
                let binding = PasscodeBinding(
                    counter: bindingCounter.counter, value: bindingCounter.value, rows: ItemSetState.emptyDigest,
                    policy: key.policyDigest(ofRecord: policy))
                extraRecords.append((PasscodeBinding.recordKey, binding.encoded(key: key)))
            }
            let key = RecoveryKey.generate()
            extraRecords += [
                (
                    RollbackRecord.recordKey,
                    RollbackRecord(counter: counter.counter, epoch: counter.value).encoded(secret: secret)
                ),
                (
                    RecoveryKey.recordKey,
                    try key.sealRecord(deviceSecret: secretBytes, classKeys: classKeys, binding: secret)
                )
            ]
            recovery = key
        }
        // The database is the marker of a finished keychain (`exists`), so it
        // is created last: a failure before leaves no half keychain behind.
        try directory.writeDeviceSecret(fileContents)
        let temporary = directory.databasePath + ".new"
        unlink(temporary)
        do {
            let store = try ItemStore(path: temporary, create: true, state: ItemSetState(secret: secret))
            try store.setMetadata(Keybag.recordKey, bag.encoded(secret: secret))
            try store.setMetadata(LockoutRecord.recordKey, LockoutRecord().encoded(secret: secret))
            try store.setMetadata(EntitlementPolicy.recordKey, EntitlementPolicy().encoded(secret: secret))
            for (key, value) in extraRecords { try store.setMetadata(key, value) }
            try store.sync()
        }
        unlink(temporary + "-wal")
        unlink(temporary + "-shm")
        // sqlite creates files with the umask's mode; docs/FILESYSTEM.md ("Layout") keeps them private
        // (sqlite gives the -wal and -shm files the database file's mode).
        guard chmod(temporary, 0o600) == 0 else { throw fileFailure("make private (chmod 600)", temporary) }
        guard rename(temporary, directory.databasePath) == 0 else {
            throw fileFailure("rename into place", directory.databasePath)
        }
        return recovery
    }
}

/// The authenticated records a device reads at boot, those of an older
/// format added first. A record that is missing or fails authentication
/// stops the boot (``KeychainError/decode``).
struct BootRecords {
    let keybag: Keybag
    let entitlements: EntitlementPolicy
    let auditAnchor: AuditLog.Anchor?

    init(store: ItemStore, secret: DeviceSecret) throws(KeychainError) {
        guard let record = try store.metadata(Keybag.recordKey) else { throw .decode }
        keybag = try Keybag(decoding: record, secret: secret)
        try store.verifyItemSet(legacy: keybag.formatVersion < Keybag.stateVersion)
        if keybag.formatVersion < Keybag.version {
            // An older format: give it the records the current one
            // requires, then mark it current (last, so an interrupted
            // upgrade is redone).
            if try store.metadata(LockoutRecord.recordKey) == nil {
                try store.setMetadata(LockoutRecord.recordKey, LockoutRecord().encoded(secret: secret))
            }
            if try store.metadata(EntitlementPolicy.recordKey) == nil {
                try store.setMetadata(EntitlementPolicy.recordKey, EntitlementPolicy().encoded(secret: secret))
            }
            if keybag.formatVersion < Keybag.detailsVersion { try store.addDetailsColumn() }
            try store.setMetadata(Keybag.recordKey, keybag.encoded(secret: secret))
        }
        if let recovery = try store.metadata(RecoveryKey.recordKey) {
            try Device.verifyRecoveryBinding(recovery, secret: secret)
        }
        guard let entitlementRecord = try store.metadata(EntitlementPolicy.recordKey) else {
            // Deleting it would open every group to every program.
            Diagnostics.log("the entitlement record is missing")
            throw .decode
        }
        do throws(KeychainError) {
            entitlements = try EntitlementPolicy(decoding: entitlementRecord, secret: secret)
        } catch {
            Diagnostics.log("the entitlement record failed authentication")
            throw error
        }
        do throws(KeychainError) {
            auditAnchor = try store.metadata(AuditLog.anchorKey).map { (raw) throws(KeychainError) in
                try AuditLog.Anchor(decoding: raw, secret: secret)
            }
        } catch {
            Diagnostics.log("the audit log's anchor record failed authentication")
            throw error
        }
    }
}
