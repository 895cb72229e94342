import Testing
@testable import KeychainCore

/// An item's details (label, content type, lookup attributes, times): kept
/// beside the value, readable while locked, carried over every change of
/// the value, sealed and bound to their row (docs/FORMAT.md, "Item details").
@Suite struct ItemDetailsTests {
    static let details = ItemDetails(
        label: "GitHub token",
        attributes: [
            "service": "github.com", "username": "ada",
            "xdg:schema": "org.freedesktop.Secret.Generic"
        ])

    func unlocked() throws -> (TemporaryKeychain, PasswordManager) {
        let keychain = try TemporaryKeychain()
        let manager = try keychain.manager()
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        return (keychain, manager)
    }

    @Test func detailsAreStoredWithTheValueAndStampedWithTheirTimes() throws {
        let (keychain, manager) = try unlocked()
        keychain.clock.advance(1_000)
        try manager.write(
            secure("ghp_1"), identifier: "GitHub token", group: "default", protectionClass: .whenUnlocked,
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
        try manager.write(
            secure("v1"), identifier: "token", group: "default", protectionClass: .whenUnlocked, details: Self.details)
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
        try manager.write(
            secure("v3"), identifier: "renamed", group: "default", protectionClass: .afterFirstUnlock,
            details: ItemDetails(label: "new", attributes: ["a": "b"]))
        kept = try #require(try manager.details(forIdentifier: "renamed"))
        #expect(kept.label == "new" && kept.attributes == ["a": "b"] && kept.created == created)
    }

    /// New details for the same value: the value is untouched, the
    /// creation time kept; a locked item's details cannot change.
    @Test func detailsAloneCanBeReplaced() throws {
        let (keychain, manager) = try unlocked()
        try manager.write(
            secure("v"), identifier: "token", group: "default", protectionClass: .whenUnlocked, details: Self.details)
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
        try manager.write(
            secure("v"), identifier: "token", group: "default", protectionClass: .whenUnlocked, details: Self.details)
        manager.localDevice.lock()
        #expect(try manager.details(forIdentifier: "token")?.attributes == Self.details.attributes)
        expectError(.interactionNotAllowed) { try manager.key(forIdentifier: "token") }
    }

    /// A write that fails leaves value and details as they were.
    @Test func aFailedWriteChangesNeitherValueNorDetails() throws {
        let (_, manager) = try unlocked()
        try manager.write(
            secure("v"), identifier: "token", group: "default", protectionClass: .whenUnlocked, details: Self.details)
        let before = try manager.details(forIdentifier: "token")
        var huge = Self.details
        huge.attributes["big"] = String(repeating: "x", count: ItemDetails.maximumText + 1)
        expectError(.param) {
            try manager.write(
                secure("other"), identifier: "token", group: "default", protectionClass: .whenUnlocked, details: huge)
        }
        var many = Self.details
        for index in 0...ItemDetails.maximumAttributes { many.attributes["a\(index)"] = "v" }
        expectError(.param) {
            try manager.write(
                secure("other"), identifier: "token", group: "default", protectionClass: .whenUnlocked, details: many)
        }
        var large = Self.details
        for index in 0..<9 { large.attributes["a\(index)"] = String(repeating: "x", count: ItemDetails.maximumText) }
        expectError(.param) {
            try manager.write(
                secure("other"), identifier: "token", group: "default", protectionClass: .whenUnlocked, details: large)
        }
        manager.localDevice.lock()
        expectError(.interactionNotAllowed) {
            try manager.write(
                secure("other"), identifier: "token", group: "default", protectionClass: .whenUnlocked,
                details: ItemDetails(label: "x", attributes: [:]))
        }
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        #expect(try manager.details(forIdentifier: "token") == before)
        #expect(try manager.string(forIdentifier: "token") == "v")
    }

    @Test func theEncodingReadsBackAndRefusesAnythingElse() throws {
        let details = ItemDetails(
            label: "l", contentType: "application/octet-stream", attributes: ["b": "2", "a": "1", "é": ""],
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
        try manager.write(
            secure("alpha-secret"), identifier: "alpha", group: "default", protectionClass: .whenUnlocked,
            details: ItemDetails(label: "alpha", attributes: ["who": "alpha"]))
        try manager.write(
            secure("beta-secret"), identifier: "beta", group: "default", protectionClass: .whenUnlocked,
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
        let manager = try booted(
            after: """
                UPDATE items SET details = (SELECT details FROM items WHERE ident = 'beta') WHERE ident = 'alpha'
                """, try prepared())
        expectError(.decode) { try manager.details(forIdentifier: "alpha") }
        expectError(.decode) { try manager.itemsWithDetails(inGroup: "default") }
        #expect(try manager.details(forIdentifier: "beta")?.label == "beta")
    }

    @Test func aFlippedDetailsByteFailsToOpen() throws {
        let manager = try booted(
            after: """
                UPDATE items SET details = substr(details, 1, 30) ||
                    (CASE WHEN substr(details, 31, 1) = x'00' THEN x'01' ELSE x'00' END) || substr(details, 32)
                WHERE ident = 'alpha'
                """, try prepared())
        expectError(.decode) { try manager.details(forIdentifier: "alpha") }
    }
}

/// Whose an item is on the bus (docs/SECRET-SERVICE.md, "Whose an item is"),
/// sealed with its details.
extension ItemDetailsTests {
    // MARK: Owner and access list

    static let owner = ProgramClaim(
        program: .executable("/usr/lib/chromium/chromium"), digest: Array(repeating: 1, count: 32),
        package: nil, unit: "app-chromium.scope")
    static let other = ProgramClaim(
        program: .executable("/usr/bin/secret-tool"), digest: Array(repeating: 2, count: 32))

    @Test func theOwnerIsSetWhenTheItemIsMadeAndNoWriteChangesItOrItsList() throws {
        let (_, manager) = try unlocked()
        var made = Self.details
        made.owner = Self.owner
        made.allowed = [Self.other]  // a writer cannot put itself on the list
        try manager.write(
            secure("v1"), identifier: "key", group: "default", protectionClass: .whenUnlocked, details: made)
        var stored = try #require(try manager.details(forIdentifier: "key"))
        #expect(stored.owner == Self.owner && stored.allowed.isEmpty)
        // A replacing write naming another owner, or none, keeps the item's.
        var claimed = Self.details
        claimed.owner = Self.other
        try manager.write(
            secure("v2"), identifier: "key", group: "default", protectionClass: .whenUnlocked, details: claimed)
        try manager.setDetails(Self.details, forIdentifier: "key")
        try manager.register("v3", forIdentifier: "key")
        stored = try #require(try manager.details(forIdentifier: "key"))
        #expect(stored.owner == Self.owner && stored.allowed.isEmpty)
        // Only allow() adds to the list, once per program.
        try manager.allow(Self.other, forIdentifier: "key")
        try manager.allow(Self.other, forIdentifier: "key")
        #expect(try manager.details(forIdentifier: "key")?.allowed == [Self.other])
        // An item made without an owner (a mount, the command line) gets none from a later write.
        try manager.register("plain", forIdentifier: "plain")
        try manager.write(
            secure("p2"), identifier: "plain", group: "default", protectionClass: .whenUnlocked, details: claimed)
        #expect(try manager.details(forIdentifier: "plain")?.owner == nil)
        expectError(.badRequest) { try manager.allow(Self.other, forIdentifier: "plain") }
    }

    @Test func ownedDetailsEncodeAndReadBackAndVersionOneStaysForTheRest() throws {
        var owned = Self.details
        owned.owner = Self.owner
        owned.allowed = [Self.other]
        let bytes = owned.encoded()
        #expect(bytes.first == 2)
        #expect(try ItemDetails(decoding: bytes) == owned)
        var fields = owned.fields[...]
        #expect(ItemDetails(fields: &fields) == owned && fields.isEmpty)
        #expect(Self.details.encoded().first == 1)
        // Version 2 with nothing to say is a second encoding of a version-1 record: refused.
        var empty = Self.details.encoded()
        empty[0] = 2
        expectError(.decode) { _ = try ItemDetails(decoding: empty + [0, 0]) }
    }

    @Test func aClaimAdmitsItsProgramOnlyByPathAndContentAndNeverAnUntrustedProcess() {
        let claim = ProgramClaim(program: .executable("/opt/app"), digest: Array(repeating: 7, count: 32))
        #expect(
            claim.admits(
                ProgramIdentity(
                    program: .executable("/opt/app"), digest: Array(repeating: 7, count: 32), unit: nil, uid: 1000)))
        // Another build at the same path (no package: a file its user could replace).
        #expect(
            !claim.admits(
                ProgramIdentity(
                    program: .executable("/opt/app"), digest: Array(repeating: 8, count: 32), unit: nil, uid: 1000)))
        #expect(
            !claim.admits(
                ProgramIdentity(
                    program: .executable("/opt/app2"), digest: Array(repeating: 7, count: 32), unit: nil, uid: 1000)))
        #expect(
            !claim.admits(
                ProgramIdentity(
                    program: .executable("/opt/app"), digest: Array(repeating: 7, count: 32), unit: nil, uid: 1000,
                    distrust: "its bus connection is shared with pid 1 (sh)")))
        // A program running a JIT is still its program (a browser is one).
        #expect(
            claim.admits(
                ProgramIdentity(
                    program: .executable("/opt/app"), digest: Array(repeating: 7, count: 32), unit: nil, uid: 1000,
                    runsAnonymousCode: true)))
    }
}

