import Synchronization
internal import CSodium

/// The per-device secret: 32 random bytes in the keychain directory that never
/// leave this machine (backups exclude it). Every class key is wrapped under a
/// key derived from it, so a copy of the database without it opens nothing.
package struct DeviceSecret: Sendable {
    /// Wraps the `always` class keys; combined with the passcode for the others.
    let wrapKey: GuardedKey
    /// Authenticates the keybag, lockout and item-set state records.
    let metadataKey: GuardedKey
    /// Keys the per-row digests of the item-set state.
    let rowDigestKey: GuardedKey
    /// Chains the lines of the audit log. In the locked arena but always
    /// readable: it is used for every audited request, and a GuardedKey's two
    /// mprotect calls per use flush every CPU's TLB. It authenticates a
    /// record of names, not secrets; the passcode-wrapped keys stay guarded.
    let auditKey: SecureBytes
    /// Seals the items' details (``ItemDetails``): always available, as
    /// names are, so that a search finds locked items.
    let detailsKey: GuardedKey
    /// The auth of the keychain's TPM rollback counter (docs/FORMAT.md, "Keys
    /// sealed by a TPM"): only the holder of the device secret reads and
    /// increments it.
    let counterAuth: SecureBytes
    /// The TPM rollback counter's value that the state, policy and audit
    /// anchor records are bound to (nil: a keychain without a counter):
    /// it is part of their MACs' domain, so a record from before a bump
    /// fails authentication after it (``RollbackRecord``).
    let epoch = RollbackEpoch()

    init(secret: SecureBytes) {
        precondition(secret.count == Crypto.keySize)
        let master = GuardedKey(copying: secret)
        wrapKey = GuardedKey(copying: master.withKey { Crypto.subkey(of: $0, id: 1, context: "kcfsdev1") })
        metadataKey = GuardedKey(copying: master.withKey { Crypto.subkey(of: $0, id: 2, context: "kcfsdev1") })
        rowDigestKey = GuardedKey(copying: master.withKey { Crypto.subkey(of: $0, id: 3, context: "kcfsdev1") })
        auditKey = master.withKey { Crypto.subkey(of: $0, id: 4, context: "kcfsdev1") }
        detailsKey = GuardedKey(copying: master.withKey { Crypto.subkey(of: $0, id: 5, context: "kcfsdev1") })
        counterAuth = master.withKey { Crypto.subkey(of: $0, id: 6, context: "kcfsdev1") }
    }

    func mac(_ domain: String, _ record: [UInt8]) -> [UInt8] {
        metadataKey.withKey { key in
            Array(domain.utf8).withUnsafeBytes { d in record.withUnsafeBytes { r in Crypto.mac(key: key, [d, r]) } }
        }
    }

    /// A metadata record: `body | MAC(domain, body)`.
    func authenticatedRecord(_ domain: String, _ body: [UInt8]) -> [UInt8] {
        body + mac(domain, body)
    }

    /// The body of an ``authenticatedRecord(_:_:)``: ``KeychainError/decode``
    /// unless its MAC holds (and its body is `length` bytes, when given).
    func authenticatedBody(_ domain: String, _ record: [UInt8], length: Int? = nil) throws(KeychainError) -> [UInt8] {
        try Self.authenticatedBody(of: record, length: length) { mac(domain, $0) }
    }

    /// The body of a `body | MAC` record whose MAC `mac` computes (this
    /// secret's metadata key, or a passcode binding's key):
    /// ``KeychainError/decode`` unless it holds (and the body is `length`
    /// bytes, when given).
    static func authenticatedBody(of record: [UInt8], length: Int? = nil, mac: ([UInt8]) -> [UInt8])
        throws(KeychainError) -> [UInt8]
    {
        guard record.count > Crypto.macSize, length.map({ record.count == $0 + Crypto.macSize }) ?? true else {
            throw .decode
        }
        let body = Array(record.dropLast(Crypto.macSize))
        guard Crypto.constantTimeEqual(mac(body), Array(record.suffix(Crypto.macSize))) else { throw .decode }
        return body
    }

    /// The domain of a record bound to the rollback counter at `epoch`
    /// (nil: unbound, a keychain without a counter, as before format 5).
    static func boundDomain(_ domain: String, epoch: UInt64?) -> String {
        epoch.map { "\(domain)@\($0)" } ?? domain
    }

    /// The epoch `domain`'s record carries now: the current ``epoch``, or
    /// none for a record that only version 2 of the rollback record binds, in a
    /// keychain whose rollback record is still version 1.
    func epoch(of domain: String) -> UInt64? {
        let (value, bindsAll) = epoch.state
        return bindsAll || !RollbackRecord.isLateBound(domain) ? value : nil
    }

    /// An ``authenticatedRecord(_:_:)`` bound to the current ``epoch``.
    func boundRecord(_ domain: String, _ body: [UInt8]) -> [UInt8] {
        authenticatedRecord(Self.boundDomain(domain, epoch: epoch(of: domain)), body)
    }

    /// The body of a ``boundRecord(_:_:)`` of the current ``epoch``.
    func boundBody(_ domain: String, _ record: [UInt8], length: Int? = nil) throws(KeychainError) -> [UInt8] {
        try authenticatedBody(Self.boundDomain(domain, epoch: epoch(of: domain)), record, length: length)
    }
}

