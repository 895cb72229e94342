internal import CLinux
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// What a device keeps of its circle, beside its keychain in `sync/state`
/// (docs/SYNC.md, "On the device"): the circle, the device's own keys
/// (sealed under its `afterFirstUnlockThisDeviceOnly` class key, so they
/// are exactly as available as such items, and never leave the device),
/// the highest manifest it has seen (rollback detection), and for each
/// synced item the version it last agreed with the circle on and the
/// item's generation then (an item whose generation moved was changed here).
/// Rewritten whole, atomically (a new file renamed over the old, both synced).
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

    var encoded: [UInt8] {
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
        writer.append(UInt32(base.count))
        for (key, entry) in base {
            writer.appendPrefixed(key.group)
            writer.appendPrefixed(key.identifier)
            writer.append(entry.generation)
            entry.vector.encode(into: &writer)
        }
        writer.append(UInt16(indexes.count))
        for (bucket, index) in indexes {
            writer.append(bucket)
            writer.append(index.digest)
            writer.append(UInt32(index.entries.count))
            for (name, digest) in index.entries {
                writer.append(name)
                writer.append(digest)
            }
        }
        writer.append(UInt32(processed.count))
        for (name, digest) in processed {
            writer.append(name)
            writer.append(digest)
        }
        writer.appendPrefixed(verifiedHead)
        writer.append(UInt32(manifestBytes.count))
        writer.append(manifestBytes)
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

    init(_ bytes: [UInt8]) throws(KeychainError) {
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
        for _ in 0..<Int(try reader.readUInt32()) {
            let key = ItemKey(group: try reader.readPrefixed(), identifier: try reader.readPrefixed())
            let generation = try reader.readInt64()
            base[key] = Base(vector: try VersionVector(reading: &reader), generation: generation)
        }
        for _ in 0..<Int(try reader.readUInt16()) {
            let bucket = try reader.readByte(), digest = try reader.read(32)
            var entries: [[UInt8]: [UInt8]] = [:]
            for _ in 0..<Int(try reader.readUInt32()) { entries[try reader.read(32)] = try reader.read(32) }
            indexes[bucket] = (digest, entries)
        }
        for _ in 0..<Int(try reader.readUInt32()) { processed[try reader.read(32)] = try reader.read(32) }
        verifiedHead = try reader.readPrefixed()
        manifestBytes = try reader.read(Int(try reader.readUInt32()))
        guard reader.isAtEnd else { throw .decode }
    }

    func member(_ id: UInt64) -> Member? { members.first { $0.id == id } }

    // MARK: The file

    static func load(from path: String) throws(SyncFailure) -> SyncState? {
        try load(from: path, unless: nil)?.state
    }

    /// Which version of the file is on disk: a state read before is still
    /// the file's while this is unchanged (the file is only ever replaced whole).
    struct FileVersion: Equatable {
        let inode: UInt64
        let size: Int64
        let seconds: Int
        let nanoseconds: Int

        init(_ info: stat) {
            inode = UInt64(info.st_ino)
            size = Int64(info.st_size)
            seconds = info.st_mtim.tv_sec
            nanoseconds = info.st_mtim.tv_nsec
        }

        /// The version of the file at `path` now; nil when there is none.
        static func of(_ path: String) -> FileVersion? {
            var info = stat()
            return stat(path, &info) == 0 ? FileVersion(info) : nil
        }
    }

    /// The state in the file, and its version; nil for the state when the file's version is `known`.
    static func load(from path: String, unless known: FileVersion?) throws(SyncFailure)
        -> (state: SyncState?, version: FileVersion)?
    {
        guard let fd = FileDescriptor(open(path, O_RDONLY | O_CLOEXEC)) else {
            let failure = Errno.current
            if failure == .noSuchFile { return nil }
            throw SyncFailure(.store(.io), "\(path) could not be read (\(failure))")
        }
        var info = stat()
        guard fstat(fd.raw, &info) == 0 else { throw SyncFailure(.store(.io), "\(path) could not be read") }
        let version = FileVersion(info)
        if version == known { return (nil, version) }
        do {
            return (try SyncState(try Descriptor.readAll(fd.raw, limit: 1 << 30)), version)
        } catch {
            throw SyncFailure(.store(.decode), "\(path) is damaged: remove it and join the circle again")
        }
    }

    func save(to path: String) throws(SyncFailure) {
        try AtomicFile.write(encoded, to: path)
    }
}

/// A file replaced whole or not at all: written beside, synced, renamed
/// over, and the directory synced (rename(2) is atomic; fsync makes it last).
enum AtomicFile {
    static func write(_ bytes: [UInt8], to path: String) throws(SyncFailure) {
        let temporary = path + ".new"
        do throws(Errno) {
            guard let fd = FileDescriptor(open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)) else {
                throw Errno.current
            }
            try Descriptor.writeAll(fd.raw, bytes)
            _ = try valueOrErrno { fsync(fd.raw) }
            _ = try valueOrErrno { rename(temporary, path) }
            let directory = String(path[..<(path.lastIndex(of: "/") ?? path.endIndex)])
            if let dir = FileDescriptor(open(directory.isEmpty ? "/" : directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
                _ = fsync(dir.raw)
            }
        } catch {
            unlink(temporary)
            if error.rawValue == ENOSPC {
                throw SyncFailure(.store(.diskFull), "no space left to save \(path)")
            }
            throw SyncFailure(.store(.io), "\(path) could not be written (\(error))")
        }
    }
}
