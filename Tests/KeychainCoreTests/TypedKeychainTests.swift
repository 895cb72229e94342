import Foundation
import Testing
@testable import KeychainCore

@Suite struct TypedKeychainTests {
    struct Credentials: Codable, Equatable {
        var user: String
        var token: String
        var expires: Int
    }

    func view(_ keychain: TemporaryKeychain, group: String = "TEAMID.com.example.app") throws -> TypedKeychain {
        let manager = try keychain.manager()
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        return try TypedKeychain(manager: manager, group: group)
    }

    @Test func stringsAndDataAreStoredAsTheirBytes() throws {
        let keychain = try TemporaryKeychain()
        let chain = try view(keychain)
        try chain.set("pässword", forKey: "text")
        try chain.set(Data([0, 1, 2, 255]), forKey: "bytes")
        #expect(try chain["text"] == "pässword")
        #expect(try chain.data(forKey: "text") == Data("pässword".utf8))
        #expect(try chain.data(forKey: "bytes") == Data([0, 1, 2, 255]))
        #expect(try chain["missing"] == nil)
        // The same bytes through the password-manager API, as `cat` would see them.
        #expect(try chain.manager.string(forIdentifier: "text", inGroup: chain.group) == "pässword")
    }

    @Test func codableValuesRoundTripAsJSON() throws {
        let keychain = try TemporaryKeychain()
        let chain = try view(keychain)
        let credentials = Credentials(user: "ada", token: "t0k3n", expires: 1_900_000_000)
        try chain.set(credentials, forKey: "login")
        try chain.set([1, 2, 3], forKey: "numbers")
        #expect(try chain["login", as: Credentials.self] == credentials)
        #expect(try chain.value(forKey: "numbers", as: [Int].self) == [1, 2, 3])
        #expect(try chain.value(forKey: "login", as: String.self)?.contains("\"user\"") == true)
    }

    @Test func bytesThatAreNotTheRequestedTypeGiveDecode() throws {
        let keychain = try TemporaryKeychain()
        let chain = try view(keychain)
        try chain.set(Data([0xff, 0xfe]), forKey: "binary")
        try chain.set("not json", forKey: "text")
        expectError(.decode) { try chain.string(forKey: "binary") }
        expectError(.decode) { try chain.value(forKey: "text", as: Credentials.self) }
        expectError(.decode) { try chain.value(forKey: "text", as: [Int].self) }
    }

    @Test func removeAndAllKeysWorkWhileLockedButReadsThrow() throws {
        let keychain = try TemporaryKeychain()
        let chain = try view(keychain)
        try chain.set("a", forKey: "a")
        try chain.set("b", forKey: "b")
        chain.manager.localDevice.lock()
        #expect(try chain.allKeys() == ["a", "b"])
        expectError(.interactionNotAllowed) { try chain.string(forKey: "a") }
        expectError(.interactionNotAllowed) { try chain.set("c", forKey: "c") }
        #expect(try chain.removeValue(forKey: "a"))
        #expect(try !chain.removeValue(forKey: "a"))
        #expect(try chain.allKeys() == ["b"])
    }

    @Test func aGroupNobodyWroteToIsEmpty() throws {
        let keychain = try TemporaryKeychain()
        let chain = try view(keychain, group: "never-written")
        #expect(try chain.allKeys() == [])
        expectError(.param) { try TypedKeychain(manager: chain.manager, group: "a/b") }
    }
}
