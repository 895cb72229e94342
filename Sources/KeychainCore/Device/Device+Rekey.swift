internal import CLinux
#if canImport(Glibc)
import Glibc
#endif

/// A change of protection makes new keys (docs/SECURITY.md, "Bound to this
/// machine, against whoever holds the files and the TPM"): a copy of a keychain
/// taken before it was sealed by a TPM held its device secret in a file,
/// and the same secret and class keys, kept by the move, opened the sealed
/// keychain with no TPM: `always` items at once, and every item, also
/// those written after, once the old passcode was guessed. Now the move
/// copies every item, group, policy and detail into a new keychain made
/// beside it (a new device secret, new class keys, sealed by the TPM),
/// swaps the two directories in one rename, and destroys the old one: no
/// copy from before opens anything written after.
extension Device {
    /// Where the new keychain is made, beside the old one; found and
    /// destroyed at the next boot when a move was interrupted.
    static func rekeyPath(_ directory: KeychainDirectory) -> String { directory.path + ".rekey" }

    /// Moves a keychain kept in a file to the TPM at `tcti` (`keychainfs
    /// passcode --tpm`), with new keys: the recovery key of the new
    /// keychain is returned, to be shown once. Needs the passcode (a wrong
    /// one is a failed attempt like a wrong unlock). No device may hold it
    /// (``KeychainError/keychainInUse``); one sealed already is
    /// ``KeychainError/duplicateKeychain``. The KeychainTPM target's
    /// `moveToTPM(at:passcode:tcti:)` is the public one.
    package static func moveToTPM(
        at directory: KeychainDirectory, passcode: SecureBytes?, tcti: String?, keyProtectors: any KeyProtectors
    ) throws(KeychainError) -> RecoveryKey {
        guard try directory.keyProtection() == .file else { throw .duplicateKeychain }
        // Directly, or through the service for a user who cannot reach the TPM.
        _ = try keyProtectors.chosen(.required, tcti: tcti)
        guard
            let recovery = try rekey(
                at: directory, passcode: passcode, tpm: .required, tcti: tcti, keyProtectors: keyProtectors)
        else {
            throw .tpmUnavailable
        }
        return recovery
    }

    /// Makes the keychain at `directory` anew with new keys, protected as
    /// `choice` says, with everything it holds (opened with `passcode`):
    /// returns the new recovery key (nil: kept in a file).
    static func rekey(
        at directory: KeychainDirectory, passcode: SecureBytes?, tpm choice: TPMChoice, tcti: String?,
        keyProtectors: any KeyProtectors
    ) throws(KeychainError) -> RecoveryKey? {
        let old = try Device(directory: directory, tcti: tcti, keyProtectors: keyProtectors)
        let recovery: RecoveryKey?
        do throws(KeychainError) {
            try old.unlock(passcode: passcode)
            recovery = try old.copyIntoNewKeychain(passcode: passcode, tpm: choice, tcti: tcti)
        } catch {
            old.shutDown()
            throw error
        }
        let oldBinding = old.passcodeCounter
        old.shutDown()
        if let tpm = old.sealingTPM.withLock({ $0 }) {
            for counter in [old.rollbackCounter.withLock { $0 }, oldBinding].compactMap({ $0 }) { tpm.release(counter) }
        }
        CrashPoint.reach("rekey-copied")
        try exchange(directory)
        CrashPoint.reach("rekey-exchanged")
        destroyLeftover(of: directory)
        return recovery
    }

