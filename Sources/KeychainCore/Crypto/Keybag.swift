internal import CSodium

/// The per-device secret: 32 random bytes in the keychain directory that never
/// leave this machine (backups exclude it). Every class key is wrapped under a
/// key derived from it, so a copy of the database without it opens nothing.
struct DeviceSecret: Sendable {
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

    init(secret: SecureBytes) {
        precondition(secret.count == Crypto.keySize)
        let master = GuardedKey(copying: secret)
        wrapKey = GuardedKey(copying: master.withKey { Crypto.subkey(of: $0, id: 1, context: "kcfsdev1") })
        metadataKey = GuardedKey(copying: master.withKey { Crypto.subkey(of: $0, id: 2, context: "kcfsdev1") })
        rowDigestKey = GuardedKey(copying: master.withKey { Crypto.subkey(of: $0, id: 3, context: "kcfsdev1") })
        auditKey = master.withKey { Crypto.subkey(of: $0, id: 4, context: "kcfsdev1") }
        detailsKey = GuardedKey(copying: master.withKey { Crypto.subkey(of: $0, id: 5, context: "kcfsdev1") })
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
        guard record.count > Crypto.macSize, length.map({ record.count == $0 + Crypto.macSize }) ?? true else { throw .decode }
        let body = Array(record.dropLast(Crypto.macSize))
        guard Crypto.constantTimeEqual(mac(domain, body), Array(record.suffix(Crypto.macSize))) else { throw .decode }
        return body
    }
}

