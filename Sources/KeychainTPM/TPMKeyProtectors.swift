import KeychainCore
import KeychainProtocol
#if canImport(Glibc)
import Glibc
#endif

/// The core's ``KeyProtectors`` over this machine's TPM (``KeychainTPM``):
/// what every Device, and every change made to a keychain without one, is
/// handed by the public calls below (docs/CONTRIBUTING.md, "Where a new piece goes").
package struct TPMKeyProtectors: KeyProtectors {
    package init() {}

    package func protector(tcti: String?) -> any KeyProtector { KeychainTPM(tcti: tcti) }

    package func present(tcti: String?) -> (any KeyProtector)? { KeychainTPM.present(tcti: tcti) }

    package func chosen(_ choice: TPMChoice, tcti: String?) throws(KeychainError) -> (any KeyProtector)? {
        try KeychainTPM.chosen(choice, tcti: tcti)
    }

    package func sealedBy(tcti: String?, storageKey: [UInt8]?, throughService: Bool) -> any KeyProtector {
        KeychainTPM.sealedBy(tcti: tcti, storageKey: storageKey, throughService: throughService)
    }

    package func sharingSession<R>(tcti: String?, _ body: () throws(KeychainError) -> R) throws(KeychainError) -> R {
        try KeychainTPM.sharingSession(tcti: tcti, body)
    }
}

// The public calls that make, boot, recover or check a keychain, as they
// were before the core named what it needs of a TPM (``KeyProtector``):
// each hands the core this machine's TPM.

extension Device {
    /// Boots the device of an existing keychain: locked, before first unlock.
    /// - Parameters:
    ///   - policy: lockout delays after wrong passcodes.
    ///   - clock: wall-clock seconds; the lockout deadline is persisted in it,
    ///     so that restarting the process does not reset it.
    ///   - tcti: the TPM of a TPM-sealed keychain (nil: `$TPM2TOOLS_TCTI`, else `/dev/tpmrm0`).
    public convenience init(
        directory: KeychainDirectory, policy: LockoutPolicy = .iOS,
        clock: @escaping @Sendable () -> Int64 = { Int64(time(nil)) },
        tcti: String? = TrustedPlatformModule.configuredTCTI
    ) throws(KeychainError) {
        try self.init(directory: directory, policy: policy, clock: clock, tcti: tcti, keyProtectors: TPMKeyProtectors())
    }

    /// Creates a new keychain at `directory`: device secret, class keys, empty store.
    /// `passcode` nil creates one whose `unlock` needs no passcode. With a
    /// TPM (`tpm`, at `tcti`), the device secret is sealed by it, the
    /// passcode entangled with it and a rollback counter defined: the
    /// recovery key is returned, to be shown once (nil: kept in a file).
    @discardableResult
    public static func createKeychain(
        at directory: KeychainDirectory, passcode: SecureBytes?,
        kdf: KDFParameters = .interactive, tpm choice: TPMChoice = .whenPresent,
        tcti: String? = TrustedPlatformModule.configuredTCTI
    ) throws(KeychainError) -> RecoveryKey? {
        try createKeychain(at: directory, passcode: passcode, kdf: kdf, tpm: choice, tcti: tcti, counterIndexes: nil)
    }

    /// ``createKeychain(at:passcode:kdf:tpm:tcti:)`` with the NV indexes its
    /// rollback counter may take (nil: chosen at random): for the test of an
    /// index that is taken.
    @discardableResult
    package static func createKeychain(
        at directory: KeychainDirectory, passcode: SecureBytes?, kdf: KDFParameters,
        tpm choice: TPMChoice, tcti: String?,
        counterIndexes: [UInt32]?
    ) throws(KeychainError) -> RecoveryKey? {
        try createKeychain(
            at: directory, passcode: passcode, kdf: kdf, tpm: choice, tcti: tcti, counterIndexes: counterIndexes,
            keyProtectors: TPMKeyProtectors())
    }