/// An interpreter is its script, and a JIT is recorded (docs/SECRET-SERVICE.md,
/// "Whose an item is").
extension ItemDetailsTests {
    static func python(_ script: ScriptIdentity?, anonymous: Bool = false) -> ProgramIdentity {
        var program = ProgramIdentity(
            program: .executable("/usr/bin/python3.11"), digest: Array(repeating: 5, count: 32), unit: nil, uid: 1000,
            runsAnonymousCode: anonymous)
        program.script = script
        return program
    }

    @Test func anInterpretersClaimIsItsScriptAndAJitIsRecorded() {
        let mine = ScriptIdentity.file(path: "/home/u/mine.py", digest: Array(repeating: 1, count: 32))
        let claim = ProgramClaim(Self.python(mine))
        #expect(claim.script == ProgramScript(path: "/home/u/mine.py", digest: Array(repeating: 1, count: 32)))
        #expect(claim.jit == false)
        #expect(claim.admits(Self.python(mine)))
        // Another script, the same script edited, code on the command line: not the owner.
        #expect(!claim.admits(Self.python(.file(path: "/home/u/other.py", digest: Array(repeating: 1, count: 32)))))
        #expect(!claim.admits(Self.python(.file(path: "/home/u/mine.py", digest: Array(repeating: 2, count: 32)))))
        #expect(!claim.admits(Self.python(.unidentifiable("it runs code given on its command line (-c)"))))
        #expect(!claim.admits(Self.python(nil)))
        // Code from anonymous memory is not the owner unless the owner ran a JIT when recorded.
        #expect(!claim.admits(Self.python(mine, anonymous: true)))
        var jit = claim
        jit.jit = true
        #expect(jit.admits(Self.python(mine, anonymous: true)))
        // An older claim (no script, JIT not recorded) is no interpreter's with a script.
        let legacy = ProgramClaim(program: .executable("/usr/bin/python3.11"), digest: Array(repeating: 5, count: 32))
        #expect(!legacy.admits(Self.python(mine)))
        #expect(claim.described.hasSuffix(" running /home/u/mine.py (sha256 010101010101…)"))
    }

