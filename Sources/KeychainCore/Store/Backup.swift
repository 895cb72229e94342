#if canImport(Glibc)
import Glibc
#endif

/// An item as it travels in a backup.
public struct BackupItem: Sendable {
    /// Its access group.
    public var group: String
    /// Its identifier.
    public var identifier: String
    /// Its class (always a migratable one).
    public var protectionClass: ProtectionClass
    /// Its value.
    public var value: SecureBytes
    /// Its details (``ItemDetails``), if it has any.
    public var details: ItemDetails? = nil
}

/// The bytes of a backup: in memory, or in a file read a record at a time
/// (``BackupFileCopy``), so that restoring costs memory for one record, not
/// for the whole file.
public protocol BackupBytes {
    /// The length in bytes.
    var count: Int { get }
    /// The bytes of `range`, which lies within `0..<count`.
    func bytes(_ range: Range<Int>) throws(KeychainError) -> [UInt8]
}

extension Array: BackupBytes where Element == UInt8 {
    public func bytes(_ range: Range<Int>) throws(KeychainError) -> [UInt8] { Array(self[range]) }
}

/// The encrypted backup file (docs/FORMAT.md, "Backups"), as iOS encrypted
/// backups: protected by a backup password of its own, holding only the
/// migratable items, readable on any device.
///
/// `header | record* | end record`, header =
/// `magic "KCFSBAK1" | version u8 = 2 | opsLimit u64 | memLimit u64 | salt[16] | check[32]`;
/// record = `kind u8 | nonce[24] | length u32 | sealed` (kind 1: an item's
/// group, identifier and class, and from version 2 its details; 2: its
/// value; 3: the end, holding the count). Version 1 files restore as ever.
/// Each record is XChaCha20-Poly1305 under a key derived from
/// Argon2id(password), with the header, the kind and the item's index as
/// associated data, so records cannot be reordered, dropped, duplicated or
/// spliced from another backup, and a cut file has no end record.
public enum BackupFile {
    static let magic = Array("KCFSBAK1".utf8)
    static let version: UInt8 = 2
    private static let headerSize = 8 + 1 + 8 + 8 + Crypto.saltSize + Crypto.macSize

    private enum Kind: UInt8 { case item = 1, value = 2, end = 3 }

    /// The most a file's header may ask of Argon2id: what `backup` writes
    /// (MODERATE, 3 passes over 256 MiB, about 0.65 s). The header is read
    /// before the password is checked, so a larger cost is the file's
    /// author's choice of the restorer's memory and time (a 73-byte file
    /// once asked the service for 16 passes over 4 GiB): refused as a file
    /// `backup` never writes (docs/FORMAT.md, "Backups").
    public static let costCeiling = KDFParameters.moderate

    /// The keys of one backup password and salt: derived on a ``SecretThread``.
    private struct Keys {
        let sealing: GuardedKey
        let check: [UInt8]

        init(password: SecureBytes, salt: [UInt8], kdf: KDFParameters) throws(KeychainError) {
            let (sealing, check) = try SecretThread.run { () throws(KeychainError) -> (GuardedKey, [UInt8]) in
                let stretched = try Crypto.stretch(passcode: password, salt: salt, parameters: kdf)
                return stretched.withUnsafeBytes { master in
                    let key = master.baseAddress!.assumingMemoryBound(to: UInt8.self)
                    let sealing = Array("kcfs-backup-seal".utf8).withUnsafeBytes { Crypto.deriveKey(key: key, [$0]) }
                    let check = Array("kcfs-backup-check".utf8).withUnsafeBytes { Crypto.mac(key: key, [$0]) }
                    return (GuardedKey(copying: sealing), check)
                }
            }
            self.sealing = sealing
            self.check = check
        }
    }

    /// Writes `items` (migratable ones only: a caller's mistake otherwise)
    /// as a backup under `password`.
    public static func encode(
        _ items: [BackupItem], password: SecureBytes,
        kdf: KDFParameters = .moderate
    ) throws(KeychainError) -> [UInt8] {
        try encode(password: password, kdf: kdf) { (write) throws(KeychainError) in
            for item in items { try write(item) }
        }.bytes
    }

