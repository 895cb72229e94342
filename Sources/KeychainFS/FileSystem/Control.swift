import KeychainCore
import KeychainProtocol
#if canImport(Glibc)
import Glibc
#endif

/// One open descriptor of `.control`: the status as it was at open, for reads.
final class ControlFile: @unchecked Sendable {
    let status: [UInt8]
    init(status: [UInt8]) { self.status = status }
}

/// `.control`'s commands (docs/FILESYSTEM.md, "`.control`"): each line is
/// one ``DeviceStateRequest``, answered by the core as the socket's are.
enum ControlCommand {
    /// The largest write parsed: the kernel delivers a write(2) of up to
    /// this size as one request (it splits only writes larger than a
    /// request, at least 124 KiB), so "every line runs or none" holds for
    /// the whole write. A larger one arrives in pieces that cannot be told
    /// apart from separate writes: it is refused whole (EINVAL).
    static let maximumWrite = 64 << 10
    /// The longest line (a passcode line included).
    static let maximumLine = 4096

    /// Parses every line of one write; any bad line rejects the whole write
    /// (EINVAL) before anything runs. Lines are compared as bytes and never
    /// become a String: a rejected line may hold a passcode (" unlock PW",
    /// "UNLOCK PW"), which goes straight from the request buffer into secret
    /// memory when the line is a valid unlock, and nowhere otherwise.
    static func parse(_ bytes: UnsafeRawBufferPointer) throws(Errno) -> [DeviceStateRequest] {
        guard bytes.count <= maximumWrite else { throw Errno(EINVAL) }
        var commands: [DeviceStateRequest] = []
        for var line in bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: true) {
            if line.last == UInt8(ascii: "\r") { line = line.dropLast() }
            guard line.count <= maximumLine else { throw Errno(EINVAL) }
            commands.append(try parseLine(line))
        }
        guard !commands.isEmpty else { throw Errno(EINVAL) }
        return commands
    }

    private static func parseLine(_ line: Slice<UnsafeRawBufferPointer>) throws(Errno) -> DeviceStateRequest {
        let space = line.firstIndex(of: UInt8(ascii: " ")) ?? line.endIndex
        let word = line[line.startIndex..<space]
        if word.elementsEqual("unlock".utf8) {
            // The passcode is everything after the first space, spaces included.
            guard space < line.endIndex else { return .unlock(passcode: nil) }
            let passcode = UnsafeRawBufferPointer(rebasing: line[line.index(after: space)...])
            guard !passcode.isEmpty else { throw Errno(EINVAL) }
            return .unlock(passcode: try core { () throws(KeychainError) in try SecureBytes(copying: passcode) })
        }
        let arguments = line[space...].split(separator: UInt8(ascii: " "), omittingEmptySubsequences: true)
        switch (arguments.count, word) {
        case (0, _) where word.elementsEqual("lock".utf8): return .lock
        case (0, _) where word.elementsEqual("purge".utf8): return .purge
        case (0, _) where word.elementsEqual("background".utf8): return .background
        case (1, _) where word.elementsEqual("accessmode".utf8):
            guard let mode = AccessMode.allCases.first(where: { arguments[0].elementsEqual($0.rawValue.utf8) }) else {
                throw Errno(EINVAL)
            }
            return .accessMode(mode)
        case (1, _) where word.elementsEqual("autolock".utf8):
            return .autoLock(after: try seconds(arguments[0]), grace: nil)
        case (1, _) where word.elementsEqual("autolock-grace".utf8):
            return .autoLock(after: nil, grace: try seconds(arguments[0]))
        case (1, _) where word.elementsEqual("migrate".utf8):
            if arguments[0].elementsEqual("yes".utf8) { return .migrate(true) }
            if arguments[0].elementsEqual("no".utf8) { return .migrate(false) }
            throw Errno(EINVAL)
        default:
            throw Errno(EINVAL)
        }
    }

    /// A duration (``Device/autoLockSeconds(_:)``); EINVAL for anything else.
    static func seconds(_ text: Slice<UnsafeRawBufferPointer>) throws(Errno) -> Int {
        guard let seconds = Device.autoLockSeconds(text) else { throw Errno(EINVAL) }
        return seconds
    }
}

extension FileSystem {
    /// The device status as `key: value` lines: the report every view
    /// shows (``DeviceStatus/report()``), with this mount's group.
    func statusText() -> [UInt8] {
        let status = manager.servedStatus(mode: ServingFacts.Mode(servingKeychainOf: owner.uid), group: scope.group)
        return Array(status.report().text.utf8)
    }

    /// Runs the commands of one write to `.control`, then wipes the request
    /// bytes (they may hold a passcode). A wrong passcode or a lockout: EACCES.
    func control(_ request: UnsafeMutableRawBufferPointer, caller: ProcessIdentity) throws(Errno) {
        defer { wipeMemory(request) }
        let mode = ServingFacts.Mode(servingKeychainOf: owner.uid)
        for command in try ControlCommand.parse(UnsafeRawBufferPointer(request)) {
            _ = try core { () throws(KeychainError) in
                try manager.answer(command, by: { caller.auditSubject }) { _ in
                    manager.servedStatus(mode: mode, group: scope.group)
                }
            }
        }
    }
}
