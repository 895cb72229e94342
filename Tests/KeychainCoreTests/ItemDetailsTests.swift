import Testing
@testable import KeychainCore

/// An item's details (label, content type, lookup attributes, times): kept
/// beside the value, readable while locked, carried over every change of
/// the value, sealed and bound to their row (docs/FORMAT.md, "Item details").
@Suite struct ItemDetailsTests {
    static let details = ItemDetails(label: "GitHub token", attributes: ["service": "github.com", "username": "ada",
                                                                          "xdg:schema": "org.freedesktop.Secret.Generic"])

    func unlocked() throws -> (TemporaryKeychain, PasswordManager) {
        let keychain = try TemporaryKeychain()
        let manager = try keychain.manager()
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        return (keychain, manager)
    }

    @Test func detailsAreStoredWithTheValueAndStampedWithTheirTimes() throws {
        let (keychain, manager) = try unlocked()
        keychain.clock.advance(1_000)
        try manager.write(secure("ghp_1"), identifier: "GitHub token", group: "default", protectionClass: .whenUnlocked,
                          details: Self.details)
        let stored = try #require(try manager.details(forIdentifier: "GitHub token"))
        #expect(stored.label == "GitHub token" && stored.attributes == Self.details.attributes)
        #expect(stored.contentType == "text/plain")
        #expect(stored.created == UInt64(keychain.clock.now) && stored.modified == stored.created)
        #expect(try manager.string(forIdentifier: "GitHub token") == "ghp_1")
        // An item written without details has none.
        try manager.register("plain", forIdentifier: "plain")
        #expect(try manager.details(forIdentifier: "plain") == nil)
        expectError(.itemNotFound) { try manager.details(forIdentifier: "absent") }
        #expect(try manager.itemsWithDetails(inGroup: "default").map(\.identifier) == ["GitHub token"])
    }

    /// A write through a mount, a class change and a rename know nothing of
    /// details: the item keeps them (a write stamps its time).
    @Test func everyChangeOfTheValueKeepsTheDetails() throws {
        let (keychain, manager) = try unlocked()
        try manager.write(secure("v1"), identifier: "token", group: "default", protectionClass: .whenUnlocked, details: Self.details)
        let created = try #require(try manager.details(forIdentifier: "token")).created
        keychain.clock.advance(60)
        try manager.register("v2", forIdentifier: "token")
        var kept = try #require(try manager.details(forIdentifier: "token"))
        #expect(kept.attributes == Self.details.attributes && kept.created == created && kept.modified == created + 60)
        try manager.setProtectionClass(.afterFirstUnlock, forIdentifier: "token")
        try manager.renameKey(forIdentifier: "token", to: "renamed")
        kept = try #require(try manager.details(forIdentifier: "renamed"))
        #expect(kept.label == "GitHub token" && kept.attributes == Self.details.attributes)
        #expect(try manager.string(forIdentifier: "renamed") == "v2")
        // New details replace the old ones but keep the creation time.
        try manager.write(secure("v3"), identifier: "renamed", group: "default", protectionClass: .afterFirstUnlock,
                          details: ItemDetails(label: "new", attributes: ["a": "b"]))
        kept = try #require(try manager.details(forIdentifier: "renamed"))
        #expect(kept.label == "new" && kept.attributes == ["a": "b"] && kept.created == created)
    }

    /// New details for the same value: the value is untouched, the
    /// creation time kept; a locked item's details cannot change.
    @Test func detailsAloneCanBeReplaced() throws {
        let (keychain, manager) = try unlocked()
        try manager.write(secure("v"), identifier: "token", group: "default", protectionClass: .whenUnlocked, details: Self.details)
        let created = try #require(try manager.details(forIdentifier: "token")).created
        keychain.clock.advance(30)
        try manager.setDetails(ItemDetails(label: "relabelled", attributes: ["k": "v"]), forIdentifier: "token")
        let replaced = try #require(try manager.details(forIdentifier: "token"))
        #expect(replaced.label == "relabelled" && replaced.attributes == ["k": "v"])
        #expect(replaced.created == created && replaced.modified == created + 30)
        #expect(try manager.string(forIdentifier: "token") == "v")
        // Details for an item that had none.
        try manager.register("plain", forIdentifier: "plain")
        try manager.setDetails(ItemDetails(label: "now labelled", attributes: [:]), forIdentifier: "plain")
        #expect(try manager.details(forIdentifier: "plain")?.label == "now labelled")
        expectError(.itemNotFound) { try manager.setDetails(Self.details, forIdentifier: "absent") }
        manager.localDevice.lock()
        expectError(.interactionNotAllowed) { try manager.setDetails(Self.details, forIdentifier: "token") }
        #expect(try manager.details(forIdentifier: "token")?.label == "relabelled")
    }

    /// Details are like names: a locked device shows them (a search must
    /// find locked items), while the value stays locked.
    @Test func detailsAreReadableWhileLocked() throws {
        let (_, manager) = try unlocked()
        try manager.write(secure("v"), identifier: "token", group: "default", protectionClass: .whenUnlocked, details: Self.details)
        manager.localDevice.lock()
        #expect(try manager.details(forIdentifier: "token")?.attributes == Self.details.attributes)
        expectError(.interactionNotAllowed) { try manager.key(forIdentifier: "token") }
    }

