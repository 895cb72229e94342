internal import CSodium
import KeychainCore

/// A device's key pair (X25519, libsodium's crypto_box), or the recovery
/// key's: sync keys are granted to its public half.
struct DeviceKeys {
    static let publicSize = Int(crypto_box_PUBLICKEYBYTES)
    static let secretSize = Int(crypto_box_SECRETKEYBYTES)

    let publicKey: [UInt8]
    let secretKey: SecureBytes

    static func generate() -> DeviceKeys {
        var publicKey = [UInt8](repeating: 0, count: publicSize)
        let secret = try! SecureBytes(count: secretSize)
        crypto_box_keypair(&publicKey, secret.mutableBytes.baseAddress!.assumingMemoryBound(to: UInt8.self))
        return DeviceKeys(publicKey: publicKey, secretKey: secret)
    }

    /// The recovery key's pair: derived from its 32 random bytes.
    static func recovery(from key: SecureBytes) -> DeviceKeys {
        var publicKey = [UInt8](repeating: 0, count: publicSize)
        let secret = try! SecureBytes(count: secretSize)
        let domain = Array("kcfs-sync-recovery".utf8)
        let seed = key.withUnsafeBytes { key in
            domain.withUnsafeBytes {
                Crypto.deriveKey(key: key.baseAddress!.assumingMemoryBound(to: UInt8.self), [$0])
            }
        }
        _ = seed.withUnsafeBytes {
            crypto_box_seed_keypair(
                &publicKey, secret.mutableBytes.baseAddress!.assumingMemoryBound(to: UInt8.self),
                $0.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
        return DeviceKeys(publicKey: publicKey, secretKey: secret)
    }
}

/// What a sync key travels as: `key[32] | circle[16] | epoch u32`, so
/// that a grant opens only as the circle and epoch it claims.
enum KeyGrant {
    static let plainSize = SyncKey.size + SyncKey.circleSize + 4

    private static func plain(_ key: SyncKey, into buffer: UnsafeMutableRawBufferPointer) {
        key.secret.withUnsafeBytes { buffer.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: SyncKey.size) }
        var tail = ByteWriter()
        tail.append(key.circle)
        tail.append(key.epoch)
        tail.bytes.withUnsafeBytes {
            (buffer.baseAddress! + SyncKey.size).copyMemory(from: $0.baseAddress!, byteCount: $0.count)
        }
    }

    private static func key(from plain: UnsafeRawBufferPointer, circle: [UInt8], epoch: UInt32) -> SyncKey? {
        var reader = ByteReader(UnsafeRawBufferPointer(rebasing: plain[SyncKey.size...]))
        guard let claimed = try? reader.read(SyncKey.circleSize), claimed == circle,
            let claimedEpoch = try? reader.readUInt32(), claimedEpoch == epoch,
            let secret = try? SecureBytes(copying: UnsafeRawBufferPointer(rebasing: plain[..<SyncKey.size]))
        else { return nil }
        return SyncKey(secret: secret, circle: circle, epoch: epoch)
    }

    /// `granter u64 | nonce | box`: from `granter`'s secret key to `recipient`.
    static func grant(_ key: SyncKey, from granter: UInt64, secret: SecureBytes, to recipient: [UInt8]) -> [UInt8] {
        let nonce = Crypto.randomBytes(Int(crypto_box_NONCEBYTES))
        var boxed = [UInt8](repeating: 0, count: plainSize + Int(crypto_box_MACBYTES))
        withGuardedBuffer(count: plainSize) { buffer in
            plain(key, into: buffer)
            secret.withUnsafeBytes { secret in
                _ = crypto_box_easy(
                    &boxed, buffer.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(plainSize), nonce,
                    recipient, secret.baseAddress!.assumingMemoryBound(to: UInt8.self))
            }
        }
        var writer = ByteWriter()
        writer.append(granter)
        writer.append(nonce)
        writer.append(boxed)
        return writer.bytes
    }

    /// Who granted, as the grant says (checked by opening it with that member's public key).
    static func granter(_ bytes: [UInt8]) -> UInt64? {
        var reader = ByteReader(bytes)
        return try? reader.readUInt64()
    }

    static func open(
        _ bytes: [UInt8], granterPublic: [UInt8], secret: SecureBytes, circle: [UInt8], epoch: UInt32
    ) -> SyncKey? {
        let nonceSize = Int(crypto_box_NONCEBYTES)
        guard bytes.count == 8 + nonceSize + plainSize + Int(crypto_box_MACBYTES) else { return nil }
        let nonce = Array(bytes[8..<8 + nonceSize]), boxed = Array(bytes[(8 + nonceSize)...])
        return withGuardedBuffer(count: plainSize) { buffer -> SyncKey? in
            let status = secret.withUnsafeBytes { secret in
                crypto_box_open_easy(
                    buffer.baseAddress!.assumingMemoryBound(to: UInt8.self), boxed, UInt64(boxed.count), nonce,
                    granterPublic, secret.baseAddress!.assumingMemoryBound(to: UInt8.self))
            }
            guard status == 0 else { return nil }
            return key(from: UnsafeRawBufferPointer(buffer), circle: circle, epoch: epoch)
        }
    }

    /// The key sealed to the recovery key's public half (anonymous: crypto_box_seal).
    static func sealForRecovery(_ key: SyncKey, recoveryPublic: [UInt8]) -> [UInt8] {
        var sealed = [UInt8](
            repeating: 0, count: plainSize + (Int(crypto_box_PUBLICKEYBYTES) + Int(crypto_box_MACBYTES)))
        withGuardedBuffer(count: plainSize) { buffer in
            plain(key, into: buffer)
            _ = crypto_box_seal(
                &sealed, buffer.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(plainSize), recoveryPublic)
        }
        return sealed
    }

    static func openWithRecovery(_ sealed: [UInt8], keys: DeviceKeys, circle: [UInt8], epoch: UInt32) -> SyncKey? {
        guard sealed.count == plainSize + (Int(crypto_box_PUBLICKEYBYTES) + Int(crypto_box_MACBYTES)) else {
            return nil
        }
        return withGuardedBuffer(count: plainSize) { buffer -> SyncKey? in
            let status = keys.secretKey.withUnsafeBytes { secret in
                crypto_box_seal_open(
                    buffer.baseAddress!.assumingMemoryBound(to: UInt8.self), sealed, UInt64(sealed.count),
                    keys.publicKey, secret.baseAddress!.assumingMemoryBound(to: UInt8.self))
            }
            guard status == 0 else { return nil }
            return key(from: UnsafeRawBufferPointer(buffer), circle: circle, epoch: epoch)
        }
    }

    static func path(epoch: UInt32, device: UInt64) -> String { "circle/grants/\(epoch)/\(Hex.string(device))" }
    static func recoveryPath(epoch: UInt32) -> String { "circle/recovery/\(epoch)" }
}

/// Joining by approval (docs/SYNC.md, "Joining"): the new device asks
/// with its public key and a commitment to a random nonce; a device of
/// the circle answers with its own nonce; the new device reveals its
/// nonce; both then show the same six digits, derived from both keys and
/// both nonces. The commitment is what keeps a remote in the middle from
/// choosing keys until the digits agree (as Bluetooth's numeric
/// comparison): it must fix its keys before it learns the nonces, so it
/// matches the digits once in a million tries, each of which the person
/// sees fail.
struct JoinRequest: Equatable {
    static let magic = Array("KCFSJOIN".utf8)
    let circle: [UInt8]
    let device: Member
    let commitment: [UInt8]