/// The rollback counter's value a keychain's bound records carry: set at
/// boot from the ``RollbackRecord`` and by each bump, while the store's
/// connection is held (an item write reads it inside its transaction);
/// and whether every record of ``RollbackRecord/boundRecords`` carries it
/// (false in a version-1 keychain until its first boot upgrades it).
final class RollbackEpoch: Sendable {
    private let current = Mutex<(value: UInt64?, bindsAll: Bool)>((nil, true))
    var value: UInt64? {
        get { current.withLock { $0.value } }
        set { current.withLock { $0.value = newValue } }
    }
    var bindsAll: Bool {
        get { current.withLock { $0.bindsAll } }
        set { current.withLock { $0.bindsAll = newValue } }
    }
    var state: (value: UInt64?, bindsAll: Bool) {
        get { current.withLock { $0 } }
        set { current.withLock { $0 = newValue } }
    }
}

/// The class keys of one keychain and how they are wrapped on disk.
///
/// Record (meta key `keybag`), little-endian:
/// `version u8 | hasPasscode u8 | opsLimit u64 | memLimit u64 | salt[16] |`
/// six times (class 1...6) `nonce[24] | wrapped key[48]`, in version 5
/// `| length u16 | the passcode's TPM object`, then `| mac[32]`, the MAC
/// (keyed BLAKE2b under the device metadata key) over all before it.
struct Keybag {
    /// Version 2 means the keychain's authenticated `state` (version 2) and
    /// `lockout` records must exist: a boot without them is tampering.
    /// Version 3 adds the `entitlements` record to them (deleting it would
    /// open every group to every program). Version 4 says the items table
    /// has the `details` column (``ItemDetails``), so an older keychainfs,
    /// which would not carry an item's details over a write, refuses it.
    /// Older keychains predate the rules and are upgraded at boot.
    static let version: UInt8 = 4
    /// The first version whose items table has the `details` column.
    static let detailsVersion: UInt8 = 4
    /// The first version that requires the `state` and `lockout` records.
    static let stateVersion: UInt8 = 2
    static let recordKey = "keybag"
    /// Bound to the rollback counter (``DeviceSecret/boundRecord(_:_:)``)
    /// since version 2 of the rollback record: an older keybag (an older passcode)
    /// fails beside newer records.
    static let macDomain = "kcfs-keybag-v1"

