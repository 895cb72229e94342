import Foundation
import Testing
@testable import KeychainCore

/// Encrypted backups, as iOS's: migratable items only, under a backup password.
@Suite struct BackupTests {
    static let password = "backup password"
    static let items: [(group: String, identifier: String, protectionClass: ProtectionClass, value: [UInt8])] = [
        ("default", "github.com", .whenUnlocked, Array("ghp_token".utf8)),
        ("default", "afu", .afterFirstUnlock, Array("afu-value".utf8)),
        ("TEAMID.com.example.shared", "binary", .always, (0...255).map { UInt8($0) }),
        ("TEAMID.com.example.shared", "empty", .whenUnlocked, []),
        ("default", "device-only", .whenUnlockedThisDeviceOnly, Array("stays".utf8)),
        ("default", "always-device-only", .alwaysThisDeviceOnly, Array("stays too".utf8))
    ]

    /// A keychain holding `items`, unlocked.
    static func source() throws -> (TemporaryKeychain, PasswordManager) {
        let keychain = try TemporaryKeychain()
        let manager = try keychain.manager()
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        for item in items {
            try manager.write(
                SecureBytes(item.value), identifier: item.identifier, group: item.group,
                protectionClass: item.protectionClass)
        }
        return (keychain, manager)
    }

    /// Another device: its own device secret and passcode.
    static func target() throws -> (TemporaryKeychain, PasswordManager) {
        let keychain = try TemporaryKeychain(passcode: "another device")
        let manager = try keychain.manager()
        try manager.localDevice.unlock(passcode: secure("another device"))
        return (keychain, manager)
    }

    static func backup(_ manager: PasswordManager) throws -> [UInt8] {
        try manager.backup(password: secure(password), kdf: .insecureFastForTests).bytes
    }

    /// A backup from before names had to be NFC may hold one that is not:
    /// restoring it is refused as a whole, before anything is written.
    @Test func aBackupHoldingANameNotInNFCIsRefusedAndWritesNothing() throws {
        let items = [
            BackupItem(group: "default", identifier: "plain", protectionClass: .whenUnlocked, value: try secure("one")),
            BackupItem(
                group: "default", identifier: "cafe\u{301}", protectionClass: .whenUnlocked, value: try secure("two"))
        ]
        let bytes = try BackupFile.encode(items, password: secure(Self.password), kdf: .insecureFastForTests)
        let (_, target) = try Self.target()
        for policy in [RestoreConflictPolicy.refuse, .keep, .overwrite] {
            expectError(.param) { _ = try target.restore(bytes, password: secure(Self.password), policy: policy) }
        }
        #expect(try target.identifiers() == [])
    }

