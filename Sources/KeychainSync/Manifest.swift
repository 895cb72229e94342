import KeychainCore

/// A device of the circle: its id, the name it gave (its host's), and the
/// public half of its key pair (X25519), to which sync keys are granted.
package struct Member: Equatable, Sendable {
    package let id: UInt64
    package let name: String
    package let publicKey: [UInt8]

    func encode(into writer: inout ByteWriter) {
        writer.append(id)
        writer.appendPrefixed(name)
        writer.append(publicKey)
    }

    init(id: UInt64, name: String, publicKey: [UInt8]) {
        self.id = id
        self.name = name
        self.publicKey = publicKey
    }

    init<Bytes>(reading reader: inout ByteReader<Bytes>) throws(KeychainError) {
        id = try reader.readUInt64()
        name = try reader.readPrefixed()
        publicKey = try reader.read(DeviceKeys.publicSize)
    }

    /// As a person names devices: the name, and the id when two share it.
    package var idText: String { Hex.string(withUnsafeBytes(of: id.bigEndian) { Array($0) }) }
}

/// The circle's manifest (docs/SYNC.md, "What the remote sees"): sealed by
/// the sync key, it names the circle's devices and the digest of every
/// index file, and each index file the digest of every record in its
/// bucket (the first byte of the record's name), so that a remote that
/// drops, swaps or replays a record, or serves an older manifest, is found
/// out. The sequence number grows with every commit a device pushes;
/// each device remembers the highest it saw.
///
/// File: `"KCFSMAN1" | circle[16] | epoch u32 | nonce | sealed(body)`, the
/// header as associated data. Body: `sequence u64 | writer u64 | written
/// u64 | recovery public[32] | members u16 (id u64, name, public[32])* |
/// indexes u16 (bucket u8, digest[32])*`.
struct Manifest: Equatable {
    static let magic = Array("KCFSMAN1".utf8)
    static let path = "manifest"

    var circle: [UInt8]
    var epoch: UInt32
    var sequence: UInt64
    var writer: UInt64
    var written: UInt64
    var recoveryPublic: [UInt8]
    var members: [Member]
    var indexes: [UInt8: [UInt8]]

    /// The circle and epoch a manifest file claims, readable without a key.
    static func header(_ bytes: [UInt8]) -> (circle: [UInt8], epoch: UInt32)? {
        guard bytes.count >= magic.count + SyncKey.circleSize + 4, Array(bytes[..<magic.count]) == magic else {
            return nil
        }
        var reader = ByteReader(bytes[magic.count...])
        guard let circle = try? reader.read(SyncKey.circleSize), let epoch = try? reader.readUInt32() else {
            return nil
        }
        return (circle, epoch)
    }

    func encode(key: SyncKey) -> [UInt8] {
        var header = ByteWriter()
        header.append(Self.magic)
        header.append(circle)
        header.append(epoch)
        var body = ByteWriter()
        body.append(sequence)
        body.append(writer)
        body.append(written)
        body.append(recoveryPublic)
        body.append(UInt16(members.count))
        for member in members { member.encode(into: &body) }
        body.append(UInt16(indexes.count))
        for (bucket, digest) in indexes.sorted(by: { $0.key < $1.key }) {
            body.append(bucket)
            body.append(digest)
        }
        let sealed = body.bytes.withUnsafeBytes { key.seal($0, associatedData: header.bytes) }
        return header.bytes + sealed
    }

    /// The manifest, if `key` sealed it; nil otherwise.
    static func decode(_ bytes: [UInt8], key: SyncKey) -> Manifest? {
        guard let (circle, epoch) = header(bytes), circle == key.circle, epoch == key.epoch else { return nil }
        let headerSize = magic.count + SyncKey.circleSize + 4
        let sealed = bytes[headerSize...]
        guard let count = SyncCipher.plaintextCount(sealed) else { return nil }
        var plain = [UInt8](repeating: 0, count: count)
        let opened = plain.withUnsafeMutableBytes {
            key.open(sealed, associatedData: Array(bytes[..<headerSize]), into: $0)
        }
        guard opened else { return nil }
        var reader = ByteReader(plain)
        do throws(KeychainError) {
            let sequence = try reader.readUInt64(), writer = try reader.readUInt64(), written = try reader.readUInt64()
            let recoveryPublic = try reader.read(DeviceKeys.publicSize)
            var members: [Member] = []
            for _ in 0..<Int(try reader.readUInt16()) { members.append(try Member(reading: &reader)) }
            var indexes: [UInt8: [UInt8]] = [:]
            for _ in 0..<Int(try reader.readUInt16()) {
                let bucket = try reader.readByte()
                indexes[bucket] = try reader.read(32)
            }
            guard reader.isAtEnd else { return nil }
            return Manifest(
                circle: circle, epoch: epoch, sequence: sequence, writer: writer, written: written,
                recoveryPublic: recoveryPublic, members: members, indexes: indexes)
        } catch {
            return nil
        }
    }
}

/// One bucket's index: every record whose name starts with the bucket's
/// byte, with the digest of the record's file. `nonce | sealed(count u32 |
/// (name[32] | digest[32])*)`, with the bucket as associated data.
enum IndexFile {
    static func path(_ bucket: UInt8) -> String { "index/" + Hex.string([bucket]) }

    static func encode(_ entries: [[UInt8]: [UInt8]], bucket: UInt8, key: SyncKey) -> [UInt8] {
        var body = ByteWriter()
        body.append(UInt32(entries.count))
        for (name, digest) in entries.sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
            body.append(name)
            body.append(digest)
        }
        return body.bytes.withUnsafeBytes { key.seal($0, associatedData: key.associatedData("index", [bucket])) }
    }

    static func decode(_ bytes: [UInt8], bucket: UInt8, key: SyncKey) -> [[UInt8]: [UInt8]]? {
        guard let count = SyncCipher.plaintextCount(bytes[...]) else { return nil }
        var plain = [UInt8](repeating: 0, count: count)
        let opened = plain.withUnsafeMutableBytes {
            key.open(bytes[...], associatedData: key.associatedData("index", [bucket]), into: $0)
        }
        guard opened else { return nil }
        var reader = ByteReader(plain)
        var entries: [[UInt8]: [UInt8]] = [:]
        guard let count = try? reader.readUInt32() else { return nil }
        for _ in 0..<count {
            guard let name = try? reader.read(32), let digest = try? reader.read(32), name.first == bucket else {
                return nil
            }
            entries[name] = digest
        }
        return reader.isAtEnd ? entries : nil
    }
}

/// A record's path: `records/<first byte>/<name>` in hex.
enum RecordPath {
    static func of(_ name: [UInt8]) -> String { "records/" + Hex.string([name[0]]) + "/" + Hex.string(name) }

    static func name(_ path: String) -> [UInt8]? {
        guard path.hasPrefix("records/"), let last = path.split(separator: "/").last else { return nil }
        return Hex.bytes(String(last), count: 32)
    }
}
