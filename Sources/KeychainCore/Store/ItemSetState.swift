/// The authenticated high-water mark of the items table: a record that
/// changes with every write in the same transaction, so that a row replaced
/// by an older copy of itself, removed, or brought back after deletion
/// outside keychainfs is detected when the device boots.
///
/// The record (meta key `state`, version 2) is
/// `digest[32] | generation u64 LE | MAC[32]`: the digest is the XOR over all
/// rows of a keyed BLAKE2b of (group, identifier, class, generation), so a
/// write updates it in O(1) (XOR out the old row, XOR in the new); the
/// generation is the last one handed out, so the counter cannot be set back
/// to make a write reuse an old generation; the MAC (device metadata key)
/// stops anyone without the device secret from recomputing either.
/// Generations are unique per write, so an older copy of a row always changes
/// the digest. Version 1 (`digest | MAC`, no generation) is read only to
/// upgrade. Restoring the whole database together with its matching record
/// is not detected (docs/SECURITY.md).
struct ItemSetState: Sendable {
    static let recordKey = "state"
    private static let macDomain = "kcfs-state-v1"

    private let rowKey: GuardedKey
    private let secret: DeviceSecret

    init(secret: DeviceSecret) {
        self.secret = secret
        rowKey = secret.rowDigestKey
    }

    private static let rowDomain = Array("kcfs-row-v1".utf8)

    static var emptyDigest: [UInt8] { [UInt8](repeating: 0, count: Crypto.macSize) }

    func rowDigest(group: String, identifier: String, protectionClass: Int64, generation: Int64) -> [UInt8] {
        Self.rowDigest(
            key: rowKey, group: group, identifier: identifier, protectionClass: protectionClass, generation: generation)
    }

    /// A row's keyed BLAKE2b under `key` (this state's, or a passcode
    /// binding's, which adds the digest of the row's details as `suffix`).
    static func rowDigest(
        key: GuardedKey, group: String, identifier: String, protectionClass: Int64, generation: Int64,
        suffix: [UInt8] = []
    ) -> [UInt8] {
        var group = group, identifier = identifier
        return group.withUTF8 { group in
            identifier.withUTF8 { identifier in
                let length = rowMessageLength(group: group.count, identifier: identifier.count)
                return withUnsafeTemporaryAllocation(byteCount: length, alignment: 8) { message in
                    writeRowMessage(
                        to: message.baseAddress!, group: UnsafeRawBufferPointer(group),
                        identifier: UnsafeRawBufferPointer(identifier),
                        protectionClass: protectionClass, generation: generation)
                    return suffix.withUnsafeBytes { suffix in
                        key.withKey { Crypto.mac(key: $0, [UnsafeRawBufferPointer(message), suffix]) }
                    }
                }
            }
        }
    }

    /// The longest row message: two names of at most 255 bytes.
    static let maximumRowMessageLength = rowMessageLength(
        group: ItemLimits.maximumNameLength,
        identifier: ItemLimits.maximumNameLength)

    static func rowMessageLength(group: Int, identifier: Int) -> Int {
        rowDomain.count + 8 + 8 + 2 + group + 2 + identifier
    }

    /// A row's message: domain | class u64 LE | generation u64 LE |
    /// u16-prefixed group | u16-prefixed identifier.
    static func writeRowMessage(
        to base: UnsafeMutableRawPointer, group: UnsafeRawBufferPointer,
        identifier: UnsafeRawBufferPointer, protectionClass: Int64, generation: Int64
    ) {
        precondition(group.count <= Int(UInt16.max) && identifier.count <= Int(UInt16.max))
        rowDomain.withUnsafeBytes { base.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        base.storeBytes(
            of: UInt64(bitPattern: protectionClass).littleEndian, toByteOffset: rowDomain.count, as: UInt64.self)
        base.storeBytes(
            of: UInt64(bitPattern: generation).littleEndian, toByteOffset: rowDomain.count + 8, as: UInt64.self)
        func store(_ bytes: UnsafeRawBufferPointer, at offset: Int) -> Int {
            base.storeBytes(of: UInt16(bytes.count).littleEndian, toByteOffset: offset, as: UInt16.self)
            if bytes.count > 0 { (base + offset + 2).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
            return offset + 2 + bytes.count
        }
        _ = store(identifier, at: store(group, at: rowDomain.count + 16))
    }

    /// Runs `body` with a pipeline whose rows are digested and filed on a
    /// second thread while `body` goes on reading them (``RowDigestPipeline``);
    /// returns the XOR of the rows' digests and their generations.
    func digestingConcurrently<E: Error>(expectedRows: Int, _ body: (RowDigestPipeline) throws(E) -> Void)
        throws(E) -> (digest: [UInt8], generations: [RowIdentity: Int64])
    {
        let pipeline = RowDigestPipeline(
            keyed: rowKey.withKey { Crypto.KeyedHash(key: $0) }, expectedRows: expectedRows)
        do throws(E) {
            try body(pipeline)
        } catch {
            _ = pipeline.finish()
            throw error
        }
        return pipeline.finish()
    }

    func rowDigest(_ row: SealedItem) -> [UInt8] {
        rowDigest(
            group: row.group, identifier: row.identifier, protectionClass: row.protectionClass.rawValue,
            generation: row.generation)
    }

    /// What the record holds.
    struct Record: Equatable {
        var digest: [UInt8]
        /// The last generation handed out; nil in a version-1 record.
        var generation: Int64?
    }

    /// Bound to the rollback counter (``DeviceSecret/boundRecord(_:_:)``).
    static let macDomainV2 = "kcfs-state-v2"

    func sealed(_ record: Record) -> [UInt8] {
        precondition(record.generation != nil, "only version 2 records are written")
        var writer = ByteWriter()
        writer.append(record.digest)
        writer.append(record.generation!)
        return secret.boundRecord(Self.macDomainV2, writer.bytes)
    }

    /// An authentic record of either version; ``KeychainError/decode`` otherwise.
    func record(from bytes: [UInt8]) throws(KeychainError) -> Record {
        switch bytes.count {
        case 2 * Crypto.macSize + 8:
            var reader = ByteReader(try secret.boundBody(Self.macDomainV2, bytes))
            let digest = try reader.read(Crypto.macSize)
            let generation = try reader.readInt64()
            guard generation >= 0 else { throw .decode }
            return Record(digest: digest, generation: generation)
        case 2 * Crypto.macSize:
            return Record(digest: try secret.authenticatedBody(Self.macDomain, bytes), generation: nil)
        default:
            throw .decode
        }
    }

    static func xor(_ a: inout [UInt8], _ b: [UInt8]) {
        for index in a.indices { a[index] ^= b[index] }
    }
}
