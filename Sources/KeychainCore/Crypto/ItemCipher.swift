/// How one item's value is sealed: XChaCha20-Poly1305 under its class key,
/// with a fresh random 24-byte nonce per write, and associated data that binds
/// the ciphertext to where it belongs. A row copied to another identifier,
/// group or class, or carrying another generation, fails to open.
///
/// Associated data (docs/FORMAT.md): `"kcfs-item" | format u8 | class u8 |
/// generation u64 LE | u16 LE length + group UTF-8 | u16 LE length + identifier UTF-8`.
/// The format byte is 1 for a row without details and 2 for one with
/// (``ItemDetails``, sealed beside the value under the device's details
/// key): removing a row's details, or giving a row details, makes its value
/// fail to open.
enum ItemCipher {
    static let formatVersion: UInt8 = 1
    static let formatVersionWithDetails: UInt8 = 2
    private static let domain = Array("kcfs-item".utf8)
    private static let detailsDomain = Array("kcfs-details".utf8)

    static func associatedData(
        group: String, identifier: String, protectionClass: ProtectionClass,
        generation: Int64, hasDetails: Bool = false
    ) -> [UInt8] {
        associatedData(
            domain, hasDetails ? formatVersionWithDetails : formatVersion, group: group, identifier: identifier,
            protectionClass: protectionClass, generation: generation)
    }

    private static func associatedData(
        _ domain: [UInt8], _ format: UInt8, group: String, identifier: String,
        protectionClass: ProtectionClass, generation: Int64
    ) -> [UInt8] {
        // Sized once: this runs on every read, and a growing array reallocated four times.
        var writer = ByteWriter(capacity: domain.count + 1 + 1 + 8 + 2 + group.utf8.count + 2 + identifier.utf8.count)
        writer.append(domain)
        writer.append(format)
        writer.append(UInt8(protectionClass.rawValue))
        writer.append(generation)
        writer.appendPrefixed(group)
        writer.appendPrefixed(identifier)
        return writer.bytes
    }

    /// Seals `value` (and `details`, under the device's `detailsKey`) as the
    /// row of `group`/`identifier` with `generation`.
    static func seal(
        _ value: SecureBytes, group: String, identifier: String, protectionClass: ProtectionClass,
        generation: Int64, key: GuardedKey, details: (ItemDetails, key: GuardedKey)? = nil,
        nonce: [UInt8] = Crypto.randomBytes(Crypto.nonceSize)
    ) -> SealedItem {
        let ad = associatedData(
            group: group, identifier: identifier, protectionClass: protectionClass, generation: generation,
            hasDetails: details != nil)
        let sealed = key.withKey { key in
            value.withUnsafeBytes { Crypto.seal($0, key: key, nonce: nonce, associatedData: ad) }
        }
        var row = SealedItem(
            group: group, identifier: identifier, protectionClass: protectionClass,
            generation: generation, nonce: nonce, sealed: sealed)
        row.details = details.map { details, detailsKey in sealDetails(details, of: row, key: detailsKey) }
        return row
    }

    /// `details` sealed for `row` (its names, class and generation) under the
    /// device's details key: `nonce[24] | ciphertext`.
    static func sealDetails(_ details: ItemDetails, of row: SealedItem, key: GuardedKey) -> [UInt8] {
        let nonce = Crypto.randomBytes(Crypto.nonceSize)
        let ad = associatedData(
            detailsDomain, 1, group: row.group, identifier: row.identifier,
            protectionClass: row.protectionClass, generation: row.generation)
        return nonce
            + key.withKey { key in
                details.encoded().withUnsafeBytes { Crypto.seal($0, key: key, nonce: nonce, associatedData: ad) }
            }
    }

    /// The plaintext, or ``KeychainError/decode`` when the row is not what was sealed there.
    static func open(_ item: SealedItem, key: GuardedKey) throws(KeychainError) -> SecureBytes {
        let ad = associatedData(
            group: item.group, identifier: item.identifier, protectionClass: item.protectionClass,
            generation: item.generation, hasDetails: item.details != nil)
        do {
            return try key.withKey { key throws(KeychainError) in
                try Crypto.open(item.sealed, key: key, nonce: item.nonce, associatedData: ad)
            }
        } catch {
            // Names only: the group and identifier are not secret (they are file names).
            // Only a failed tag is a failed authentication: no memory for the value is not.
            Diagnostics.log(
                "item \(item.group)/\(item.identifier) "
                    + (error == .decode ? "failed authentication" : "could not be opened: \(error)"))
            throw error
        }
    }

    /// The row's details (nil: it has none), or ``KeychainError/decode``
    /// when they are not what was sealed for this row.
    static func openDetails(_ item: SealedItem, key: GuardedKey) throws(KeychainError) -> ItemDetails? {
        guard let sealed = item.details else { return nil }
        guard sealed.count >= Crypto.nonceSize + Crypto.tagSize else { throw .decode }
        let ad = associatedData(
            detailsDomain, 1, group: item.group, identifier: item.identifier,
            protectionClass: item.protectionClass, generation: item.generation)
        do {
            let plaintext = try key.withKey { key throws(KeychainError) in
                try Crypto.open(
                    Array(sealed.dropFirst(Crypto.nonceSize)), key: key,
                    nonce: Array(sealed.prefix(Crypto.nonceSize)), associatedData: ad)
            }
            return try ItemDetails(decoding: plaintext.bytes())
        } catch {
            Diagnostics.log("the details of item \(item.group)/\(item.identifier) failed authentication")
            throw error
        }
    }
}
