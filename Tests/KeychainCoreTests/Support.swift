import Foundation
import Synchronization
import TestSupport
import Testing
@testable import KeychainCore
@testable import KeychainTPM

/// A keychain in a fresh temporary directory, removed when the test ends.
final class TemporaryKeychain: @unchecked Sendable {
    static let passcode = "correct horse battery staple"

    let root: String
    let directory: KeychainDirectory
    let clock = ManualClock()

    init(passcode: String? = TemporaryKeychain.passcode, kdf: KDFParameters = .insecureFastForTests) throws {
        root = try makeTemporaryDirectory()
        directory = KeychainDirectory(path: root + "/keychain")
        try Device.createKeychain(
            at: directory, passcode: passcode.map { try SecureBytes($0) }, kdf: kdf, tpm: .declined)
    }

    /// Copies a keychain fixture into a fresh temporary directory.
    init(copying fixture: String) throws {
        root = try makeTemporaryDirectory()
        directory = KeychainDirectory(path: root + "/keychain")
        try FileManager.default.copyItem(atPath: fixture, toPath: directory.path)
        // git keeps no modes: make the copy as private as a real keychain.
        chmod(directory.path, 0o700)
        for file in try FileManager.default.contentsOfDirectory(atPath: directory.path) {
            chmod(directory.path + "/" + file, 0o600)
        }
    }

    deinit { try? FileManager.default.removeItem(atPath: root) }

    func device(policy: LockoutPolicy = .iOS) throws -> Device {
        let clock = self.clock
        return try Device(directory: directory, policy: policy, clock: { clock.now })
    }

    func manager(policy: LockoutPolicy = .iOS) throws -> PasswordManager {
        PasswordManager(device: try device(policy: policy))
    }

    /// A raw connection to the database, to play the attacker who edits the file.
    func withRawDatabase(_ body: (SQLiteConnection) throws -> Void) throws {
        let db = try SQLiteConnection(path: directory.databasePath, create: false)
        try body(db)
    }
}

/// Wall-clock seconds that a test moves by hand.
final class ManualClock: Sendable {
    private let seconds = Mutex<Int64>(1_800_000_000)
    var now: Int64 { seconds.withLock { $0 } }
    func advance(_ delta: Int64) { seconds.withLock { $0 += delta } }
}

func secure(_ string: String) throws -> SecureBytes { try SecureBytes(string) }

/// SQL that changes byte `position` (1-based) of the meta record `key`,
/// whatever it held (0xff becomes 0xfe, anything else 0xff): an attacker's edit.
func changingByte(_ position: Int, ofMetaRecord key: String) -> String {
    """
    UPDATE meta SET value = substr(value, 1, \(position - 1))
        || (CASE WHEN substr(value, \(position), 1) = x'ff' THEN x'fe' ELSE x'ff' END) || substr(value, \(position + 1))
    WHERE key = '\(key)'
    """
}

/// Expects `body` to throw exactly `expected`.
func expectError<R>(
    _ expected: KeychainError, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () throws -> R
) {
    do {
        let result = try body()
        Issue.record("expected \(expected), got a result: \(result)", sourceLocation: sourceLocation)
    } catch let error as KeychainError {
        #expect(error == expected, sourceLocation: sourceLocation)
    } catch {
        Issue.record("expected \(expected), got \(error)", sourceLocation: sourceLocation)
    }
}

extension Data {
    init(hex: String) {
        var bytes: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            bytes.append(UInt8(hex[index..<next], radix: 16)!)
            index = next
        }
        self.init(bytes)
    }
}
