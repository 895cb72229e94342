import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// One open descriptor of `.control`: the status as it was at open, for reads.
final class ControlFile: @unchecked Sendable {
    let status: [UInt8]
    init(status: [UInt8]) { self.status = status }
}

/// A parsed `.control` command (SPEC, "The control file").
enum ControlCommand {
    case lock
    case unlock(SecureBytes?)
    case purge
    case background
    case accessMode(AccessMode)
    case migrate(Bool)

    /// Parses every line of one write; any bad line rejects the whole write
    /// (EINVAL) before anything runs. The passcode goes straight from the
    /// request buffer into secret memory, never through a String.
    static func parse(_ bytes: UnsafeRawBufferPointer) throws(FSError) -> [ControlCommand] {
        var commands: [ControlCommand] = []
        for var line in bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: true) {
            if line.last == UInt8(ascii: "\r") { line = line.dropLast() }
            let unlockWord = Array("unlock".utf8)
            if line.starts(with: unlockWord) {
                let rest = line.dropFirst(unlockWord.count)
                if rest.isEmpty {
                    commands.append(.unlock(nil))
                    continue
                }
                guard rest.first == UInt8(ascii: " "), rest.count > 1 else { throw FSError(EINVAL) }
                let passcode = UnsafeRawBufferPointer(rebasing: rest.dropFirst())
                commands.append(.unlock(try core { () throws(KeychainError) in try SecureBytes(copying: passcode) }))
                continue
            }
            guard let text = String(validating: line, as: UTF8.self) else { throw FSError(EINVAL) }
            let words = text.split(separator: " ", omittingEmptySubsequences: true).map(String.init)
            switch (words.first, words.count) {
            case ("lock", 1): commands.append(.lock)
            case ("purge", 1): commands.append(.purge)
            case ("background", 1): commands.append(.background)
            case ("accessmode", 2):
                guard let mode = AccessMode(rawValue: words[1]) else { throw FSError(EINVAL) }
                commands.append(.accessMode(mode))
            case ("migrate", 2):
                guard words[1] == "yes" || words[1] == "no" else { throw FSError(EINVAL) }
                commands.append(.migrate(words[1] == "yes"))
            default:
                throw FSError(EINVAL)
            }
        }
        guard !commands.isEmpty else { throw FSError(EINVAL) }
        return commands
    }
}

extension FileSystem {
    /// The device status as `key: value` lines.
    func statusText() -> [UInt8] {
        let status = manager.device.status
        var lines = [
            "state: \(status.isLocked ? "locked" : "unlocked")",
            "first-unlock: \(status.hasUnlockedSinceBoot ? "yes" : "no")",
            "accessmode: \(manager.accessMode.rawValue)",
            "migrate: \(manager.migrate ? "yes" : "no")",
            "passcode: \(status.hasPasscode ? "yes" : "no")",
            "failed-attempts: \(status.failedAttempts)",
        ]
        if status.retryAfter > 0 { lines.append("retry-after: \(status.retryAfter)") }
        lines.append("pid: \(getpid())")
        // Escaped: a path or name must never forge a status line.
        lines.append("keychain: \(LineEscaping.escaped(manager.device.directory.path))")
        if case .group(let group) = scope { lines.append("group: \(LineEscaping.escaped(group))") }
        return Array((lines.joined(separator: "\n") + "\n").utf8)
    }

    /// Runs the commands of one write to `.control`, then wipes the request
    /// bytes (they may hold a passcode). A wrong passcode or a lockout: EACCES.
    func control(_ request: UnsafeMutableRawBufferPointer) throws(FSError) {
        defer { wipeMemory(request) }
        for command in try ControlCommand.parse(UnsafeRawBufferPointer(request)) {
            switch command {
            case .lock: manager.device.lock()
            case .unlock(let passcode):
                try core { () throws(KeychainError) in try manager.device.unlock(passcode: passcode) }
            case .purge: manager.purge()
            case .background: manager.background()
            case .accessMode(let mode): manager.accessMode = mode
            case .migrate(let migrate): manager.migrate = migrate
            }
        }
    }
}
