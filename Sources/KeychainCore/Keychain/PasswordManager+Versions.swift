/// One version of an item, whole: what a door that copies items elsewhere
/// (sync, docs/SYNC.md) reads, and the generation that names the version,
/// so that it changes the item only if no other write came between.
package struct ItemVersion: Sendable {
    package let value: SecureBytes
    package let protectionClass: ProtectionClass
    package let details: ItemDetails?
    /// Every write gives the item a new generation (the store's counter).
    package let generation: Int64
}

/// An item's name, class and generation: enough to tell, with no key,
/// whether it changed since a generation was last seen.
package struct ItemGeneration: Sendable, Equatable {
    package let identifier: String
    package let protectionClass: ProtectionClass
    package let generation: Int64
}

extension PasswordManager {
    /// The items of `group` with their generations. Works while locked.
    package func generations(inGroup group: String) throws(KeychainError) -> [ItemGeneration] {
        try ItemLimits.validate(name: group)
        return try localDevice.store.generations(group: group).map {
            ItemGeneration(identifier: $0.identifier, protectionClass: $0.protectionClass, generation: $0.generation)
        }
    }

    /// The item's value, class, details and generation; nil when absent,
    /// ``KeychainError/interactionNotAllowed`` while its class is locked.
    package func version(forIdentifier identifier: String, inGroup group: String) throws(KeychainError)
        -> ItemVersion?
    {
        let device = localDevice
        guard let row = try device.store.item(group: group, identifier: identifier) else { return nil }
        let value = try ItemCipher.open(row, key: try device.classKey(row.protectionClass))
        return ItemVersion(
            value: value, protectionClass: row.protectionClass,
            details: try ItemCipher.openDetails(row, key: device.secret.detailsKey), generation: row.generation)
    }

    /// Writes the item exactly so (its details as given, times and owner
    /// included) if it is still at generation `expected` (nil: if it is
    /// still absent). Returns the generation written, or nil with nothing
    /// written when another write came first. Needs the class keys of the
    /// old and the new class, as every write does.
    package func write(
        _ value: SecureBytes, identifier: String, group: String, protectionClass: ProtectionClass,
        details: ItemDetails?, replacing expected: Int64?
    ) throws(KeychainError) -> Int64? {
        try ItemLimits.validate(name: group)
        try ItemLimits.validate(identifier: identifier)
        guard value.count <= ItemLimits.maximumValueSize else { throw .valueTooLarge }
        try details?.validate()
        let device = localDevice
        let key = try device.classKey(protectionClass)
        var moved = false
        do throws(KeychainError) {
            let written = try device.store.write(group: group, identifier: identifier) {
                existing, generation throws(KeychainError) in
                guard existing?.generation == expected else {
                    moved = true
                    throw .badRequest
                }
                if let existing { _ = try device.classKey(existing.protectionClass) }
                return ItemCipher.seal(
                    value, group: group, identifier: identifier, protectionClass: protectionClass,
                    generation: generation, key: key, details: details.map { ($0, device.secret.detailsKey) })
            }
            forget(group: group, identifier: identifier)
            return written.generation
        } catch .badRequest where moved {
            return nil
        }
    }

    /// Deletes the item if it is still at generation `expected`; false
    /// (nothing deleted) when it changed or is gone. Works while locked.
    package func deleteKey(forIdentifier identifier: String, inGroup group: String, generation expected: Int64)
        throws(KeychainError) -> Bool
    {
        forget(group: group, identifier: identifier)
        return try localDevice.store.delete(group: group, identifier: identifier, generation: expected)
    }
}

extension Device {
    /// `plaintext` sealed under the key of `protectionClass` with
    /// `context` as associated data: `nonce | ciphertext`. For a door's own
    /// secrets kept beside the keychain (the sync key), which are then
    /// exactly as available as that class's items.
    package func sealBlob(_ plaintext: SecureBytes, under protectionClass: ProtectionClass, context: [UInt8])
        throws(KeychainError) -> [UInt8]
    {
        let key = try classKey(protectionClass)
        let nonce = Crypto.randomBytes(Crypto.nonceSize)
        return nonce
            + key.withKey { key in
                plaintext.withUnsafeBytes { Crypto.seal($0, key: key, nonce: nonce, associatedData: context) }
            }
    }

    /// What ``sealBlob(_:under:context:)`` sealed; ``KeychainError/decode`` for
    /// bytes it did not seal so, ``KeychainError/interactionNotAllowed``
    /// while the class is locked.
    package func openBlob(_ sealed: [UInt8], under protectionClass: ProtectionClass, context: [UInt8])
        throws(KeychainError) -> SecureBytes
    {
        let key = try classKey(protectionClass)
        guard sealed.count >= Crypto.nonceSize + Crypto.tagSize else { throw .decode }
        return try key.withKey { key throws(KeychainError) in
            try Crypto.open(
                Array(sealed[Crypto.nonceSize...]), key: key, nonce: Array(sealed[..<Crypto.nonceSize]),
                associatedData: context)
        }
    }
}

extension PasswordManager {
    /// One item's class and generation, or nil; needs no key.
    package func generation(forIdentifier identifier: String, inGroup group: String) throws(KeychainError)
        -> ItemGeneration?
    {
        guard let row = try localDevice.store.item(group: group, identifier: identifier) else { return nil }
        return ItemGeneration(identifier: identifier, protectionClass: row.protectionClass, generation: row.generation)
    }
}
