import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// What a device keeps of its circle, beside its keychain
/// (docs/SYNC.md, "On the device"): the circle, the device's own keys
/// (sealed under its `afterFirstUnlockThisDeviceOnly` class key, so they
/// are exactly as available as such items, and never leave the device),
/// the highest manifest it has seen (rollback detection), and for each
/// synced item the version it last agreed with the circle on and the
/// item's generation then (an item whose generation moved was changed here).
/// Kept in `sync/state.db` (``SyncStateStore``), one table per part.
struct SyncState {
    struct Base: Equatable {
        var vector: VersionVector
        /// The item's generation when it was last synced; 0 for a tombstone.
        var generation: Int64
    }

    var remote: String
    var circle: [UInt8]
    var epoch: UInt32
    var device: UInt64
    var deviceName: String
    var publicKey: [UInt8]
    /// `sync key[32] | device secret key[32]`, sealed (``Device/sealBlob(_:under:context:)``).
    var sealedSecrets: [UInt8]
    var counter: UInt64 = 0
    var sequence: UInt64 = 0
    var manifestDigest: [UInt8] = []
    var recoveryPublic: [UInt8]
    var members: [Member]
    var base: [ItemKey: Base] = [:]
    /// When the last round finished (milliseconds since 1970; 0: never), and what went wrong since.
    var lastSync: UInt64 = 0
    var lastProblem: String = ""
    /// When each member was last heard from: the newest manifest it wrote.
    var heard: [UInt64: UInt64] = [:]
    /// Each index file as last read: its digest and its entries (record
    /// name to record digest), so that a round reads only the buckets that changed.
    var indexes: [UInt8: (digest: [UInt8], entries: [[UInt8]: [UInt8]])] = [:]
    /// The digest of each record as this device last agreed with it (it
    /// applied it, held it already, or pushed it): a record listed with that
    /// digest is not read again.
    var processed: [[UInt8]: [UInt8]] = [:]
    /// The commit this device last read whole or made (empty: none): the
    /// next round reads only what changed since (git diff-tree), and its manifest as read.
    var verifiedHead = ""
    var manifestBytes: [UInt8] = []
    /// The groups this machine syncs (empty: every group). A machine's own
    /// choice, as iCloud Keychain's is per device: another may sync more.
    var groups: [String] = []

    /// Whether items of `group` sync here.
    func syncs(_ group: String) -> Bool { groups.isEmpty || groups.contains(group) }

    static let magic = Array("KCFSSYNC".utf8)
    static let version: UInt8 = 1

    static let secretClass = ProtectionClass.afterFirstUnlockThisDeviceOnly

    static func secretsContext(circle: [UInt8], device: UInt64) -> [UInt8] {
        var writer = ByteWriter()
        writer.appendPrefixed("kcfs-sync-secrets")
        writer.append(circle)
        writer.append(device)
        return writer.bytes
    }

    /// The circle and this machine, without the per-item tables: the `meta` row.
    var encodedHead: [UInt8] {
        var writer = ByteWriter()
        writer.append(Self.magic)
        writer.append(Self.version)
        writer.appendPrefixed(remote)
        writer.append(circle)
        writer.append(epoch)
        writer.append(device)
        writer.appendPrefixed(deviceName)
        writer.append(publicKey)
        writer.append(UInt32(sealedSecrets.count))
        writer.append(sealedSecrets)
        writer.append(counter)
        writer.append(sequence)
        writer.append(UInt8(manifestDigest.count))
        writer.append(manifestDigest)
        writer.append(recoveryPublic)
        writer.append(UInt16(members.count))
        for member in members { member.encode(into: &writer) }
        writer.append(lastSync)
        writer.appendPrefixed(String(decoding: lastProblem.utf8.prefix(1000), as: UTF8.self))
        writer.append(UInt16(heard.count))
        for (device, time) in heard {
            writer.append(device)
            writer.append(time)
        }
        writer.appendPrefixed(verifiedHead)
        writer.append(UInt32(manifestBytes.count))
        writer.append(manifestBytes)
        writer.append(UInt16(groups.count))
        for group in groups { writer.appendPrefixed(group) }
        return writer.bytes
    }

    init(
        remote: String, circle: [UInt8], epoch: UInt32, device: UInt64, deviceName: String, publicKey: [UInt8],
        sealedSecrets: [UInt8], recoveryPublic: [UInt8], members: [Member]
    ) {
        self.remote = remote
        self.circle = circle
        self.epoch = epoch
        self.device = device
        self.deviceName = deviceName
        self.publicKey = publicKey
        self.sealedSecrets = sealedSecrets
        self.recoveryPublic = recoveryPublic
        self.members = members
    }

    init(head bytes: [UInt8]) throws(KeychainError) {
        var reader = ByteReader(bytes)
        guard try reader.read(Self.magic.count) == Self.magic, try reader.readByte() == Self.version else {
            throw .decode
        }
        remote = try reader.readPrefixed()
        circle = try reader.read(SyncKey.circleSize)
        epoch = try reader.readUInt32()
        device = try reader.readUInt64()
        deviceName = try reader.readPrefixed()
        publicKey = try reader.read(DeviceKeys.publicSize)
        sealedSecrets = try reader.read(Int(try reader.readUInt32()))
        counter = try reader.readUInt64()
        sequence = try reader.readUInt64()
        manifestDigest = try reader.read(Int(try reader.readByte()))
        recoveryPublic = try reader.read(DeviceKeys.publicSize)
        members = []
        for _ in 0..<Int(try reader.readUInt16()) { members.append(try Member(reading: &reader)) }
        lastSync = try reader.readUInt64()
        lastProblem = try reader.readPrefixed()
        for _ in 0..<Int(try reader.readUInt16()) { heard[try reader.readUInt64()] = try reader.readUInt64() }
        verifiedHead = try reader.readPrefixed()
        manifestBytes = try reader.read(Int(try reader.readUInt32()))
        for _ in 0..<Int(try reader.readUInt16()) { groups.append(try reader.readPrefixed()) }
        guard reader.isAtEnd else { throw .decode }
    }

    func member(_ id: UInt64) -> Member? { members.first { $0.id == id } }

    /// This device agrees with `commit` (read and checked, or made and
    /// pushed), whose manifest is `manifest` (number `sequence`), with
    /// `indexes` as its index files: a round after reads only what changed since.
    mutating func agree(
        with commit: String, manifest: [UInt8], sequence: UInt64,
        indexes: [UInt8: (digest: [UInt8], entries: [[UInt8]: [UInt8]])]? = nil
    ) {
        self.sequence = sequence
        manifestDigest = Crypto.hash(manifest)
        manifestBytes = manifest
        verifiedHead = commit
        if let indexes { self.indexes = indexes }
    }

    /// Forgets which records and index files were read, so that the next
    /// round reads the remote whole once (a group chosen, a policy gone).
    mutating func forgetWhatWasRead() {
        processed = [:]
        indexes = [:]
        verifiedHead = ""
    }
}
