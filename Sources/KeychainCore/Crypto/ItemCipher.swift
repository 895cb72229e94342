/// How one item's value is sealed: XChaCha20-Poly1305 under its class key,
/// with a fresh random 24-byte nonce per write, and associated data that binds
/// the ciphertext to where it belongs. A row copied to another identifier,
/// group or class, or carrying another generation, fails to open.
///
/// Associated data (docs/FORMAT.md): `"kcfs-item" | format u8 | class u8 |
/// generation u64 LE | u16 LE length + group UTF-8 | u16 LE length + identifier UTF-8`.
enum ItemCipher {
    static let formatVersion: UInt8 = 1
    private static let domain = Array("kcfs-item".utf8)

    static func associatedData(group: String, identifier: String, protectionClass: ProtectionClass,
                               generation: Int64) -> [UInt8] {
        // Sized once: this runs on every read, and a growing array reallocated four times.
        var writer = ByteWriter(capacity: Self.domain.count + 1 + 1 + 8 + 2 + group.utf8.count + 2 + identifier.utf8.count)
        writer.append(Self.domain)
        writer.append(formatVersion)
        writer.append(UInt8(protectionClass.rawValue))
        writer.append(generation)
        writer.appendPrefixed(group)
        writer.appendPrefixed(identifier)
        return writer.bytes
    }

    static func seal(_ value: SecureBytes, group: String, identifier: String, protectionClass: ProtectionClass,
                     generation: Int64, key: GuardedKey, nonce: [UInt8] = Crypto.randomBytes(Crypto.nonceSize)) -> SealedItem {
        let ad = associatedData(group: group, identifier: identifier, protectionClass: protectionClass, generation: generation)
        let sealed = key.withKey { key in
            value.withUnsafeBytes { Crypto.seal($0, key: key, nonce: nonce, associatedData: ad) }
        }
        return SealedItem(group: group, identifier: identifier, protectionClass: protectionClass,
                          generation: generation, nonce: nonce, sealed: sealed)
    }

    /// The plaintext, or ``KeychainError/decode`` when the row is not what was sealed there.
    static func open(_ item: SealedItem, key: GuardedKey) throws(KeychainError) -> SecureBytes {
        let ad = associatedData(group: item.group, identifier: item.identifier,
                                protectionClass: item.protectionClass, generation: item.generation)
        do {
            return try key.withKey { key throws(KeychainError) in
                try Crypto.open(item.sealed, key: key, nonce: item.nonce, associatedData: ad)
            }
        } catch {
            // Names only: the group and identifier are not secret (they are file names).
            Diagnostics.log("item \(item.group)/\(item.identifier) failed authentication")
            throw error
        }
    }
}
