import Glibc
import Testing
@testable import KeychainCore
@testable import KeychainTPM

/// Stored bytes that were altered give `decode`, never wrong data (gocryptfs
/// doRead). Changes to a row's identity (group, identifier, class,
/// generation), rolled-back, removed or resurrected rows are caught when the
/// device boots (the item-set state); altered ciphertext when it is read.
@Suite struct TamperTests {
    func prepared() throws -> TemporaryKeychain {
        let keychain = try TemporaryKeychain()
        let manager = try keychain.manager()
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        try manager.register("alpha-secret", forIdentifier: "alpha")
        try manager.register("beta-secret", forIdentifier: "beta")
        try manager.register("other-group", forIdentifier: "alpha", inGroup: "other")
        return keychain
    }

    /// Edits the database as an attacker would, then boots and unlocks.
    func boot(after sql: String, _ keychain: TemporaryKeychain) throws -> Result<PasswordManager, KeychainError> {
        try keychain.withRawDatabase { try $0.execute(sql) }
        do {
            let manager = PasswordManager(device: try keychain.device())
            try manager.localDevice.unlock(passcode: try SecureBytes(TemporaryKeychain.passcode))
            return .success(manager)
        } catch let error as KeychainError {
            return .failure(error)
        }
    }

    @Test func flippedCiphertextByteFailsTheRead() throws {
        let keychain = try prepared()
        let manager = try boot(
            after: """
                UPDATE items SET sealed = (CASE WHEN substr(sealed, 1, 1) = x'00' THEN x'01' ELSE x'00' END) || substr(sealed, 2)
                WHERE ident = 'alpha' AND grp = 'default'
                """, keychain
        ).get()
        expectError(.decode) { try manager.key(forIdentifier: "alpha") }
        // The other rows still read.
        #expect(try manager.string(forIdentifier: "beta") == "beta-secret")
    }

    /// A row cut short (shorter than its authentication tag) made the
    /// listing of its whole group fail, so `ls` showed nothing while the
    /// other items read. Now the group lists every item (the damaged one
    /// at size 0), its read says it is damaged, and it can be removed.
    @Test func aRowCutShortLeavesItsGroupListedAndCanBeRemoved() throws {
        let keychain = try prepared()
        let manager = try boot(
            after: "UPDATE items SET sealed = x'00' WHERE ident = 'alpha' AND grp = 'default'", keychain
        ).get()
        let listed = try manager.items()
        #expect(listed.map(\.identifier) == ["alpha", "beta"])
        #expect(listed.first?.info.size == 0)
        expectError(.decode) { try manager.key(forIdentifier: "alpha") }
        #expect(try manager.string(forIdentifier: "beta") == "beta-secret")
        try manager.deleteKey(forIdentifier: "alpha")
        #expect(try manager.items().map(\.identifier) == ["beta"])
    }

    @Test func ciphertextSwappedBetweenIdentifiersFailsTheRead() throws {
        let keychain = try prepared()
        let manager = try boot(
            after: """
                UPDATE items SET nonce = (SELECT nonce FROM items WHERE ident = 'beta'),
                                 sealed = (SELECT sealed FROM items WHERE ident = 'beta')
                WHERE ident = 'alpha' AND grp = 'default'
                """, keychain
        ).get()
        expectError(.decode) { try manager.key(forIdentifier: "alpha") }
    }

    @Test(arguments: [
        // A whole row copied over another (generation included).
        """
        UPDATE items SET nonce = (SELECT nonce FROM items WHERE ident = 'beta'),
                         sealed = (SELECT sealed FROM items WHERE ident = 'beta'),
                         generation = (SELECT generation FROM items WHERE ident = 'beta')
        WHERE ident = 'alpha' AND grp = 'default'
        """,
        // A row moved to another group.
        """
        DELETE FROM items WHERE grp = 'default' AND ident = 'alpha';
        UPDATE items SET grp = 'default' WHERE grp = 'other' AND ident = 'alpha';
        """,
        "UPDATE items SET generation = generation + 1 WHERE ident = 'alpha' AND grp = 'default'",
        // Claiming `always` would make a row readable while locked if the class were not bound.
        "UPDATE items SET class = 3 WHERE ident = 'alpha' AND grp = 'default'",
        "UPDATE items SET class = 99 WHERE ident = 'alpha' AND grp = 'default'",
        "DELETE FROM items WHERE ident = 'beta'",
        // A digest byte (random: the edit must change it whatever it was).
        changingByte(11, ofMetaRecord: "state"),
        // A missing record is tampering too. With the state gone, the next
        // boot would rebuild it from whatever rows are there.
        "DELETE FROM meta WHERE key = 'state'",
        "DELETE FROM meta WHERE key = 'state'; DELETE FROM items WHERE ident = 'beta'",
        // A version-1 record (digest | MAC) in its place: no generation to check.
        "UPDATE meta SET value = substr(value, 1, 32) || substr(value, 41) WHERE key = 'state'",
        // With the lockout record gone, the count of wrong passcodes would start over.
        "DELETE FROM meta WHERE key = 'lockout'",
        // Names no keychainfs could write: refused, never a crash of the boot check.
        "UPDATE items SET ident = printf('%.256c', 'x') WHERE ident = 'alpha' AND grp = 'default'",
        "UPDATE items SET grp = printf('%.70000c', 'x') WHERE ident = 'alpha' AND grp = 'other'"
    ])
    func tamperingIsCaughtAtBoot(_ sql: String) throws {
        let keychain = try prepared()
        #expect(throws: KeychainError.decode) { try boot(after: sql, keychain).get() }
    }

