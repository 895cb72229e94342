import Foundation
import Testing
@testable import KeychainCore

/// Fixed vectors for the on-disk encryption. The item vectors were computed
/// by docs/vectors/item_vector.py, an independent implementation (HChaCha20
/// written out, ChaCha20-Poly1305 from pyca/cryptography).
@Suite struct KnownAnswerTests {
    /// draft-irtf-cfrg-xchacha-03, appendix A.3.1.
    @Test func xchacha20Poly1305MatchesTheDraftVector() throws {
        let key = GuardedKey(copying: try SecureBytes(Array(0x80...0x9f)))
        let nonce = Array(UInt8(0x40)...UInt8(0x57))
        let plaintext = try SecureBytes(
            "Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it."
        )
        let ad = [UInt8](Data(hex: "50515253c0c1c2c3c4c5c6c7"))
        let sealed = key.withKey { k in
            plaintext.withUnsafeBytes { Crypto.seal($0, key: k, nonce: nonce, associatedData: ad) }
        }
        #expect(
            Data(sealed)
                == Data(
                    hex: """
                        bd6d179d3e83d43b9576579493c0e939572a1700252bfaccbed2902c21396cbb731c7f1b0b4aa6440bf3a82f4eda7e39ae64c6708c54c216cb96b72e1213b4522f8c9ba40db5d945b11b69b982c1bb9e3f3fac2bc369488f76b2383565d3fff921f9664c97637da9768812f615c68b13b52ec0875924c1c7987947deafd8780acf49
                        """))
        let opened = try key.withKey { k in try Crypto.open(sealed, key: k, nonce: nonce, associatedData: ad) }
        #expect(opened == plaintext)
    }

    @Test func itemAssociatedDataLayoutIsStable() {
        let ad = ItemCipher.associatedData(
            group: "TEAMID.com.example.shared", identifier: "db-password",
            protectionClass: .always, generation: 42)
        #expect(
            Data(ad)
                == Data(
                    hex:
                        "6b6366732d6974656d01032a0000000000000019005445414d49442e636f6d2e6578616d706c652e7368617265640b0064622d70617373776f7264"
                ))
    }

    @Test func sealedItemMatchesTheIndependentImplementation() throws {
        let key = GuardedKey(copying: try SecureBytes(Array(0...31)))
        let row = ItemCipher.seal(
            try SecureBytes("hunter2"), group: "TEAMID.com.example.shared", identifier: "db-password",
            protectionClass: .always, generation: 42, key: key, nonce: Array(100...123))
        #expect(Data(row.sealed) == Data(hex: "140697c49a5cbb5c3d6320aa1e35a301631bc431de391c"))
        #expect(try ItemCipher.open(row, key: key).string() == "hunter2")
    }
}
