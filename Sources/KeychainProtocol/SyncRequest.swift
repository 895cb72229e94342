import KeychainCore
/// Sync with the person's other devices through a git remote
/// (docs/SYNC.md): what `keychainfs sync` asks of a per-user device. The
/// device answers them with its sync engine (KeychainSync); the keychain's
/// model and store know nothing of sync, only these request shapes do.
public enum SyncRequest: Equatable, Sendable {
    /// Start a circle at `remote` with this keychain's `groups` (empty: all). Answers ``SyncRecoveryKey``.
    case start(remote: String, groups: [String])
    /// Join the circle at `remote` with its recovery key, syncing `groups` (empty: all). Answers ``SyncSummary``.
    case joinWithRecoveryKey(remote: String, recoveryKey: SecureBytes, groups: [String])
    /// Ask to join the circle at `remote`, syncing `groups` (empty: all), or
    /// (nil) go on asking. Answers ``JoinStep``.
    case join(remote: String?, groups: [String])
    /// Stop asking to join. Answers ``Done``.
    case cancelJoin
    /// The code the approving machine shows, typed on the joining one: its
    /// key is taken only once this matches. Answers ``Done``.
    case confirmJoin(code: String)
    /// Sync now. Answers ``SyncSummary``.
    case now
    /// The circle and the last sync. Answers ``SyncStatusLines``.
    case status
    /// The devices asking to join; the one named (a device id), or the
    /// only one when a single one asks, is answered. Answers ``JoinAskers``.
    case joinRequests(device: String?)
    /// The code the asking device shows, once it can. Answers ``JoinCode``.
    case joinCode(device: String)
    /// Grant the circle's key to the asking device whose code is `code`. Answers ``Done``.
    case approve(device: String, code: String)
    /// Remove a device from the circle (a new key, and a new recovery key). Answers ``SyncRecoveryKey``.
    case remove(device: String)
    /// Forget the circle on this device. Answers ``Done``.
    case leave
    /// Sync only `set` from now on (empty: every group); nil: only say which.
    /// Answers ``SyncStatusLines`` (`groups` and the list, or `all`).
    case groups(set: [String]?)
}

extension SyncRequest {
    /// The `kind` byte of each request of this group: unique among all
    /// groups (``DeviceRequest/kindsOfEachGroup``, checked by the protocol's tests),
    /// and never reused, since a byte means one request to every version.
    enum Kind: UInt8, CaseIterable {
        case start = 42, joinWithRecoveryKey = 43, join = 44, cancelJoin = 45, now = 46, status = 47, joinRequests = 48,
            joinCode = 49, approve = 50, remove = 51, leave = 52, groups = 53, confirmJoin = 54
    }

    var frameParts: (Kind, [FrameField]) {
        switch self {
        case .start(let remote, let groups): return (.start, [.text(remote), .text(Self.list(groups))])
        case .joinWithRecoveryKey(let remote, let key, let groups):
            return (.joinWithRecoveryKey, [.text(remote), .optionalSecret(key), .text(Self.list(groups))])
        case .join(let remote, let groups): return (.join, [.optionalText(remote), .text(Self.list(groups))])
        case .cancelJoin: return (.cancelJoin, [])
        case .confirmJoin(let code): return (.confirmJoin, [.text(code)])
        case .now: return (.now, [])
        case .status: return (.status, [])
        case .joinRequests(let device): return (.joinRequests, [.optionalText(device)])
        case .joinCode(let device): return (.joinCode, [.text(device)])
        case .approve(let device, let code): return (.approve, [.text(device), .text(code)])
        case .remove(let device): return (.remove, [.text(device)])
        case .leave: return (.leave, [])
        case .groups(let set): return (.groups, [.optionalText(set.map(Self.list))])
        }
    }

    /// Group names hold no newline (ItemLimits): one text carries the list.
    private static func list(_ groups: [String]) -> String { groups.joined(separator: "\n") }

    private static func groups(_ text: String) throws(KeychainError) -> [String] {
        let groups = text.isEmpty ? [] : text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        // One spelling per request: no empty or repeated name.
        guard !groups.contains(""), Set(groups).count == groups.count else { throw .param }
        return groups
    }