    /// Moves a keychain kept in a file to the TPM at `tcti` (`keychainfs
    /// passcode --tpm`), with new keys: the recovery key of the new
    /// keychain is returned, to be shown once. Needs the passcode (a wrong
    /// one is a failed attempt like a wrong unlock). No device may hold it
    /// (``KeychainError/keychainInUse``); one sealed already is
    /// ``KeychainError/duplicateKeychain``.
    public static func moveToTPM(
        at directory: KeychainDirectory, passcode: SecureBytes?,
        tcti: String? = TrustedPlatformModule.configuredTCTI
    ) throws(KeychainError) -> RecoveryKey {
        try moveToTPM(at: directory, passcode: passcode, tcti: tcti, keyProtectors: TPMKeyProtectors())
    }

    /// Opens a TPM-sealed keychain with its recovery key, without the TPM
    /// that sealed it (cleared, replaced, another machine), and seals it to
    /// the TPM at `tcti` with `newPasscode` (nil: none), or keeps it in a
    /// file when `choice` is ``TPMChoice/declined`` (or no TPM answers and it
    /// is ``TPMChoice/whenPresent``). No device may hold the keychain. Then
    /// the keychain is made anew with new keys: returns its new recovery
    /// key (nil: kept in a file); the old one opens nothing of it.
    /// ``KeychainError/authFailed``: not this keychain's recovery key.
    public static func recover(
        at directory: KeychainDirectory, recoveryKey: RecoveryKey, newPasscode: SecureBytes?,
        tpm choice: TPMChoice = .whenPresent, kdf: KDFParameters = .interactive,
        tcti: String? = TrustedPlatformModule.configuredTCTI
    ) throws(KeychainError) -> RecoveryKey? {
        try recover(
            at: directory, recoveryKey: recoveryKey, newPasscode: newPasscode, tpm: choice, kdf: kdf, tcti: tcti,
            keyProtectors: TPMKeyProtectors())
    }

    /// Accepts a keychain put back from an older copy of its files on
    /// purpose (as `restore` puts back a backup): binds its state to the
    /// TPM's current counter, so that it boots. Needs the passcode, checked
    /// through the TPM (counted by its lockout). No device may hold it.
    /// ``KeychainError/badRequest`` when the keychain is not behind its counter.
    public static func acceptRollback(
        at directory: KeychainDirectory, passcode: SecureBytes?,
        tcti: String? = TrustedPlatformModule.configuredTCTI
    ) throws(KeychainError) {
        try acceptRollback(at: directory, passcode: passcode, tcti: tcti, keyProtectors: TPMKeyProtectors())
    }

    /// Who keeps the people's shares of the TPM in this process (the service's broker).
    package static func keepTPMGuessShares(with broker: TPMBroker) {
        KeychainTPM.guessShares.withLock { $0 = broker }
    }
}

extension AuditLog {
    /// Checks the chain of `directory`'s audit log (the rotated file first,
    /// then the current one) and that it reaches the newest line the
    /// keychain recorded. Returns the lines checked and the problems found
    /// (none: intact). Needs the device secret (unsealed by the TPM when it
    /// is sealed), not the passcode.
    public static func verify(directory: KeychainDirectory) throws(KeychainError) -> VerifyReport {
        try verify(directory: directory, keyProtectors: TPMKeyProtectors())
    }
}

extension KeychainDirectory {
    /// The device secret's 32 bytes (unsealed by the TPM at `tcti` when it is sealed).
    func readDeviceSecret(tcti: String? = TrustedPlatformModule.configuredTCTI) throws(KeychainError) -> SecureBytes {
        try readDeviceSecret(tcti: tcti, keyProtectors: TPMKeyProtectors())
    }

    /// The device secret, unsealed by the TPM at `tcti` when it is sealed,
    /// with the TPM that sealed it (nil: kept in the file).
    func openDeviceSecret(tcti: String?) throws(KeychainError) -> (DeviceSecret, sealedBy: (any KeyProtector)?) {
        try openDeviceSecret(tcti: tcti, keyProtectors: TPMKeyProtectors())
    }
}
