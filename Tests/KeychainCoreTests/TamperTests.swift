import Glibc
import Testing
@testable import KeychainCore

/// Stored bytes that were altered give `decode`, never wrong data (gocryptfs doRead).
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

    func readAfter(_ keychain: TemporaryKeychain, _ sql: String, identifier: String = "alpha",
                   group: String = "default") throws -> Result<String, KeychainError> {
        try keychain.withRawDatabase { try $0.execute(sql) }
        let manager = try keychain.manager()
        try manager.device.unlock(passcode: secure(TemporaryKeychain.passcode))
        return Result { () throws(KeychainError) in try manager.string(forIdentifier: identifier, inGroup: group) }
    }

    @Test func flippedCiphertextByteIsDetected() throws {
        let keychain = try prepared()
        let result = try readAfter(keychain, """
            UPDATE items SET sealed = (CASE WHEN substr(sealed, 1, 1) = x'00' THEN x'01' ELSE x'00' END) || substr(sealed, 2)
            WHERE ident = 'alpha' AND grp = 'default'
            """)
        #expect(throws: KeychainError.decode) { try result.get() }
    }

    @Test func rowsSwappedBetweenIdentifiersAreDetected() throws {
        let keychain = try prepared()
        let result = try readAfter(keychain, """
            UPDATE items SET nonce = (SELECT nonce FROM items WHERE ident = 'beta'),
                             sealed = (SELECT sealed FROM items WHERE ident = 'beta'),
                             generation = (SELECT generation FROM items WHERE ident = 'beta')
            WHERE ident = 'alpha' AND grp = 'default'
            """)
        #expect(throws: KeychainError.decode) { try result.get() }
    }

    @Test func rowMovedToAnotherGroupIsDetected() throws {
        let keychain = try prepared()
        let result = try readAfter(keychain, """
            DELETE FROM items WHERE grp = 'default' AND ident = 'alpha';
            UPDATE items SET grp = 'default' WHERE grp = 'other' AND ident = 'alpha';
            """)
        #expect(throws: KeychainError.decode) { try result.get() }
    }

    @Test func changedGenerationIsDetected() throws {
        let keychain = try prepared()
        let result = try readAfter(keychain, "UPDATE items SET generation = generation + 1 WHERE ident = 'alpha' AND grp = 'default'")
        #expect(throws: KeychainError.decode) { try result.get() }
    }

    @Test func downgradedClassIsDetected() throws {
        let keychain = try prepared()
        // Claiming `always` would make the row readable while locked if the class were not bound.
        let result = try readAfter(keychain, "UPDATE items SET class = 3 WHERE ident = 'alpha' AND grp = 'default'")
        #expect(throws: KeychainError.decode) { try result.get() }
    }

    @Test func unknownClassIsDetected() throws {
        let keychain = try prepared()
        let result = try readAfter(keychain, "UPDATE items SET class = 99 WHERE ident = 'alpha' AND grp = 'default'")
        #expect(throws: KeychainError.decode) { try result.get() }
    }

    @Test func untouchedRowsStillReadAfterAnotherIsTampered() throws {
        let keychain = try prepared()
        let result = try readAfter(keychain, "UPDATE items SET generation = 0 WHERE ident = 'alpha' AND grp = 'default'",
                                   identifier: "beta")
        #expect(try result.get() == "beta-secret")
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
