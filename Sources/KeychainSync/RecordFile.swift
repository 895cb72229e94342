import KeychainCore

/// A record as the remote holds it (docs/SYNC.md, "What the remote sees"):
/// `"KCFSREC1" | epoch u32 | nonce | sealed`, under the sync key with the
/// circle, the epoch and the record's name as associated data, so that a
/// record moved to another name, epoch or circle does not open. The
/// plaintext is padded to a power of two (at least 512 bytes), so that
/// sizes tell little of a value's length.
///
/// Plaintext: `version u8 = 1 | vector | kind u8 (1 item, 2 tombstone) |
/// group | identifier | changed u64 | origin u64` and for an item
/// `class u8 | details length u32 | details | value length u32 | value`,
/// then zeros.
enum RecordFile {
    static let magic = Array("KCFSREC1".utf8)
    private static let version: UInt8 = 1

    static func paddedSize(_ count: Int) -> Int {
        var size = 512
        while size < count { size <<= 1 }
        return size
    }

    static func encode(_ record: SyncRecord, name: [UInt8], key: SyncKey) -> [UInt8] {
        var meta = ByteWriter()
        meta.append(version)
        record.vector.encode(into: &meta)
        meta.append(UInt8(record.isTombstone ? 2 : 1))
        meta.appendPrefixed(record.key.group)
        meta.appendPrefixed(record.key.identifier)
        meta.append(record.changed)
        meta.append(record.origin)
        let content = record.content
        if let content {
            meta.append(UInt8(content.protectionClass.rawValue))
            let details = content.details?.encoded() ?? []
            meta.append(UInt32(details.count))
            meta.append(details)
            meta.append(UInt32(content.value.count))
        }
        let valueCount = content?.value.count ?? 0
        let count = paddedSize(meta.bytes.count + valueCount)
        let sealed = withGuardedBuffer(count: count) { plain in
            plain.initializeMemory(as: UInt8.self, repeating: 0)
            meta.bytes.withUnsafeBytes { plain.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
            content?.value.withUnsafeBytes { value in
                if value.count > 0 {
                    (plain.baseAddress! + meta.bytes.count).copyMemory(from: value.baseAddress!, byteCount: value.count)
                }
            }
            return key.seal(UnsafeRawBufferPointer(plain), associatedData: key.associatedData("record", name))
        }
        var writer = ByteWriter()
        writer.append(magic)
        writer.append(key.epoch)
        writer.append(sealed)
        return writer.bytes
    }

    /// The record, if `bytes` is one sealed by `key` under `name`.
    static func decode(_ bytes: [UInt8], name: [UInt8], key: SyncKey) -> SyncRecord? {
        guard bytes.count > magic.count + 4, Array(bytes[..<magic.count]) == magic else { return nil }
        var header = ByteReader(bytes[magic.count..<magic.count + 4])
        guard let epoch = try? header.readUInt32(), epoch == key.epoch else { return nil }
        let sealed = bytes[(magic.count + 4)...]
        guard let count = SyncCipher.plaintextCount(sealed) else { return nil }
        return withGuardedBuffer(count: count) { plain -> SyncRecord? in
            guard key.open(sealed, associatedData: key.associatedData("record", name), into: plain) else { return nil }
            return try? parse(UnsafeRawBufferPointer(plain))
        }
    }

    private static func parse(_ plain: UnsafeRawBufferPointer) throws(KeychainError) -> SyncRecord {
        var reader = ByteReader(plain)
        guard try reader.readByte() == version else { throw .decode }
        let vector = try VersionVector(reading: &reader)
        let kind = try reader.readByte()
        let key = ItemKey(group: try reader.readPrefixed(), identifier: try reader.readPrefixed())
        let changed = try reader.readUInt64(), origin = try reader.readUInt64()
        let body: SyncRecord.Body
        switch kind {
        case 1:
            guard let protectionClass = ProtectionClass(rawValue: Int64(try reader.readByte())),
                protectionClass.isMigratable
            else { throw .decode }
            let detailsCount = Int(try reader.readUInt32())
            let details = detailsCount == 0 ? nil : try ItemDetails(decoding: try reader.read(detailsCount))
            let valueCount = Int(try reader.readUInt32())
            guard valueCount <= ItemLimits.maximumValueSize else { throw .decode }
            let value = try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: try reader.take(valueCount)))
            body = .item(SyncedContent(protectionClass: protectionClass, value: value, details: details))
        case 2:
            body = .tombstone
        default:
            throw .decode
        }
        // The padding is zeros only: one plaintext, one meaning.
        while !reader.isAtEnd { guard try reader.readByte() == 0 else { throw .decode } }
        return SyncRecord(key: key, vector: vector, body: body, changed: changed, origin: origin)
    }
}
