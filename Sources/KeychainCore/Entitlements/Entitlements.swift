internal import CSodium
#if canImport(Glibc)
import Glibc
#endif

/// What the kernel tells about a program making a request: its executable
/// (the resolved `/proc/PID/exe` and the SHA-256 of that very file), its
/// systemd unit and its uid. The entitlement check compares it with the
/// rules of a group, as iOS compares an app's signed `keychain-access-groups`.
public struct ProgramIdentity: Sendable, Equatable {
    /// The executable's path as the kernel resolved it, or the sandboxed app it is.
    public var program: ProgramName
    /// SHA-256 of the executable file the process runs.
    public var digest: [UInt8]
    /// The systemd unit of the process's cgroup (`foo.service`, `app-x.scope`), if any.
    public var unit: String?
    public var uid: UInt32
    /// Why the process cannot be taken for that program whatever its
    /// executable (another user namespace, a tracer, foreign code in it);
    /// nil when nothing says so. No rule admits it then.
    public var distrust: String?
    /// It runs code from anonymous executable memory (a JIT, or code
    /// written there): only a rule granted with `--allow-jit` admits it.
    public var runsAnonymousCode: Bool
    /// For an interpreter, the script it runs (docs/SECRET-SERVICE.md, "Whose an
    /// item is"); nil for any other program.
    public var script: ScriptIdentity?

    public init(
        program: ProgramName, digest: [UInt8], unit: String?, uid: UInt32, distrust: String? = nil,
        runsAnonymousCode: Bool = false
    ) {
        self.program = program
        self.digest = digest
        self.unit = unit
        self.uid = uid
        self.distrust = distrust
        self.runsAnonymousCode = runsAnonymousCode
    }

    /// An interpreter running code that no file names (`python3 -c`,
    /// standard input, a module by name, a script others may write, an
    /// environment that loads code): no owner matches it
    /// (docs/SECRET-SERVICE.md, "Whose an item is").
    public var runsUnidentifiableScript: Bool {
        if case .unidentifiable? = script { return true }
        return false
    }

    /// Why a rule that names this executable may still refuse it, for the audit log.
    public var doubt: String? {
        distrust ?? (runsAnonymousCode ? "it runs code from anonymous memory (a rule needs --allow-jit)" : nil)
    }
}

/// One program allowed to use an access group: the executable at `executable`
/// whose content hashed to `digest` when the rule was granted (a binary
/// replaced at that path no longer matches), optionally only in `unit` and
/// as `uid`.
public struct EntitlementRule: Sendable, Equatable {
    public var executable: String
    public var digest: [UInt8]
    public var unit: String?
    public var uid: UInt32?
    /// The program may run code from anonymous executable memory (a JIT:
    /// a JavaScript engine, a JVM). Otherwise such a process is refused,
    /// since code written into memory is no executable's.
    public var allowsJIT: Bool

    public init(executable: String, digest: [UInt8], unit: String? = nil, uid: UInt32? = nil, allowsJIT: Bool = false) {
        self.executable = executable
        self.digest = digest
        self.unit = unit
        self.uid = uid
        self.allowsJIT = allowsJIT
    }

    /// Whether `program` is the program this rule names. Paths and units
    /// compare as bytes, as the kernel names files: String's `==` takes
    /// `/opt/café` spelled with `e` + U+0301 for the one with U+00E9, and a
    /// copy of the binary there would pass for the granted one.
    public func admits(_ program: ProgramIdentity) -> Bool {
        program.distrust == nil && (!program.runsAnonymousCode || allowsJIT)
            && Self.sameBytes(program.program.path, executable) && Crypto.constantTimeEqual(program.digest, digest)
            && (unit == nil || Self.sameBytes(program.unit, unit)) && (uid == nil || program.uid == uid)
    }

    /// Whether the rule names this executable (and this unit and uid, when given): what `revoke` removes.
    func matches(executable: String?, unit: String?, uid: UInt32?) -> Bool {
        (executable == nil || Self.sameBytes(self.executable, executable))
            && (unit == nil || Self.sameBytes(self.unit, unit)) && (uid == nil || self.uid == uid)
    }

    /// Whether `other` names the same program, unit and uid (a new grant of it replaces this rule).
    func namesSameProgram(as other: EntitlementRule) -> Bool {
        Self.sameBytes(executable, other.executable) && Self.sameBytes(unit, other.unit) && uid == other.uid
    }

    /// Whether two paths (or units) are the same bytes: String's `==`
    /// takes canonically equivalent spellings for one another.
    static func sameBytes(_ a: String?, _ b: String?) -> Bool {
        switch (a, b) {
        case (nil, nil): return true
        case let (a?, b?): return a.utf8.elementsEqual(b.utf8)
        default: return false
        }
    }

    /// The digest in lowercase hexadecimal, as `sha256sum` prints it.
    public var digestHex: String { Hex.string(digest) }
}

/// The entitlement policies of a keychain: for each access group that has
/// one, the programs allowed to use it (an empty list allows none). A group
/// without a policy is open to every program of the user, as before.
///
/// Record (meta key `entitlements`), little-endian:
/// `version u8 | groups u32 |` per group `name | rules u32 |` per rule
/// `executable | digest[32] | unit? | uid? | flags u8` `| mac[32]`, strings as
/// `length u16 | UTF-8`, optional fields as a presence byte (0 or 1) then the value;
/// flags bit 0: the rule allows JIT code. The flags byte is there only in
/// version 2, written only when some rule allows JIT (one encoding per
/// policy, and a keychain that uses no JIT rule still boots in builds that
/// know only version 1); the MAC (keyed BLAKE2b under the device metadata
/// key) over all before it. Version 3 (docs/SECRET-SERVICE.md, "Whose an item is"),
/// written only when some group's items are open to every program over the bus, has
/// the flags byte in every rule and ends with `open u32 | name*` (sorted), those
/// groups.
struct EntitlementPolicy: Equatable, Sendable {
    static let recordKey = "entitlements"
    private static let versionWithFlags: UInt8 = 2
    private static let versionWithOpenGroups: UInt8 = 3
    /// Bound to the rollback counter (``DeviceSecret/boundRecord(_:_:)``).
    static let macDomain = "kcfs-entitlements-v1"

