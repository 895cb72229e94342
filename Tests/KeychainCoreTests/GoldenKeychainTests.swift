import Foundation
import Testing
@testable import KeychainCore

/// A keychain written by each on-disk format version, committed with its
/// passcode: every later version must still open them and read every item
/// (gocryptfs tests/example_filesystems). Format 1 is upgraded on its first boot.
@Suite struct GoldenKeychainTests {
    static let passcode = "golden-passcode-1234"
    static let binary = (0...255).map { UInt8($0) }
    static let items: [(group: String, identifier: String, protectionClass: ProtectionClass, value: [UInt8])] = [
        ("default", "github.com", .whenUnlocked, Array("ghp_golden_whenUnlocked".utf8)),
        ("default", "afu", .afterFirstUnlock, Array("afu-value".utf8)),
        ("default", "always", .always, Array("always-value".utf8)),
        ("TEAMID.com.example.shared", "db-password", .whenUnlockedThisDeviceOnly, Array("db-secret\n".utf8)),
        ("TEAMID.com.example.shared", "afu-tdo", .afterFirstUnlockThisDeviceOnly, Array("afu-tdo-value".utf8)),
        ("TEAMID.com.example.shared", "always-tdo", .alwaysThisDeviceOnly, binary),
        ("TEAMID.com.example.shared", "empty", .whenUnlocked, []),
    ]

    static func fixture(_ name: String = "golden-v1") -> String {
        Bundle.module.path(forResource: name, ofType: nil, inDirectory: "Fixtures")!
    }

    @Test(arguments: ["golden-v1", "golden-v2"])
    func everyFormatVersionStillOpensAndReadsEveryItem(_ fixture: String) throws {
        let keychain = try TemporaryKeychain(copying: Self.fixture(fixture))
        let manager = try keychain.manager()
        #expect(try manager.groups() == ["TEAMID.com.example.shared", "default", "empty-group"])
        // Before the first unlock only the `always` classes read.
        #expect(try manager.key(forIdentifier: "always").bytes() == Array("always-value".utf8))
        expectError(.interactionNotAllowed) { try manager.key(forIdentifier: "afu") }
        expectError(.authFailed) { try manager.localDevice.unlock(passcode: secure("not the passcode")) }
        try manager.localDevice.unlock(passcode: secure(Self.passcode))
        for item in Self.items {
            #expect(try manager.info(forIdentifier: item.identifier, inGroup: item.group)
                    == ItemInfo(protectionClass: item.protectionClass, size: item.value.count))
            #expect(try manager.key(forIdentifier: item.identifier, inGroup: item.group).bytes() == item.value)
        }
        #expect(try manager.identifiers(inGroup: "empty-group") == [])
    }

    /// Writes the fixture: `KEYCHAINFS_WRITE_GOLDEN=DIR swift test --filter writeGoldenKeychain`.
    /// A tool kept beside the test it feeds, not a test: it is skipped unless asked for.
    @Test(.enabled(if: ProcessInfo.processInfo.environment["KEYCHAINFS_WRITE_GOLDEN"] != nil))
    func writeGoldenKeychain() throws {
        let target = KeychainDirectory(path: ProcessInfo.processInfo.environment["KEYCHAINFS_WRITE_GOLDEN"]!)
        try Device.createKeychain(at: target, passcode: secure(Self.passcode), kdf: .interactive)
        do {
            let manager = PasswordManager(device: try Device(directory: target))
            try manager.localDevice.unlock(passcode: secure(Self.passcode))
            for item in Self.items {
                try manager.write(SecureBytes(item.value), identifier: item.identifier, group: item.group,
                                  protectionClass: item.protectionClass)
            }
            try manager.createGroup("empty-group")
        }
        let db = try SQLiteConnection(path: target.databasePath, create: false)
        try db.execute("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE")
    }
}
