/// The recovery key of a TPM-sealed keychain (docs/SECURITY.md, "Keys sealed by
/// the TPM"): 256 random bits, shown once at sealing, as
/// `systemd-cryptenroll --recovery-key` shows its own, in modhex (the letters
/// of a YubiKey's keyboard-layout-proof alphabet) in eight dash-separated
/// groups of eight. With it, `keychainfs recover` opens the keychain without
/// the TPM (after a TPM clear, a new motherboard, another machine) and seals it
/// to the TPM it finds. It needs no stretching: no one guesses 256 random bits.
public struct RecoveryKey: Sendable {
    package let key: SecureBytes

    private static let alphabet = Array("cbdefghijklnrtuv".utf8)

    package static func generate() -> RecoveryKey { RecoveryKey(key: SecureBytes.random(count: Crypto.keySize)) }

    /// The key as the user writes it down (a secret: shown once, never logged).
    public func formatted() -> SecureBytes {
        let characters = Crypto.keySize * 2, groups = characters / 8
        let text = try! SecureBytes(count: characters + groups - 1)
        key.withUnsafeBytes { bytes in
            let out = text.mutableBytes
            var position = 0
            for (index, byte) in bytes.enumerated() {
                if index > 0 && index % 4 == 0 {
                    out[position] = UInt8(ascii: "-")
                    position += 1
                }
                out[position] = Self.alphabet[Int(byte >> 4)]
                out[position + 1] = Self.alphabet[Int(byte & 0x0F)]
                position += 2
            }
        }
        return text
    }

    /// Reads a key as typed: dashes and white space ignored, either case;
    /// nil unless it is 64 modhex letters.
    public init?(typed: SecureBytes) {
        guard let key = try? SecureBytes(count: Crypto.keySize) else { return nil }
        var nibbles = 0
        let valid = typed.withUnsafeBytes { text -> Bool in
            let out = key.mutableBytes
            for character in text {
                if character == UInt8(ascii: "-") || character == UInt8(ascii: " ") || character == UInt8(ascii: "\t") {
                    continue
                }
                let lower = character | 0x20
                guard let value = Self.alphabet.firstIndex(of: lower), nibbles < 2 * Crypto.keySize else {
                    return false
                }
                if nibbles % 2 == 0 {
                    out[nibbles / 2] = UInt8(value) << 4
                } else {
                    out[nibbles / 2] |= UInt8(value)
                }
                nibbles += 1
            }
            return nibbles == 2 * Crypto.keySize
        }
        guard valid else { return nil }
        self.key = key
    }

    private init(key: SecureBytes) { self.key = key }

    private func wrappingKey() -> GuardedKey {
        let derived = key.withUnsafeBytes { raw in
            Array("kcfs-recovery-kek-v1".utf8).withUnsafeBytes { domain in
                Crypto.deriveKey(key: raw.baseAddress!.assumingMemoryBound(to: UInt8.self), [domain])
            }
        }
        return GuardedKey(copying: derived)
    }

    private static let associatedData = Array("kcfs-recovery-v1".utf8)
    private static let legacyVersion: UInt8 = 1
    private static let recordVersion: UInt8 = 2
    static let recordKey = "recovery"
    /// The MAC domain of a version-2 record, bound to the rollback counter.
    static let macDomain = "kcfs-recovery-v2"
    /// The classes whose keys need the passcode: ``ProtectionClass/allCases`` order.
    static let passcodeClasses = ProtectionClass.allCases.filter { $0.mode != .always }

    /// The record (meta key `recovery`): `version u8 (2) | nonce[24] |
    /// sealed(device secret[32] | the passcode classes' keys, 32 bytes each)
    /// | MAC[32]`, XChaCha20-Poly1305 under a key derived from this recovery
    /// key, then MACed with `secret`'s metadata key bound to the rollback
    /// counter (``DeviceSecret/boundRecord(_:_:)``), so that an older record
    /// (an older recovery key) fails beside newer records. Version 1 (beside a
    /// version-1 rollback record) has no MAC. The `always` classes need no more
    /// than the device secret.
    func sealRecord(deviceSecret: SecureBytes, classKeys: [ProtectionClass: GuardedKey], binding secret: DeviceSecret)
        throws(KeychainError) -> [UInt8]
    {
        let plain = try SecureBytes(count: Crypto.keySize * (1 + Self.passcodeClasses.count))
        let out = plain.mutableBytes
        deviceSecret.withUnsafeBytes { out.copyMemory(from: $0) }
        for (index, protectionClass) in Self.passcodeClasses.enumerated() {
            guard let classKey = classKeys[protectionClass] else { throw .param }
            classKey.withKey { key in
                UnsafeMutableRawBufferPointer(
                    rebasing: out[(index + 1) * Crypto.keySize..<(index + 2) * Crypto.keySize]
                )
                .copyMemory(from: UnsafeRawBufferPointer(start: key, count: Crypto.keySize))
            }
        }
        let nonce = Crypto.randomBytes(Crypto.nonceSize)
        let sealed = wrappingKey().withKey { key in
            plain.withUnsafeBytes { Crypto.seal($0, key: key, nonce: nonce, associatedData: Self.associatedData) }
        }
        return secret.boundRecord(Self.macDomain, [Self.recordVersion] + nonce + sealed)
    }

    /// Checks a record's binding to the rollback counter with the device
    /// secret it opened to. A version-1 record, which has none, is taken
    /// only in a keychain not yet upgraded (``RollbackEpoch/bindsAll``).
    static func verifyBinding(_ record: [UInt8], secret: DeviceSecret) throws(KeychainError) {
        if record.first == legacyVersion {
            guard !secret.epoch.bindsAll else { throw .decode }
            return
        }
        _ = try secret.boundBody(macDomain, record)
    }

    /// What ``sealRecord(deviceSecret:classKeys:)`` sealed; ``KeychainError/authFailed``
    /// when this is not the keychain's recovery key, ``KeychainError/decode`` for a damaged record.
    func openRecord(_ record: [UInt8]) throws(KeychainError) -> (
        deviceSecret: SecureBytes, classKeys: [ProtectionClass: GuardedKey]
    ) {
        let expected = 1 + Crypto.nonceSize + Crypto.keySize * (1 + Self.passcodeClasses.count) + Crypto.tagSize
        let mac = record.first == Self.recordVersion ? Crypto.macSize : 0
        guard record.count == expected + mac, record.first == Self.recordVersion || record.first == Self.legacyVersion
        else { throw .decode }
        let nonce = Array(record[1...Crypto.nonceSize])
        let sealed = Array(record.dropFirst(1 + Crypto.nonceSize).dropLast(mac))
        let plain: SecureBytes
        do throws(KeychainError) {
            plain = try wrappingKey().withKey { (key) throws(KeychainError) in
                try Crypto.open(sealed, key: key, nonce: nonce, associatedData: Self.associatedData)
            }
        } catch {
            throw .authFailed
        }
        let deviceSecret = try plain.withUnsafeBytes { (bytes) throws(KeychainError) in
            try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: bytes.prefix(Crypto.keySize)))
        }
        var keys: [ProtectionClass: GuardedKey] = [:]
        try plain.withUnsafeBytes { (bytes) throws(KeychainError) in
            for (index, protectionClass) in Self.passcodeClasses.enumerated() {
                let slice = UnsafeRawBufferPointer(
                    rebasing: bytes[(index + 1) * Crypto.keySize..<(index + 2) * Crypto.keySize])
                keys[protectionClass] = GuardedKey(copying: try SecureBytes(copying: slice))
            }
        }
        return (deviceSecret, keys)
    }
}
