#if canImport(Glibc)
import Glibc
#endif

/// How a keychain's device secret is kept (issue 30), as `status` and
/// `.control` say it.
public enum KeyProtection: String, Sendable, Equatable {
    /// Sealed by a TPM 2.0: the files alone open nothing, and every
    /// passcode guess goes through the TPM and its lockout.
    case tpm2
    /// In a file of the keychain: a copy of the files can be guessed at
    /// offline, at Argon2id's pace.
    case file
}

/// What `init` (and `passcode --tpm`) does about a TPM.
public enum TPMChoice: Sendable, Equatable {
    /// Seal to the TPM when one answers, else keep the device secret in a file.
    case whenPresent
    /// Seal to the TPM; fail when none answers.
    case required
    /// Keep the device secret in a file (`--no-tpm`).
    case declined
}

/// The TPM a keychain's keys are sealed by, reached at the TCTI given
/// (nil: `$TPM2TOOLS_TCTI`, else tpm2-tss's default, `/dev/tpmrm0`), with
/// its failures in a keychain's terms. Each use opens its own connection:
/// the TPM is used at boot, unlock, passcode changes and counter bumps only.
struct KeychainTPM: Sendable {
    let tcti: String?

    /// The TPM that answers at `tcti`, or nil when none does (the caller
    /// says how the keys are kept instead).
    static func present(tcti: String?) -> KeychainTPM? {
        (try? TrustedPlatformModule(tcti: tcti)).map { _ in KeychainTPM(tcti: tcti) }
    }

    /// The TPM `choice` asks for at `tcti`: nil when declined, or when
    /// none answers and one is merely welcome; ``KeychainError/tpmUnavailable``
    /// when one is required and none answers.
    static func chosen(_ choice: TPMChoice, tcti: String?) throws(KeychainError) -> KeychainTPM? {
        switch choice {
        case .declined: return nil
        case .whenPresent: return present(tcti: tcti)
        case .required:
            guard let found = present(tcti: tcti) else { throw .tpmUnavailable }
            return found
        }
    }

    /// Runs `body` with a connection; a TPM's refusal becomes the keychain's error.
    func use<R>(_ body: (TrustedPlatformModule) throws(TPMError) -> R) throws(KeychainError) -> R {
        do throws(TPMError) {
            return try body(try TrustedPlatformModule(tcti: tcti))
        } catch {
            switch error {
            case .authFailed: throw .authFailed
            case .lockedOut: throw .tpmLockedOut
            case .notThisTPM: throw .tpmMismatch
            case .unavailable, .busy:
                Diagnostics.log("\(error)")
                throw .tpmUnavailable
            case .indexTaken:
                Diagnostics.log("every NV index tried for the keychain's rollback counter is taken on the TPM")
                throw .io
            case .failed:
                Diagnostics.log("the TPM failed: \(error)")
                throw .io
            }
        }
    }

    /// Seals `secret` with an empty auth, usable in a lockout: only this TPM opens it.
    func sealDeviceSecret(_ secret: SecureBytes) throws(KeychainError) -> [UInt8] {
        let empty = try SecureBytes(count: 0)
        return try use { tpm throws(TPMError) in try tpm.seal(secret, auth: empty, guarded: false) }
    }

    func unsealDeviceSecret(_ blob: [UInt8]) throws(KeychainError) -> SecureBytes {
        let empty = try SecureBytes(count: 0)
        let secret = try use { tpm throws(TPMError) in try tpm.unseal(blob, auth: empty) }
        guard secret.count == Crypto.keySize else { throw .tpmMismatch }
        return secret
    }

    /// The TPM's dictionary-attack state, for `status`; nil when it does not answer.
    func lockout() -> (failures: UInt32, maximum: UInt32, recoverySeconds: UInt32)? {
        try? use { tpm throws(TPMError) in try tpm.lockout() }
    }

    // MARK: The rollback counter

    /// NV indexes are tried at random in the owner's range of TCG's
    /// registry of reserved handles (0x01800000–0x01BFFFFF), above the
    /// subrange it assigned to systemd (0x01800400–0x018005FF), so that
    /// keychains of several users coexist with each other and with systemd.
    static let counterIndexes: ClosedRange<UInt32> = 0x0181_0000...0x01BF_FFFF

    /// Defines a new counter at a free index, tried among `candidates`
    /// (nil: 16 at random in ``counterIndexes``, so a taken one is passed
    /// over); returns the index and its value.
    func defineCounter(candidates: [UInt32]? = nil) throws(KeychainError) -> (index: UInt32, value: UInt64) {
        let indexes = candidates ?? (0..<16).map { _ in UInt32.random(in: Self.counterIndexes) }
        return try use { tpm throws(TPMError) in
            for index in indexes {
                do throws(TPMError) {
                    try tpm.defineCounter(at: index)
                    return (index, try tpm.counter(at: index))
                } catch .indexTaken {
                    continue
                }
            }
            throw .indexTaken
        }
    }

    func counter(at index: UInt32) throws(KeychainError) -> UInt64 {
        try use { tpm throws(TPMError) in try tpm.counter(at: index) }
    }

    @discardableResult
    func increment(counter index: UInt32) throws(KeychainError) -> UInt64 {
        try use { tpm throws(TPMError) in try tpm.increment(counter: index) }
    }
}

/// The `device-secret` file: the 32 bytes themselves (file protection), or
/// `"KCFSTPM2" | version u8 (1) | blob` where the blob is the device secret
/// sealed by the TPM (``TrustedPlatformModule/seal(_:auth:guarded:)``).
enum DeviceSecretFile {
    case plain(SecureBytes)
    case sealed([UInt8])

    static let magic = Array("KCFSTPM2".utf8)
    static let version: UInt8 = 1
    /// A sealed object's public and private parts are a few hundred bytes.
    static let maximumSize = 4096

    static func encodeSealed(_ blob: [UInt8]) -> [UInt8] { magic + [version] + blob }

    init(_ contents: SecureBytes) throws(KeychainError) {
        if contents.count == Crypto.keySize {
            self = .plain(contents)
            return
        }
        let bytes = contents.bytes()
        guard bytes.count > Self.magic.count + 1, Array(bytes.prefix(Self.magic.count)) == Self.magic,
            bytes[Self.magic.count] == Self.version
        else {
            Diagnostics.log("the keychain's device secret is damaged")
            throw .decode
        }
        self = .sealed(Array(bytes.dropFirst(Self.magic.count + 1)))
    }
}
