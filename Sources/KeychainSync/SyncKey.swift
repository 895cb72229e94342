import KeychainCore

/// The circle's sync key of one epoch (docs/SYNC.md, "The circle and its
/// keys"), and the keys derived from it: one names records, one seals them.
/// A new epoch (a device removed) is a new random key.
package final class SyncKey: Sendable {
    package let circle: [UInt8]
    package let epoch: UInt32
    let secret: SecureBytes
    private let nameKey: SecureBytes
    let sealKey: SecureBytes

    package static let size = 32
    package static let circleSize = 16

    init(secret: SecureBytes, circle: [UInt8], epoch: UInt32) {
        precondition(secret.count == Self.size && circle.count == Self.circleSize)
        self.secret = secret
        self.circle = circle
        self.epoch = epoch
        nameKey = secret.withUnsafeBytes { key in
            Crypto.deriveKey(key: key.baseAddress!.assumingMemoryBound(to: UInt8.self), [Self.bytes("kcfs-sync-name")])
        }
        sealKey = secret.withUnsafeBytes { key in
            Crypto.deriveKey(key: key.baseAddress!.assumingMemoryBound(to: UInt8.self), [Self.bytes("kcfs-sync-seal")])
        }
    }

    static func random(circle: [UInt8], epoch: UInt32) -> SyncKey {
        SyncKey(secret: SecureBytes.random(count: size), circle: circle, epoch: epoch)
    }

    private static func bytes(_ text: StaticString) -> UnsafeRawBufferPointer {
        UnsafeRawBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount)
    }

    /// The record's name in the repository: a keyed hash of group and
    /// identifier, so that the remote learns no name and cannot tell two
    /// circles' records of the same name apart.
    func recordName(_ key: ItemKey) -> [UInt8] {
        var writer = ByteWriter()
        writer.appendPrefixed(key.group)
        writer.appendPrefixed(key.identifier)
        return nameKey.withUnsafeBytes { nameKey in
            writer.bytes.withUnsafeBytes {
                Crypto.mac(key: nameKey.baseAddress!.assumingMemoryBound(to: UInt8.self), [$0])
            }
        }
    }

    func seal(_ plaintext: UnsafeRawBufferPointer, associatedData: [UInt8]) -> [UInt8] {
        sealKey.withUnsafeBytes { SyncCipher.seal(plaintext, key: $0, associatedData: associatedData) }
    }

    func open(_ sealed: ArraySlice<UInt8>, associatedData: [UInt8], into output: UnsafeMutableRawBufferPointer)
        -> Bool
    {
        sealKey.withUnsafeBytes { SyncCipher.open(sealed, key: $0, associatedData: associatedData, into: output) }
    }

    /// Associated data: a domain, the circle, the epoch and the place.
    func associatedData(_ domain: String, _ place: [UInt8]) -> [UInt8] {
        var writer = ByteWriter()
        writer.appendPrefixed(domain)
        writer.append(circle)
        writer.append(epoch)
        writer.append(place)
        return writer.bytes
    }
}
