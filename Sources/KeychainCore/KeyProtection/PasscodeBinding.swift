/// Forging a rollback takes the passcode (docs/FORMAT.md, "The passcode
/// binding").
///
/// The rollback counter (``RollbackRecord``) and every record bound to it
/// are MACed and moved under keys the device secret gives. Its TPM object
/// has an empty auth (so `always` items open while locked), so whoever
/// reaches the TPM unseals it, re-signs an older copy for the counter's
/// value, and the copy boots as current. The passcode binding closes that
/// for everything but `always` items: a second TPM counter whose auth, and
/// a record whose MAC, come from a key only the passcode unwraps (derived
/// from the `afterFirstUnlock` class key, so it stays in memory after the
/// first unlock, as that key does on iOS).
///
/// Record (meta key `passcode-binding`), MACed under ``PasscodeBindingKey``
/// (domain `kcfs-passcode-binding-v1`): `index u32 | value u64 | length u16 |
/// the counter's TPM name | rows[32] | policy[32]`. `rows` is the XOR, over
/// every item row of a passcode class and every row in the removals record,
/// of a keyed BLAKE2b (the binding key's) of the row's group, identifier,
/// class and generation and the digest of its value's nonce and its
/// details; `policy` is the keyed BLAKE2b of the entitlement
/// policy's body. Item writes and policy changes update it in their own
/// transaction (they have the key: a passcode class is written only with
/// its key in memory, a policy changed only with the passcode); a bump of
/// the rollback counter after such a change also moves the binding's
/// counter, in the same order as the rollback counter (commit, then
/// increment).
///
/// At the first unlock of a boot the binding is checked: its value against
/// its counter (behind it: an older copy re-signed, ``KeychainError/rolledBack``),
/// its rows against the table, its policy against the policy. So a copy
/// re-signed by someone who holds the device secret but not the passcode
/// is refused at the next unlock at the latest. What is left: `always`
/// items (readable with the device secret alone, as on iOS), removals made
/// since the last bump, and writes within the window (docs/SECURITY.md).
struct PasscodeBinding: Equatable {
    static let recordKey = "passcode-binding"
    private static let macDomain = "kcfs-passcode-binding-v1"

    var index: UInt32
    var value: UInt64
    var name: [UInt8]
    var rows: [UInt8]
    var policy: [UInt8]

    init(counter: CounterReference, value: UInt64, rows: [UInt8], policy: [UInt8]) {
        index = counter.index
        self.value = value
        name = counter.name ?? []
        self.rows = rows
        self.policy = policy
    }

    func encoded(key: PasscodeBindingKey) -> [UInt8] {
        var writer = ByteWriter()
        writer.append(index)
        writer.append(value)
        writer.append(UInt16(name.count))
        writer.append(name)
        writer.append(rows)
        writer.append(policy)
        return writer.bytes + key.mac(Self.macDomain, writer.bytes)
    }

    /// ``KeychainError/decode`` unless the binding key MACed it.
    init(decoding record: [UInt8], key: PasscodeBindingKey) throws(KeychainError) {
        var reader = ByteReader(
            try DeviceSecret.authenticatedBody(of: record) { key.mac(Self.macDomain, $0) })
        index = try reader.readUInt32()
        value = try reader.readUInt64()
        let length = Int(try reader.readUInt16())
        guard length > 0 else { throw .decode }
        name = try reader.read(length)
        rows = try reader.read(Crypto.macSize)
        policy = try reader.read(Crypto.macSize)
        guard reader.isAtEnd, KeyProtection.counterIndexes.contains(index) else { throw .decode }
    }

    /// The binding's counter as the TPM is asked about it.
    func counter(key: PasscodeBindingKey) -> CounterReference {
        CounterReference(index: index, name: name, auth: key.counterAuth)
    }

    /// Whether a row of `protectionClass` is bound: every class but the
    /// `always` ones, whose keys the device secret alone unwraps.
    static func binds(_ protectionClass: ProtectionClass) -> Bool { protectionClass.mode != .always }
}

