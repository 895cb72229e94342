import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

// What each request answers, as a type (docs/PROTOCOL.md, "Replies"): the
// device makes one of these, the socket carries it as a reply, and the client
// gets it back decoded once, where the reply arrives. A caller in the device's
// own process (the Secret Service provider) gets the value itself, never its
// fields. `DeviceReply` and its `[String]` are the framing only.

/// A request's answer, carried by one reply.
public protocol DeviceResult: Sendable {
    /// The reply that carries it (its one encoder).
    var reply: DeviceReply { get }
    /// It, from the `ok` or `value` reply that carries it (its one
    /// decoder); `.io` for a reply of another shape: another build answered.
    init(reply: DeviceReply) throws(KeychainError)
}

/// A result carried as an `ok` reply's fields.
public protocol DeviceResultFields: DeviceResult {
    var fields: [String] { get }
    init(fields: [String]) throws(KeychainError)
}

extension DeviceResultFields {
    public var reply: DeviceReply { .ok(fields) }

    public init(reply: DeviceReply) throws(KeychainError) {
        guard case .ok(let fields) = reply else { throw .io }
        try self.init(fields: fields)
    }
}

/// Why a request was not carried out, as the device said it.
public enum DeviceRefusal: Error, Equatable, Sendable {
    /// A core error, as the core threw it ("locked" stays "locked"), with a sentence for the user.
    case keychain(KeychainError, String)
    /// A system error (an errno), with a sentence for the user.
    case system(Int32, String)
    /// An answer the request never gets: another keychainfs build answered.
    case unexpected

    /// The reply that says it (``unexpected`` is never sent: a device
    /// that cannot encode its answer says so as an `EIO`).
    public var reply: DeviceReply {
        switch self {
        case .keychain(let error, let sentence): return .keychainError(error, sentence)
        case .system(let code, let sentence): return .systemError(code, sentence)
        case .unexpected: return .systemError(EIO, Self.unexpectedSentence)
        }
    }

    /// The core error it stands for: a system error's `ENOENT` is an absent
    /// item, anything else a failed store.
    public var keychainError: KeychainError {
        switch self {
        case .keychain(let error, _): return error
        case .system(let code, _): return code == ENOENT ? .itemNotFound : .io
        case .unexpected: return .io
        }
    }

    /// Its sentence for the user.
    public var sentence: String {
        switch self {
        case .keychain(_, let sentence), .system(_, let sentence): return sentence
        case .unexpected: return Self.unexpectedSentence
        }
    }

    public static let unexpectedSentence = "unexpected reply from the device (a device of another keychainfs build?)"
}

/// A request's answer or why there is none.
public typealias DeviceOutcome<Result: DeviceResult> = Swift.Result<Result, DeviceRefusal>

extension DeviceReply {
    /// What the reply says of a request that answers `Result`: the answer
    /// (decoded here, once) or the refusal.
    public func outcome<Result: DeviceResult>(_: Result.Type = Result.self) -> DeviceOutcome<Result> {
        switch self {
        case .keychainError(let error, let sentence): return .failure(.keychain(error, sentence))
        case .systemError(let code, let sentence): return .failure(.system(code, sentence))
        case .ok, .value:
            guard let result = try? Result(reply: self) else { return .failure(.unexpected) }
            return .success(result)
        }
    }
}

extension Swift.Result where Success: DeviceResult, Failure == DeviceRefusal {
    /// The refusal; nil for an answer.
    public var refusal: DeviceRefusal? {
        guard case .failure(let refusal) = self else { return nil }
        return refusal
    }
}

/// What a handler of many requests answers: the result of whichever it was.
public typealias DeviceAnswer = Swift.Result<any DeviceResult, DeviceRefusal>

extension Swift.Result<any DeviceResult, DeviceRefusal> {
    /// The answer as a reply for the socket.
    public var reply: DeviceReply {
        switch self {
        case .success(let result): return result.reply
        case .failure(let refusal): return refusal.reply
        }
    }

