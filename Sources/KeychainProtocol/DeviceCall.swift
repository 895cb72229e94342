import KeychainCore
/// A request and the type of its answer. The factories below are the one table
/// that pairs each request with its result, in groups: a client names a call
/// (`.info(group:identifier:)`) and gets an ``ItemInfo`` back, decoded once
/// where the reply arrives; nobody picks a decoder. Adding a request:
/// docs/CONTRIBUTING.md, "Adding a request".
public struct DeviceCall<Result: DeviceResult>: Sendable {
    public let request: DeviceRequest

    /// Only the factories here pair a request with a result.
    fileprivate init(_ request: DeviceRequest) { self.request = request }

    /// The outcome a reply to this call says.
    public func outcome(of reply: DeviceReply) -> DeviceOutcome<Result> { reply.outcome(Result.self) }
}

// MARK: Items (work while locked, unless they read or write a value)

extension DeviceCall where Result == ItemValue {
    public static func get(group: String, identifier: String) -> Self {
        .init(.item(.get(group: group, identifier: identifier)))
    }
}

extension DeviceCall where Result == ItemInfo {
    public static func info(group: String, identifier: String) -> Self {
        .init(.item(.info(group: group, identifier: identifier)))
    }
}

extension DeviceCall where Result == GroupList {
    public static var groups: Self { .init(.item(.list(group: nil))) }
}

extension DeviceCall where Result == ItemList {
    public static func items(inGroup group: String) -> Self { .init(.item(.list(group: group))) }
}

extension DeviceCall where Result == DetailsList {
    /// One item's details (none: it has none), or those of every item of the group that has some.
    public static func details(group: String, identifier: String?) -> Self {
        .init(.item(.details(group: group, identifier: identifier)))
    }
}

extension DeviceCall where Result == Done {
    public static func set(
        group: String, identifier: String, value: SecureBytes, protectionClass: ProtectionClass? = nil,
        condition: PasswordManager.WriteCondition = .always, details: ItemDetails? = nil
    ) -> Self {
        .init(
            .item(
                .set(
                    group: group, identifier: identifier, value: value, protectionClass: protectionClass,
                    condition: condition, details: details)))
    }

    public static func setDetails(group: String, identifier: String, details: ItemDetails) -> Self {
        .init(.item(.setDetails(group: group, identifier: identifier, details: details)))
    }

    public static func remove(group: String, identifier: String) -> Self {
        .init(.item(.remove(group: group, identifier: identifier)))
    }

    public static func setClass(group: String, identifier: String, protectionClass: ProtectionClass) -> Self {
        .init(.item(.setClass(group: group, identifier: identifier, protectionClass: protectionClass)))
    }

    public static func rename(group: String, from: String, to: String, replacing: Bool) -> Self {
        .init(.item(.rename(group: group, from: from, to: to, replacing: replacing)))
    }

    public static func createGroup(_ group: String) -> Self { .init(.item(.createGroup(group))) }
    public static func removeGroup(_ group: String) -> Self { .init(.item(.removeGroup(group))) }
}

// MARK: The device (its lock, its life, its mounts)

extension DeviceCall where Result == Done {
    public static var ping: Self { .init(.process(.ping)) }
    public static var lock: Self { .init(.device(.lock)) }
    public static func unlock(passcode: SecureBytes?) -> Self { .init(.device(.unlock(passcode: passcode))) }
    public static var sync: Self { .init(.device(.sync)) }
    public static var purge: Self { .init(.device(.purge)) }
    public static var background: Self { .init(.device(.background)) }
    public static func accessMode(_ mode: AccessMode) -> Self { .init(.device(.accessMode(mode))) }
    public static func migrate(_ migrate: Bool) -> Self { .init(.device(.migrate(migrate))) }
    public static func changePasscode(old: SecureBytes?, new: SecureBytes?) -> Self {
        .init(.device(.changePasscode(old: old, new: new)))
    }
    public static var stop: Self { .init(.process(.stop)) }
    /// After the answer, the connection carries `.events` lines.
    public static var watch: Self { .init(.process(.watch)) }
    public static func serveBus(address: String, replace: Bool) -> Self {
        .init(.process(.serveBus(address: address, replace: replace)))
    }
    public static func mount(group: String?, mountpoint: String) -> Self {
        .init(.mount(.mount(group: group, mountpoint: mountpoint)))
    }
    /// The `/dev/fuse` descriptor goes with the request.
    public static func attach(group: String?, mountpoint: String) -> Self {
        .init(.mount(.attach(group: group, mountpoint: mountpoint)))
    }
}