    /// The format this record was written in (``version`` for new ones).
    var formatVersion = Keybag.version
    var hasPasscode: Bool
    var kdf: KDFParameters
    var salt: [UInt8]
    var wrapped: [ProtectionClass: (nonce: [UInt8], sealed: [UInt8])] = [:]
    /// The passcode's TPM object (docs/FORMAT.md, "Keys sealed by a TPM"): a
    /// random secret sealed by the TPM under an auth derived from
    /// Argon2id(passcode), without which the passcode KEK cannot be derived, so
    /// every guess goes through the TPM and its dictionary-attack lockout. Nil
    /// for a keychain kept in a file, or without a passcode. A record carrying
    /// one is version 5 (``tpmVersion``), which builds before format 5 refuse.
    var tpmPasscodeObject: [UInt8]?
    /// The version of a record with a ``tpmPasscodeObject``.
    static let tpmVersion: UInt8 = 5
    /// Whether the keychain keeps a ``PasscodeBinding`` (docs/FORMAT.md, "The
    /// passcode binding"): its state is bound to a TPM counter that only the
    /// passcode moves. Said where only the passcode reaches: the associated
    /// data of the wrapped passcode classes, so that a keybag stripped of it
    /// (to boot a copy without the binding) no longer unwraps. A record with it
    /// is version 6 (``passcodeBoundVersion``), which builds before refuse.
    var isPasscodeBound = false
    static let passcodeBoundVersion: UInt8 = 6
    /// Whether it can be bound at all: it has a passcode, and the TPM
    /// seals that passcode's object (whether or not it is bound yet).
    var isBindable: Bool { hasPasscode && tpmPasscodeObject != nil }

    private init(hasPasscode: Bool, kdf: KDFParameters, salt: [UInt8]) {
        self.hasPasscode = hasPasscode
        self.kdf = kdf
        self.salt = salt
    }

    /// New random class keys, wrapped for `passcode` (nil: a keychain
    /// without one), its KEK entangled with `tpm` when given. Returns the
    /// keys of the passcode classes too (for a recovery record).
    static func create(
        secret: DeviceSecret, passcode: SecureBytes?, kdf: KDFParameters,
        tpm: (any KeyProtector)? = nil
    ) throws(KeychainError) -> (Keybag, [ProtectionClass: GuardedKey]) {
        var bag = Keybag(hasPasscode: passcode != nil, kdf: kdf, salt: [])
        let passcodeKey = try bag.enroll(secret: secret, passcode: passcode, tpm: tpm, bound: true)
        var keys: [ProtectionClass: GuardedKey] = [:]
        for protectionClass in ProtectionClass.allCases {
            let classKey = SecureBytes.random(count: Crypto.keySize)
            try bag.wrap(classKey, as: protectionClass, secret: secret, passcodeKey: passcodeKey)
            if protectionClass.mode != .always { keys[protectionClass] = GuardedKey(copying: classKey) }
        }
        return (bag, keys)
    }

    /// The keybag with the passcode classes' `classKeys` wrapped under
    /// `newPasscode` (`keychainfs recover` has them from the recovery key),
    /// kept bound to a ``PasscodeBinding`` when it was (`bound` nil) or
    /// when `bound` says so, as long as a passcode and a TPM remain.
    func rewrapped(
        secret: DeviceSecret, classKeys: [ProtectionClass: GuardedKey], newPasscode: SecureBytes?,
        sealingTPM: (any KeyProtector)?, bound: Bool? = nil
    ) throws(KeychainError) -> Keybag {
        var bag = self
        let newKey = try bag.enroll(
            secret: secret, passcode: newPasscode, tpm: sealingTPM, bound: bound ?? isPasscodeBound)
        for protectionClass in ProtectionClass.allCases where protectionClass.mode != .always {
            guard let classKey = classKeys[protectionClass] else { throw .decode }
            let plain = try classKey.withKey { (key) throws(KeychainError) in
                try SecureBytes(copying: UnsafeRawBufferPointer(start: key, count: Crypto.keySize))
            }
            try bag.wrap(plain, as: protectionClass, secret: secret, passcodeKey: newKey)
        }
        return bag
    }

    /// The keys of the passcode classes, given the passcode.
    func unwrapPasscodeClasses(
        secret: DeviceSecret, passcode: SecureBytes?,
        tpm: (any KeyProtector)?
    ) throws(KeychainError) -> [ProtectionClass: GuardedKey] {
        let passcodeKey = try passcodeKey(secret: secret, passcode: passcode, tpm: tpm)
        var keys: [ProtectionClass: GuardedKey] = [:]
        for protectionClass in ProtectionClass.allCases where protectionClass.mode != .always {
            keys[protectionClass] = try unwrap(protectionClass, secret: secret, passcodeKey: passcodeKey)
        }
        return keys
    }