    @Test func identifiedClaimsEncodeAsVersionThreeAndReadBack() throws {
        var owned = Self.details
        owned.owner = ProgramClaim(
            program: .executable("/usr/bin/python3.11"), digest: Array(repeating: 5, count: 32),
            package: "python3.11-minimal",
            script: ProgramScript(path: "/home/u/mine.py", digest: Array(repeating: 1, count: 32)), jit: false)
        owned.allowed = [
            Self.other,
            ProgramClaim(program: .executable("/opt/node"), digest: Array(repeating: 3, count: 32), jit: true)
        ]
        let bytes = owned.encoded()
        #expect(bytes.first == 3)
        #expect(try ItemDetails(decoding: bytes) == owned)
        var fields = owned.fields[...]
        #expect(ItemDetails(fields: &fields) == owned && fields.isEmpty)
        // Claims that say nothing more stay version 2; version 3 saying nothing more is refused.
        var plain = Self.details
        plain.owner = Self.owner
        #expect(plain.encoded().first == 2)
        // (The version-2 record ends with the list's count: the owner's flags go before it.)
        var second = plain.encoded()
        second[0] = 3
        second.insert(2, at: second.count - 1)
        expectError(.decode) { _ = try ItemDetails(decoding: second) }
        second[second.count - 2] = 0
        #expect(try ItemDetails(decoding: second).owner?.jit == false)
        // Unknown flag bits, and a JIT "not recorded" beside one, are refused.
        for flags: UInt8 in [8, 3] {
            var record = Self.details
            record.owner = ProgramClaim(
                program: .executable("/opt/app"), digest: Array(repeating: 7, count: 32), jit: false)
            var encoded = record.encoded()
            encoded[encoded.count - 2] = flags
            expectError(.decode) { _ = try ItemDetails(decoding: encoded) }
        }
    }
}
