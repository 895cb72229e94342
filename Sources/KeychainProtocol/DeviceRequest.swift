import KeychainCore
/// A request to the device, in groups (docs/CONTRIBUTING.md, "Where a new piece
/// goes"): each group has one handler at the device, and what only some
/// requests have (a group of items, a consent verb) is said by that group
/// alone. Clients name a request through ``DeviceCall``, which pairs it with
/// its answer's type.
public enum DeviceRequest: Equatable, Sendable {
    /// An item or a group of items: the library's operations, under the
    /// caller policy (a group's entitlement, the owner rule) and audited.
    case item(ItemRequest)
    /// The device's lock and its settings: lock, unlock, status, sync, the
    /// passcode, auto-lock, the cache, the class of new writes. `.control`'s
    /// lines are these requests too (``PasswordManager/answer(_:by:status:)``).
    case device(DeviceStateRequest)
    /// Who may use a group or an item: entitlement rules and access lists
    /// (changes need the passcode).
    case policy(PolicyRequest)
    /// The device's mounts.
    case mount(MountRequest)
    /// Files passed with the request or its reply: backups and the audit log.
    case file(FileRequest)
    /// The device process itself: whether it answers, its end, its events,
    /// the bus it serves, a user's keychain in the service.
    case process(ProcessRequest)
    /// The TPM, through the service, for a user who cannot reach it.
    case tpm(TPMRequest)
    /// Sync with the person's other devices (a per-user device only).
    case sync(SyncRequest)

    /// Every group's kind bytes, in the order ``init(body:)`` tries them.
    /// A group names its own (its `Kind`); no byte may be two groups'
    /// (the protocol's tests check this list).
    static var kindsOfEachGroup: [[UInt8]] {
        [
            ItemRequest.Kind.allCases.map(\.rawValue), DeviceStateRequest.Kind.allCases.map(\.rawValue),
            PolicyRequest.Kind.allCases.map(\.rawValue), MountRequest.Kind.allCases.map(\.rawValue),
            FileRequest.Kind.allCases.map(\.rawValue), ProcessRequest.Kind.allCases.map(\.rawValue),
            TPMRequest.Kind.allCases.map(\.rawValue), SyncRequest.Kind.allCases.map(\.rawValue)
        ]
    }

    /// The request as a frame, in secret memory: its group's kind and fields.
    public func frame() throws(KeychainError) -> SecureBytes {
        let (kind, fields): (UInt8, [FrameField])
        switch self {
        case .item(let request): (kind, fields) = try Self.parts(request.frameParts())
        case .device(let request): (kind, fields) = Self.parts(request.frameParts)
        case .policy(let request): (kind, fields) = Self.parts(request.frameParts)
        case .mount(let request): (kind, fields) = Self.parts(request.frameParts)
        case .file(let request): (kind, fields) = Self.parts(request.frameParts)
        case .process(let request): (kind, fields) = Self.parts(request.frameParts)
        case .tpm(let request): (kind, fields) = Self.parts(request.frameParts)
        case .sync(let request): (kind, fields) = Self.parts(request.frameParts)
        }
        return try FrameField.frame(kind: kind, code: 0, fields)
    }

    private static func parts<Kind: RawRepresentable<UInt8>>(_ parts: (Kind, [FrameField])) -> (UInt8, [FrameField]) {
        (parts.0.rawValue, parts.1)
    }

    /// Parses a request body (``DeviceProtocol/version`` only): the group
    /// whose `Kind` the kind byte is reads the fields.
    public init(body: UnsafeRawBufferPointer) throws(KeychainError) {
        var reader = ByteReader(frame: body)
        guard try reader.readByte() == DeviceProtocol.version else { throw .param }
        let kind = try reader.readByte()
        guard try reader.readInt32() == 0 else { throw .param }
        if let kind = ItemRequest.Kind(rawValue: kind) {
            self = .item(try ItemRequest.parsing(kind, &reader))
        } else if let kind = DeviceStateRequest.Kind(rawValue: kind) {
            self = .device(try DeviceStateRequest.parsing(kind, &reader))
        } else if let kind = PolicyRequest.Kind(rawValue: kind) {
            self = .policy(try PolicyRequest.parsing(kind, &reader))
        } else if let kind = MountRequest.Kind(rawValue: kind) {
            self = .mount(try MountRequest.parsing(kind, &reader))
        } else if let kind = FileRequest.Kind(rawValue: kind) {
            self = .file(try FileRequest.parsing(kind, &reader))
        } else if let kind = ProcessRequest.Kind(rawValue: kind) {
            self = .process(try ProcessRequest.parsing(kind, &reader))
        } else if let kind = TPMRequest.Kind(rawValue: kind) {
            self = .tpm(try TPMRequest.parsing(kind, &reader))
        } else if let kind = SyncRequest.Kind(rawValue: kind) {
            self = .sync(try SyncRequest.parsing(kind, &reader))
        } else {
            throw .param
        }
        guard reader.isAtEnd else { throw .param }
    }

    /// The audit log's name of an item request (nil: not an item access).
    public var auditOperation: String? { item?.auditOperation }

    /// The item request it is, if it is one.
    public var item: ItemRequest? {
        guard case .item(let request) = self else { return nil }
        return request
    }

    /// The access group an item request is about (nil: none, or all of them).
    public var group: String? { item?.group }

    static func protectionClass(_ name: String) throws(KeychainError) -> ProtectionClass {
        guard let parsed = ProtectionClass(name: name) else { throw .param }
        return parsed
    }

    /// A uid in canonical decimal (no sign, no leading zero), or nil.
    static func uid(_ text: String?) throws(KeychainError) -> UInt32? {
        guard let text else { return nil }
        guard let uid = UInt32(text), String(uid) == text else { throw .param }
        return uid
    }

    /// An auto-lock duration in canonical decimal seconds, or nil.
    static func seconds(_ text: String?) throws(KeychainError) -> Int? {
        guard let text else { return nil }
        guard let seconds = Int(text), String(seconds) == text, (0...Device.maximumAutoLockSeconds).contains(seconds)
        else {
            throw .param
        }
        return seconds
    }

    /// `1` or `0`, nothing else: a request means one thing only.
    static func flag(_ text: String) throws(KeychainError) -> Bool {
        guard text == "1" || text == "0" else { throw .param }
        return text == "1"
    }
}
