import Glibc
import Testing
@testable import KeychainCore

/// Stored bytes that were altered give `decode`, never wrong data (gocryptfs
/// doRead). Changes to a row's identity (group, identifier, class,
/// generation), rolled-back, removed or resurrected rows are caught when the
/// device boots (the item-set state); altered ciphertext when it is read.
@Suite struct TamperTests {
    func prepared() throws -> TemporaryKeychain {
        let keychain = try TemporaryKeychain()
        let manager = try keychain.manager()
        try manager.device.unlock(passcode: secure(TemporaryKeychain.passcode))
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
            try manager.device.unlock(passcode: try SecureBytes(TemporaryKeychain.passcode))
            return .success(manager)
        } catch let error as KeychainError {
            return .failure(error)
        }
    }

    @Test func flippedCiphertextByteFailsTheRead() throws {
        let keychain = try prepared()
        let manager = try boot(after: """
            UPDATE items SET sealed = (CASE WHEN substr(sealed, 1, 1) = x'00' THEN x'01' ELSE x'00' END) || substr(sealed, 2)
            WHERE ident = 'alpha' AND grp = 'default'
            """, keychain).get()
        expectError(.decode) { try manager.key(forIdentifier: "alpha") }
        // The other rows still read.
        #expect(try manager.string(forIdentifier: "beta") == "beta-secret")
    }

    @Test func ciphertextSwappedBetweenIdentifiersFailsTheRead() throws {
        let keychain = try prepared()
        let manager = try boot(after: """
            UPDATE items SET nonce = (SELECT nonce FROM items WHERE ident = 'beta'),
                             sealed = (SELECT sealed FROM items WHERE ident = 'beta')
            WHERE ident = 'alpha' AND grp = 'default'
            """, keychain).get()
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
        "UPDATE meta SET value = substr(value, 1, 10) || x'00' || substr(value, 12) WHERE key = 'state'",
    ])
    func changedRowIdentityIsCaughtAtBoot(_ sql: String) throws {
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
            try manager.device.unlock(passcode: secure(TemporaryKeychain.passcode))
            try manager.register("changed-password", forIdentifier: "alpha")
        }
        #expect(throws: KeychainError.decode) {
            try boot(after: """
                UPDATE items SET class = (SELECT class FROM saved), generation = (SELECT generation FROM saved),
                                 nonce = (SELECT nonce FROM saved), sealed = (SELECT sealed FROM saved)
                WHERE ident = 'alpha' AND grp = 'default'
                """, keychain).get()
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
        #expect(throws: KeychainError.decode) { try boot(after: "INSERT INTO items SELECT * FROM saved", keychain).get() }
    }

    @Test func everyMutationKeepsTheStateConsistent() throws {
        let keychain = try prepared()
        do {
            let manager = try keychain.manager()
            try manager.device.unlock(passcode: secure(TemporaryKeychain.passcode))
            try manager.register("v2", forIdentifier: "alpha")
            try manager.renameKey(forIdentifier: "alpha", to: "gamma")
            try manager.renameKey(forIdentifier: "gamma", to: "beta", replacing: true)
            try manager.setProtectionClass(.alwaysThisDeviceOnly, forIdentifier: "beta")
            try manager.deleteKey(forIdentifier: "alpha", inGroup: "other")
            try manager.write(secure("x"), identifier: "new", group: "g", protectionClass: .always, condition: .ifAbsent)
        }
        let manager = try boot(after: "SELECT 1", keychain).get()
        #expect(try manager.string(forIdentifier: "beta") == "v2")
        #expect(try manager.identifiers() == ["beta"])
    }

    @Test func tamperedKeybagIsDecodeNotAWrongPasscode() throws {
        let keychain = try prepared()
        try keychain.withRawDatabase { db in
            try db.execute("UPDATE meta SET value = substr(value, 1, 40) || x'ff' || substr(value, 42) WHERE key = 'keybag'")
        }
        expectError(.decode) { try keychain.device() }
    }

    @Test func truncatedDeviceSecretIsDecode() throws {
        let keychain = try prepared()
        #expect(truncate(keychain.directory.deviceSecretPath, 16) == 0)
        expectError(.decode) { try keychain.device() }
    }
}