    /// The request of `kind`, read from its fields.
    static func parsing(_ kind: Kind, _ reader: inout ByteReader<UnsafeRawBufferPointer>)
        throws(KeychainError) -> Self
    {
        switch kind {
        case .start: return .start(remote: try reader.text(), groups: try groups(try reader.text()))
        case .joinWithRecoveryKey:
            let remote = try reader.text()
            guard let key = try reader.optionalSecret() else { throw .param }
            return .joinWithRecoveryKey(remote: remote, recoveryKey: key, groups: try groups(try reader.text()))
        case .join: return .join(remote: try reader.optionalText(), groups: try groups(try reader.text()))
        case .cancelJoin: return .cancelJoin
        case .confirmJoin: return .confirmJoin(code: try reader.text())
        case .now: return .now
        case .status: return .status
        case .joinRequests: return .joinRequests(device: try reader.optionalText())
        case .joinCode: return .joinCode(device: try reader.text())
        case .approve: return .approve(device: try reader.text(), code: try reader.text())
        case .remove: return .remove(device: try reader.text())
        case .leave: return .leave
        case .groups:
            return .groups(set: try reader.optionalText().map { (text) throws(KeychainError) in try groups(text) })
        }
    }
}

// MARK: Answers

/// `sync init`: the circle's recovery key, shown to the person once.
public struct SyncRecoveryKey: DeviceResult {
    public let recoveryKey: SecureBytes

    public init(recoveryKey: SecureBytes) { self.recoveryKey = recoveryKey }

    public var reply: DeviceReply { .value(recoveryKey, .always) }

    public init(reply: DeviceReply) throws(KeychainError) {
        guard case .value(let key, .always) = reply else { throw .io }
        recoveryKey = key
    }
}

/// What a round of sync did: items received and sent, items waiting for
/// their class key, and the conflict copies made (`group/name`).
public struct SyncSummary: DeviceResultFields, Equatable {
    public let received: Int
    public let sent: Int
    public let waiting: Int
    public let conflicts: [String]

    public init(received: Int, sent: Int, waiting: Int, conflicts: [String]) {
        self.received = received
        self.sent = sent
        self.waiting = waiting
        self.conflicts = conflicts
    }

    public var fields: [String] { [String(received), String(sent), String(waiting)] + conflicts }

    public init(fields: [String]) throws(KeychainError) {
        guard fields.count >= 3, let received = Int(fields[0]), let sent = Int(fields[1]), let waiting = Int(fields[2])
        else { throw .io }
        self.init(received: received, sent: sent, waiting: waiting, conflicts: Array(fields[3...]))
    }
}

/// How far a join by approval is.
public enum JoinStep: DeviceResultFields, Equatable {
    /// Waiting for a device of the circle to answer.
    case asked
    /// Both devices show this code now: waiting for the person's approval there.
    case code(String)
    /// In the circle, after a first round.
    case joined(SyncSummary)

    public var fields: [String] {
        switch self {
        case .asked: return ["asked"]
        case .code(let code): return ["code", code]
        case .joined(let summary): return ["joined"] + summary.fields
        }
    }

    public init(fields: [String]) throws(KeychainError) {
        switch fields.first {
        case "asked" where fields.count == 1: self = .asked
        case "code" where fields.count == 2: self = .code(fields[1])
        case "joined": self = .joined(try SyncSummary(fields: Array(fields.dropFirst())))
        default: throw .io
        }
    }
}

/// `name value` lines: `sync status`, and the device `sync remove` removed.
public struct SyncStatusLines: DeviceResultFields, Equatable {
    public let lines: [SyncStatusLine]

    public init(_ lines: [SyncStatusLine]) { self.lines = lines }

    public var fields: [String] { lines.flatMap { [$0.name, $0.value] } }

    public init(fields: [String]) throws(KeychainError) {
        guard fields.count % 2 == 0 else { throw .io }
        lines = stride(from: 0, to: fields.count, by: 2).map { SyncStatusLine(fields[$0], fields[$0 + 1]) }
    }
}

public struct SyncStatusLine: Equatable, Sendable {
    public let name: String
    public let value: String

    public init(_ name: String, _ value: String) {
        self.name = name
        self.value = value
    }
}

/// The devices asking to join: id (as `sync status` shows ids) and name.
public struct JoinAskers: DeviceResultFields, Equatable {
    public let devices: [SyncStatusLine]

    public init(_ devices: [SyncStatusLine]) { self.devices = devices }

    public var fields: [String] { SyncStatusLines(devices).fields }

    public init(fields: [String]) throws(KeychainError) { devices = try SyncStatusLines(fields: fields).lines }
}

/// The code an asking device shows; none until it can.
public struct JoinCode: DeviceResultFields, Equatable {
    public let code: String?

    public init(_ code: String?) { self.code = code }

    public var fields: [String] { code.map { [$0] } ?? [] }

    public init(fields: [String]) throws(KeychainError) {
        guard fields.count <= 1 else { throw .io }
        code = fields.first
    }
}
