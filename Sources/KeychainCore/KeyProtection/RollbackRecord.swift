/// The keychain's side of its TPM rollback counter (docs/FORMAT.md, "Keys
/// sealed by a TPM").
///
/// Record (meta key `rollback`), version 2: `index u32 LE | epoch u64 LE |
/// length u16 LE | the counter's TPM name | MAC[32]` (domain
/// `kcfs-rollback-v2`): the NV index of the counter, the value the
/// keychain's bound records carry (``DeviceSecret/boundRecord(_:_:)``,
/// ``boundRecords``), and the name the TPM gave the counter when it was
/// made, which covers its type, attributes and auth: an index defined
/// again in its place is not it. Version 1, the older, is `index | epoch | MAC`
/// (domain `kcfs-rollback-v1`): a counter the owner could increment or
/// redefine, with the keybag, lockout and recovery records unbound; it is
/// replaced at the first boot (``Device/upgradeCounter``).
///
/// The TPM's counter only goes up. A bump from `e` to `e + 1` first
/// commits the bound records re-MACed for `e + 1` and this record (one
/// transaction, synced), then increments the counter. So a keychain whose
/// epoch is the counter's value, or one more (a bump interrupted before the
/// increment, which boot completes), is current; one whose epoch is lower
/// is an older copy put back, refused at boot (``KeychainError/rolledBack``).
/// Splicing a record from a newer copy into an older one fails too: the
/// older copy's bound records carry its older epoch.
struct RollbackRecord: Equatable {
    static let recordKey = "rollback"
    private static let legacyDomain = "kcfs-rollback-v1"
    private static let macDomain = "kcfs-rollback-v2"

    /// The records whose MAC domain carries the epoch: (meta key, domain).
    /// Every record that decides what the keychain holds and who opens it:
    /// an older row of any of them fails beside newer ones.
    static let boundRecords: [(key: String, domain: String)] =
        [
            (ItemSetState.recordKey, ItemSetState.macDomainV2),
            (EntitlementPolicy.recordKey, EntitlementPolicy.macDomain),
            (AuditLog.anchorKey, AuditLog.anchorDomain),
            (TPMFailuresSeen.recordKey, TPMFailuresSeen.macDomain)
        ] + lateBoundRecords

    /// The records that only version 2 binds: a version-1 keychain has them
    /// unbound.
    static let lateBoundRecords: [(key: String, domain: String)] = [
        (Keybag.recordKey, Keybag.macDomain),
        (LockoutRecord.recordKey, LockoutRecord.macDomain),
        (RecoveryKey.recordKey, RecoveryKey.macDomain)
    ]

    static func isLateBound(_ domain: String) -> Bool { lateBoundRecords.contains { $0.domain == domain } }

    /// The body of a record of ``lateBoundRecords`` as a version-1 keychain
    /// has it: MACed without an epoch, or, for the recovery record, not
    /// MACed at all (its version byte becomes 2, which says a MAC follows;
    /// the sealed part does not cover it).
    static func unboundBody(_ key: String, _ domain: String, _ record: [UInt8], secret: DeviceSecret)
        throws(KeychainError) -> [UInt8]
    {
        if key == RecoveryKey.recordKey, record.first == 1 { return [2] + record.dropFirst() }
        return try secret.authenticatedBody(domain, record)
    }

    /// Writes are bound to the counter once they pause this many seconds
    /// (a burst of writes is one bump)...
    static let idleBindSeconds: Int64 = 10
    /// ... or once the first of them is this old, while writes go on. The
    /// window in which an older copy put back goes unnoticed, stated in
    /// docs/SECURITY.md; and at most one NV write a minute from writes
    /// (TPM NV memory wears, and real TPMs rate-limit NV writes).
    static let maximumWindowSeconds: Int64 = 60

    var index: UInt32
    var epoch: UInt64
    /// The counter's TPM name; nil in a version-1 record.
    var name: [UInt8]?

    var isLegacy: Bool { name == nil }

    func encoded(secret: DeviceSecret) -> [UInt8] {
        var writer = ByteWriter()
        writer.append(index)
        writer.append(epoch)
        guard let name else { return secret.authenticatedRecord(Self.legacyDomain, writer.bytes) }
        writer.append(UInt16(name.count))
        writer.append(name)
        return secret.authenticatedRecord(Self.macDomain, writer.bytes)
    }

    init(counter: CounterReference, epoch: UInt64) {
        self.index = counter.index
        self.epoch = epoch
        self.name = counter.name
    }

    init(decoding record: [UInt8], secret: DeviceSecret) throws(KeychainError) {
        if let legacy = try? secret.authenticatedBody(Self.legacyDomain, record, length: 12) {
            var reader = ByteReader(legacy)
            index = try reader.readUInt32()
            epoch = try reader.readUInt64()
            name = nil
        } else {
            var reader = ByteReader(try secret.authenticatedBody(Self.macDomain, record))
            index = try reader.readUInt32()
            epoch = try reader.readUInt64()
            let length = Int(try reader.readUInt16())
            guard length > 0 else { throw .decode }
            name = try reader.read(length)
            guard reader.isAtEnd else { throw .decode }
        }
        guard KeyProtection.counterIndexes.contains(index) else { throw .decode }
    }

    /// The counter as the TPM is asked about it: this record's index and
    /// name, with the auth `secret` gives (a version-1 counter has none).
    func counter(secret: DeviceSecret) -> CounterReference {
        CounterReference(index: index, name: name, auth: isLegacy ? nil : secret.counterAuth)
    }

    /// Checks the keychain's epoch against the TPM's counter, completing a
    /// bump that was committed but not yet counted.
    func check(against tpm: any KeyProtector, secret: DeviceSecret) throws(KeychainError) {
        let counter = self.counter(secret: secret)
        let value = try tpm.value(of: counter)
        if epoch < value {
            Diagnostics.log(
                "the keychain's state is from rollback counter \(epoch), but the TPM's counter is at \(value): "
                    + "an older copy of its files was put back")
            throw .rolledBack
        }
        if epoch == value + 1 {
            try tpm.increment(counter)
        } else if epoch != value {
            Diagnostics.log(
                "the keychain's rollback counter (\(epoch)) is ahead of the TPM's (\(value)): it is not this TPM's keychain"
            )
            throw .decode
        }
    }
}
