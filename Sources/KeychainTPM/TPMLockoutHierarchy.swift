import KeychainCore
import KeychainProtocol
#if canImport(Glibc)
import Glibc
#endif

/// The TPM's lockout hierarchy, taken (docs/SECURITY.md, "Bound to this
/// machine, against whoever holds the files and the TPM"): on most machines its
/// auth is empty, so anyone who reaches the TPM can clear its count of wrong
/// passcodes or set parameters that stop the counting, and guesses then
/// go through at the TPM's speed. As Windows does, a random auth is set
/// and kept sealed by the TPM in a root-only file (a copy of the file
/// opens on no other TPM; the file's reader on this one must also reach
/// the TPM): `keychainfs tpm take-lockout`, which the service does at its
/// start where its account may. The way back: `tpm release-lockout` (the
/// auth empty again), or clearing the TPM in the firmware setup (which
/// also needs every sealed keychain's recovery key).
public enum TPMLockoutHierarchy {
    /// `KEYCHAINFS_TPM=none`: the TPM is not to be used, not even taken.
    public static var declinedByEnvironment: Bool { KeychainTPM.declinedByEnvironment }

    /// Where the sealed auth is kept, in the state directory given.
    public static let fileName = "tpm-lockout-auth"
    /// Dictionary-attack settings set when the TPM's stop counting
    /// (Windows' defaults): 32 tries, one forgiven every 2 hours, 24 hours
    /// before the lockout auth may be tried again after a wrong one.
    public static let counting = (maximum: UInt32(32), recoverySeconds: UInt32(7200), lockoutRecovery: UInt32(86400))

    /// Takes the lockout hierarchy of the TPM at `tcti`: when its
    /// counting is off, it is switched on (``counting``); then a random
    /// auth is sealed into `directory`'s ``fileName`` (written first: a
    /// crash leaves an auth unset, which taking again replaces) and set.
    /// ``KeychainError/badRequest`` when its auth is set already (by an
    /// earlier take, or by someone else), ``KeychainError/tpmUnavailable``
    /// when no TPM answers. Returns its state after.
    public static func take(stateDirectory: String, tcti: String? = TrustedPlatformModule.configuredTCTI)
        throws(KeychainError) -> TPMLockoutState
    {
        Sodium.ensureInitialized()
        guard let tpm = KeychainTPM.present(tcti: tcti), let before = tpm.lockout() else { throw .tpmUnavailable }
        guard !before.lockoutAuthSet else { throw .badRequest }
        let empty = try SecureBytes(count: 0)
        if !before.limitsGuesses {
            try tpm.use { module throws(TPMError) in
                try module.setLockoutParameters(
                    auth: empty, maximum: counting.maximum, recoverySeconds: counting.recoverySeconds,
                    lockoutRecoverySeconds: counting.lockoutRecovery)
            }
        }
        let auth = SecureBytes.random(count: Crypto.keySize)
        let sealed = try tpm.sealDeviceSecret(auth)
        try KeychainDirectory.writePrivateFile(
            sealed.file,
            at: stateDirectory + "/" + fileName)
        try KeychainTPM(tcti: tcti, storageKey: sealed.storageKey).use { module throws(TPMError) in
            try module.changeLockoutAuth(from: empty, to: auth)
        }
        guard let after = tpm.lockout() else { throw .tpmUnavailable }
        return after
    }

    /// Gives the lockout hierarchy back its empty auth, and removes the file.
    public static func release(stateDirectory: String, tcti: String? = TrustedPlatformModule.configuredTCTI)
        throws(KeychainError)
    {
        let (auth, tpm) = try sealedAuth(stateDirectory: stateDirectory, tcti: tcti)
        let empty = try SecureBytes(count: 0)
        try tpm.use { module throws(TPMError) in try module.changeLockoutAuth(from: auth, to: empty) }
        unlink(stateDirectory + "/" + fileName)
    }

    /// Clears the TPM's count of wrong passcodes with the sealed auth: for
    /// root, when a user is locked out by the TPM and root knows it is them.
    public static func resetCount(stateDirectory: String, tcti: String? = TrustedPlatformModule.configuredTCTI)
        throws(KeychainError)
    {
        let (auth, tpm) = try sealedAuth(stateDirectory: stateDirectory, tcti: tcti)
        try tpm.use { module throws(TPMError) in try module.resetLockoutCount(auth: auth) }
    }

    /// The sealed auth, unsealed by the TPM it is pinned to. ``KeychainError/noSuchKeychain``
    /// when there is no file (the hierarchy was not taken here).
    private static func sealedAuth(stateDirectory: String, tcti: String?) throws(KeychainError)
        -> (SecureBytes, KeychainTPM)
    {
        Sodium.ensureInitialized()
        let path = stateDirectory + "/" + fileName
        guard access(path, F_OK) == 0 else { throw .noSuchKeychain }
        guard case .sealed(let blob, let storageKey, false) = try KeychainDirectory.readSealedFile(at: path) else {
            throw .decode
        }
        let tpm = KeychainTPM(tcti: tcti, storageKey: storageKey)
        return (try tpm.unsealDeviceSecret(blob).secret, tpm)
    }
}
