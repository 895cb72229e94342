import Foundation
import Synchronization
import TestSupport
import Testing
@testable import KeychainCore
@testable import KeychainTPM
@testable import KeychainSync

/// One device of a circle, in this process: a keychain in a temporary
/// directory, unlocked, with its sync engine.
final class SyncedDevice: @unchecked Sendable {
    static let passcode = "correct horse battery staple"

    let root: String
    let directory: KeychainDirectory
    let manager: PasswordManager
    let engine: SyncEngine
    let name: String

    init(_ name: String, clock: @escaping @Sendable () -> UInt64 = SyncEngine.now) throws {
        self.name = name
        root = try makeTemporaryDirectory("kcfs-sync-\(name)")
        directory = KeychainDirectory(path: root + "/keychain")
        try Device.createKeychain(
            at: directory, passcode: try SecureBytes(Self.passcode), kdf: .insecureFastForTests, tpm: .declined)
        manager = PasswordManager(device: try Device(directory: directory))
        try manager.localDevice.unlock(passcode: try SecureBytes(Self.passcode))
        engine = SyncEngine(manager: manager, keychainPath: directory.path, hostName: name, clock: clock)
    }

    deinit { try? FileManager.default.removeItem(atPath: root) }

    func set(
        _ identifier: String, _ value: String, group: String = "default",
        _ protectionClass: ProtectionClass = .whenUnlocked
    )
        throws
    {
        try manager.write(
            try SecureBytes(value), identifier: identifier, group: group, protectionClass: protectionClass)
    }

    func get(_ identifier: String, group: String = "default") throws -> String? {
        do {
            return try manager.string(forIdentifier: identifier, inGroup: group)
        } catch KeychainError.itemNotFound {
            return nil
        }
    }

    /// Every item as `group/identifier=value (class)`, sorted.
    func contents() throws -> [String] {
        var lines: [String] = []
        for group in try manager.groups() {
            for (identifier, info) in try manager.items(inGroup: group) {
                let value = try manager.string(forIdentifier: identifier, inGroup: group)
                lines.append("\(group)/\(identifier)=\(value) (\(info.protectionClass.name))")
            }
        }
        return lines.sorted()
    }
}

/// Milliseconds that a test moves by hand.
final class TestClock: Sendable {
    private let milliseconds = Mutex<UInt64>(1_795_000_000_000)
    var now: UInt64 { milliseconds.withLock { $0 } }
    func advance(_ delta: UInt64) { milliseconds.withLock { $0 += delta } }
}

/// A bare repository in a temporary directory: the remote.
final class BareRemote: @unchecked Sendable {
    let root: String
    var url: String { root + "/remote.git" }

    init() throws {
        root = try makeTemporaryDirectory("kcfs-remote")
        try git(["init", "--bare", "--quiet", url])
        // A push may start `gc --auto`: in the foreground, so that nothing outlives the test.
        try git(["--git-dir=" + url, "config", "gc.autoDetach", "false"])
    }

    deinit { try? FileManager.default.removeItem(atPath: root) }

    /// Runs git on this repository; its standard output.
    @discardableResult
    func git(_ arguments: [String], in directory: String? = nil, input: Data = Data()) throws -> Data {
        try runGit(arguments, in: directory ?? root, input: input)
    }

    /// The branch's commit.
    func head() throws -> String {
        String(decoding: try git(["--git-dir=" + url, "rev-parse", "refs/heads/keychainfs"]), as: UTF8.self)
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Sets the branch to `commit`, as a remote that rolls back or forges history does.
    func force(_ commit: String) throws {
        try git(["--git-dir=" + url, "update-ref", "refs/heads/keychainfs", commit])
    }

    /// A commit on the branch's head that changes files (nil: removes),
    /// as a remote that edits what it serves does; the branch moves to it.
    func tamper(_ edit: [String: Data?]) throws {
        let work = root + "/work-\(UUID().uuidString)"
        try git(["clone", "--quiet", "--branch", "keychainfs", url, work])
        for (path, contents) in edit {
            if let contents {
                let url = URL(fileURLWithPath: work + "/" + path)
                try FileManager.default.createDirectory(
                    at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
                try contents.write(to: url)
            } else {
                try git(["rm", "--quiet", "-r", path], in: work)
            }
        }
        try git(["add", "-A"], in: work)
        try git(["-c", "user.name=attacker", "-c", "user.email=a@b", "commit", "--quiet", "-m", "x"], in: work)
        try git(["push", "--quiet", "origin", "HEAD:keychainfs"], in: work)
    }

    /// The files of the branch's head, by path.
    func files() throws -> [String: Data] {
        let work = root + "/read-\(UUID().uuidString)"
        try git(["clone", "--quiet", "--branch", "keychainfs", url, work])
        var files: [String: Data] = [:]
        let enumerator = FileManager.default.enumerator(atPath: work)
        while let path = enumerator?.nextObject() as? String {
            guard !path.hasPrefix(".git"), let data = FileManager.default.contents(atPath: work + "/" + path),
                !isDirectory(work + "/" + path)
            else { continue }
            files[path] = data
        }
        try FileManager.default.removeItem(atPath: work)
        return files
    }

    /// Every object of the repository, every version of every file, commits and trees included.
    func everyObject() throws -> Data {
        try git(["--git-dir=" + url, "cat-file", "--batch-all-objects", "--batch", "--unordered"])
    }

    private func isDirectory(_ path: String) -> Bool {
        var directory: ObjCBool = false
        return FileManager.default.fileExists(atPath: path, isDirectory: &directory) && directory.boolValue
    }
}

@discardableResult
func runGit(_ arguments: [String], in directory: String, input: Data = Data()) throws -> Data {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/git")
    process.arguments = ["-c", "protocol.file.allow=always"] + arguments
    process.currentDirectoryURL = URL(fileURLWithPath: directory)
    let output = Pipe(), errors = Pipe(), stdin = Pipe()
    process.standardOutput = output
    process.standardError = errors
    process.standardInput = stdin
    try process.run()
    stdin.fileHandleForWriting.write(input)
    try stdin.fileHandleForWriting.close()
    let data = output.fileHandleForReading.readDataToEndOfFile()
    let message = errors.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    guard process.terminationStatus == 0 else {
        throw GitFailed(arguments: arguments, message: String(decoding: message, as: UTF8.self))
    }
    return data
}

struct GitFailed: Error, CustomStringConvertible {
    let arguments: [String]
    let message: String
    var description: String { "git \(arguments.joined(separator: " ")): \(message)" }
}

/// Expects `body` to fail with `reason`; the sentence.
@discardableResult
func expectFailure(
    _ reason: SyncFailure.Reason, sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void
) -> String {
    do {
        try body()
        Issue.record("expected a failure (\(reason)), got success", sourceLocation: sourceLocation)
        return ""
    } catch let error as SyncFailure {
        #expect(error.reason == reason, "\(error.sentence)", sourceLocation: sourceLocation)
        return error.sentence
    } catch {
        Issue.record("expected a failure (\(reason)), got \(error)", sourceLocation: sourceLocation)
        return ""
    }
}