/// The class keys of one keychain and how they are wrapped on disk.
///
/// Record (meta key `keybag`), little-endian:
/// `version u8 | hasPasscode u8 | opsLimit u64 | memLimit u64 | salt[16] |`
/// six times (class 1...6) `nonce[24] | wrapped key[48]` `| mac[32]`,
/// the MAC (keyed BLAKE2b under the device metadata key) over all before it.
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
    private static let macDomain = "kcfs-keybag-v1"

    /// The format this record was written in (``version`` for new ones).
    var formatVersion = Keybag.version
    var hasPasscode: Bool
    var kdf: KDFParameters
    var salt: [UInt8]
    var wrapped: [ProtectionClass: (nonce: [UInt8], sealed: [UInt8])] = [:]

    private init(hasPasscode: Bool, kdf: KDFParameters, salt: [UInt8]) {
        self.hasPasscode = hasPasscode
        self.kdf = kdf
        self.salt = salt
    }

    /// New random class keys, wrapped for `passcode` (nil: a keychain without one).
    static func create(secret: DeviceSecret, passcode: SecureBytes?, kdf: KDFParameters) throws(KeychainError) -> Keybag {
        var bag = Keybag(hasPasscode: passcode != nil, kdf: kdf, salt: Crypto.randomBytes(Crypto.saltSize))
        let passcodeKey = try bag.passcodeKey(secret: secret, passcode: passcode)
        for protectionClass in ProtectionClass.allCases {
            try bag.wrap(SecureBytes.random(count: Crypto.keySize), as: protectionClass, secret: secret, passcodeKey: passcodeKey)
        }
        return bag
    }

    /// The keybag for another passcode (nil: none): the keys of the
    /// passcode-protected classes, unwrapped with `oldPasscode`, wrapped
    /// again under `newPasscode` with a fresh salt. The class keys stay the
    /// same (no item is re-encrypted) and the `always` classes are untouched.
    /// ``KeychainError/decode`` when `oldPasscode` is wrong.
    func rewrapped(secret: DeviceSecret, oldPasscode: SecureBytes?, newPasscode: SecureBytes?) throws(KeychainError) -> Keybag {
        let oldKey = try passcodeKey(secret: secret, passcode: oldPasscode)
        var bag = self
        bag.formatVersion = Keybag.version
        bag.hasPasscode = newPasscode != nil
        bag.salt = Crypto.randomBytes(Crypto.saltSize)
        let newKey = try bag.passcodeKey(secret: secret, passcode: newPasscode)
        for protectionClass in ProtectionClass.allCases where protectionClass.mode != .always {
            let classKey = try unwrap(protectionClass, secret: secret, passcodeKey: oldKey)
            let plain = try classKey.withKey { (key) throws(KeychainError) in
                try SecureBytes(copying: UnsafeRawBufferPointer(start: key, count: Crypto.keySize))
            }
            try bag.wrap(plain, as: protectionClass, secret: secret, passcodeKey: newKey)
        }
        return bag
    }

    /// Seals one class key under its wrapping key, with a fresh nonce.
    private mutating func wrap(_ classKey: SecureBytes, as protectionClass: ProtectionClass, secret: DeviceSecret,
                               passcodeKey: GuardedKey?) throws(KeychainError) {
        let nonce = Crypto.randomBytes(Crypto.nonceSize)
        let sealed = try withWrappingKey(for: protectionClass, secret: secret, passcodeKey: passcodeKey) { key in
            classKey.withUnsafeBytes { plain in
                Crypto.seal(plain, key: key, nonce: nonce, associatedData: Self.associatedData(protectionClass))
            }
        }
        wrapped[protectionClass] = (nonce, sealed)
    }

    /// The key that wraps the passcode-protected classes: BLAKE2b keyed with
    /// the device wrap key over Argon2id(passcode). Tied to this device, so
    /// the passcode cannot be brute-forced from the database alone.
    func passcodeKey(secret: DeviceSecret, passcode: SecureBytes?) throws(KeychainError) -> GuardedKey {
        let stretched: SecureBytes
        let domain: String
        if hasPasscode {
            guard let passcode else { throw .authFailed }
            stretched = try Crypto.stretch(passcode: passcode, salt: salt, parameters: kdf)
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

    private func withWrappingKey<R>(for protectionClass: ProtectionClass, secret: DeviceSecret, passcodeKey: GuardedKey?,
                                    _ body: (UnsafePointer<UInt8>) throws(KeychainError) -> R) throws(KeychainError) -> R {
        if protectionClass.mode == .always {
            return try secret.wrapKey.withKey(body)
        }
        guard let passcodeKey else { throw .interactionNotAllowed }
        return try passcodeKey.withKey(body)
    }

    /// Unwraps one class key; ``KeychainError/decode`` if the wrapping key is wrong.
    func unwrap(_ protectionClass: ProtectionClass, secret: DeviceSecret, passcodeKey: GuardedKey?) throws(KeychainError) -> GuardedKey {
        guard let entry = wrapped[protectionClass] else { throw .decode }
        let plain = try withWrappingKey(for: protectionClass, secret: secret, passcodeKey: passcodeKey) { key throws(KeychainError) in
            try Crypto.open(entry.sealed, key: key, nonce: entry.nonce, associatedData: Self.associatedData(protectionClass))
        }
        guard plain.count == Crypto.keySize else { throw .decode }
        return GuardedKey(copying: plain)
    }

    private static func associatedData(_ protectionClass: ProtectionClass) -> [UInt8] {
        Array("kcfs-classkey-v1".utf8) + [UInt8(protectionClass.rawValue)]
    }

    // MARK: Record

    func encoded(secret: DeviceSecret) -> [UInt8] {
        var writer = ByteWriter()
        writer.append(Self.version)  // re-encoding a version 1 record upgrades it
        writer.append(UInt8(hasPasscode ? 1 : 0))
        writer.append(kdf.opsLimit)
        writer.append(kdf.memLimit)
        writer.append(salt)
        for protectionClass in ProtectionClass.allCases {
            writer.append(wrapped[protectionClass]!.nonce)
            writer.append(wrapped[protectionClass]!.sealed)
        }
        return secret.authenticatedRecord(Self.macDomain, writer.bytes)
    }

    /// Parses and authenticates the record: ``KeychainError/decode`` when it
    /// was altered or belongs to another device secret.
    init(decoding record: [UInt8], secret: DeviceSecret) throws(KeychainError) {
        var reader = ByteReader(try secret.authenticatedBody(Self.macDomain, record))
        formatVersion = try reader.readByte()
        guard (1...Self.version).contains(formatVersion) else { throw .decode }
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
        guard reader.isAtEnd else { throw .decode }
    }
}
