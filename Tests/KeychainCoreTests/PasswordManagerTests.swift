import Glibc
import Testing
@testable import KeychainCore
@testable import KeychainTPM

@Suite struct PasswordManagerTests {
    func unlockedManager(_ keychain: TemporaryKeychain) throws -> PasswordManager {
        let manager = try keychain.manager()
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        return manager
    }

    /// The seed scenario: a default item is unreadable while locked, and
    /// registering it again with access mode `always` makes it readable.
    @Test func seedScenarioLockedReadFailsUntilRegisteredAsAlways() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.register("secret", forIdentifier: "manager")
        manager.localDevice.lock()
        expectError(.interactionNotAllowed) { try manager.key(forIdentifier: "manager") }
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        manager.accessMode = .always
        try manager.register("secret", forIdentifier: "manager")
        manager.localDevice.lock()
        #expect(try manager.string(forIdentifier: "manager") == "secret")
        #expect(try manager.info(forIdentifier: "manager")?.protectionClass == .always)
    }

    @Test func lockedIsNeverReportedAsAbsentAndAbsentIsNeverReportedAsLocked() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.register("x", forIdentifier: "present")
        manager.localDevice.lock()
        expectError(.interactionNotAllowed) { try manager.key(forIdentifier: "present") }
        expectError(.interactionNotAllowed) { try manager.validKey("x", forIdentifier: "present") }
        expectError(.itemNotFound) { try manager.key(forIdentifier: "absent") }
        #expect(try manager.validKey(nil as String?, forIdentifier: "present"))
        #expect(try !manager.validKey(nil as String?, forIdentifier: "absent"))
    }

    /// SSKeychain's bug: an update while locked must not lose the old value.
    @Test func writeWhileLockedFailsAndKeepsTheOldValue() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.register("old", forIdentifier: "item")
        manager.localDevice.lock()
        expectError(.interactionNotAllowed) { try manager.register("new", forIdentifier: "item") }
        // Even a class whose key is available cannot overwrite a locked item.
        manager.accessMode = .always
        expectError(.interactionNotAllowed) { try manager.register("new", forIdentifier: "item") }
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        #expect(try manager.string(forIdentifier: "item") == "old")
        #expect(try manager.info(forIdentifier: "item")?.protectionClass == .whenUnlocked)
    }

    @Test func registerReplacesTheValueAndAppliesTheCurrentSettings() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.register("one", forIdentifier: "item", inGroup: "TEAMID.com.example.shared")
        manager.accessMode = .afterFirstUnlock
        manager.migrate = false
        try manager.register("two", forIdentifier: "item", inGroup: "TEAMID.com.example.shared")
        #expect(try manager.string(forIdentifier: "item", inGroup: "TEAMID.com.example.shared") == "two")
        #expect(
            try manager.info(forIdentifier: "item", inGroup: "TEAMID.com.example.shared")?.protectionClass
                == .afterFirstUnlockThisDeviceOnly)
        #expect(try manager.groups() == ["TEAMID.com.example.shared", "default"])
    }

    @Test func settingsStartAsWhenUnlockedAndMigratable() throws {
        let keychain = try TemporaryKeychain()
        let manager = try keychain.manager()
        #expect(manager.accessMode == .whenUnlocked)
        #expect(manager.migrate)
        #expect(manager.classForNewWrites == .whenUnlocked)
    }

    @Test func valuesAreByteExactIncludingEmptyAndBinary() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        let binary = (0...255).map { UInt8($0) } + [0, 0, 10]
        try manager.register(SecureBytes(binary), forIdentifier: "binary")
        try manager.register(SecureBytes([]), forIdentifier: "empty")
        try manager.register("with newline\n", forIdentifier: "text")
        manager.purge()
        #expect(try manager.key(forIdentifier: "binary").bytes() == binary)
        #expect(try manager.key(forIdentifier: "empty").count == 0)
        #expect(try manager.string(forIdentifier: "text") == "with newline\n")
        #expect(try manager.info(forIdentifier: "binary")?.size == binary.count)
    }

    @Test func aValueOfOneMebibyteFitsAndOneByteMoreIsRefusedKeepingTheOldValue() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        let limit = ItemLimits.maximumValueSize
        try manager.register(SecureBytes([UInt8](repeating: 7, count: limit)), forIdentifier: "big")
        #expect(try manager.info(forIdentifier: "big")?.size == limit)
        try manager.register("small", forIdentifier: "item")
        expectError(.valueTooLarge) {
            try manager.register(SecureBytes([UInt8](repeating: 1, count: limit + 1)), forIdentifier: "item")
        }
        #expect(try manager.string(forIdentifier: "item") == "small")
    }

    @Test(arguments: [
        "", ".", "..", ".control", ".events", "a//b", "/lead", "trail/", "a/../b", "a/./b", "nul\0byte", "new\nline",
        "tab\there", "bell\u{07}",
        "del\u{7F}", "c1\u{85}control", "x\nstate: unlocked\nkeychain: elsewhere"
    ])
    func badNamesAreRefusedWithParam(_ name: String) throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        expectError(.param) { try manager.register("v", forIdentifier: name) }
        expectError(.param) { try manager.register("v", forIdentifier: "ok", inGroup: name) }
        #expect(try manager.identifiers() == [])
    }

    /// pass's names: an identifier may be names joined by `/` (a folder in
    /// a mount), a group may not; an item and a folder never share a name.
    @Test func anIdentifierMayHoldFoldersAndNeverSharesANameWithOne() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.register("imap", forIdentifier: "work/imap", inGroup: "email")
        #expect(try manager.string(forIdentifier: "work/imap", inGroup: "email") == "imap")
        expectError(.param) { try manager.register("v", forIdentifier: "x", inGroup: "a/b") }
        expectError(.nameConflict) { try manager.register("v", forIdentifier: "work", inGroup: "email") }
        expectError(.nameConflict) { try manager.register("v", forIdentifier: "work/imap/deeper", inGroup: "email") }
        // Beside it, and its own replacement, are fine; a name that only starts alike is another name.
        try manager.register("smtp", forIdentifier: "work/smtp", inGroup: "email")
        try manager.register("imap2", forIdentifier: "work/imap", inGroup: "email")
        try manager.register("w", forIdentifier: "work-notes", inGroup: "email")
        expectError(.nameConflict) { try manager.renameKey(forIdentifier: "work-notes", to: "work", inGroup: "email") }
        #expect(try manager.identifiers(inGroup: "email").sorted() == ["work-notes", "work/imap", "work/smtp"])
    }

    @Test(arguments: ["TEAMID.com.example.shared", "naïve", "日本語", "space in name", "¡exclamación!", "emoji 🔑"])
    func printableUnicodeNamesAreAccepted(_ name: String) throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.register("v", forIdentifier: name, inGroup: name)
        #expect(try manager.identifiers(inGroup: name) == [name])
    }

    /// Canonically equivalent spellings are one Swift `String` but two byte
    /// strings: only the NFC one is a name, so no two items look alike and
    /// no table keyed by `String` can confuse two rows.
    @Test(arguments: ["cafe\u{301}", "\u{1112}\u{1161}\u{11AB}", "\u{212A}elvin", "a\u{37E}b", "q\u{307}\u{323}"])
    func namesNotInNFCAreRefusedAndTheirNFCTwinIsUntouched(_ name: String) throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        let twin = String(decoding: name._nfcCodeUnits, as: UTF8.self)
        #expect(!twin.utf8.elementsEqual(name.utf8) && twin == name)
        try manager.register("first", forIdentifier: twin, inGroup: twin)
        expectError(.param) { try manager.register("second", forIdentifier: name, inGroup: twin) }
        expectError(.param) { try manager.register("second", forIdentifier: "ok", inGroup: name) }
        expectError(.param) { _ = try manager.string(forIdentifier: name, inGroup: twin) }
        expectError(.param) { try manager.createGroup(name) }
        #expect(try manager.string(forIdentifier: twin, inGroup: twin) == "first")
        #expect(try manager.identifiers(inGroup: twin).map { Array($0.utf8) } == [Array(twin.utf8)])
    }

    @Test func statusEscapingKeepsAnyTextOnOneLineAndRoundTrips() {
        for text in [
            "plain", "/home/a b/kc", "x\nstate: unlocked", "back\\slash\\n", "tab\t", "\u{01}\u{7F}\u{85}", "日本"
        ] {
            let escaped = LineEscaping.escaped(text)
            #expect(!escaped.unicodeScalars.contains { $0.value < 0x20 || (0x7f...0x9f).contains($0.value) })
            #expect(LineEscaping.unescaped(escaped) == text)
        }
        #expect(LineEscaping.unescaped("bad\\q") == nil)
        #expect(LineEscaping.unescaped("short\\x4") == nil)
    }

    @Test func namesLongerThan255BytesAreRefusedAsTooLong() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.register("v", forIdentifier: String(repeating: "a", count: 255))
        expectError(.nameTooLong) { try manager.register("v", forIdentifier: String(repeating: "é", count: 128)) }
        #expect(try manager.identifiers().count == 1)
    }

    @Test func validKeyComparesTheWholeValue() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.register("hunter2", forIdentifier: "item")
        #expect(try manager.validKey("hunter2", forIdentifier: "item"))
        #expect(try !manager.validKey("hunter", forIdentifier: "item"))
        #expect(try !manager.validKey("hunter3", forIdentifier: "item"))
        #expect(try !manager.validKey("hunter2", forIdentifier: "absent"))
    }

    @Test func deleteWorksWhileLockedAndReportsAbsentItems() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.register("v", forIdentifier: "item")
        manager.localDevice.lock()
        try manager.deleteKey(forIdentifier: "item")
        expectError(.itemNotFound) { try manager.deleteKey(forIdentifier: "item") }
        expectError(.itemNotFound) { try manager.key(forIdentifier: "item") }
    }

    @Test func changingTheClassReEncryptsAndNeedsBothKeys() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.register("v", forIdentifier: "item")
        try manager.setProtectionClass(.alwaysThisDeviceOnly, forIdentifier: "item")
        manager.localDevice.lock()
        #expect(try manager.string(forIdentifier: "item") == "v")
        expectError(.interactionNotAllowed) { try manager.setProtectionClass(.whenUnlocked, forIdentifier: "item") }
        #expect(try manager.info(forIdentifier: "item")?.protectionClass == .alwaysThisDeviceOnly)
        expectError(.itemNotFound) { try manager.setProtectionClass(.always, forIdentifier: "absent") }
    }

    @Test func renameMovesTheValueNeedsTheClassKeyAndRespectsExistingTargets() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.register("a", forIdentifier: "a")
        try manager.register("b", forIdentifier: "b")
        expectError(.duplicateItem) { try manager.renameKey(forIdentifier: "a", to: "b") }
        try manager.renameKey(forIdentifier: "a", to: "c")
        #expect(try manager.string(forIdentifier: "c") == "a")
        expectError(.itemNotFound) { try manager.key(forIdentifier: "a") }
        try manager.renameKey(forIdentifier: "c", to: "b", replacing: true)
        #expect(try manager.identifiers() == ["b"])
        #expect(try manager.string(forIdentifier: "b") == "a")
        manager.localDevice.lock()
        expectError(.interactionNotAllowed) { try manager.renameKey(forIdentifier: "b", to: "d") }
        #expect(try manager.identifiers() == ["b"])
    }

    @Test func groupsAreCreatedListedAndRemovedOnlyWhenEmpty() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.createGroup("empty")
        expectError(.duplicateItem) { try manager.createGroup("empty") }
        try manager.register("v", forIdentifier: "item", inGroup: "full")
        #expect(try manager.groups() == ["default", "empty", "full"])
        expectError(.badRequest) { try manager.removeGroup("full") }
        expectError(.param) { try manager.removeGroup("default") }
        try manager.removeGroup("empty")
        expectError(.itemNotFound) { try manager.removeGroup("empty") }
        expectError(.itemNotFound) { try manager.identifiers(inGroup: "empty") }
        manager.localDevice.lock()
        #expect(try manager.identifiers(inGroup: "full") == ["item"])
    }

    @Test func cacheHoldsTheLastAccessUntilPurgeLockOrBackground() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        manager.accessMode = .always
        try manager.register("v", forIdentifier: "item")
        #expect(manager.isCacheEmpty)
        _ = try manager.key(forIdentifier: "item")
        #expect(!manager.isCacheEmpty)
        manager.purge()
        #expect(manager.isCacheEmpty)
        _ = try manager.key(forIdentifier: "item")
        manager.background()
        #expect(manager.isCacheEmpty)
        _ = try manager.key(forIdentifier: "item")
        manager.localDevice.lock()
        #expect(manager.isCacheEmpty)
        // A write replaces what the cache would answer.
        _ = try manager.key(forIdentifier: "item")
        try manager.register("w", forIdentifier: "item")
        #expect(try manager.string(forIdentifier: "item") == "w")
    }

    @Test func cachedValueOfALockedClassIsNotServedAfterLock() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.register("v", forIdentifier: "item")
        _ = try manager.key(forIdentifier: "item")
        manager.localDevice.lock()
        expectError(.interactionNotAllowed) { try manager.key(forIdentifier: "item") }
    }

    @Test func sharedInstanceIsOneManagerUntilDropped() throws {
        let keychain = try TemporaryKeychain()
        setenv("XDG_DATA_HOME", keychain.root, 1)
        defer { unsetenv("XDG_DATA_HOME") }
        unlink(keychain.root + "/keychainfs")
        #expect(symlink(keychain.directory.path, keychain.root + "/keychainfs") == 0)
        let first = try PasswordManager.shared()
        #expect(try PasswordManager.shared() === first)
        PasswordManager.dropShared()
    }

    @Test func syncMakesWritesDurableWithoutChangingThem() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.register("v", forIdentifier: "item")
        try manager.sync()
        #expect(try manager.string(forIdentifier: "item") == "v")
    }
}

