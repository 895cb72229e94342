#if canImport(Glibc)
import Glibc
#endif

// What the core needs of whatever protects a keychain's keys (docs/SECURITY.md,
// "Keys sealed by the TPM"), named here so that the core depends on no TPM:
// the TPM adapter (the KeychainTPM target) implements it, and whoever builds a
// Device hands it in (docs/CONTRIBUTING.md, "Where a new piece goes").

/// The TPM a keychain's keys are sealed by, as the core uses it: at boot,
/// unlock, passcode changes and counter bumps. Its failures are the
/// keychain's errors (``KeychainError/tpmUnavailable``, ``KeychainError/authFailed``...).
package protocol KeyProtector: Sendable {
    /// The TCTI it is reached at (nil: the machine's, ``KeyProtection/machineTCTI``).
    var tcti: String? { get }
    /// The name of the storage primary key the keychain was sealed under
    /// (nil: not recorded yet): no session is salted with another.
    var storageKey: [UInt8]? { get set }
    /// The person whose share of the TPM's lockout a wrong passcode here
    /// uses, for the keychains the service holds for each user; nil: none is kept.
    var person: UInt32? { get set }
    /// Reached through the keychainfs service, for a user who cannot reach the TPM.
    var throughService: Bool { get }

    /// Seals `secret` under `auth` (`guarded`: counted by the lockout);
    /// returns the blob and the name of the storage key it is sealed under.
    func seal(_ secret: SecureBytes, auth: SecureBytes, guarded: Bool) throws(KeychainError)
        -> (blob: [UInt8], storageKey: [UInt8])
    /// What `blob` holds, and the name of the storage key it was unsealed under.
    func unseal(_ blob: [UInt8], auth: SecureBytes) throws(KeychainError) -> (secret: SecureBytes, storageKey: [UInt8])
    /// The device secret sealed with an empty auth: the contents of its
    /// file (``DeviceSecretFile``) and the storage key it is sealed under.
    func sealDeviceSecret(_ secret: SecureBytes) throws(KeychainError) -> (file: SecureBytes, storageKey: [UInt8])
    /// The device secret `blob` holds, and the storage key it was unsealed under.
    func unsealDeviceSecret(_ blob: [UInt8]) throws(KeychainError) -> (secret: SecureBytes, storageKey: [UInt8])
    /// The TPM's dictionary-attack state, for `status`; nil when it does not answer.
    func lockout() -> TPMLockoutState?

    /// Defines a new counter that only `auth` reads and increments, at a
    /// free index among `candidates` (nil: chosen at random in
    /// ``KeyProtection/counterIndexes``); returns it and its value.
    func defineCounter(auth: SecureBytes, candidates: [UInt32]?) throws(KeychainError)
        -> (counter: CounterReference, value: UInt64)
    /// The passcode binding counter of `key` the TPM holds at one of its indexes (nil: none).
    func bindingCounter(of key: PasscodeBindingKey) throws(KeychainError) -> CounterReference?
    func value(of counter: CounterReference) throws(KeychainError) -> UInt64
    func increment(_ counter: CounterReference) throws(KeychainError)
    /// Frees a counter the keychain no longer uses; a failure is logged.
    func release(_ counter: CounterReference)
}

extension KeyProtector {
    /// How a keychain sealed by it says it.
    package var protection: KeyProtection { throughService ? .tpm2Service : .tpm2 }

    /// ``defineCounter(auth:candidates:)`` at an index chosen at random.
    package func defineCounter(auth: SecureBytes) throws(KeychainError) -> (counter: CounterReference, value: UInt64) {
        try defineCounter(auth: auth, candidates: nil)
    }

    /// A new passcode binding counter of `key`, at the first free one of
    /// its indexes (``PasscodeBindingKey/counterCandidates``).
    package func defineBindingCounter(of key: PasscodeBindingKey) throws(KeychainError)
        -> (counter: CounterReference, value: UInt64)
    {
        try defineCounter(auth: key.counterAuth, candidates: key.counterCandidates)
    }
}

/// Where the core finds a keychain's ``KeyProtector``: the one a choice
/// asks for, the one a sealed file names, the one at a TCTI. Handed to a
/// ``Device`` (and to what makes, recovers or checks a keychain) by whoever
/// builds it: the TPM adapter's (KeychainTPM's `TPMKeyProtectors`).
package protocol KeyProtectors: Sendable {
    /// The TPM at `tcti`, whether or not one answers there.
    func protector(tcti: String?) -> any KeyProtector
    /// The TPM that answers at `tcti`, or nil when none does.
    func present(tcti: String?) -> (any KeyProtector)?
    /// The TPM `choice` asks for at `tcti`: nil when declined, or when none
    /// answers and one is merely welcome; ``KeychainError/tpmUnavailable``
    /// when one is required, or named, and none answers.
    func chosen(_ choice: TPMChoice, tcti: String?) throws(KeychainError) -> (any KeyProtector)?
    /// The TPM a sealed file names: the service's for this user, or the one at `tcti`.
    func sealedBy(tcti: String?, storageKey: [UInt8]?, throughService: Bool) -> any KeyProtector
    /// Runs `body`, whose uses of the TPM at `tcti` on this thread share
    /// one connection and session (a boot's unseal and counter read).
    func sharingSession<R>(tcti: String?, _ body: () throws(KeychainError) -> R) throws(KeychainError) -> R
}

extension KeyProtection {
    /// The machine's TPM, through the kernel's resource manager: what is
    /// reached when no TCTI is named. Never tpm2-tss's default list, which
    /// after `/dev/tpmrm0` and `/dev/tpm0` tries tabrmd and then swtpm and
    /// mssim on `localhost:2321`: a port any local user can listen on, so
    /// that for a user who cannot open the device (an ordinary Debian user)
    /// another user's software TPM would seal the keychain and hold its
    /// counters (docs/SECURITY.md, "The TPM is the machine's, or none").
    package static let machineTCTI = "device:/dev/tpmrm0"

    /// The TCTI `$TPM2TOOLS_TCTI` names (nil: unset or empty, the machine's).
    package static var configuredTCTI: String? {
        getenv("TPM2TOOLS_TCTI").map { String(cString: $0) }.flatMap { $0.isEmpty ? nil : $0 }
    }

    /// NV indexes are tried at random in the owner's range of TCG's
    /// registry of reserved handles (0x01800000–0x01BFFFFF), above the
    /// subrange it assigned to systemd (0x01800400–0x018005FF), so that
    /// keychains of several users coexist with each other and with systemd.
    package static let counterIndexes: ClosedRange<UInt32> = 0x0181_0000...0x01BF_FFFF
}