    /// Sets this keybag up for `passcode` (nil: none): a fresh salt and, with
    /// `tpm`, a fresh TPM object; returns the passcode KEK. `bound`: kept
    /// with a ``PasscodeBinding``, which only a passcode sealed by a TPM has.
    private mutating func enroll(secret: DeviceSecret, passcode: SecureBytes?, tpm: (any KeyProtector)?, bound: Bool)
        throws(KeychainError) -> GuardedKey
    {
        formatVersion = Keybag.version
        hasPasscode = passcode != nil
        isPasscodeBound = bound && passcode != nil && tpm != nil
        salt = Crypto.randomBytes(Crypto.saltSize)
        tpmPasscodeObject = nil
        guard let passcode, let tpm else { return try passcodeKey(secret: secret, passcode: passcode, tpm: nil) }
        let stretched = try Crypto.stretch(passcode: passcode, salt: salt, parameters: kdf)
        let tpmSecret = SecureBytes.random(count: Crypto.keySize)
        let auth = Self.tpmAuth(stretched)
        tpmPasscodeObject = try tpm.seal(tpmSecret, auth: auth, guarded: true).blob
        return Self.entangledKey(secret: secret, stretched: stretched, tpmSecret: tpmSecret)
    }

    /// The auth of the passcode's TPM object: a key derived from the
    /// stretched passcode (never the KEK's own input as it is).
    private static func tpmAuth(_ stretched: SecureBytes) -> SecureBytes {
        stretched.withUnsafeBytes { raw in
            Array("kcfs-tpm-auth-v1".utf8).withUnsafeBytes { domain in
                Crypto.deriveKey(key: raw.baseAddress!.assumingMemoryBound(to: UInt8.self), [domain])
            }
        }
    }

    private static func entangledKey(secret: DeviceSecret, stretched: SecureBytes, tpmSecret: SecureBytes) -> GuardedKey
    {
        let derived = secret.wrapKey.withKey { key in
            Array("kcfs-passcode-kek-tpm-v1".utf8).withUnsafeBytes { d in
                stretched.withUnsafeBytes { s in
                    tpmSecret.withUnsafeBytes { t in Crypto.deriveKey(key: key, [d, s, t]) }
                }
            }
        }
        return GuardedKey(copying: derived)
    }

    /// Seals one class key under its wrapping key, with a fresh nonce.
    private mutating func wrap(
        _ classKey: SecureBytes, as protectionClass: ProtectionClass, secret: DeviceSecret,
        passcodeKey: GuardedKey?
    ) throws(KeychainError) {
        let nonce = Crypto.randomBytes(Crypto.nonceSize)
        let sealed = try withWrappingKey(for: protectionClass, secret: secret, passcodeKey: passcodeKey) { key in
            classKey.withUnsafeBytes { plain in
                Crypto.seal(plain, key: key, nonce: nonce, associatedData: associatedData(protectionClass))
            }
        }
        wrapped[protectionClass] = (nonce, sealed)
    }

    /// The key that wraps the passcode-protected classes: BLAKE2b keyed with
    /// the device wrap key over Argon2id(passcode) and, for a keybag with a
    /// TPM object, the secret the TPM unseals for that passcode alone (a
    /// wrong one is ``KeychainError/authFailed``, counted by the TPM). Tied
    /// to this device, so the passcode cannot be brute-forced from the
    /// database alone, nor, with a TPM, from every file of the keychain.
    func passcodeKey(secret: DeviceSecret, passcode: SecureBytes?, tpm: (any KeyProtector)?) throws(KeychainError)
        -> GuardedKey
    {
        let stretched: SecureBytes
        let domain: String
        if hasPasscode {
            guard let passcode else { throw .authFailed }
            stretched = try Crypto.stretch(passcode: passcode, salt: salt, parameters: kdf)
            if let object = tpmPasscodeObject {
                guard let tpm else { throw .tpmUnavailable }
                let auth = Self.tpmAuth(stretched)
                let tpmSecret = try tpm.unseal(object, auth: auth).secret
                return Self.entangledKey(secret: secret, stretched: stretched, tpmSecret: tpmSecret)
            }
            domain = "kcfs-passcode-kek-v1"
        } else {
            // A keychain without a passcode: unlocking needs none, but
            // `whenUnlocked` items still become unreadable on lock.
            stretched = try SecureBytes(count: 0)
            domain = "kcfs-no-passcode-kek-v1"
        }
        let derived = secret.wrapKey.withKey { key in
            Array(domain.utf8).withUnsafeBytes { d in
                stretched.withUnsafeBytes { s in Crypto.deriveKey(key: key, [d, s]) }
            }
        }
        return GuardedKey(copying: derived)
    }