    @Test func aRowRolledBackToAnOlderCopyIsCaughtAtBoot() throws {
        let keychain = try prepared()
        try keychain.withRawDatabase { db in
            try db.execute("CREATE TABLE saved AS SELECT * FROM items WHERE ident = 'alpha' AND grp = 'default'")
        }
        do {
            let manager = try keychain.manager()
            try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
            try manager.register("changed-password", forIdentifier: "alpha")
        }
        #expect(throws: KeychainError.decode) {
            try boot(
                after: """
                    UPDATE items SET class = (SELECT class FROM saved), generation = (SELECT generation FROM saved),
                                     nonce = (SELECT nonce FROM saved), sealed = (SELECT sealed FROM saved)
                    WHERE ident = 'alpha' AND grp = 'default'
                    """, keychain
            ).get()
        }
    }

    @Test func aDeletedRowBroughtBackIsCaughtAtBoot() throws {
        let keychain = try prepared()
        try keychain.withRawDatabase { db in
            try db.execute("CREATE TABLE saved AS SELECT * FROM items WHERE ident = 'beta'")
        }
        do {
            let manager = try keychain.manager()
            try manager.deleteKey(forIdentifier: "beta")  // works while locked
        }
        #expect(throws: KeychainError.decode) {
            try boot(after: "INSERT INTO items SELECT * FROM saved", keychain).get()
        }
    }

    @Test func everyMutationKeepsTheStateConsistent() throws {
        let keychain = try prepared()
        do {
            let manager = try keychain.manager()
            try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
            try manager.register("v2", forIdentifier: "alpha")
            try manager.renameKey(forIdentifier: "alpha", to: "gamma")
            try manager.renameKey(forIdentifier: "gamma", to: "beta", replacing: true)
            try manager.setProtectionClass(.alwaysThisDeviceOnly, forIdentifier: "beta")
            try manager.deleteKey(forIdentifier: "alpha", inGroup: "other")
            try manager.write(
                secure("x"), identifier: "new", group: "g", protectionClass: .always, condition: .ifAbsent)
        }
        let manager = try boot(after: "SELECT 1", keychain).get()
        #expect(try manager.string(forIdentifier: "beta") == "v2")
        #expect(try manager.identifiers() == ["beta"])
    }

    @Test func tamperedKeybagIsDecodeNotAWrongPasscode() throws {
        let keychain = try prepared()
        // Byte 41 is random (a nonce): the edit changes it whatever it holds.
        try keychain.withRawDatabase { try $0.execute(changingByte(41, ofMetaRecord: "keybag")) }
        expectError(.decode) { try keychain.device() }
    }

    @Test func truncatedDeviceSecretIsDecode() throws {
        let keychain = try prepared()
        #expect(truncate(keychain.directory.deviceSecretPath, 16) == 0)
        expectError(.decode) { try keychain.device() }
    }

    // MARK: Records that switch the checks off

    @Test func anUpgradedFormatOneKeychainRequiresItsRecordsFromThenOn() throws {
        let keychain = try TemporaryKeychain(copying: GoldenKeychainTests.fixture("golden-v1"))
        _ = try keychain.device()  // boots once: upgraded
        try keychain.withRawDatabase { try $0.execute("DELETE FROM meta WHERE key = 'state'") }
        expectError(.decode) { try keychain.device() }
    }

    /// The counter once lived in the clear: setting it back let a later write
    /// reuse an old generation, so that an old row could be put back unseen.
    @Test(arguments: [
        "UPDATE meta SET value = 1 WHERE key = 'generation'",
        "UPDATE meta SET value = 9223372036854775807 WHERE key = 'generation'",
        "DELETE FROM meta WHERE key = 'generation'"
    ])
    func theGenerationCounterCannotBeSetBack(_ sql: String) throws {
        let keychain = try prepared()
        try keychain.withRawDatabase { db in
            try db.execute("CREATE TABLE saved AS SELECT * FROM items WHERE ident = 'alpha' AND grp = 'default'")
            try db.execute(sql)
        }
        do {
            let manager = try keychain.manager()
            try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
            try manager.register("second", forIdentifier: "alpha")
            try manager.register("third", forIdentifier: "alpha")
            try manager.register("gamma", forIdentifier: "gamma")
        }
        var generations: [Int64] = []
        try keychain.withRawDatabase { db in
            let query = try db.statement("SELECT generation FROM items ORDER BY generation")
            while try query.step() { generations.append(query.int64(0)) }
            db.finishStatements()
        }
        #expect(Set(generations).count == generations.count, "generations reused: \(generations)")
        #expect(throws: KeychainError.decode) {
            try boot(
                after: """
                    UPDATE items SET generation = (SELECT generation FROM saved), nonce = (SELECT nonce FROM saved),
                                     sealed = (SELECT sealed FROM saved)
                    WHERE ident = 'alpha' AND grp = 'default'
                    """, keychain
            ).get()
        }
    }

    @Test func anExhaustedGenerationCounterRefusesWritesAndKeepsValues() throws {
        let keychain = try prepared()
        // Only the device can write the record: play it, with its secret.
        let secret = DeviceSecret(secret: try keychain.directory.readDeviceSecret())
        let state = ItemSetState(secret: secret)
        try keychain.withRawDatabase { db in
            let query = try db.statement("SELECT value FROM meta WHERE key = 'state'")
            #expect(try query.step())
            var record = try state.record(from: query.blob(0))
            db.finishStatements()
            record.generation = Int64.max - 1
            try db.statement("UPDATE meta SET value = ? WHERE key = 'state'").bind(1, state.sealed(record)).run()
        }
        let manager = try keychain.manager()
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        try manager.register("last", forIdentifier: "alpha")
        expectError(.io) { try manager.register("one too many", forIdentifier: "alpha") }
        expectError(.io) { try manager.register("new", forIdentifier: "delta") }
        #expect(try manager.string(forIdentifier: "alpha") == "last")
    }

    // MARK: Rows changed under a running device

    @Test(arguments: [
        // An older copy of the row put back.
        """
        UPDATE items SET generation = (SELECT generation FROM saved), nonce = (SELECT nonce FROM saved),
                         sealed = (SELECT sealed FROM saved)
        WHERE ident = 'alpha' AND grp = 'default'
        """,
        // The row removed: "absent" would be a lie, it is tampering.
        "DELETE FROM items WHERE ident = 'alpha' AND grp = 'default'"
    ])
    func aRowChangedWhileTheDeviceRunsIsNotServed(_ sql: String) throws {
        let keychain = try prepared()
        do {
            let manager = try keychain.manager()
            try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
            try keychain.withRawDatabase { db in
                try db.execute("CREATE TABLE saved AS SELECT * FROM items WHERE ident = 'alpha' AND grp = 'default'")
            }
            try manager.register("changed-password", forIdentifier: "alpha")
            try keychain.withRawDatabase { try $0.execute(sql) }
            manager.purge()
            // The device serves the row it committed (kept among its recent
            // rows), never the one put back, and never "absent".
            #expect(try manager.string(forIdentifier: "alpha") == "changed-password")
            // And its size (what `stat` shows) is that row's too, not the
            // put-back one's, nor "absent" for the removed one.
            #expect(try manager.info(forIdentifier: "alpha")?.size == "changed-password".utf8.count)
            // A write reads the stored row: it refuses to replace a changed one.
            expectError(.decode) { try manager.register("overwrite", forIdentifier: "alpha") }
            // The other rows still serve.
            #expect(try manager.string(forIdentifier: "beta") == "beta-secret")
        }
        // And the keychain does not boot again.
        expectError(.decode) { try keychain.device() }
    }

    @Test func aRemovedRowBroughtBackWhileTheDeviceRunsIsNotServed() throws {
        let keychain = try prepared()
        let manager = try keychain.manager()
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        try keychain.withRawDatabase { db in
            try db.execute("CREATE TABLE saved AS SELECT * FROM items WHERE ident = 'beta'")
        }
        try manager.deleteKey(forIdentifier: "beta")
        try keychain.withRawDatabase { try $0.execute("INSERT INTO items SELECT * FROM saved") }
        expectError(.decode) { try manager.key(forIdentifier: "beta") }
    }
}
