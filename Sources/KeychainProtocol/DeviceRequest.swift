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

    /// The `kind` byte of each request.
    enum Operation: UInt8, CaseIterable {
        case ping = 1, mount = 2, unmount = 3, changePasscode = 4, backup = 5, restore = 6
        case get = 7, set = 8, remove = 9, list = 10, info = 11, setClass = 12, rename = 13
        case createGroup = 14, removeGroup = 15, lock = 16, unlock = 17, status = 18, sync = 19
        case grant = 20, revoke = 21, policy = 22, create = 23, attach = 24, auditLog = 25, verifyLog = 26, stop = 27
        case watch = 28, autoLock = 29, details = 30, setDetails = 31, serveBus = 32, access = 33, apps = 34
        case tpmSeal = 35, tpmUnseal = 36, tpmDefineCounter = 37, tpmCounterValue = 38, tpmIncrement = 39
        case tpmRelease = 40, tpmLockout = 41
        case syncStart = 42, syncJoinWithRecoveryKey = 43, syncJoin = 44, syncCancelJoin = 45, syncNow = 46
        case syncStatus = 47, syncJoinRequests = 48, syncJoinCode = 49, syncApprove = 50, syncRemove = 51
        case syncLeave = 52, syncGroups = 53, syncConfirmJoin = 54
        case purge = 55, background = 56, accessMode = 57, migrate = 58

        /// The request group whose enum holds this kind (and parses its fields).
        enum Group { case item, device, policy, mount, file, process, tpm, sync }

        var group: Group {
            switch self {
            case .get, .set, .remove, .list, .info, .setClass, .rename, .createGroup, .removeGroup, .details,
                .setDetails:
                .item
            case .lock, .unlock, .status, .sync, .changePasscode, .autoLock, .purge, .background, .accessMode,
                .migrate:
                .device
            case .grant, .revoke, .policy, .access, .apps: .policy
            case .mount, .unmount, .attach: .mount
            case .backup, .restore, .auditLog, .verifyLog: .file
            case .ping, .stop, .watch, .serveBus, .create: .process
            case .tpmSeal, .tpmUnseal, .tpmDefineCounter, .tpmCounterValue, .tpmIncrement, .tpmRelease, .tpmLockout:
                .tpm
            case .syncStart, .syncJoinWithRecoveryKey, .syncJoin, .syncCancelJoin, .syncNow, .syncStatus,
                .syncJoinRequests, .syncJoinCode, .syncApprove, .syncRemove, .syncLeave, .syncGroups, .syncConfirmJoin:
                .sync
            }
        }
    }

    /// The request as a frame, in secret memory: its group's kind and fields.
    public func frame() throws(KeychainError) -> SecureBytes {
        let (operation, fields): (Operation, [FrameField])
        switch self {
        case .item(let request): (operation, fields) = try request.frameParts()
        case .device(let request): (operation, fields) = request.frameParts
        case .policy(let request): (operation, fields) = request.frameParts
        case .mount(let request): (operation, fields) = request.frameParts
        case .file(let request): (operation, fields) = request.frameParts
        case .process(let request): (operation, fields) = request.frameParts
        case .tpm(let request): (operation, fields) = request.frameParts
        case .sync(let request): (operation, fields) = request.frameParts
        }
        return try FrameField.frame(kind: operation.rawValue, code: 0, fields)
    }

    /// Parses a request body (``DeviceProtocol/version`` only): its group,
    /// by its kind, reads the fields.
    public init(body: UnsafeRawBufferPointer) throws(KeychainError) {
        var reader = ByteReader(frame: body)
        guard try reader.readByte() == DeviceProtocol.version,
            let operation = Operation(rawValue: try reader.readByte()),
            try reader.readInt32() == 0
        else { throw .param }
        let parsed: DeviceRequest?
        switch operation.group {
        case .item: parsed = try ItemRequest.parsing(operation, &reader).map(DeviceRequest.item)
        case .device: parsed = try DeviceStateRequest.parsing(operation, &reader).map(DeviceRequest.device)
        case .policy: parsed = try PolicyRequest.parsing(operation, &reader).map(DeviceRequest.policy)
        case .mount: parsed = try MountRequest.parsing(operation, &reader).map(DeviceRequest.mount)
        case .file: parsed = try FileRequest.parsing(operation, &reader).map(DeviceRequest.file)
        case .process: parsed = try ProcessRequest.parsing(operation, &reader).map(DeviceRequest.process)
        case .tpm: parsed = try TPMRequest.parsing(operation, &reader).map(DeviceRequest.tpm)
        case .sync: parsed = try SyncRequest.parsing(operation, &reader).map(DeviceRequest.sync)
        }
        guard let parsed, reader.isAtEnd else { throw .param }
        self = parsed
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
