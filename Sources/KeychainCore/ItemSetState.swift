/// The authenticated high-water mark of the items table: a record that
/// changes with every write in the same transaction, so that a row replaced
/// by an older copy of itself, removed, or brought back after deletion
/// outside keychainfs is detected when the device boots.
///
/// The record (meta key `state`) is `digest[32] | MAC[32]`: the digest is the
/// XOR over all rows of a keyed BLAKE2b of (group, identifier, class,
/// generation), so a write updates it in O(1) (XOR out the old row, XOR in
/// the new); the MAC (device metadata key) stops anyone without the device
/// secret from recomputing it. Generations are unique per write, so an older
/// copy of a row always changes the digest. Restoring the whole database
/// together with its matching record is not detected (docs/SECURITY.md).
struct ItemSetState: Sendable {
    static let recordKey = "state"
    private static let macDomain = "kcfs-state-v1"

    private let rowKey: GuardedKey
    private let secret: DeviceSecret

    init(secret: DeviceSecret) {
        self.secret = secret
        rowKey = secret.rowDigestKey
    }

    static var emptyDigest: [UInt8] { [UInt8](repeating: 0, count: Crypto.macSize) }

    func rowDigest(group: String, identifier: String, protectionClass: Int64, generation: Int64) -> [UInt8] {
        var writer = ByteWriter()
        writer.append(Array("kcfs-row-v1".utf8))
        writer.append(protectionClass)
        writer.append(generation)
        writer.appendPrefixed(group)
        writer.appendPrefixed(identifier)
        return rowKey.withKey { key in writer.bytes.withUnsafeBytes { Crypto.mac(key: key, [$0]) } }
    }

    func rowDigest(_ row: SealedItem) -> [UInt8] {
        rowDigest(group: row.group, identifier: row.identifier, protectionClass: row.protectionClass.rawValue,
                  generation: row.generation)
    }

    func sealed(_ digest: [UInt8]) -> [UInt8] {
        digest + secret.mac(Self.macDomain, digest)
    }

    /// The digest of an authentic record; ``KeychainError/decode`` otherwise.
    func digest(from record: [UInt8]) throws(KeychainError) -> [UInt8] {
        guard record.count == 2 * Crypto.macSize else { throw .decode }
        let digest = Array(record.prefix(Crypto.macSize))
        guard Crypto.constantTimeEqual(secret.mac(Self.macDomain, digest), Array(record.suffix(Crypto.macSize))) else {
            throw .decode
        }
        return digest
    }

    static func xor(_ a: inout [UInt8], _ b: [UInt8]) {
        for index in a.indices { a[index] ^= b[index] }
    }
}
