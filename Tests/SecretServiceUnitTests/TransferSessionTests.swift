import KeychainCore
import Testing
@testable import SecretService

/// Both ends of the spec's transfer algorithms: what one end seals, the
/// other opens, and nothing else does (dh-ietf1024-sha256-aes128-cbc-pkcs7,
/// as libsecret and gnome-keyring do it; and plain).
@Suite struct TransferSessionTests {
    static func secret(_ text: String) throws -> SecureBytes { try SecureBytes(text) }

    @Test func aSecretSealedAtOneEndOfADHSessionOpensAtTheOtherAndNowhereElse() throws {
        let client = try TransferSession.clientKeyPair()
        let (server, serverPublic) = try TransferSession.server(
            algorithm: TransferSession.diffieHellman, peer: client.publicKey,
            owner: ":1.7", path: "/org/freedesktop/secrets/session/1")
        let clientEnd = try TransferSession.client(
            path: server.path, exponent: client.exponent, peer: try #require(serverPublic))
        // Provider to client (GetSecret) and client to provider (CreateItem, SetSecret).
        let (parameters, sealed) = try server.seal(try Self.secret("hunter2"))
        #expect(parameters.count == 16 && sealed.bytes() != Array("hunter2".utf8))
        #expect(try clientEnd.open(sealed, parameters: parameters).bytes() == Array("hunter2".utf8))
        let (back, sent) = try clientEnd.seal(try Self.secret("s3cret"))
        #expect(try server.open(sent, parameters: back).bytes() == Array("s3cret".utf8))
        // Another session's key does not open it.
        let other = try TransferSession.clientKeyPair()
        let (stranger, _) = try TransferSession.server(
            algorithm: TransferSession.diffieHellman, peer: other.publicKey,
            owner: ":1.8", path: "/org/freedesktop/secrets/session/2")
        #expect((try? stranger.open(sealed, parameters: parameters).bytes()) != Array("hunter2".utf8))
        // A fresh IV every time: the same secret never crosses twice the same.
        #expect(try server.seal(try Self.secret("hunter2")).sealed.bytes() != sealed.bytes())
    }

    @Test func aPeerKeyOutsideTheGroupOrOfAWrongSizeIsRefused() throws {
        let p = try #require(
            Hex.bytes(
                "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD"
                    + "EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED"
                    + "EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE65381FFFFFFFFFFFFFFFF", count: 128))
        var pMinusOne = p
        pMinusOne[pMinusOne.count - 1] -= 1
        for peer in [[0], [1], pMinusOne, p, [UInt8](repeating: 0xFF, count: 128)] as [[UInt8]] {
            #expect(throws: BusError.self) {
                _ = try TransferSession.server(
                    algorithm: TransferSession.diffieHellman, peer: peer, owner: ":1.7", path: "/s")
            }
        }
        #expect(throws: BusError.self) {
            _ = try TransferSession.server(
                algorithm: TransferSession.diffieHellman, peer: [UInt8](repeating: 2, count: 129),
                owner: ":1.7", path: "/s")
        }
    }

    @Test func aPlainSessionCarriesTheSecretAsItIsAndTakesNoParameters() throws {
        let (plain, output) = try TransferSession.server(
            algorithm: TransferSession.plain, peer: nil, owner: ":1.7", path: "/s")
        #expect(output == nil)
        let (parameters, sealed) = try plain.seal(try Self.secret("v"))
        #expect(parameters.isEmpty && sealed.bytes() == Array("v".utf8))
        #expect(throws: BusError.self) { _ = try plain.open(try Self.secret("v"), parameters: [1]) }
    }
}