    var groups: [String: [EntitlementRule]] = [:]
    /// The groups whose items belong to no program over the bus
    /// (`keychainfs policy GROUP --apps open`: gnome-keyring's behaviour).
    var appsOpen: Set<String> = []

    init() {}

    func encoded(secret: DeviceSecret) -> [UInt8] {
        var writer = ByteWriter()
        let version =
            !appsOpen.isEmpty
            ? Self.versionWithOpenGroups
            : groups.values.contains { $0.contains(where: \.allowsJIT) } ? Self.versionWithFlags : 1
        let flags = version != 1
        writer.append(version)
        writer.append(UInt32(groups.count))
        for group in groups.keys.sorted() {
            writer.appendPrefixed(group)
            let rules = groups[group] ?? []
            writer.append(UInt32(rules.count))
            for rule in rules {
                writer.appendPrefixed(rule.executable)
                writer.append(rule.digest)
                writer.append(rule.unit == nil ? UInt8(0) : 1)
                if let unit = rule.unit { writer.appendPrefixed(unit) }
                writer.append(rule.uid == nil ? UInt8(0) : 1)
                if let uid = rule.uid { writer.append(uid) }
                if flags { writer.append(rule.allowsJIT ? UInt8(1) : 0) }
            }
        }
        if version == Self.versionWithOpenGroups {
            writer.append(UInt32(appsOpen.count))
            for group in appsOpen.sorted() { writer.appendPrefixed(group) }
        }
        return secret.boundRecord(Self.macDomain, writer.bytes)
    }

    init(decoding record: [UInt8], secret: DeviceSecret) throws(KeychainError) {
        var reader = ByteReader(try secret.boundBody(Self.macDomain, record))
        let version = try reader.readByte()
        guard (1...Self.versionWithOpenGroups).contains(version) else { throw .decode }
        var previous: String?
        for _ in 0..<(try reader.readUInt32()) {
            let group = try reader.readPrefixed()
            // One canonical encoding: valid names, each once, in order. Legacy
            // names: a record from before names had to be NFC still boots.
            guard (try? ItemLimits.validate(name: group, legacy: true)) != nil, previous.map({ $0 < group }) ?? true
            else { throw .decode }
            previous = group
            var rules: [EntitlementRule] = []
            for _ in 0..<(try reader.readUInt32()) {
                let executable = try reader.readPrefixed()
                let digest = try reader.read(ExecutableDigest.size)
                let unit = try Self.isPresent(try reader.readByte()) ? try reader.readPrefixed() : nil
                let uid = try Self.isPresent(try reader.readByte()) ? try reader.readUInt32() : nil
                // Only bit 0 is defined: one encoding per rule.
                let allowsJIT = version == 1 ? false : try Self.isPresent(try reader.readByte())
                guard executable.hasPrefix("/"), unit?.isEmpty != true else { throw .decode }
                rules.append(
                    EntitlementRule(executable: executable, digest: digest, unit: unit, uid: uid, allowsJIT: allowsJIT))
            }
            groups[group] = rules
        }
        if version == Self.versionWithOpenGroups {
            var previous: String?
            for _ in 0..<(try reader.readUInt32()) {
                let group = try reader.readPrefixed()
                guard (try? ItemLimits.validate(name: group)) != nil, previous.map({ $0 < group }) ?? true else {
                    throw .decode
                }
                appsOpen.insert(group)
                previous = group
            }
            // Version 3 only for a policy that opens some group.
            guard !appsOpen.isEmpty else { throw .decode }
        } else {
            // Version 2 only for a policy that needs its flags.
            let flags = groups.values.contains { $0.contains(where: \.allowsJIT) }
            guard (version == Self.versionWithFlags) == flags else { throw .decode }
        }
        guard reader.isAtEnd else { throw .decode }
    }

    private static func isPresent(_ flag: UInt8) throws(KeychainError) -> Bool {
        guard flag <= 1 else { throw .decode }
        return flag == 1
    }
}

/// SHA-256 of an executable file, as `sha256sum` computes it.
public enum ExecutableDigest {
    public static let size = Int(crypto_hash_sha256_BYTES)

    /// The digest of what `fd` reads from its start (pread: the offset is left alone).
    public static func of(_ fd: BorrowedDescriptor) -> [UInt8]? {
        var state = crypto_hash_sha256_state()
        crypto_hash_sha256_init(&state)
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        var offset: off_t = 0
        while true {
            guard let count = buffer.withUnsafeMutableBytes({ try? fd.read(into: $0, at: offset) }) else {
                return nil
            }
            if count == 0 { break }
            buffer.withUnsafeBytes {
                _ = crypto_hash_sha256_update(&state, $0.bindMemory(to: UInt8.self).baseAddress, UInt64(count))
            }
            offset += off_t(count)
        }
        var digest = [UInt8](repeating: 0, count: size)
        crypto_hash_sha256_final(&state, &digest)
        return digest
    }

    /// The digest of `bytes`: what a sandboxed app's name stands on, in
    /// place of an executable's (``SandboxApp``).
    public static func of(bytes: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: size)
        _ = crypto_hash_sha256(&digest, bytes, UInt64(bytes.count))
        return digest
    }
}
