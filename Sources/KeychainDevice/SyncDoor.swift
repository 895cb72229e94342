import KeychainCore
import KeychainProtocol
import KeychainSync
#if canImport(Glibc)
import Glibc
#endif

/// A per-user device's sync (docs/SYNC.md): the engine that answers
/// `keychainfs sync`, and the schedule that syncs by itself after changes,
/// at unlock and periodically.
final class KeychainSyncDoor: Sendable {
    private let engine: SyncEngine
    private let schedule: SyncSchedule

    init(manager: PasswordManager, keychainPath: String) {
        engine = SyncEngine(manager: manager, keychainPath: keychainPath, hostName: Self.hostName())
        schedule = SyncSchedule(
            engine: engine, device: manager.localDevice, intervalMilliseconds: Self.interval() * 1000)
    }

    /// How often the device looks for the other machines' changes:
    /// `KEYCHAINFS_SYNC_INTERVAL` seconds (1 to 86400) in its environment,
    /// else 15 minutes (docs/SYNC.md, "When it syncs").
    static func interval() -> Int64 {
        guard let text = getenv("KEYCHAINFS_SYNC_INTERVAL").map({ String(cString: $0) }), let seconds = Int64(text),
            (1...86_400).contains(seconds)
        else { return 900 }
        return seconds
    }

    /// The machine's name, as the other devices show this one.
    static func hostName() -> String {
        var buffer = [UInt8](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return "a device" }
        let name = String(decoding: buffer.prefix { $0 != 0 }, as: UTF8.self)
        return name.isEmpty ? "a device" : String(name.prefix(64))
    }

    func answer(_ request: SyncRequest) -> DeviceAnswer {
        do throws(SyncFailure) {
            switch request {
            case .start(let remote, let groups):
                let started = try engine.create(remote: remote, groups: groups)
                return .success(SyncRecoveryKey(recoveryKey: started.recoveryKey))
            case .joinWithRecoveryKey(let remote, let key, let groups):
                return .success(Self.summary(try engine.join(remote: remote, recoveryKey: key, groups: groups)))
            case .join(let remote, let groups):
                switch try engine.join(remote: remote, groups: groups) {
                case .asked: return .success(JoinStep.asked)
                case .code(let code): return .success(JoinStep.code(code))
                case .joined(let report): return .success(JoinStep.joined(Self.summary(report)))
                }
            case .cancelJoin:
                try engine.cancelJoin()
                return .success(Done())
            case .confirmJoin(let code):
                try engine.confirmJoin(code: code)
                return .success(Done())
            case .now:
                return .success(Self.summary(try schedule.roundNow()))
            case .status:
                return .success(SyncStatusLines(engine.status().map { SyncStatusLine($0.0, $0.1) }))
            case .joinRequests(let device):
                let named = try device.map { (text) throws(SyncFailure) in try Self.device(text) }
                return .success(
                    JoinAskers(try engine.joinRequests(answering: named).map { SyncStatusLine($0.idText, $0.name) }))
            case .joinCode(let device):
                return .success(JoinCode(try engine.joinCode(for: try Self.device(device))))
            case .approve(let device, let code):
                try engine.approve(try Self.device(device), code: code)
                schedule.ask(after: 0)
                return .success(Done())
            case .remove(let device):
                return .success(SyncRecoveryKey(recoveryKey: try engine.remove(device).recoveryKey))
            case .leave:
                try engine.leave()
                return .success(Done())
            case .groups(let set):
                if let set {
                    _ = try engine.setGroups(set)
                    schedule.ask(after: 0)
                }
                return .success(SyncStatusLines([SyncStatusLine("groups", engine.groupsText)]))
            }
        } catch {
            return .failure(Self.refusal(error))
        }
    }

    private static func device(_ text: String) throws(SyncFailure) -> UInt64 {
        guard let id = SyncEngine.deviceID(text) else {
            throw SyncFailure(.badInput, "\(text) is not a device id (16 hexadecimal digits, as `sync approve` shows)")
        }
        return id
    }

    private static func summary(_ report: SyncReport) -> SyncSummary {
        SyncSummary(received: report.received, sent: report.sent, waiting: report.waiting, conflicts: report.conflicts)
    }

    /// A failure as the command line reports it: "locked" stays "locked"
    /// (exit 3); a remote that failed or was refused is an I/O problem; a bad argument a parameter one.
    private static func refusal(_ failure: SyncFailure) -> DeviceRefusal {
        switch failure.reason {
        case .locked: return .keychain(.interactionNotAllowed, failure.sentence)
        case .badInput: return .keychain(.param, failure.sentence)
        case .notInCircle: return .keychain(.itemNotFound, failure.sentence)
        case .alreadyInCircle: return .keychain(.duplicateItem, failure.sentence)
        case .store(let error): return .keychain(error, failure.sentence)
        case .remote: return .system(EIO, failure.sentence)
        case .refused: return .system(EPROTO, failure.sentence)
        case .removed: return .system(EACCES, failure.sentence)
        }
    }
}