    /// A write that fails leaves value and details as they were.
    @Test func aFailedWriteChangesNeitherValueNorDetails() throws {
        let (_, manager) = try unlocked()
        try manager.write(secure("v"), identifier: "token", group: "default", protectionClass: .whenUnlocked, details: Self.details)
        let before = try manager.details(forIdentifier: "token")
        var huge = Self.details
        huge.attributes["big"] = String(repeating: "x", count: ItemDetails.maximumText + 1)
        expectError(.param) {
            try manager.write(secure("other"), identifier: "token", group: "default", protectionClass: .whenUnlocked, details: huge)
        }
        var many = Self.details
        for index in 0...ItemDetails.maximumAttributes { many.attributes["a\(index)"] = "v" }
        expectError(.param) {
            try manager.write(secure("other"), identifier: "token", group: "default", protectionClass: .whenUnlocked, details: many)
        }
        var large = Self.details
        for index in 0..<9 { large.attributes["a\(index)"] = String(repeating: "x", count: ItemDetails.maximumText) }
        expectError(.param) {
            try manager.write(secure("other"), identifier: "token", group: "default", protectionClass: .whenUnlocked, details: large)
        }
        manager.localDevice.lock()
        expectError(.interactionNotAllowed) {
            try manager.write(secure("other"), identifier: "token", group: "default", protectionClass: .whenUnlocked,
                              details: ItemDetails(label: "x", attributes: [:]))
        }
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        #expect(try manager.details(forIdentifier: "token") == before)
        #expect(try manager.string(forIdentifier: "token") == "v")
    }

    @Test func theEncodingReadsBackAndRefusesAnythingElse() throws {
        let details = ItemDetails(label: "l", contentType: "application/octet-stream", attributes: ["b": "2", "a": "1", "é": ""],
                                  created: 1, modified: 2)
        let encoded = details.encoded()
        #expect(try ItemDetails(decoding: encoded) == details)
        // Every cut, and one byte more, is malformed.
        for length in 0..<encoded.count {
            expectError(.decode) { try ItemDetails(decoding: Array(encoded.prefix(length))) }
        }
        expectError(.decode) { try ItemDetails(decoding: encoded + [0]) }
        // The attributes out of order: another encoding of the same value.
        var fields = details.fields[...]
        #expect(ItemDetails(fields: &fields) == details && fields.isEmpty)
        var swapped = ByteWriter()
        swapped.append(UInt8(1))
        swapped.appendPrefixed("l")
        swapped.appendPrefixed("t")
        swapped.append(UInt64(0))
        swapped.append(UInt64(0))
        swapped.append(UInt32(2))
        for name in ["b", "a"] {
            swapped.appendPrefixed(name)
            swapped.appendPrefixed("v")
        }
        expectError(.decode) { try ItemDetails(decoding: swapped.bytes) }
    }
}

/// Stored details that were altered make the row fail to open, never show
/// other details or lose them silently.
@Suite struct ItemDetailsTamperTests {
    func prepared() throws -> TemporaryKeychain {
        let keychain = try TemporaryKeychain()
        let manager = try keychain.manager()
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        try manager.write(secure("alpha-secret"), identifier: "alpha", group: "default", protectionClass: .whenUnlocked,
                          details: ItemDetails(label: "alpha", attributes: ["who": "alpha"]))
        try manager.write(secure("beta-secret"), identifier: "beta", group: "default", protectionClass: .whenUnlocked,
                          details: ItemDetails(label: "beta", attributes: ["who": "beta"]))
        return keychain
    }

    func booted(after sql: String, _ keychain: TemporaryKeychain) throws -> PasswordManager {
        try keychain.withRawDatabase { try $0.execute(sql) }
        let manager = try keychain.manager()
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        return manager
    }

    @Test func detailsRemovedFromARowMakeItsValueFailToOpen() throws {
        let manager = try booted(after: "UPDATE items SET details = NULL WHERE ident = 'alpha'", try prepared())
        expectError(.decode) { try manager.key(forIdentifier: "alpha") }
        #expect(try manager.string(forIdentifier: "beta") == "beta-secret")
    }

    @Test func detailsSwappedBetweenRowsFailToOpen() throws {
        let manager = try booted(after: """
            UPDATE items SET details = (SELECT details FROM items WHERE ident = 'beta') WHERE ident = 'alpha'
            """, try prepared())
        expectError(.decode) { try manager.details(forIdentifier: "alpha") }
        expectError(.decode) { try manager.itemsWithDetails(inGroup: "default") }
        #expect(try manager.details(forIdentifier: "beta")?.label == "beta")
    }

    @Test func aFlippedDetailsByteFailsToOpen() throws {
        let manager = try booted(after: """
            UPDATE items SET details = substr(details, 1, 30) ||
                (CASE WHEN substr(details, 31, 1) = x'00' THEN x'01' ELSE x'00' END) || substr(details, 32)
            WHERE ident = 'alpha'
            """, try prepared())
        expectError(.decode) { try manager.details(forIdentifier: "alpha") }
    }
}