    /// Writes the items `produce` hands its writer, one at a time, as a
    /// backup under `password`: each is sealed as it comes, so that a
    /// backup holds one value in secret memory at a time, not the whole
    /// keychain (an outsider's backups of their own large items once took
    /// the service's locked memory from every other user). The bytes, and
    /// how many items they hold.
    public static func encode(
        password: SecureBytes, kdf: KDFParameters = .moderate,
        _ produce: (_ write: (BackupItem) throws(KeychainError) -> Void) throws(KeychainError) -> Void
    ) throws(KeychainError) -> (bytes: [UInt8], count: Int) {
        Sodium.ensureInitialized()
        let salt = Crypto.randomBytes(Crypto.saltSize)
        let keys = try Keys(password: password, salt: salt, kdf: kdf)
        var writer = ByteWriter()
        writer.append(magic)
        writer.append(version)
        writer.append(kdf.opsLimit)
        writer.append(kdf.memLimit)
        writer.append(salt)
        writer.append(keys.check)
        let header = writer.bytes
        var index = 0
        try produce { (item) throws(KeychainError) in
            precondition(item.protectionClass.isMigratable, "ThisDeviceOnly items never leave the device")
            var meta = ByteWriter()
            meta.append(UInt8(item.protectionClass.rawValue))
            meta.appendPrefixed(item.group)
            meta.appendPrefixed(item.identifier)
            // Version 2: hasDetails u8 [| ItemDetails' encoding].
            meta.append(UInt8(item.details == nil ? 0 : 1))
            if let details = item.details { meta.append(details.encoded()) }
            let metaBytes = try SecureBytes(meta.bytes)
            seal(metaBytes, kind: .item, index: index, header: header, keys: keys, into: &writer)
            seal(item.value, kind: .value, index: index, header: header, keys: keys, into: &writer)
            index += 1
        }
        var end = ByteWriter()
        end.append(UInt64(index))
        seal(try SecureBytes(end.bytes), kind: .end, index: index, header: header, keys: keys, into: &writer)
        return (writer.bytes, index)
    }

    private static func seal(
        _ plaintext: SecureBytes, kind: Kind, index: Int, header: [UInt8], keys: Keys,
        into writer: inout ByteWriter
    ) {
        let nonce = Crypto.randomBytes(Crypto.nonceSize)
        let sealed = keys.sealing.withKey { key in
            plaintext.withUnsafeBytes {
                Crypto.seal($0, key: key, nonce: nonce, associatedData: associatedData(header, kind, index))
            }
        }
        writer.append(kind.rawValue)
        writer.append(nonce)
        writer.append(UInt32(sealed.count))
        writer.append(sealed)
    }

    private static func associatedData(_ header: [UInt8], _ kind: Kind, _ index: Int) -> [UInt8] {
        var writer = ByteWriter()
        writer.append(header)
        writer.append(kind.rawValue)
        writer.append(UInt64(index))
        return writer.bytes
    }

    /// Decrypts a whole backup and hands each item to `body`, in order.
    /// ``KeychainError/param`` for a file that is not a backup (or of an
    /// unknown version), ``KeychainError/authFailed`` for a wrong password,
    /// ``KeychainError/decode`` for a damaged, cut or altered one. Nothing is
    /// handed out before the whole file was checked.
    public static func decode(
        _ bytes: some BackupBytes, password: SecureBytes,
        _ body: (BackupItem) throws(KeychainError) -> Void
    ) throws(KeychainError) {
        Sodium.ensureInitialized()
        guard bytes.count >= headerSize else { throw .param }
        let header = try bytes.bytes(0..<headerSize)
        guard Array(header.prefix(8)) == magic else { throw .param }
        var reader = ByteReader(header)
        _ = try reader.read(8)
        let fileVersion = try reader.readByte()
        guard (1...version).contains(fileVersion) else { throw .param }
        let kdf = KDFParameters(opsLimit: try reader.readUInt64(), memLimit: try reader.readUInt64())
        guard kdf.isWithin(costCeiling) else { throw .decode }
        let salt = try reader.read(Crypto.saltSize)
        let check = try reader.read(Crypto.macSize)
        let keys = try Keys(password: password, salt: salt, kdf: kdf)
        guard Crypto.constantTimeEqual(keys.check, check) else { throw .authFailed }
        // Two passes: every record authenticated first, then handed out.
        for pass in 0..<2 {
            var offset = headerSize, index = 0
            while true {
                let (kind, record) = try open(bytes, at: &offset, header: header, keys: keys, index: index)
                if kind == .end {
                    var end = ByteReader(record.bytes())
                    guard try end.readUInt64() == UInt64(index), end.isAtEnd, offset == bytes.count else {
                        throw .decode
                    }
                    break
                }
                guard kind == .item else { throw .decode }
                var meta = ByteReader(record.bytes())
                guard let protectionClass = ProtectionClass(rawValue: Int64(try meta.readByte())),
                    protectionClass.isMigratable
                else { throw .decode }
                let group = try meta.readPrefixed(), identifier = try meta.readPrefixed()
                var details: ItemDetails?
                if fileVersion >= 2, try meta.readByte() == 1 {
                    details = try ItemDetails(decoding: Array(try meta.take(meta.remaining)))
                }
                guard meta.isAtEnd else { throw .decode }
                let (valueKind, value) = try open(bytes, at: &offset, header: header, keys: keys, index: index)
                guard valueKind == .value else { throw .decode }
                if pass == 1 {
                    try body(
                        BackupItem(
                            group: group, identifier: identifier, protectionClass: protectionClass, value: value,
                            details: details))
                }
                index += 1
            }
        }
    }