/// The keys of a ``PasscodeBinding``, derived from the `afterFirstUnlock`
/// class key (`crypto_kdf`, context `kcfspcb1`): 1 MACs the record, 2
/// digests the rows and the policy, 3 is the auth of its TPM counter.
package struct PasscodeBindingKey: Sendable {
    private let macKey: GuardedKey
    private let digestKey: GuardedKey
    package let counterAuth: SecureBytes
    /// The indexes the binding's counter is defined at, the first free one:
    /// 16 of ``KeyProtection/counterIndexes`` that only this key gives. So
    /// the TPM itself says that a keychain was bound, where a copy from
    /// before has no record of it (``Device/keyPasscodeBinding(classKeys:passcode:upgrade:)``).
    package let counterCandidates: [UInt32]

    init(afterFirstUnlock classKey: GuardedKey) {
        macKey = GuardedKey(copying: classKey.withKey { Crypto.subkey(of: $0, id: 1, context: "kcfspcb1") })
        digestKey = GuardedKey(copying: classKey.withKey { Crypto.subkey(of: $0, id: 2, context: "kcfspcb1") })
        counterAuth = classKey.withKey { Crypto.subkey(of: $0, id: 3, context: "kcfspcb1") }
        let seed = [4, 5].flatMap { id in
            classKey.withKey { Crypto.subkey(of: $0, id: id, context: "kcfspcb1") }.withUnsafeBytes { Array($0) }
        }
        let indexes = KeyProtection.counterIndexes
        let count = UInt32(indexes.count)
        counterCandidates = stride(from: 0, to: seed.count, by: 4).map { offset in
            let word = seed[offset..<offset + 4].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
            return indexes.lowerBound + word % count
        }
    }

    /// The key of the class keys a passcode unwrapped (nil without the
    /// `afterFirstUnlock` one).
    init?(classKeys: [ProtectionClass: GuardedKey]) {
        guard let key = classKeys[.afterFirstUnlock] else { return nil }
        self.init(afterFirstUnlock: key)
    }

    func mac(_ domain: String, _ body: [UInt8]) -> [UInt8] {
        macKey.withKey { key in
            Array(domain.utf8).withUnsafeBytes { d in body.withUnsafeBytes { b in Crypto.mac(key: key, [d, b]) } }
        }
    }

    /// One row's share of ``PasscodeBinding/rows``: its names, class and
    /// generation, and the digest of its content (``contentDigest(nonce:details:)``).
    func rowDigest(
        group: String, identifier: String, protectionClass: Int64, generation: Int64, contentDigest: [UInt8]
    ) -> [UInt8] {
        ItemSetState.rowDigest(
            key: digestKey, group: group, identifier: identifier, protectionClass: protectionClass,
            generation: generation, suffix: contentDigest)
    }

    func rowDigest(_ row: SealedItem) -> [UInt8] {
        rowDigest(
            group: row.group, identifier: row.identifier, protectionClass: row.protectionClass.rawValue,
            generation: row.generation, contentDigest: Self.contentDigest(nonce: row.nonce, details: row.details))
    }

    /// BLAKE2b-256 of a row's value nonce and sealed details. The nonce
    /// names the one ciphertext that opens with it, so an older value
    /// sealed under the same generation (a generation counter set back by
    /// whoever re-signs the state) does not match; the details are sealed
    /// under a key of the device secret and would otherwise be its to
    /// rewrite (an item's access list is there).
    static func contentDigest(nonce: [UInt8], details: [UInt8]?) -> [UInt8] {
        Crypto.hash(nonce + (details ?? []))
    }

    /// ``PasscodeBinding/policy`` of an entitlement policy record: its
    /// body, without the MAC, which carries the rollback counter's value
    /// and so changes at every bump.
    func policyDigest(ofRecord record: [UInt8]) -> [UInt8] {
        let body = Array(record.dropLast(Crypto.macSize))
        return digestKey.withKey { key in
            Array("kcfs-binding-policy-v1".utf8).withUnsafeBytes { d in
                body.withUnsafeBytes { b in Crypto.mac(key: key, [d, b]) }
            }
        }
    }
}

/// Rows of a passcode class removed while no binding key was in memory
/// (before the first unlock of a boot: `rm` works while locked), which the
/// binding still counts until its next check folds them out. Meta key
/// `passcode-binding-removals`: `count u32`, then per row `class u8 |
/// generation u64 | content digest[32] | u16-prefixed group |
/// u16-prefixed identifier`. Not
/// authenticated: each entry must name a generation no row has now, and
/// an entry the binding never counted breaks the XOR, so an entry can only
/// say that a bound row is gone.
struct BindingRemovals: Equatable {
    static let recordKey = "passcode-binding-removals"

    struct Row: Equatable {
        var group: String
        var identifier: String
        var protectionClass: Int64
        var generation: Int64
        var contentDigest: [UInt8]
    }
    var rows: [Row] = []

    init(rows: [Row] = []) { self.rows = rows }

    var encoded: [UInt8] {
        var writer = ByteWriter()
        writer.append(UInt32(rows.count))
        for row in rows {
            writer.append(UInt8(truncatingIfNeeded: row.protectionClass))
            writer.append(row.generation)
            writer.append(row.contentDigest)
            writer.appendPrefixed(row.group)
            writer.appendPrefixed(row.identifier)
        }
        return writer.bytes
    }

    init(decoding bytes: [UInt8]) throws(KeychainError) {
        var reader = ByteReader(bytes)
        let count = try reader.readUInt32()
        for _ in 0..<count {
            let protectionClass = Int64(try reader.readByte())
            let generation = try reader.readInt64()
            let details = try reader.read(Crypto.macSize)
            rows.append(
                Row(
                    group: try reader.readPrefixed(), identifier: try reader.readPrefixed(),
                    protectionClass: protectionClass, generation: generation, contentDigest: details))
        }
        guard reader.isAtEnd else { throw .decode }
    }
}
