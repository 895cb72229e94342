import Foundation
import Testing
@testable import KeychainCore
@testable import KeychainTPM

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
        ("TEAMID.com.example.shared", "empty", .whenUnlocked, [])
    ]

    /// From format 4: an item the Secret Service made, with its details.
    static let detailed = ItemDetails(
        label: "Golden label", contentType: "text/plain",
        attributes: ["xdg:schema": "org.example.Golden", "user": "ada"], created: 1_700_000_000,
        modified: 1_700_000_001)

    static func fixture(_ name: String = "golden-v1") -> String {
        Bundle.module.path(forResource: name, ofType: nil, inDirectory: "Fixtures")!
    }

    @Test(arguments: ["golden-v1", "golden-v2", "golden-v3", "golden-v4"])
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
            #expect(
                try manager.info(forIdentifier: item.identifier, inGroup: item.group)
                    == ItemInfo(protectionClass: item.protectionClass, size: item.value.count))
            #expect(try manager.key(forIdentifier: item.identifier, inGroup: item.group).bytes() == item.value)
        }
        #expect(try manager.identifiers(inGroup: "empty-group") == [])
        if fixture >= "golden-v4" {
            #expect(try manager.details(forIdentifier: "detailed") == Self.detailed)
            #expect(try manager.string(forIdentifier: "detailed") == "detailed-value")
        }
    }

    /// Upgraded to the current format at its first boot, every older
    /// keychain stores details, and boots again with them.
    @Test(arguments: ["golden-v1", "golden-v2", "golden-v3"])
    func everyOlderFormatIsUpgradedToStoreDetails(_ fixture: String) throws {
        let keychain = try TemporaryKeychain(copying: Self.fixture(fixture))
        do {
            let manager = try keychain.manager()
            try manager.localDevice.unlock(passcode: secure(Self.passcode))
            try manager.write(
                secure("v"), identifier: "with-details", group: "default", protectionClass: .whenUnlocked,
                details: Self.detailed)
            try manager.register("changed", forIdentifier: "github.com")
        }
        let rebooted = try keychain.manager()
        try rebooted.localDevice.unlock(passcode: secure(Self.passcode))
        #expect(try rebooted.details(forIdentifier: "with-details") == Self.detailed)
        #expect(try rebooted.string(forIdentifier: "github.com") == "changed")
        #expect(try rebooted.string(forIdentifier: "always") == "always-value")
    }

    /// Writes the fixture: `KEYCHAINFS_WRITE_GOLDEN=DIR swift test --filter writeGoldenKeychain`.
    /// A tool kept beside the test it feeds, not a test: it is skipped unless asked for.
    @Test(.enabled(if: ProcessInfo.processInfo.environment["KEYCHAINFS_WRITE_GOLDEN"] != nil))
    func writeGoldenKeychain() throws {
        let target = KeychainDirectory(path: ProcessInfo.processInfo.environment["KEYCHAINFS_WRITE_GOLDEN"]!)
        try Device.createKeychain(at: target, passcode: secure(Self.passcode), kdf: .interactive, tpm: .declined)
        do {
            let manager = PasswordManager(device: try Device(directory: target))
            try manager.localDevice.unlock(passcode: secure(Self.passcode))
            for item in Self.items {
                try manager.write(
                    SecureBytes(item.value), identifier: item.identifier, group: item.group,
                    protectionClass: item.protectionClass)
            }
            try manager.createGroup("empty-group")
            try manager.write(
                secure("detailed-value"), identifier: "detailed", group: "default", protectionClass: .whenUnlocked,
                details: Self.detailed)
        }
        let db = try SQLiteConnection(path: target.databasePath, create: false)
        try db.execute("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE")
    }
}
