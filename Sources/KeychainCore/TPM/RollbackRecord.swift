/// The keychain's side of its TPM rollback counter (issue 30).
///
/// Record (meta key `rollback`): `index u32 LE | epoch u64 LE | MAC[32]`
/// (domain `kcfs-rollback-v1`): the NV index of the counter and the value
/// the keychain's bound records carry (``DeviceSecret/boundRecord(_:_:)``:
/// the item set's state, the entitlement policy and the audit anchor).
///
/// The TPM's counter only goes up. A bump from `e` to `e + 1` first
/// commits the bound records re-MACed for `e + 1` and this record (one
/// transaction, synced), then increments the counter. So a keychain whose
/// epoch is the counter's value, or one more (a bump interrupted before the
/// increment, which boot completes), is current; one whose epoch is lower
/// is an older copy put back, refused at boot (``KeychainError/rolledBack``).
/// Splicing this record from a newer copy into an older one fails too: the
/// older copy's bound records carry its older epoch.
struct RollbackRecord: Equatable {
    static let recordKey = "rollback"
    private static let macDomain = "kcfs-rollback-v1"

    /// The records whose MAC domain carries the epoch: (meta key, domain).
    static let boundRecords: [(key: String, domain: String)] = [
        (ItemSetState.recordKey, ItemSetState.macDomainV2),
        (EntitlementPolicy.recordKey, EntitlementPolicy.macDomain),
        (AuditLog.anchorKey, AuditLog.anchorDomain)
    ]

    /// Writes since the last bump do not bump again before this many seconds
    /// (TPM NV memory wears and real TPMs rate-limit NV writes): the window in
    /// which an older copy goes unnoticed, stated in docs/SECURITY.md.
    static let writeBumpInterval: Int64 = 300

    var index: UInt32
    var epoch: UInt64

    func encoded(secret: DeviceSecret) -> [UInt8] {
        var writer = ByteWriter()
        writer.append(index)
        writer.append(epoch)
        return secret.authenticatedRecord(Self.macDomain, writer.bytes)
    }

    init(index: UInt32, epoch: UInt64) {
        self.index = index
        self.epoch = epoch
    }

    init(decoding record: [UInt8], secret: DeviceSecret) throws(KeychainError) {
        var reader = ByteReader(try secret.authenticatedBody(Self.macDomain, record, length: 12))
        index = try reader.readUInt32()
        epoch = try reader.readUInt64()
        guard KeychainTPM.counterIndexes.contains(index) else { throw .decode }
    }

    /// Checks the keychain's epoch against the TPM's counter, completing a
    /// bump that was committed but not yet counted.
    func check(against tpm: KeychainTPM) throws(KeychainError) {
        let counter = try tpm.counter(at: index)
        if epoch < counter {
            Diagnostics.log(
                "the keychain's state is from rollback counter \(epoch), but the TPM's counter is at \(counter): "
                    + "an older copy of its files was put back")
            throw .rolledBack
        }
        if epoch == counter + 1 {
            try tpm.increment(counter: index)
        } else if epoch != counter {
            Diagnostics.log(
                "the keychain's rollback counter (\(epoch)) is ahead of the TPM's (\(counter)): it is not this TPM's keychain"
            )
            throw .decode
        }
    }
}