    private static func open(
        _ bytes: some BackupBytes, at offset: inout Int, header: [UInt8], keys: Keys,
        index: Int
    ) throws(KeychainError) -> (Kind, SecureBytes) {
        let fixed = 1 + Crypto.nonceSize + 4
        guard bytes.count - offset >= fixed else { throw .decode }
        let prefix = try bytes.bytes(offset..<(offset + fixed))
        guard let kind = Kind(rawValue: prefix[0]) else { throw .decode }
        let nonce = Array(prefix[1..<(1 + Crypto.nonceSize)])
        var lengthReader = ByteReader(Array(prefix[(1 + Crypto.nonceSize)...]))
        let length = Int(try lengthReader.readUInt32())
        guard length <= ItemLimits.maximumValueSize + Crypto.tagSize, bytes.count - offset - fixed >= length else {
            throw .decode
        }
        let sealed = try bytes.bytes((offset + fixed)..<(offset + fixed + length))
        offset += fixed + length
        let plaintext = try keys.sealing.withKey { (key) throws(KeychainError) in
            try Crypto.open(sealed, key: key, nonce: nonce, associatedData: associatedData(header, kind, index))
        }
        return (kind, plaintext)
    }
}

/// How long guessing a backup password takes whoever holds the file: a
/// backup leaves the device, so nothing but Argon2id (``BackupFile/costCeiling``,
/// about 0.65 s a guess on one core of this machine) stands between a copy
/// and its items. The estimate is the count of passwords of the same length
/// over the same kinds of characters (digits, lower case, upper case,
/// anything else) times that cost: an upper bound for a random password, a
/// generous one for a word.
public enum BackupPasswordStrength {
    /// Seconds a guess costs on one core at ``BackupFile/costCeiling``.
    public static let secondsPerGuess = 0.65
    /// What `backup` accepts without `--weak-password`: every password of
    /// its kind takes a thousand years of one core (a hundred cores: ten years).
    public static let minimumCoreYears = 1000.0

    /// Core-years to try every password like `password`.
    public static func coreYears(_ password: SecureBytes) -> Double {
        password.withUnsafeBytes { bytes in
            var digits = false, lower = false, upper = false, other = false
            for byte in bytes {
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digits = true
                case UInt8(ascii: "a")...UInt8(ascii: "z"): lower = true
                case UInt8(ascii: "A")...UInt8(ascii: "Z"): upper = true
                default: other = true
                }
            }
            let alphabet = Double((digits ? 10 : 0) + (lower ? 26 : 0) + (upper ? 26 : 0) + (other ? 33 : 0))
            let guesses = pow(max(alphabet, 1), Double(bytes.count))
            return guesses * secondsPerGuess / (365.25 * 24 * 3600)
        }
    }

    /// The estimate in words: "3 hours", "12 days", "4,000 years".
    public static func said(_ coreYears: Double) -> String {
        let seconds = coreYears * 365.25 * 24 * 3600
        switch seconds {
        case ..<120: return "\(Int(seconds.rounded())) seconds"
        case ..<7200: return "\(Int((seconds / 60).rounded())) minutes"
        case ..<172_800: return "\(Int((seconds / 3600).rounded())) hours"
        case ..<(2 * 365.25 * 86400): return "\(Int((seconds / 86400).rounded())) days"
        case ..<(1e12 * 365.25 * 86400): return "\(Int(coreYears.rounded())) years"
        default: return "more than a trillion years"
        }
    }
}