    @Test func migratableItemsMoveToAnotherDeviceWithTheirClassesAndThisDeviceOnlyOnesNever() throws {
        let (_, source) = try Self.source()
        let bytes = try Self.backup(source)
        var names: [String] = []
        try BackupFile.decode(bytes, password: secure(Self.password)) { names.append($0.group + "/" + $0.identifier) }
        #expect(
            names.sorted() == [
                "TEAMID.com.example.shared/binary", "TEAMID.com.example.shared/empty",
                "default/afu", "default/github.com"
            ])
        let (_, target) = try Self.target()
        let summary = try target.restore(bytes, password: secure(Self.password), policy: .refuse)
        #expect(summary == RestoreSummary(added: 4))
        for item in Self.items {
            if item.protectionClass.isMigratable {
                #expect(
                    try target.info(forIdentifier: item.identifier, inGroup: item.group)?.protectionClass
                        == item.protectionClass)
                #expect(try target.key(forIdentifier: item.identifier, inGroup: item.group).bytes() == item.value)
            } else {
                #expect(try target.info(forIdentifier: item.identifier, inGroup: item.group) == nil)
            }
        }
        // Again: nothing changes.
        #expect(
            try target.restore(bytes, password: secure(Self.password), policy: .refuse) == RestoreSummary(unchanged: 4))
    }

    /// Items the Secret Service made travel with their label, attributes and
    /// times (backup version 2); restoring twice changes nothing.
    @Test func detailsTravelWithTheirItems() throws {
        let (keychain, source) = try Self.source()
        keychain.clock.advance(500)
        let details = ItemDetails(
            label: "Mail password", contentType: "text/plain",
            attributes: ["xdg:schema": "org.gnome.Evolution", "user": "ada@example.org"])
        try source.write(
            secure("imap-pw"), identifier: "Mail password", group: "default", protectionClass: .whenUnlocked,
            details: details)
        let stored = try #require(try source.details(forIdentifier: "Mail password"))
        let bytes = try Self.backup(source)
        let (_, target) = try Self.target()
        #expect(try target.restore(bytes, password: secure(Self.password), policy: .refuse).added == 5)
        #expect(try target.details(forIdentifier: "Mail password") == stored)
        #expect(try target.string(forIdentifier: "Mail password") == "imap-pw")
        #expect(try target.details(forIdentifier: "github.com") == nil)
        #expect(
            try target.restore(bytes, password: secure(Self.password), policy: .refuse) == RestoreSummary(unchanged: 5))
        // Other details for the same name are a conflict, as another value is.
        try target.write(
            secure("imap-pw"), identifier: "Mail password", group: "default", protectionClass: .whenUnlocked,
            details: ItemDetails(label: "changed", attributes: [:]))
        let refused = try target.restore(bytes, password: secure(Self.password), policy: .refuse)
        #expect(!refused.applied && refused.conflicts == ["default/Mail password"])
    }

    @Test func conflictsAreRefusedKeptOrOverwrittenAsAsked() throws {
        let (_, source) = try Self.source()
        let bytes = try Self.backup(source)
        let (_, target) = try Self.target()
        try target.register("local", forIdentifier: "github.com")
        try target.write(secure("afu-value"), identifier: "afu", group: "default", protectionClass: .always)
        let refused = try target.restore(bytes, password: secure(Self.password), policy: .refuse)
        #expect(!refused.applied && refused.conflicts == ["default/afu", "default/github.com"])
        #expect(try target.identifiers(inGroup: "default") == ["afu", "github.com"])  // nothing written
        let kept = try target.restore(bytes, password: secure(Self.password), policy: .keep)
        #expect(kept.kept == 2 && kept.added == 2)
        #expect(try target.string(forIdentifier: "github.com") == "local")
        let overwritten = try target.restore(bytes, password: secure(Self.password), policy: .overwrite)
        #expect(overwritten.replaced == 2 && overwritten.unchanged == 2)
        #expect(try target.string(forIdentifier: "github.com") == "ghp_token")
        #expect(try target.info(forIdentifier: "afu")?.protectionClass == .afterFirstUnlock)
    }

    @Test func wrongPasswordsAndCutAlteredOrForeignFilesChangeNothing() throws {
        let (sourceKeychain, source) = try Self.source()
        let bytes = try Self.backup(source)
        let (_, target) = try Self.target()
        func restoring(_ candidate: [UInt8], password: String = Self.password) -> KeychainError? {
            do {
                _ = try target.restore(candidate, password: secure(password), policy: .overwrite)
                return nil
            } catch let error as KeychainError {
                return error
            } catch {
                return .io
            }
        }
        #expect(restoring(bytes, password: "wrong") == .authFailed)
        for cut in [0, 7, 40, 99, bytes.count / 2, bytes.count - 1] {
            #expect(restoring(Array(bytes.prefix(cut))) != nil, "cut at \(cut)")
        }
        for position in stride(from: 8, to: bytes.count, by: max(1, bytes.count / 40)) {
            var altered = bytes
            altered[position] ^= 0x01
            let error = restoring(altered)
            #expect(
                error == .decode || error == .authFailed || error == .param,
                "byte \(position): \(String(describing: error))")
        }
        #expect(restoring(bytes + [0]) == .decode)
        #expect(restoring(Array("not a backup at all, just text".utf8)) == .param)
        // A file that is not a backup is refused from its first bytes, before it is read.
        #expect(throws: KeychainError.param) { try BackupFile.load(from: sourceKeychain.directory.databasePath) }
        #expect(try target.identifiers(inGroup: "default") == [])
    }

    /// A backup's header names its Argon2id cost, and is read before the
    /// password is checked: a file asking for more than `backup` writes
    /// (MODERATE, 3 passes over 256 MiB) is refused as altered, at once,
    /// with no hashing run. Before, up to 16 passes over 4 GiB were run at
    /// the file author's choice, in the service for any user's `restore`.
    @Test func aBackupAskingForMoreHashingThanBackupWritesIsRefusedBeforeAnyIsRun() throws {
        let (_, target) = try Self.target()
        func header(opsLimit: UInt64, memLimit: UInt64) -> [UInt8] {
            var writer = ByteWriter()
            writer.append(Array("KCFSBAK1".utf8))
            writer.append(UInt8(2))
            writer.append(opsLimit)
            writer.append(memLimit)
            writer.append([UInt8](repeating: 7, count: 16 + 32))
            return writer.bytes
        }
        // More memory, more passes, or both: each refused as altered, where a
        // hashing run would have said "wrong password" (authFailed) after it.
        for (ops, mem) in [(3, UInt64(512) << 20), (4, UInt64(256) << 20), (16, UInt64(8192))] {
            let crafted = header(opsLimit: UInt64(ops), memLimit: mem)
            #expect(crafted.count == 73)
            #expect(throws: KeychainError.decode, "\(ops) passes over \(mem) bytes") {
                _ = try target.restore(crafted, password: secure("wrong"), policy: .overwrite)
            }
        }
        #expect(BackupFile.costCeiling == .moderate)
        #expect(try target.identifiers(inGroup: "default") == [])
    }

    /// The device restores from its own copy of the file a client passed,
    /// read a record at a time: the client changing the file meanwhile
    /// changes nothing, and a file that is not a backup is not copied.
    @Test func aRestoreReadsAPrivateCopyOfThePassedFile() throws {
        let (_, source) = try Self.source()
        let (keychain, target) = try Self.target()
        let path = keychain.root + "/passed.kcbak", directory = keychain.directory.path
        try Data(try Self.backup(source)).write(to: URL(fileURLWithPath: path))
        let opened = open(path, O_RDONLY)
        try #require(opened >= 0)
        let file = FileDescriptor(opened)!
        let before = try FileManager.default.contentsOfDirectory(atPath: directory)
        let copy = try BackupFileCopy(of: file.borrowed, name: path, in: directory)
        // The copy has no name in the directory (O_TMPFILE).
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == before)
        // The client empties and rewrites its file after passing it.
        try Data("not a backup any more".utf8).write(to: URL(fileURLWithPath: path))
        let summary = try target.restore(copy, password: secure(Self.password), policy: .refuse)
        #expect(summary.added == Self.items.filter { $0.protectionClass.isMigratable }.count)
        let reopened = open(path, O_RDONLY)
        try #require(reopened >= 0)
        let foreign = FileDescriptor(reopened)!
        #expect(throws: KeychainError.param) { try BackupFileCopy(of: foreign.borrowed, name: path, in: directory) }
    }

    @Test func aLockedKeychainMakesNoBackup() throws {
        let (_, source) = try Self.source()
        try source.lock()
        expectError(.interactionNotAllowed) { try Self.backup(source) }
    }

    /// Every later version must restore this file (docs/FORMAT.md, "Backups").
    @Test func theGoldenVersion1BackupStillRestores() throws {
        let path = Bundle.module.path(forResource: "golden-backup-v1", ofType: "kcbak", inDirectory: "Fixtures")!
        let (_, target) = try Self.target()
        let summary = try target.restore(
            try BackupFile.load(from: path), password: secure(Self.password), policy: .refuse)
        #expect(summary.added == 4)
        for item in Self.items where item.protectionClass.isMigratable {
            #expect(try target.key(forIdentifier: item.identifier, inGroup: item.group).bytes() == item.value)
        }
    }

    /// Writes the golden backup: `KEYCHAINFS_WRITE_GOLDEN_BACKUP=FILE swift test --filter writeGoldenBackup`.
    @Test(.enabled(if: ProcessInfo.processInfo.environment["KEYCHAINFS_WRITE_GOLDEN_BACKUP"] != nil))
    func writeGoldenBackup() throws {
        let (_, source) = try Self.source()
        try BackupFile.save(
            try Self.backup(source), to: ProcessInfo.processInfo.environment["KEYCHAINFS_WRITE_GOLDEN_BACKUP"]!)
    }
}
