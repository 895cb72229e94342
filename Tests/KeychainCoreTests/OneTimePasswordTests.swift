import Testing
@testable import KeychainCore

/// RFC 6238 appendix B, through the otpauth:// URIs a user stores: the seeds
/// are the RFC's ASCII keys ("1234567890" repeated to 20, 32 and 64 bytes), in base32.
@Suite struct OneTimePasswordTests {
    static let seeds: [OneTimePassword.Algorithm: String] = [
        .sha1: "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ",
        .sha256: "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQGEZA====",
        .sha512:
            "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQGEZDGNA="
    ]

    static let vectors: [(time: Int64, sha1: String, sha256: String, sha512: String)] = [
        (59, "94287082", "46119246", "90693936"),
        (1_111_111_109, "07081804", "68084774", "25091201"),
        (1_111_111_111, "14050471", "67062674", "99943326"),
        (1_234_567_890, "89005924", "91819424", "93441116"),
        (2_000_000_000, "69279037", "90698825", "38618901"),
        (20_000_000_000, "65353130", "77737706", "47863826")
    ]

    static func generator(_ uri: String) throws -> OneTimePassword {
        try OneTimePassword(item: try SecureBytes(uri))
    }

    @Test(arguments: OneTimePassword.Algorithm.allCases)
    func rfc6238Vectors(algorithm: OneTimePassword.Algorithm) throws {
        let otp = try Self.generator(
            "otpauth://totp/Example:alice?secret=\(Self.seeds[algorithm]!)&algorithm=\(algorithm.rawValue)&digits=8&period=30"
        )
        for vector in Self.vectors {
            let expected =
                switch algorithm {
                case .sha1: vector.sha1;
                case .sha256: vector.sha256;
                case .sha512: vector.sha512
                }
            #expect(try otp.code(at: vector.time) == expected, "T=\(vector.time)")
        }
    }

    @Test func defaultsAreSha1SixDigitsThirtySeconds() throws {
        let otp = try Self.generator("otpauth://totp/x?secret=GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ")
        #expect((otp.algorithm, otp.digits, otp.period) == (.sha1, 6, 30))
        #expect(try otp.code(at: 59) == "287082")  // the low six digits of the 8-digit vector
        #expect(otp.secondsRemaining(at: 59) == 1)
        #expect(otp.secondsRemaining(at: 60) == 30)
    }

    @Test func theUriMayBeAnyLineOfAPassStyleEntry() throws {
        let otp = try Self.generator(
            "hunter2\nuser: alice\r\nOTPAUTH://TOTP/x?Secret=gezdgnbvgy3tqojqgezdgnbvgy3tqojq&issuer=Example\n")
        #expect(try otp.code(at: 59) == "287082")
    }

    @Test func percentEncodedPaddingAndSpacesAreAccepted() throws {
        let otp = try Self.generator(
            "otpauth://totp/x?algorithm=sha256&digits=7&secret=GEZD GNBV GY3T QOJQ GEZD GNBV GY3T QOJQ GEZD GNBV GY3T QOJQ GEZA%3D%3D%3D%3D"
        )
        #expect(try otp.code(at: 59) == "6119246")
    }

    @Test func aLongerPeriodChangesTheCounter() throws {
        let otp = try Self.generator("otpauth://totp/x?secret=GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ&period=60&digits=8")
        // T=118 with a 60 s period is counter 1, as T=59 is with 30 s.
        #expect(try otp.code(at: 118) == "94287082")
    }

    @Test(arguments: [
        ("no uri here", OneTimePasswordError.noURI),
        ("otpauth://hotp/x?secret=GEZDGNBV&counter=1", .notTimeBased(type: "hotp")),
        ("otpauth://totp/x", .missingSecret),
        ("otpauth://totp/x?issuer=Example", .missingSecret),
        ("otpauth://totp/x?secret=", .missingSecret),
        ("otpauth://totp/x?secret=GEZD1GNBV", .badSecret),
        ("otpauth://totp/x?secret=GEZD%4", .badSecret),
        (
            "otpauth://totp/x?secret=GEZDGNBV&algorithm=MD5",
            .badParameter(name: "algorithm", expected: "SHA1, SHA256 or SHA512")
        ),
        ("otpauth://totp/x?secret=GEZDGNBV&digits=5", .badParameter(name: "digits", expected: "6, 7 or 8")),
        ("otpauth://totp/x?secret=GEZDGNBV&digits=9", .badParameter(name: "digits", expected: "6, 7 or 8")),
        (
            "otpauth://totp/x?secret=GEZDGNBV&period=0",
            .badParameter(name: "period", expected: "seconds from 1 to 86400")
        ),
        (
            "otpauth://totp/x?secret=GEZDGNBV&period=-30",
            .badParameter(name: "period", expected: "seconds from 1 to 86400")
        )
    ])
    func badUrisSayWhatIsWrong(uri: String, expected: OneTimePasswordError) {
        #expect(throws: expected) { try OneTimePassword(item: try SecureBytes(uri)) }
    }

    @Test func errorsNeverQuoteTheSecret() {
        let error = #expect(throws: OneTimePasswordError.self) {
            try OneTimePassword(item: try SecureBytes("otpauth://totp/x?secret=SECRETSECRET1&digits=6"))
        }
        #expect(error.map { !"\($0)".contains("SECRET") } == true)
    }
}
