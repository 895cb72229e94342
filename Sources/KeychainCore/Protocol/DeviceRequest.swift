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
    }

    /// The request as a frame, in secret memory.
    public func frame() throws(KeychainError) -> SecureBytes {
        var fields: [FrameField] = []
        let operation: Operation
        switch self {
        case .process(.ping):
            operation = .ping
        case .mount(.mount(let group, let mountpoint)):
            operation = .mount
            fields = [.optionalText(group), .text(mountpoint)]
        case .mount(.unmount(let mountpoint)):
            operation = .unmount
            fields = [.text(mountpoint)]
        case .device(.changePasscode(let old, let new)):
            operation = .changePasscode
            fields = [.optionalSecret(old), .optionalSecret(new)]
        case .file(.backup(let path, let password, let policedGroups, let passcode)):
            operation = .backup
            // Names hold no newline (ItemLimits): one text carries the list.
            fields = [
                .text(path), .optionalSecret(password), .text(policedGroups.joined(separator: "\n")),
                .optionalSecret(passcode)
            ]
        case .file(.restore(let path, let password, let policy, let passcode)):
            operation = .restore
            fields = [.text(path), .optionalSecret(password), .text(String(policy.rawValue)), .optionalSecret(passcode)]
        case .item(.get(let group, let identifier)):
            operation = .get
            fields = [.text(group), .text(identifier)]
        case .item(.set(let group, let identifier, let value, let protectionClass, let condition, let details)):
            operation = .set
            fields = [
                .text(group), .text(identifier), .optionalSecret(value), .optionalText(protectionClass?.name),
                .text(condition.rawValue),
                .optionalSecret(
                    try details.map { (details) throws(KeychainError) in
                        try SecureBytes(details.encoded())
                    })
            ]
        case .item(.details(let group, let identifier)):
            operation = .details
            fields = [.text(group), .optionalText(identifier)]
        case .process(.serveBus(let address, let replace)):
            operation = .serveBus
            fields = [.text(address), .text(replace ? "1" : "0")]
        case .item(.setDetails(let group, let identifier, let details)):
            operation = .setDetails
            fields = [.text(group), .text(identifier), .optionalSecret(try SecureBytes(details.encoded()))]
        case .item(.remove(let group, let identifier)):
            operation = .remove
            fields = [.text(group), .text(identifier)]
        case .item(.list(let group)):
            operation = .list
            fields = [.optionalText(group)]
        case .item(.info(let group, let identifier)):
            operation = .info
            fields = [.text(group), .text(identifier)]
        case .item(.setClass(let group, let identifier, let protectionClass)):
            operation = .setClass
            fields = [.text(group), .text(identifier), .text(protectionClass.name)]
        case .item(.rename(let group, let from, let to, let replacing)):
            operation = .rename
            fields = [.text(group), .text(from), .text(to), .text(replacing ? "1" : "0")]
        case .item(.createGroup(let group)):
            operation = .createGroup
            fields = [.text(group)]
        case .item(.removeGroup(let group)):
            operation = .removeGroup
            fields = [.text(group)]
        case .device(.lock):
            operation = .lock
        case .device(.unlock(let passcode)):
            operation = .unlock
            fields = [.optionalSecret(passcode)]
        case .device(.status(let mountpoint)):
            operation = .status
            fields = [.optionalText(mountpoint)]
        case .device(.sync):
            operation = .sync
        case .device(.purge):
            operation = .purge
        case .device(.background):
            operation = .background
        case .device(.accessMode(let mode)):
            operation = .accessMode
            fields = [.text(mode.rawValue)]
        case .device(.migrate(let migrate)):
            operation = .migrate
            fields = [.text(migrate ? "1" : "0")]
        case .policy(.grant(let group, let executable, let unit, let uid, let passcode, let allowJIT)):
            operation = .grant
            fields = [
                .text(group), .text(executable), .optionalText(unit), .optionalText(uid.map { String($0) }),
                .optionalSecret(passcode), .text(allowJIT ? "1" : "0")
            ]
        case .policy(.revoke(let group, let executable, let unit, let uid, let all, let passcode)):
            operation = .revoke
            fields = [
                .text(group), .optionalText(executable), .optionalText(unit), .optionalText(uid.map { String($0) }),
                .text(all ? "1" : "0"), .optionalSecret(passcode)
            ]
        case .policy(.access(let group, let identifier, let executable, let change, let passcode)):
            operation = .access
            fields = [
                .text(group), .text(identifier), .text(executable), .text(change.rawValue), .optionalSecret(passcode)
            ]
        case .policy(.apps(let group, let open, let passcode)):
            operation = .apps
            fields = [.text(group), .optionalText(open.map { $0 ? "1" : "0" }), .optionalSecret(passcode)]
        case .policy(.policy(let group)):
            operation = .policy
            fields = [.optionalText(group)]
        case .process(.create(let passcode)):
            operation = .create
            fields = [.optionalSecret(passcode)]
        case .mount(.attach(let group, let mountpoint)):
            operation = .attach
            fields = [.optionalText(group), .text(mountpoint)]
        case .file(.auditLog(let rotated)):
            operation = .auditLog
            fields = [.text(rotated ? "1" : "0")]
        case .file(.verifyLog):
            operation = .verifyLog
        case .process(.stop):
            operation = .stop
        case .process(.watch):
            operation = .watch
        case .device(.autoLock(let after, let grace)):
            operation = .autoLock
            fields = [.optionalText(after.map { String($0) }), .optionalText(grace.map { String($0) })]
        case .tpm(let request):
            (operation, fields) = request.frameParts
        case .sync(let request):
            (operation, fields) = request.frameParts
        }
        return try FrameField.frame(kind: operation.rawValue, code: 0, fields)
    }

    /// Parses a request body (``DeviceProtocol/version`` only).
    public init(body: UnsafeRawBufferPointer) throws(KeychainError) {
        var reader = ByteReader(frame: body)
        guard try reader.readByte() == DeviceProtocol.version,
            let operation = Operation(rawValue: try reader.readByte()),
            try reader.readInt32() == 0
        else { throw .param }
        switch operation {
        case .ping:
            self = .process(.ping)
        case .mount:
            self = .mount(.mount(group: try reader.optionalText(), mountpoint: try reader.text()))
        case .unmount:
            self = .mount(.unmount(mountpoint: try reader.text()))
        case .changePasscode:
            self = .device(.changePasscode(old: try reader.optionalSecret(), new: try reader.optionalSecret()))
        case .backup:
            let path = try reader.text()
            guard let password = try reader.optionalSecret() else { throw .param }
            let list = try reader.text()
            let policedGroups =
                list.isEmpty ? [] : list.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
            // One spelling per request: no empty or repeated name.
            guard !policedGroups.contains(""), Set(policedGroups).count == policedGroups.count else { throw .param }
            self = .file(
                .backup(
                    path: path, password: password, policedGroups: policedGroups, passcode: try reader.optionalSecret())
            )
        case .restore:
            let path = try reader.text()
            let passwordField = try reader.optionalSecret(), policyText = try reader.text()
            // Only the canonical spelling ("2", not "02"): a request means one thing only.
            guard let password = passwordField,
                let policy = RestoreConflictPolicy.allCases.first(where: { String($0.rawValue) == policyText })
            else {
                throw .param
            }
            self = .file(
                .restore(path: path, password: password, policy: policy, passcode: try reader.optionalSecret()))
        case .get:
            self = .item(.get(group: try reader.text(), identifier: try reader.text()))
        case .set:
            let group = try reader.text(), identifier = try reader.text()
            guard let value = try reader.optionalSecret() else { throw .param }
            let protectionClass = try reader.optionalText().map { (name) throws(KeychainError) in
                try Self.protectionClass(name)
            }
            guard let condition = PasswordManager.WriteCondition(rawValue: try reader.text()) else { throw .param }
            let details = try reader.optionalSecret().map { (encoded) throws(KeychainError) in
                try ItemDetails(decoding: encoded.bytes(), malformed: .param)
            }
            self = .item(
                .set(
                    group: group, identifier: identifier, value: value, protectionClass: protectionClass,
                    condition: condition,
                    details: details))
        case .details:
            self = .item(.details(group: try reader.text(), identifier: try reader.optionalText()))
        case .serveBus:
            let address = try reader.text()
            self = .process(.serveBus(address: address, replace: try Self.flag(try reader.text())))
        case .setDetails:
            let group = try reader.text(), identifier = try reader.text()
            guard let encoded = try reader.optionalSecret() else { throw .param }
            self = .item(
                .setDetails(
                    group: group, identifier: identifier,
                    details: try ItemDetails(decoding: encoded.bytes(), malformed: .param)))
        case .remove:
            self = .item(.remove(group: try reader.text(), identifier: try reader.text()))
        case .list:
            self = .item(.list(group: try reader.optionalText()))
        case .info:
            self = .item(.info(group: try reader.text(), identifier: try reader.text()))
        case .setClass:
            self = .item(
                .setClass(
                    group: try reader.text(), identifier: try reader.text(),
                    protectionClass: try Self.protectionClass(try reader.text())))
        case .rename:
            let group = try reader.text(), from = try reader.text(), to = try reader.text()
            self = .item(.rename(group: group, from: from, to: to, replacing: try Self.flag(try reader.text())))
        case .createGroup:
            self = .item(.createGroup(try reader.text()))
        case .removeGroup:
            self = .item(.removeGroup(try reader.text()))
        case .lock:
            self = .device(.lock)
        case .unlock:
            self = .device(.unlock(passcode: try reader.optionalSecret()))
        case .status:
            self = .device(.status(mountpoint: try reader.optionalText()))
        case .sync:
            self = .device(.sync)
        case .purge:
            self = .device(.purge)
        case .background:
            self = .device(.background)
        case .accessMode:
            guard let mode = AccessMode(rawValue: try reader.text()) else { throw .param }
            self = .device(.accessMode(mode))
        case .migrate:
            self = .device(.migrate(try Self.flag(try reader.text())))
        case .grant:
            let group = try reader.text(), executable = try reader.text(), unit = try reader.optionalText()
            let uid = try Self.uid(try reader.optionalText())
            let passcode = try reader.optionalSecret()
            self = .policy(
                .grant(
                    group: group, executable: executable, unit: unit, uid: uid, passcode: passcode,
                    allowJIT: try Self.flag(try reader.text())))
        case .revoke:
            let group = try reader.text(), executable = try reader.optionalText(), unit = try reader.optionalText()
            let uid = try Self.uid(try reader.optionalText()), all = try Self.flag(try reader.text())
            self = .policy(
                .revoke(
                    group: group, executable: executable, unit: unit, uid: uid, all: all,
                    passcode: try reader.optionalSecret()))
        case .access:
            let group = try reader.text(), identifier = try reader.text(), executable = try reader.text()
            guard let change = AccessChange(rawValue: try reader.text()) else { throw .param }
            self = .policy(
                .access(
                    group: group, identifier: identifier, executable: executable, change: change,
                    passcode: try reader.optionalSecret()))
        case .apps:
            let group = try reader.text()
            let open = try reader.optionalText().map { (text) throws(KeychainError) in try Self.flag(text) }
            self = .policy(.apps(group: group, open: open, passcode: try reader.optionalSecret()))
        case .policy:
            self = .policy(.policy(group: try reader.optionalText()))
        case .create:
            self = .process(.create(passcode: try reader.optionalSecret()))
        case .attach:
            self = .mount(.attach(group: try reader.optionalText(), mountpoint: try reader.text()))
        case .auditLog:
            self = .file(.auditLog(rotated: try Self.flag(try reader.text())))
        case .verifyLog:
            self = .file(.verifyLog)
        case .stop:
            self = .process(.stop)
        case .watch:
            self = .process(.watch)
        case .autoLock:
            self = .device(
                .autoLock(
                    after: try Self.seconds(try reader.optionalText()),
                    grace: try Self.seconds(try reader.optionalText())))
        case .tpmSeal: self = .tpm(try .parsingSeal(&reader))
        case .tpmUnseal: self = .tpm(try .parsingUnseal(&reader))
        case .tpmDefineCounter: self = .tpm(try .parsingDefineCounter(&reader))
        case .tpmCounterValue: self = .tpm(.counterValue(try TPMRequest.counter(&reader)))
        case .tpmIncrement: self = .tpm(.increment(try TPMRequest.counter(&reader)))
        case .tpmRelease: self = .tpm(.release(try TPMRequest.counter(&reader)))
        case .tpmLockout: self = .tpm(.lockout)
        case .syncStart, .syncJoinWithRecoveryKey, .syncJoin, .syncCancelJoin, .syncNow, .syncStatus,
            .syncJoinRequests, .syncJoinCode, .syncApprove, .syncRemove, .syncLeave, .syncGroups, .syncConfirmJoin:
            guard let request = try SyncRequest.parsing(operation, &reader) else { throw .param }
            self = .sync(request)
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

    private static func protectionClass(_ name: String) throws(KeychainError) -> ProtectionClass {
        guard let parsed = ProtectionClass(name: name) else { throw .param }
        return parsed
    }

    /// A uid in canonical decimal (no sign, no leading zero), or nil.
    private static func uid(_ text: String?) throws(KeychainError) -> UInt32? {
        guard let text else { return nil }
        guard let uid = UInt32(text), String(uid) == text else { throw .param }
        return uid
    }

    /// An auto-lock duration in canonical decimal seconds, or nil.
    private static func seconds(_ text: String?) throws(KeychainError) -> Int? {
        guard let text else { return nil }
        guard let seconds = Int(text), String(seconds) == text, (0...Device.maximumAutoLockSeconds).contains(seconds)
        else {
            throw .param
        }
        return seconds
    }

    /// `1` or `0`, nothing else: a request means one thing only.
    private static func flag(_ text: String) throws(KeychainError) -> Bool {
        guard text == "1" || text == "0" else { throw .param }
        return text == "1"
    }
}

/// What an ``DeviceRequest/access(group:identifier:executable:change:passcode:)`` does.
public enum AccessChange: String, Sendable, Equatable, CaseIterable {
    /// Put the program on the item's access list.
    case add = "0"
    /// Take every program at the path off the list.
    case remove = "1"
    /// Make an item of no program (imported, made through a mount or the
    /// command line) the program's, as if it had made it over the bus.
    case claim = "2"
}

/// An item or a group of items: the library's operations, under the
/// caller policy (a group's entitlement, the owner rule) and audited.
public enum ItemRequest: Equatable, Sendable {
    /// An item's value (the reply is ``DeviceReply/value(_:)``).
    case get(group: String, identifier: String)
    /// Add or replace an item under `protectionClass` (nil: the device's
    /// current access mode and migrate setting), as `condition` allows,
    /// with `details` (nil: an item replaced keeps its own).
    case set(
        group: String, identifier: String, value: SecureBytes,
        protectionClass: ProtectionClass? = nil, condition: PasswordManager.WriteCondition = .always,
        details: ItemDetails? = nil)
    /// The details of one item, or of every item of `group` that has some:
    /// per item its identifier, then ``ItemDetails/fields`` (needs no key).
    case details(group: String, identifier: String?)
    /// Replace an item's details (its value stays; needs its class key).
    case setDetails(group: String, identifier: String, details: ItemDetails)
    /// Delete an item (works while locked).
    case remove(group: String, identifier: String)
    /// The groups (nil), or a group's items as (identifier, class, size) triples.
    case list(group: String?)
    /// An item's class and size, as two fields (needs no key).
    case info(group: String, identifier: String)
    /// Re-encrypt an item under another class.
    case setClass(group: String, identifier: String, protectionClass: ProtectionClass)
    /// Rename an item within its group.
    case rename(group: String, from: String, to: String, replacing: Bool)
    /// Create an empty access group.
    case createGroup(String)
    /// Remove an empty access group.
    case removeGroup(String)
}

/// The device's lock and its settings: lock, unlock, status, sync, the
/// passcode, auto-lock.
public enum DeviceStateRequest: Equatable, Sendable {
    /// Lock the device.
    case lock
    /// Unlock the device (nil: a keychain without a passcode).
    case unlock(passcode: SecureBytes?)
    /// The device's state (``DeviceStatus``), as the mount at `mountpoint`
    /// shows it (its group; nil: the keychain's device itself).
    case status(mountpoint: String?)
    /// Make every acknowledged write durable against power loss.
    case sync
    /// Change the passcode (nil: none), as ``Device/changePasscode(from:to:)``.
    case changePasscode(old: SecureBytes?, new: SecureBytes?)
    /// Set the auto-lock delay and grace (nil: keep it), in seconds; the
    /// reply is both as they are now.
    case autoLock(after: Int?, grace: Int?)
    /// Wipe the cache of the last access (UYLPasswordManager's `purge`).
    case purge
    /// What iOS does when an app goes to the background: purge the cache.
    case background
    /// The class that items written from now on get (UYLPasswordManager's `accessMode`).
    case accessMode(AccessMode)
    /// Whether items written from now on may leave the device (`false`: the `ThisDeviceOnly` form).
    case migrate(Bool)
}

/// Who may use a group or an item: entitlement rules and access lists
/// (changes need the passcode).
public enum PolicyRequest: Equatable, Sendable {
    /// Allow the executable at `executable` (absolute; the device resolves
    /// and hashes it), optionally only in `unit` and as `uid`, to use `group`
    /// (``Device/grant(_:toGroup:passcode:)``), with JIT code when `allowJIT`.
    /// The reply's field is the digest.
    case grant(
        group: String, executable: String, unit: String?, uid: UInt32?, passcode: SecureBytes?, allowJIT: Bool = false)
    /// Remove rules of `group`, or (`all`) its whole policy (``Device/revoke(group:executable:unit:uid:all:passcode:)``).
    /// The reply's field is the number of rules removed.
    case revoke(group: String, executable: String?, unit: String?, uid: UInt32?, all: Bool, passcode: SecureBytes?)
    /// Change who may use an item over the bus (``AccessChange``;
    /// docs/SECRET-SERVICE.md, "Whose an item is") with the program at
    /// `executable`. Needs the passcode, as `grant` does. The reply's fields:
    /// the executable and its SHA-256 in hex (add, claim), the number removed
    /// (remove).
    case access(group: String, identifier: String, executable: String, change: AccessChange, passcode: SecureBytes?)
    /// Whether programs own the items they make in `group` over the bus
    /// (`own`, the default) or its items are every program's (`open`):
    /// set to `open` (with the passcode), or read (nil; the reply's field is
    /// `own` or `open`).
    case apps(group: String, open: Bool?, passcode: SecureBytes?)
    /// The rules of one group (or of every group with a policy), six fields
    /// each: group, executable, SHA-256 in hex, unit, uid, `jit` (the last three empty when not set).
    case policy(group: String?)
}

/// The device's mounts.
public enum MountRequest: Equatable, Sendable {
    /// Mount the keychain, or one group of it, at a mount point (absolute).
    case mount(group: String?, mountpoint: String)
    /// Serve the FUSE connection passed with the request (a `/dev/fuse`
    /// descriptor the caller mounted with fusermount3) at `mountpoint`.
    case attach(group: String?, mountpoint: String)
    /// Unmount one of the device's mounts.
    case unmount(mountpoint: String)
}

/// Files passed with the request or its reply: backups and the audit log.
public enum FileRequest: Equatable, Sendable {
    /// Write a backup of the migratable items to the file passed with the
    /// request (`path` names it in messages); policed groups only when
    /// named, with the keychain's passcode.
    case backup(path: String, password: SecureBytes, policedGroups: [String] = [], passcode: SecureBytes? = nil)
    /// Restore the backup file passed with the request (`path` names it in
    /// messages); writing into a policed group needs the keychain's passcode.
    case restore(path: String, password: SecureBytes, policy: RestoreConflictPolicy, passcode: SecureBytes? = nil)
    /// The audit log file (or the rotated one before it), passed back
    /// read-only with the reply.
    case auditLog(rotated: Bool)
    /// Check the audit log's chain: the reply is the number of lines, then
    /// one field per problem.
    case verifyLog
}

/// The device process itself: whether it answers, its end, its events,
/// the bus it serves, a user's keychain in the service.
public enum ProcessRequest: Equatable, Sendable {
    /// Is a device serving this socket?
    case ping
    /// Stop the per-user device: unmount everything and exit (as SIGTERM).
    case stop
    /// Follow the device's events: after the `ok` reply the connection
    /// carries `.events` lines until the client closes it.
    case watch
    /// A per-user device: serve the Secret Service on the session bus at
    /// `address` too (with `replace`, taking the name over), as if started
    /// with `--secret-service`.
    case serveBus(address: String, replace: Bool)
    /// Service mode: create the caller's keychain (nil: no passcode).
    case create(passcode: SecureBytes?)
}

extension ItemRequest {
    /// The audit log's name of the request (nil: a listing of the groups, which names no item).
    public var auditOperation: String? {
        switch self {
        case .get: "get"
        case .set: "set"
        case .details: "details"
        case .setDetails: "set-details"
        case .remove: "remove"
        case .info: "info"
        case .setClass: "set-class"
        case .rename: "rename"
        case .list(let group): group == nil ? nil : "list"
        case .createGroup: "create-group"
        case .removeGroup: "remove-group"
        }
    }

    /// The request with no owner or access list in the details it carries
    /// (docs/SECRET-SERVICE.md, "Whose an item is"): what a client of the
    /// socket sends is taken so.
    public var withoutOwner: ItemRequest {
        switch self {
        case .set(let group, let identifier, let value, let protectionClass, let condition, let details?):
            .set(
                group: group, identifier: identifier, value: value, protectionClass: protectionClass,
                condition: condition, details: details.ownerless)
        case .setDetails(let group, let identifier, let details):
            .setDetails(group: group, identifier: identifier, details: details.ownerless)
        case .set(_, _, _, _, _, nil), .get, .details, .remove, .list, .info, .setClass, .rename, .createGroup,
            .removeGroup:
            self
        }
    }

    /// What the request does to an item another program may own, as the
    /// person's question says it (docs/SECRET-SERVICE.md, "Whose an item is");
    /// nil for a request that hands out no secret and changes no item (a
    /// listing, details, a group).
    public var consentVerb: String? {
        switch self {
        case .get: "read the secret of"
        case .set: "change the secret of"
        case .remove: "delete"
        case .rename: "rename or replace"
        case .setClass: "change the protection of"
        case .setDetails: "change the label or attributes of"
        case .details, .list, .info, .createGroup, .removeGroup: nil
        }
    }

    /// The items of ``group`` whose owner the request needs the leave of:
    /// the item it reads or changes, and the one a rename would replace.
    public var ownedIdentifiers: [String] {
        switch self {
        case .get(_, let identifier), .set(_, let identifier, _, _, _, _), .remove(_, let identifier),
            .setClass(_, let identifier, _), .setDetails(_, let identifier, _):
            [identifier]
        case .rename(_, let from, let to, _):
            [from, to]
        // No ``consentVerb``: nothing to ask about.
        case .details, .list, .info, .createGroup, .removeGroup:
            []
        }
    }

    /// The item the request is about, for the audit log (nil: a group's).
    public var identifier: String? {
        switch self {
        case .get(_, let identifier), .set(_, let identifier, _, _, _, _), .remove(_, let identifier),
            .info(_, let identifier), .setClass(_, let identifier, _), .setDetails(_, let identifier, _),
            .rename(_, let identifier, _, _):
            identifier
        case .details(_, let identifier): identifier
        case .list, .createGroup, .removeGroup: nil
        }
    }

    /// The access group the request is about (nil: the list of groups).
    /// `createGroup`'s group is none yet: no policy can name it.
    public var group: String? {
        switch self {
        case .get(let group, _), .set(let group, _, _, _, _, _), .remove(let group, _), .info(let group, _),
            .details(let group, _), .setDetails(let group, _, _), .setClass(let group, _, _),
            .rename(let group, _, _, _), .removeGroup(let group):
            group
        case .list(let group): group
        case .createGroup: nil
        }
    }
}