    private func withWrappingKey<R>(
        for protectionClass: ProtectionClass, secret: DeviceSecret, passcodeKey: GuardedKey?,
        _ body: (UnsafePointer<UInt8>) throws(KeychainError) -> R
    ) throws(KeychainError) -> R {
        if protectionClass.mode == .always {
            return try secret.wrapKey.withKey(body)
        }
        guard let passcodeKey else { throw .interactionNotAllowed }
        return try passcodeKey.withKey(body)
    }

    /// Unwraps one class key; ``KeychainError/decode`` if the wrapping key is wrong.
    func unwrap(_ protectionClass: ProtectionClass, secret: DeviceSecret, passcodeKey: GuardedKey?)
        throws(KeychainError) -> GuardedKey
    {
        guard let entry = wrapped[protectionClass] else { throw .decode }
        let plain = try withWrappingKey(for: protectionClass, secret: secret, passcodeKey: passcodeKey) {
            key throws(KeychainError) in
            try Crypto.open(
                entry.sealed, key: key, nonce: entry.nonce, associatedData: associatedData(protectionClass))
        }
        guard plain.count == Crypto.keySize else { throw .decode }
        return GuardedKey(copying: plain)
    }

    /// A passcode class of a bound keybag is wrapped with `v2`: the mark
    /// of ``isPasscodeBound`` that the device secret alone cannot remove.
    private func associatedData(_ protectionClass: ProtectionClass) -> [UInt8] {
        let bound = isPasscodeBound && protectionClass.mode != .always
        return Array((bound ? "kcfs-classkey-v2" : "kcfs-classkey-v1").utf8) + [UInt8(protectionClass.rawValue)]
    }

    // MARK: Record

    func encoded(secret: DeviceSecret) -> [UInt8] {
        var writer = ByteWriter()
        // Re-encoding a version 1 record upgrades it.
        writer.append(
            isPasscodeBound ? Self.passcodeBoundVersion : tpmPasscodeObject == nil ? Self.version : Self.tpmVersion)
        writer.append(UInt8(hasPasscode ? 1 : 0))
        writer.append(kdf.opsLimit)
        writer.append(kdf.memLimit)
        writer.append(salt)
        for protectionClass in ProtectionClass.allCases {
            writer.append(wrapped[protectionClass]!.nonce)
            writer.append(wrapped[protectionClass]!.sealed)
        }
        if let object = tpmPasscodeObject {
            writer.append(UInt16(object.count))
            writer.append(object)
        }
        return secret.boundRecord(Self.macDomain, writer.bytes)
    }

    /// Parses and authenticates the record: ``KeychainError/decode`` when it
    /// was altered or belongs to another device secret.
    init(decoding record: [UInt8], secret: DeviceSecret) throws(KeychainError) {
        var reader = ByteReader(try secret.boundBody(Self.macDomain, record))
        formatVersion = try reader.readByte()
        guard (1...Self.passcodeBoundVersion).contains(formatVersion) else { throw .decode }
        // Only the two canonical values: a record means one thing only.
        let passcodeFlag = try reader.readByte()
        guard passcodeFlag <= 1 else { throw .decode }
        hasPasscode = passcodeFlag == 1
        kdf = KDFParameters(opsLimit: try reader.readUInt64(), memLimit: try reader.readUInt64())
        salt = try reader.read(Crypto.saltSize)
        wrapped = [:]
        for protectionClass in ProtectionClass.allCases {
            let nonce = try reader.read(Crypto.nonceSize)
            wrapped[protectionClass] = (nonce, try reader.read(Crypto.keySize + Crypto.tagSize))
        }
        if formatVersion >= Self.tpmVersion {
            let length = Int(try reader.readUInt16())
            guard length > 0, hasPasscode else { throw .decode }
            tpmPasscodeObject = try reader.read(length)
        }
        isPasscodeBound = formatVersion == Self.passcodeBoundVersion
        guard reader.isAtEnd else { throw .decode }
    }
}