extension PasswordManagerTests {
    @Test func conditionalWritesLeaveExistingOrDeletedItemsAlone() throws {
        let keychain = try TemporaryKeychain()
        let manager = try unlockedManager(keychain)
        try manager.write(
            secure("first"), identifier: "item", group: "default", protectionClass: .always, condition: .ifAbsent)
        expectError(.duplicateItem) {
            try manager.write(
                secure("second"), identifier: "item", group: "default", protectionClass: .always, condition: .ifAbsent)
        }
        #expect(try manager.string(forIdentifier: "item") == "first")
        try manager.deleteKey(forIdentifier: "item")
        expectError(.itemNotFound) {
            try manager.write(
                secure("third"), identifier: "item", group: "default", protectionClass: .always, condition: .ifPresent)
        }
        expectError(.itemNotFound) { try manager.key(forIdentifier: "item") }
    }

    @Test func secureBufferGrowsWritesAtOffsetsAndRefusesToPassTheLimit() throws {
        let buffer = SecureBuffer()
        try Array("hello".utf8).withUnsafeBytes { try buffer.append($0) }
        try Array("J".utf8).withUnsafeBytes { try buffer.write($0, at: 0) }
        try Array("!".utf8).withUnsafeBytes { try buffer.write($0, at: 7) }
        #expect(try buffer.snapshot().bytes() == Array("Jello".utf8) + [0, 0] + Array("!".utf8))
        let big = [UInt8](repeating: 1, count: 5000)
        try big.withUnsafeBytes { try buffer.append($0) }
        #expect(buffer.count == 5008)
        #expect(throws: KeychainError.valueTooLarge) {
            try big.withUnsafeBytes { try buffer.write($0, at: ItemLimits.maximumValueSize - 10) }
        }
        #expect(buffer.count == 5008)
        try buffer.resize(to: 2)
        #expect(try buffer.snapshot().string() == "Je")
        buffer.wipe()
        #expect(buffer.count == 0)
    }
}

extension PasswordManagerTests {
    @Test func refinedParamErrorsReportTheParamOSStatus() {
        #expect(KeychainError.nameTooLong.osStatus == -50)
        #expect(KeychainError.valueTooLarge.osStatus == -50)
        #expect(KeychainError.keychainInUse.osStatus == -909)
        #expect(KeychainError.interactionNotAllowed.osStatus == -25308)
        #expect(KeychainError.itemNotFound.osStatus == -25300)
    }
}