    /// The answer as `call`'s outcome, for a caller in the same process:
    /// the value itself, never its fields. A result of another type than
    /// the call's is ``DeviceRefusal/unexpected``, as from another build.
    public func outcome<Result>(of call: DeviceCall<Result>) -> DeviceOutcome<Result> {
        flatMap { answer in (answer as? Result).map { .success($0) } ?? .failure(.unexpected) }
    }
}

// MARK: The results

/// The answer of a request that returns nothing but its success.
public struct Done: DeviceResultFields, Equatable {
    public init() {}
    public var fields: [String] { [] }
    public init(fields: [String]) throws(KeychainError) {
        guard fields.isEmpty else { throw .io }
    }
}

/// `get`'s answer: an item's value, in secret memory, and its class.
public struct ItemValue: DeviceResult {
    public let value: SecureBytes
    public let protectionClass: ProtectionClass

    public init(value: SecureBytes, protectionClass: ProtectionClass) {
        self.value = value
        self.protectionClass = protectionClass
    }

    public var reply: DeviceReply { .value(value, protectionClass) }

    public init(reply: DeviceReply) throws(KeychainError) {
        guard case .value(let value, let protectionClass) = reply else { throw .io }
        self.init(value: value, protectionClass: protectionClass)
    }
}

extension ItemInfo: DeviceResultFields {}
extension PinnedProgram: DeviceResultFields {}
extension ReplyCount: DeviceResultFields {}
extension RestoreSummary: DeviceResultFields {}
extension GroupApps: DeviceResultFields {}
extension UnmountOutcome: DeviceResultFields {}
extension AutoLockSetting: DeviceResultFields {}
extension AuditLogFile: DeviceResultFields {}

/// `list` of the keychain: its groups.
public struct GroupList: DeviceResultFields, Equatable {
    public let groups: [String]
    public init(_ groups: [String]) { self.groups = groups }
    public var fields: [String] { groups }
    public init(fields: [String]) { groups = fields }
}

/// `list` of a group: its items (identifier, class, size).
public struct ItemList: DeviceResultFields, Equatable {
    public let items: [ItemListing]
    public init(_ items: [ItemListing]) { self.items = items }
    public var fields: [String] { ItemListing.fields(items) }
    public init(fields: [String]) throws(KeychainError) { items = try ItemListing.items(fromFields: fields) }
}

/// `details`: items and their details.
public struct DetailsList: DeviceResultFields {
    public let entries: [(identifier: String, details: ItemDetails)]
    public init(_ entries: [(identifier: String, details: ItemDetails)]) { self.entries = entries }
    public var fields: [String] { ItemDetails.listingFields(entries) }
    public init(fields: [String]) throws(KeychainError) { entries = try ItemDetails.listed(fromFields: fields) }
}

/// `policy`: the rules, a row each.
public struct PolicyList: DeviceResultFields, Equatable {
    public let rows: [PolicyListing]
    public init(_ rows: [PolicyListing]) { self.rows = rows }
    public var fields: [String] { PolicyListing.fields(rows) }
    public init(fields: [String]) throws(KeychainError) { rows = try PolicyListing.rows(fromFields: fields) }
}

extension DeviceStatus: DeviceResultFields {
    public init(fields: [String]) throws(KeychainError) {
        guard let status = DeviceStatus(parsing: fields) else { throw .io }
        self = status
    }
}

extension AuditLog.VerifyReport: DeviceResultFields {
    public init(fields: [String]) throws(KeychainError) {
        guard let report = AuditLog.VerifyReport(parsing: fields) else { throw .io }
        self = report
    }
}

/// `create` (the service): the keychain exists now; when the TPM sealed
/// its keys, the recovery key, which goes to the user once, as a secret.
public struct CreatedKeychain: DeviceResult {
    public let recoveryKey: SecureBytes?

    public init(recoveryKey: SecureBytes?) { self.recoveryKey = recoveryKey }

    public var reply: DeviceReply { recoveryKey.map { .value($0, .always) } ?? .ok([]) }

    public init(reply: DeviceReply) throws(KeychainError) {
        switch reply {
        case .ok([]): recoveryKey = nil
        case .value(let key, .always): recoveryKey = key
        case .ok, .value, .keychainError, .systemError: throw .io
        }
    }
}