extension DeviceCall where Result == CreatedKeychain {
    /// The service: create the caller's keychain.
    public static func create(passcode: SecureBytes?) -> Self { .init(.process(.create(passcode: passcode))) }
}

extension DeviceCall where Result == DeviceStatus {
    public static var status: Self { .init(.device(.status(mountpoint: nil))) }
    /// The status as the mount at `mountpoint` shows it (its group).
    public static func status(ofMount mountpoint: String) -> Self { .init(.device(.status(mountpoint: mountpoint))) }
}

extension DeviceCall where Result == AutoLockSetting {
    public static func autoLock(after: Int?, grace: Int?) -> Self {
        .init(.device(.autoLock(after: after, grace: grace)))
    }
}

extension DeviceCall where Result == UnmountOutcome {
    public static func unmount(mountpoint: String) -> Self { .init(.mount(.unmount(mountpoint: mountpoint))) }
}

// MARK: Backups (the file goes with the request)

extension DeviceCall where Result == ReplyCount {
    public static func backup(
        path: String, password: SecureBytes, policedGroups: [String] = [], passcode: SecureBytes? = nil
    ) -> Self {
        .init(.file(.backup(path: path, password: password, policedGroups: policedGroups, passcode: passcode)))
    }
}

extension DeviceCall where Result == RestoreSummary {
    public static func restore(
        path: String, password: SecureBytes, policy: RestoreConflictPolicy, passcode: SecureBytes? = nil
    ) -> Self {
        .init(.file(.restore(path: path, password: password, policy: policy, passcode: passcode)))
    }
}

// MARK: Policy (entitlements and items' access lists)

/// A call of the policy group: known to be one by its type, so that the command
/// line, which answers a policy request itself when no device runs, gets the
/// ``PolicyRequest`` without asking at run time.
public struct PolicyCall<Result: DeviceResult>: Sendable {
    public let request: PolicyRequest

    private init(_ request: PolicyRequest) { self.request = request }

    /// The call as any other: sent to a device, decoded where it arrives.
    public var call: DeviceCall<Result> { DeviceCall(.policy(request)) }
}

extension PolicyCall where Result == PinnedProgram {
    public static func grant(
        group: String, executable: String, unit: String?, uid: UInt32?, passcode: SecureBytes?,
        allowJIT: Bool = false
    ) -> Self {
        .init(
            .grant(group: group, executable: executable, unit: unit, uid: uid, passcode: passcode, allowJIT: allowJIT))
    }

    /// Puts the program on the item's access list.
    public static func allow(group: String, identifier: String, executable: String, passcode: SecureBytes?) -> Self {
        .init(.access(group: group, identifier: identifier, executable: executable, change: .add, passcode: passcode))
    }

    /// Makes an item of no program the program's.
    public static func claim(group: String, identifier: String, executable: String, passcode: SecureBytes?) -> Self {
        .init(.access(group: group, identifier: identifier, executable: executable, change: .claim, passcode: passcode))
    }
}

extension PolicyCall where Result == ReplyCount {
    public static func revoke(
        group: String, executable: String?, unit: String?, uid: UInt32?, all: Bool, passcode: SecureBytes?
    ) -> Self {
        .init(.revoke(group: group, executable: executable, unit: unit, uid: uid, all: all, passcode: passcode))
    }

    /// Takes every program at the path off the item's access list.
    public static func disallow(
        group: String, identifier: String, executable: String, passcode: SecureBytes?
    ) -> Self {
        .init(
            .access(group: group, identifier: identifier, executable: executable, change: .remove, passcode: passcode))
    }
}

extension PolicyCall where Result == GroupApps {
    /// Sets (`open` given, with the passcode) or reads (nil) whose a group's items are.
    public static func apps(group: String, open: Bool?, passcode: SecureBytes?) -> Self {
        .init(.apps(group: group, open: open, passcode: passcode))
    }
}

