import KeychainCore
// The small results of the requests that answer `ok` with a few fields:
// one encoder (the device) and one decoder (every client) each, as
// ItemListing, PolicyListing and ItemDetails are for the larger ones
// (docs/PROTOCOL.md, "Replies"). Fields of another shape came from another
// build: `.io`, never a made-up class, count or digest.

extension ItemInfo {
    /// `info`'s fields: the class name and the size in decimal.
    public var fields: [String] { [protectionClass.name, String(size)] }

    public init(fields: [String]) throws(KeychainError) {
        guard fields.count == 2, let protectionClass = ProtectionClass(name: fields[0]), let size = Int(fields[1]),
            size >= 0
        else { throw .io }
        self.init(protectionClass: protectionClass, size: size)
    }
}

/// The program a `grant`, or an `access` add or claim, pinned: its path
/// as the device resolved it and the SHA-256 of the file it read.
public struct PinnedProgram: Equatable, Sendable {
    public let executable: String
    public let digest: [UInt8]

    public init(executable: String, digest: [UInt8]) {
        self.executable = executable
        self.digest = digest
    }

    public var digestHex: String { Hex.string(digest) }

    public var fields: [String] { [executable, digestHex] }

    public init(fields: [String]) throws(KeychainError) {
        guard fields.count == 2, let digest = Hex.bytes(fields[1], count: 32) else { throw .io }
        self.init(executable: fields[0], digest: digest)
    }
}

/// How many a request took away or wrote: the rules `revoke` removed, the
/// programs an `access` remove took off a list, the items `backup` wrote.
public struct ReplyCount: Equatable, Sendable {
    public let count: Int

    public init(_ count: Int) { self.count = count }

    public var fields: [String] { [String(count)] }

    public init(fields: [String]) throws(KeychainError) {
        guard fields.count == 1, let count = Int(fields[0]), count >= 0 else { throw .io }
        self.init(count)
    }
}

extension RestoreSummary {
    /// `restore`'s fields, once the backup was applied: added, replaced,
    /// unchanged and kept, in decimal (a restore refused for conflicts is
    /// a `duplicateItem` error that lists them).
    public var fields: [String] { [added, replaced, unchanged, kept].map(String.init) }

    public init(fields: [String]) throws(KeychainError) {
        let counts = fields.compactMap { Int($0) }.filter { $0 >= 0 }
        guard fields.count == 4, counts.count == 4 else { throw .io }
        self.init(counted: counts[0], replaced: counts[1], unchanged: counts[2], kept: counts[3])
    }
}

/// `apps`: whether a policed group's items are their programs' own (each
/// item is its maker's; iOS's model) or open to every admitted program.
public enum GroupApps: String, Equatable, Sendable {
    case own, open

    public var fields: [String] { [rawValue] }

    public init(fields: [String]) throws(KeychainError) {
        guard fields.count == 1, let apps = GroupApps(rawValue: fields[0]) else { throw .io }
        self = apps
    }
}

/// `unmount`: whether the mount was the device's last, after which it
/// exits and the client waits for that (a headless device stays).
public enum UnmountOutcome: Equatable, Sendable {
    case othersRemain, last

    public var fields: [String] { self == .last ? ["last"] : [] }

    public init(fields: [String]) throws(KeychainError) {
        switch fields {
        case []: self = .othersRemain
        case ["last"]: self = .last
        default: throw .io
        }
    }
}

/// `autolock`'s answer: the device's setting once the request applied.
public struct AutoLockSetting: Equatable, Sendable {
    /// Seconds without an access before the device locks (0: never).
    public let after: Int
    /// Seconds between `will-lock` and an auto-lock.
    public let grace: Int

    public init(after: Int, grace: Int) {
        self.after = after
        self.grace = grace
    }

    public var fields: [String] { [String(after), String(grace)] }

    public init(fields: [String]) throws(KeychainError) {
        guard fields.count == 2, let after = Int(fields[0]), let grace = Int(fields[1]), after >= 0, grace >= 0 else {
            throw .io
        }
        self.init(after: after, grace: grace)
    }
}

/// `audit-log`'s answer: the file is passed with the reply, or there is
/// none (a keychain whose log has not rotated has no `audit.log.1`).
public enum AuditLogFile: Equatable, Sendable {
    case attached
    case absent

    public var fields: [String] { self == .absent ? ["absent"] : [] }

    public init(fields: [String]) throws(KeychainError) {
        switch fields {
        case []: self = .attached
        case ["absent"]: self = .absent
        default: throw .io
        }
    }
}
