#if canImport(Glibc)
import Glibc
#endif

// The status, built once (docs/FILESYSTEM.md, "`.control`"): the `.control`
// file, the socket's `status` and `keychainfs status` (its text and its --json)
// all show ``DeviceStatus/report()``. Before, the lines were written in two
// places with different keys, and --json parsed the text back.

/// One line of a status: its key and value.
public struct StatusEntry: Sendable, Equatable {
    public enum Value: Sendable, Equatable {
        case text(String)
        /// A count or a number of seconds: a number in --json.
        case number(Int64)
    }

    public let key: String
    public let value: Value

    public init(_ key: String, _ text: String) {
        self.key = key
        value = .text(text)
    }

    public init<Number: BinaryInteger>(_ key: String, number: Number) {
        self.key = key
        value = .number(Int64(number))
    }

    /// `key: value`, the value escaped so that a path or a name never
    /// forges a line (``LineEscaping``).
    public var line: String {
        switch value {
        case .text(let text): return key + ": " + LineEscaping.escaped(text)
        case .number(let number): return key + ": " + String(number)
        }
    }
}

extension Array where Element == StatusEntry {
    /// The lines, each ended by a newline.
    public var text: String { map { $0.line + "\n" }.joined() }
}

/// The facts of the process that serves a keychain, as its status says them.
public struct ServingFacts: Sendable, Equatable {
    public enum Mode: String, Sendable {
        /// A device process of the keychain's user.
        case perUser = "per-user"
        /// The keychainfs service, for every user.
        case service

        /// The mode of this process serving `owner`'s keychain: a device
        /// running as another user than the keychain's is the service.
        public init(servingKeychainOf owner: uid_t) {
            self = owner == geteuid() ? .perUser : .service
        }
    }

    /// The class new items get, and whether they may leave the device (the mount's `accessmode`, `migrate`).
    public var accessMode: AccessMode
    public var migrate: Bool
    public var pid: Int32
    public var mode: Mode
    public var keychain: String
    /// What the Secret Service provider is doing (nil: it does not serve).
    public var secretService: String?
    /// The access group a mount shows at its root (nil: the whole keychain).
    public var group: String?
    /// The keychain's files cannot be written (``Device/isReadOnly``).
    public var readOnly: Bool

    public init(
        accessMode: AccessMode, migrate: Bool, pid: Int32, mode: Mode, keychain: String, secretService: String?,
        group: String?, readOnly: Bool = false
    ) {
        self.accessMode = accessMode
        self.migrate = migrate
        self.pid = pid
        self.mode = mode
        self.keychain = keychain
        self.secretService = secretService
        self.group = group
        self.readOnly = readOnly
    }

    /// What this kind of device can and cannot hold (docs/SECURITY.md),
    /// said where a user looks, not only in the docs.
    public static func limits(of mode: Mode) -> String {
        switch mode {
        case .perUser:
            "the keychain's files belong to this user: any program of this user can read them "
                + "(and so the always items), edit or roll back the audit log and the policy; entitlements hold "
                + "only for what goes through the device"
        case .service:
            "the keychain's files belong to the service's account: programs of this user "
                + "reach items only through the device, which decides per program; root and the service's "
                + "account can read everything"
        }
    }

    /// The protocol's eight fields: access mode, migrate (`1`, `0`), pid,
    /// mode, keychain, Secret Service state, group (each empty: none) and
    /// read-only (`1`, `0`).
    package var fields: [String] {
        [
            accessMode.rawValue, migrate ? "1" : "0", String(pid), mode.rawValue, keychain, secretService ?? "",
            group ?? "", readOnly ? "1" : "0"
        ]
    }

    package init?(fields: ArraySlice<String>) {
        let values = Array(fields)
        guard values.count == Self.fieldCount, let accessMode = AccessMode(rawValue: values[0]),
            ["0", "1"].contains(values[1]), let pid = Int32(values[2]), let mode = Mode(rawValue: values[3]),
            ["0", "1"].contains(values[7])
        else { return nil }
        self.init(
            accessMode: accessMode, migrate: values[1] == "1", pid: pid, mode: mode, keychain: values[4],
            secretService: values[5].isEmpty ? nil : values[5], group: values[6].isEmpty ? nil : values[6],
            readOnly: values[7] == "1")
    }

    package static let fieldCount = 8
}

extension DeviceStatus {
    /// Every view of the status: the lock, the lockout and auto-lock, the
    /// process serving it and what its mode allows, how the keys are kept,
    /// the keychain and the group, the Secret Service, who decides. What is
    /// not known (a status from a client's own boot) is left out.
    public func report() -> [StatusEntry] {
        var entries = [
            StatusEntry("state", isLocked ? "locked" : "unlocked"),
            StatusEntry("first-unlock", hasUnlockedSinceBoot ? "yes" : "no")
        ]
        if let serving {
            entries += [
                StatusEntry("accessmode", serving.accessMode.rawValue),
                StatusEntry("migrate", serving.migrate ? "yes" : "no")
            ]
        }
        entries += [
            StatusEntry("passcode", hasPasscode ? "yes" : "no"), StatusEntry("failed-attempts", number: failedAttempts)
        ]
        if retryAfter > 0 { entries.append(StatusEntry("retry-after", number: retryAfter)) }
        entries += [
            StatusEntry("autolock", number: autoLockAfter), StatusEntry("autolock-grace", number: autoLockGrace)
        ]
        if let serving {
            entries += [
                StatusEntry("pid", number: serving.pid), StatusEntry("mode", serving.mode.rawValue),
                StatusEntry("mode-limits", ServingFacts.limits(of: serving.mode))
            ]
        }
        entries += keyProtection?.entries ?? []
        if let serving {
            entries.append(StatusEntry("keychain", serving.keychain))
            if serving.readOnly {
                entries.append(
                    StatusEntry(
                        "read-only",
                        "yes: the keychain's files cannot be written; it is read, every change is refused, wrong "
                            + "passcodes are counted until the device stops, and the audit log records nothing"))
            }
            if let group = serving.group { entries.append(StatusEntry("group", group)) }
            if let bus = serving.secretService { entries.append(StatusEntry("secret-service", bus)) }
        }
        entries += judge?.entries ?? []
        return entries
    }

    /// A keychain no device holds: `state: stopped`, the mode asked of,
    /// and how the keys are kept when the files say (no TPM asked).
    public static func stoppedReport(mode: ServingFacts.Mode, keyProtection: KeyProtection?) -> [StatusEntry] {
        [StatusEntry("state", "stopped"), StatusEntry("mode", mode.rawValue)]
            + (keyProtection.map { [StatusEntry("key-protection", $0.rawValue)] } ?? [])
    }
}

extension PasswordManager {
    /// The status of the device this manager boots, as every view shows
    /// it: the lock, how the keys are kept (asked of the TPM), who decides,
    /// and the serving process's facts (`mode`; the group a mount shows at
    /// its root).
    package func servedStatus(mode: ServingFacts.Mode, group: String? = nil) -> DeviceStatus {
        let device = localDevice
        var status = device.status
        status.keyProtection = device.keyProtection
        status.judge = DeviceJudge.current
        status.serving = ServingFacts(
            accessMode: accessMode, migrate: migrate, pid: getpid(), mode: mode, keychain: device.directory.path,
            secretService: device.secretServiceState, group: group, readOnly: device.isReadOnly)
        return status
    }
}