extension PolicyCall where Result == PolicyList {
    public static func policy(group: String?) -> Self { .init(.policy(group: group)) }
}

// MARK: The audit log

extension DeviceCall where Result == AuditLogFile {
    /// The file comes back with the answer.
    public static func auditLog(rotated: Bool) -> Self { .init(.file(.auditLog(rotated: rotated))) }
}

extension DeviceCall where Result == AuditLog.VerifyReport {
    public static var verifyLog: Self { .init(.file(.verifyLog)) }
}

// MARK: The TPM, through the service (docs/FORMAT.md, "The TPM through the service")

extension DeviceCall where Result == TPMSealed {
    public static func tpmSeal(_ secret: SecureBytes, auth: SecureBytes, guarded: Bool) -> Self {
        .init(.tpm(.seal(secret: secret, auth: auth, guarded: guarded)))
    }
}

extension DeviceCall where Result == TPMUnsealed {
    public static func tpmUnseal(_ blob: [UInt8], auth: SecureBytes, storageKey: [UInt8]) -> Self {
        .init(.tpm(.unseal(blob: blob, auth: auth, storageKey: storageKey)))
    }
}

extension DeviceCall where Result == TPMCounter {
    public static func tpmDefineCounter(auth: SecureBytes, candidates: [UInt32]) -> Self {
        .init(.tpm(.defineCounter(auth: auth, candidates: candidates)))
    }
}

extension DeviceCall where Result == TPMCounterValue {
    public static func tpmCounterValue(_ counter: TPMCounterHandle) -> Self { .init(.tpm(.counterValue(counter))) }
}

extension DeviceCall where Result == Done {
    public static func tpmIncrement(_ counter: TPMCounterHandle) -> Self { .init(.tpm(.increment(counter))) }
    public static func tpmRelease(_ counter: TPMCounterHandle) -> Self { .init(.tpm(.release(counter))) }
}

extension DeviceCall where Result == TPMLockoutShare {
    public static var tpmLockout: Self { .init(.tpm(.lockout)) }
}

// MARK: Sync (a per-user device's; docs/SYNC.md)

extension DeviceCall where Result == SyncRecoveryKey {
    /// Answers the circle's new recovery key.
    public static func syncRemove(device: String) -> Self { .init(.sync(.remove(device: device))) }
    public static func syncStart(remote: String, groups: [String] = []) -> Self {
        .init(.sync(.start(remote: remote, groups: groups)))
    }
}

extension DeviceCall where Result == SyncSummary {
    public static func syncJoin(remote: String, recoveryKey: SecureBytes, groups: [String] = []) -> Self {
        .init(.sync(.joinWithRecoveryKey(remote: remote, recoveryKey: recoveryKey, groups: groups)))
    }
    public static var syncNow: Self { .init(.sync(.now)) }
}

extension DeviceCall where Result == JoinStep {
    public static func syncJoin(remote: String?, groups: [String] = []) -> Self {
        .init(.sync(.join(remote: remote, groups: groups)))
    }
}

extension DeviceCall where Result == SyncStatusLines {
    public static var syncStatus: Self { .init(.sync(.status)) }
    public static func syncGroups(set groups: [String]?) -> Self { .init(.sync(.groups(set: groups))) }
}

extension DeviceCall where Result == JoinAskers {
    public static func syncJoinRequests(answering device: String? = nil) -> Self {
        .init(.sync(.joinRequests(device: device)))
    }
}

extension DeviceCall where Result == JoinCode {
    public static func syncJoinCode(device: String) -> Self { .init(.sync(.joinCode(device: device))) }
}

extension DeviceCall where Result == Done {
    public static var syncCancelJoin: Self { .init(.sync(.cancelJoin)) }
    public static func syncConfirmJoin(code: String) -> Self { .init(.sync(.confirmJoin(code: code))) }
    public static func syncApprove(device: String, code: String) -> Self {
        .init(.sync(.approve(device: device, code: code)))
    }
    public static var syncLeave: Self { .init(.sync(.leave)) }
}