    /// Copies everything of this unlocked device into a new keychain at
    /// ``rekeyPath(_:)`` with `passcode`, sealed as `choice` says; returns
    /// its recovery key (nil: kept in a file).
    private func copyIntoNewKeychain(passcode: SecureBytes?, tpm choice: TPMChoice, tcti: String?)
        throws(KeychainError) -> RecoveryKey?
    {
        let target = KeychainDirectory(path: Self.rekeyPath(directory))
        Self.destroyKeychainFiles(at: target.path)
        let recovery = try Device.createKeychain(
            at: target, passcode: passcode, kdf: keybag.kdf, tpm: choice, tcti: tcti, counterIndexes: nil,
            keyProtectors: keyProtectors)
        guard
            FileDescriptor(open(target.path + "/" + Self.unfinishedMarker, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600))
                != nil
        else { throw fileFailure("create", target.path + "/" + Self.unfinishedMarker) }
        let copy = try Device(directory: target, tcti: tcti, keyProtectors: keyProtectors)
        defer { copy.shutDown() }
        try copy.unlock(passcode: passcode)
        let from = PasswordManager(device: self), to = PasswordManager(device: copy)
        var count = 0
        for group in try from.groups() {
            if group != ItemLimits.defaultGroup { try to.createGroup(group) }
            for (identifier, info) in try from.items(inGroup: group) {
                try to.write(
                    try from.key(forIdentifier: identifier, inGroup: group), identifier: identifier, group: group,
                    protectionClass: info.protectionClass, condition: .ifAbsent,
                    details: try from.details(forIdentifier: identifier, inGroup: group))
                count += 1
            }
        }
        from.purge()
        to.purge()
        // The collections' labels are the keychain's too (no secret: copied as they are).
        for (group, label) in directory.collectionLabels() { try target.setCollectionLabel(label, of: group) }
        let policy = entitlements.withLock { $0 }
        try copy.writePolicy(policy)
        copy.entitlements.withLock { $0 = policy }
        copy.audit.record(
            AuditEvent(
                operation: "rekey", result: "ok", subject: nil,
                detail: "\(recovery == nil ? "file" : "tpm2"), new keys: \(count) items copied; the log before is "
                    + "\(AuditLog.fileName).before-rekey"))
        return recovery
    }

    /// Swaps the new keychain into place in one rename (RENAME_EXCHANGE):
    /// until it, the old keychain is whole; from it, the new one is.
    private static func exchange(_ directory: KeychainDirectory) throws(KeychainError) {
        guard CLinux_rename_exchange(rekeyPath(directory), directory.path) == 0 else {
            throw fileFailure("exchange with the new keychain", directory.path)
        }
        KeychainDirectory.syncParent(of: directory.path)
    }

    /// Marks the new keychain until it is exchanged into place.
    static let unfinishedMarker = ".rekey-unfinished"

    /// After the exchange (or at a boot after an interrupted move): the
    /// keychain left at ``rekeyPath(_:)`` is destroyed. A new one whose move
    /// did not finish still has its ``unfinishedMarker``; the old one has
    /// none, and its log is kept beside the new one's first.
    static func destroyLeftover(of directory: KeychainDirectory) {
        unlink(directory.path + "/" + unfinishedMarker)
        let leftover = KeychainDirectory(path: rekeyPath(directory))
        guard leftover.exists else { return }
        if access(leftover.path + "/" + unfinishedMarker, F_OK) != 0 {
            rename(leftover.path + "/" + AuditLog.fileName, directory.path + "/" + AuditLog.fileName + ".before-rekey")
        }
        destroyKeychainFiles(at: leftover.path)
    }

    /// Removes a keychain's files (the device secret overwritten first:
    /// it is the key to everything else) and its directory; anything else
    /// in it is left, and with it the directory.
    static func destroyKeychainFiles(at path: String) {
        let secretPath = path + "/device-secret"
        if let fd = FileDescriptor(open(secretPath, O_WRONLY | O_CLOEXEC)) {
            var info = stat()
            if fstat(fd.raw, &info) == 0, info.st_size > 0 {
                let zeros = [UInt8](repeating: 0, count: Int(info.st_size))
                _ = zeros.withUnsafeBytes { write(fd.raw, $0.baseAddress, $0.count) }
                fsync(fd.raw)
            }
        }
        for name in [
            "device-secret", "device-secret.new", "keychain.db", "keychain.db-wal", "keychain.db-shm",
            "keychain.db.new", "device.lock", AuditLog.fileName, AuditLog.rotatedName, unfinishedMarker,
            KeychainDirectory.spaceReserveName, KeychainDirectory.collectionLabelsFileName,
            KeychainDirectory.collectionLabelsFileName + ".new"
        ] {
            unlink(path + "/" + name)
        }
        rmdir(path)
    }
}
