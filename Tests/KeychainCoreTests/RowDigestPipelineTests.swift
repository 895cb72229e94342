import Testing
@testable import KeychainCore

/// The boot check's two-thread pipeline must give exactly what digesting
/// and filing each row in turn gives, across many slots and their reuse.
@Suite struct RowDigestPipelineTests {
    struct Row {
        let group: [UInt8]
        let identifier: [UInt8]
        let protectionClass: Int64
        let generation: Int64
        var identity: RowIdentity {
            RowIdentity(low: UInt64(generation) &* 0x9E37_79B9_7F4A_7C15, high: UInt64(identifier.count))
        }
    }

    /// 6,000 rows with names of 1 to 255 bytes: about 30 slots of 64 KiB,
    /// so the four slots go round several times.
    static let rows: [Row] = (0..<6000).map { index in
        let length = 1 + (index * 37) % 255
        return Row(
            group: Array("group-\(index % 7)".utf8),
            identifier: [UInt8](repeating: UInt8(65 + index % 26), count: length),
            protectionClass: Int64(index % 6), generation: Int64(index + 1))
    }

    func key() -> SecureBytes { try! SecureBytes(Crypto.randomBytes(Crypto.keySize)) }

    func serialDigest(_ key: SecureBytes, _ rows: [Row]) -> [UInt8] {
        let keyed = Crypto.KeyedHash(key: key.pointer.assumingMemoryBound(to: UInt8.self))
        var digest = ItemSetState.emptyDigest
        for row in rows {
            let length = ItemSetState.rowMessageLength(group: row.group.count, identifier: row.identifier.count)
            var message = [UInt8](repeating: 0, count: length)
            row.group.withUnsafeBytes { group in
                row.identifier.withUnsafeBytes { identifier in
                    message.withUnsafeMutableBytes {
                        ItemSetState.writeRowMessage(
                            to: $0.baseAddress!, group: group, identifier: identifier,
                            protectionClass: row.protectionClass, generation: row.generation)
                    }
                }
            }
            var one = ItemSetState.emptyDigest
            message.withUnsafeBytes { message in one.withUnsafeMutableBytes { keyed.xorDigest(of: message, into: $0) } }
            ItemSetState.xor(&digest, one)
        }
        return digest
    }

    func piped(_ key: SecureBytes, _ rows: [Row], concurrent: Bool) -> (
        digest: [UInt8], generations: [RowIdentity: Int64]
    ) {
        let pipeline = RowDigestPipeline(
            keyed: Crypto.KeyedHash(key: key.pointer.assumingMemoryBound(to: UInt8.self)),
            expectedRows: rows.count, concurrent: concurrent)
        for row in rows {
            row.group.withUnsafeBytes { group in
                row.identifier.withUnsafeBytes { identifier in
                    pipeline.add(
                        row.identity, group: group, identifier: identifier,
                        protectionClass: row.protectionClass, generation: row.generation)
                }
            }
        }
        return pipeline.finish()
    }

    @Test(arguments: [true, false])
    func givesTheSerialDigestAndEveryGeneration(concurrent: Bool) {
        let key = key()
        let result = piped(key, Self.rows, concurrent: concurrent)
        #expect(result.digest == serialDigest(key, Self.rows))
        #expect(result.digest != ItemSetState.emptyDigest)
        #expect(result.generations.count == Self.rows.count)
        #expect(Self.rows.allSatisfy { result.generations[$0.identity] == $0.generation })
    }

    @Test func oneChangedRowChangesTheDigest() {
        let key = key()
        var changed = Self.rows
        changed[4321] = Row(
            group: changed[4321].group, identifier: changed[4321].identifier,
            protectionClass: changed[4321].protectionClass, generation: changed[4321].generation + 1)
        #expect(piped(key, changed, concurrent: true).digest != piped(key, Self.rows, concurrent: true).digest)
    }

    @Test func noRowsGiveTheEmptyDigest() {
        let result = piped(key(), [], concurrent: true)
        #expect(result.digest == ItemSetState.emptyDigest && result.generations.isEmpty)
    }
}