    static func path(_ device: UInt64) -> String { "circle/join/\(Hex.string(device))/request" }
    static func responsePath(_ device: UInt64) -> String { "circle/join/\(Hex.string(device))/response" }
    static func revealPath(_ device: UInt64) -> String { "circle/join/\(Hex.string(device))/reveal" }

    var encoded: [UInt8] {
        var writer = ByteWriter()
        writer.append(Self.magic)
        writer.append(circle)
        device.encode(into: &writer)
        writer.append(commitment)
        return writer.bytes
    }

    init(circle: [UInt8], device: Member, commitment: [UInt8]) {
        self.circle = circle
        self.device = device
        self.commitment = commitment
    }

    init?(_ bytes: [UInt8]) {
        var reader = ByteReader(bytes)
        guard (try? reader.read(Self.magic.count)) == Self.magic, let circle = try? reader.read(SyncKey.circleSize),
            let device = try? Member(reading: &reader), let commitment = try? reader.read(32), reader.isAtEnd
        else { return nil }
        self.init(circle: circle, device: device, commitment: commitment)
    }

    static func commitment(to nonce: [UInt8]) -> [UInt8] { Crypto.hash(Array("kcfs-sync-commit".utf8) + nonce) }

    /// The six digits both devices show: `123 456`.
    static func code(circle: [UInt8], joiner: Member, approver: Member, approverNonce: [UInt8], joinerNonce: [UInt8])
        -> String
    {
        var writer = ByteWriter()
        writer.appendPrefixed("kcfs-sync-code")
        writer.append(circle)
        joiner.encode(into: &writer)
        approver.encode(into: &writer)
        writer.append(approverNonce)
        writer.append(joinerNonce)
        let digest = Crypto.hash(writer.bytes)
        var number: UInt64 = 0
        for byte in digest.prefix(8) { number = number << 8 | UInt64(byte) }
        let digits = String(number % 1_000_000)
        let padded = String(repeating: "0", count: 6 - digits.count) + digits
        return String(padded.prefix(3)) + " " + String(padded.suffix(3))
    }
}

/// A circle device's answer to a join request: `approver (id, name,
/// public[32]) | nonce[32]`.
struct JoinResponse: Equatable {
    let approver: Member
    let nonce: [UInt8]

    var encoded: [UInt8] {
        var writer = ByteWriter()
        approver.encode(into: &writer)
        writer.append(nonce)
        return writer.bytes
    }

    init(approver: Member, nonce: [UInt8]) {
        self.approver = approver
        self.nonce = nonce
    }

    init?(_ bytes: [UInt8]) {
        var reader = ByteReader(bytes)
        guard let approver = try? Member(reading: &reader), let nonce = try? reader.read(32), reader.isAtEnd else {
            return nil
        }
        self.init(approver: approver, nonce: nonce)
    }
}

extension Hex {
    static func string(_ value: UInt64) -> String { string(withUnsafeBytes(of: value.bigEndian) { Array($0) }) }

    static func device(_ text: String) -> UInt64? {
        guard let bytes = bytes(text, count: 8) else { return nil }
        return bytes.reduce(0) { $0 << 8 | UInt64($1) }
    }
}
