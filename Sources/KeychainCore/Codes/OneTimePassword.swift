internal import COpenSSL

/// Time-based one-time codes (TOTP, RFC 6238) from an item holding an
/// `otpauth://totp/` key URI, the format authenticator apps scan from QR
/// codes (and that pass-otp stores on a line of its own).
///
/// The key stays in secret memory; only the code, which is meant to be shown,
/// leaves as a `String`.
public struct OneTimePassword: Sendable {
    /// The HMAC hash (the URI's `algorithm`, SHA1 unless it says otherwise).
    public enum Algorithm: String, Sendable, CaseIterable {
        case sha1 = "SHA1", sha256 = "SHA256", sha512 = "SHA512"
    }

    public let algorithm: Algorithm
    /// Length of a code: 6 to 8 (RFC 4226 section 5.3 asks for at least 6).
    public let digits: Int
    /// Seconds each code is valid for (the URI's `period`, 30 unless it says otherwise).
    public let period: Int
    private let key: SecureBytes

    public static let digitRange = 6...8
    public static let periodRange = 1...86_400

    /// A generator for a raw key.
    public init(key: SecureBytes, algorithm: Algorithm = .sha1, digits: Int = 6, period: Int = 30)
        throws(OneTimePasswordError)
    {
        guard Self.digitRange.contains(digits) else { throw .badParameter(name: "digits", expected: "6, 7 or 8") }
        guard Self.periodRange.contains(period) else {
            throw .badParameter(name: "period", expected: "seconds from 1 to 86400")
        }
        guard key.count > 0 else { throw .missingSecret }
        self.key = key
        self.algorithm = algorithm
        self.digits = digits
        self.period = period
    }

    /// The generator an item's value describes: its first line that is an
    /// `otpauth://` URI (so a pass entry with the password on line one works).
    public init(item value: SecureBytes) throws(OneTimePasswordError) {
        let uri: KeyURI = try value.withUnsafeBytes { (bytes) throws(OneTimePasswordError) in try KeyURI(firstIn: bytes)
        }
        try self.init(key: uri.key, algorithm: uri.algorithm, digits: uri.digits, period: uri.period)
    }

    /// The code for a Unix time (seconds since 1970-01-01 UTC).
    public func code(at time: Int64) throws(OneTimePasswordError) -> String {
        let counter = UInt64(max(time, 0)) / UInt64(period)
        return try Self.hotp(key: key, counter: counter, algorithm: algorithm, digits: digits)
    }

    /// Seconds until the code for `time` changes.
    public func secondsRemaining(at time: Int64) -> Int {
        period - Int(UInt64(max(time, 0)) % UInt64(period))
    }

    /// HOTP (RFC 4226 section 5.3): HMAC of the big-endian counter, dynamic
    /// truncation to 31 bits, the low `digits` decimal digits.
    static func hotp(key: SecureBytes, counter: UInt64, algorithm: Algorithm, digits: Int) throws(OneTimePasswordError)
        -> String
    {
        var message = [UInt8](repeating: 0, count: 8)
        for index in 0..<8 { message[index] = UInt8(truncatingIfNeeded: counter >> (56 - 8 * UInt64(index))) }
        var mac = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        defer { mac.withUnsafeMutableBytes { wipeMemory($0) } }
        var macLength: UInt32 = 0
        let digest =
            switch algorithm {
            case .sha1: "EVP_sha1"
            case .sha256: "EVP_sha256"
            case .sha512: "EVP_sha512"
            }
        let status = key.withUnsafeBytes { raw in
            COpenSSL_hmac(digest, raw.baseAddress, Int32(raw.count), message, message.count, &mac, &macLength)
        }
        guard status == 0, macLength >= 20 else { throw .noCrypto }
        let offset = Int(mac[Int(macLength) - 1] & 0x0f)
        let binary =
            UInt32(mac[offset] & 0x7f) << 24 | UInt32(mac[offset + 1]) << 16
            | UInt32(mac[offset + 2]) << 8 | UInt32(mac[offset + 3])
        var modulus: UInt32 = 1
        for _ in 0..<digits { modulus *= 10 }
        let text = String(binary % modulus)
        return String(repeating: "0", count: digits - text.count) + text
    }
}

/// Why an item gives no one-time code; never quotes the secret.
public enum OneTimePasswordError: Error, Equatable, CustomStringConvertible {
    case noURI
    case notTimeBased(type: String)
    case missingSecret
    case badSecret
    case badParameter(name: String, expected: String)
    case noCrypto

    public var description: String {
        switch self {
        case .noURI: "holds no otpauth:// URI"
        case .notTimeBased(let type):
            "holds an otpauth://\(type) URI; only time-based codes (otpauth://totp) are supported"
        case .missingSecret: "its otpauth:// URI has no secret"
        case .badSecret: "its otpauth:// URI's secret is not base32 (RFC 4648)"
        case .badParameter(let name, let expected): "its otpauth:// URI's \(name) must be \(expected)"
        case .noCrypto: "needs OpenSSL's libcrypto (libssl3), which could not be loaded"
        }
    }
}

/// The parts of `otpauth://TYPE/LABEL?secret=...&algorithm=...&digits=...&period=...`
/// (Google Authenticator's key URI format) that make a code; the label,
/// issuer and anything else are ignored.
struct KeyURI {
    var key: SecureBytes
    var algorithm = OneTimePassword.Algorithm.sha1
    var digits = 6
    var period = 30

    init(firstIn value: UnsafeRawBufferPointer) throws(OneTimePasswordError) {
        let scheme = Array("otpauth://".utf8)
        // Index ranges into the secret memory itself: no line is copied to the heap.
        let newline = UInt8(ascii: "\n"), carriageReturn = UInt8(ascii: "\r")
        let line = Self.ranges(of: value, in: 0..<value.count, separatedBy: newline)
            .map {
                $0.upperBound > $0.lowerBound && value[$0.upperBound - 1] == carriageReturn
                    ? $0.lowerBound..<($0.upperBound - 1) : $0
            }
            .first { $0.count >= scheme.count && zip(value[$0], scheme).allSatisfy { lowercased($0) == $1 } }
        guard let line else { throw .noURI }
        let rest = (line.lowerBound + scheme.count)..<line.upperBound
        let typeEnd = value[rest].firstIndex { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") } ?? rest.upperBound
        let type = value[rest.lowerBound..<typeEnd]
        guard type.map(lowercased).elementsEqual("totp".utf8) else {
            throw .notTimeBased(type: String(decoding: type.prefix(16), as: UTF8.self).filter { $0.isLetter })
        }
        guard let query = value[rest].firstIndex(of: UInt8(ascii: "?")) else { throw .missingSecret }
        var key: SecureBytes?
        for field in Self.ranges(of: value, in: (query + 1)..<rest.upperBound, separatedBy: UInt8(ascii: "&")) {
            let nameEnd = value[field].firstIndex(of: UInt8(ascii: "=")) ?? field.upperBound
            let name = String(decoding: value[field.lowerBound..<nameEnd].map(lowercased), as: UTF8.self)
            let text = value[min(nameEnd + 1, field.upperBound)..<field.upperBound]
            switch name {
            case "secret": key = try Self.base32(percentDecoding: UnsafeRawBufferPointer(rebasing: text))
            case "algorithm":
                guard
                    let algorithm = OneTimePassword.Algorithm(
                        rawValue: String(decoding: text, as: UTF8.self).uppercased())
                else {
                    throw .badParameter(name: "algorithm", expected: "SHA1, SHA256 or SHA512")
                }
                self.algorithm = algorithm
            // Not a number is out of range: OneTimePassword.init checks both, once.
            case "digits": digits = Self.number(text) ?? 0
            case "period": period = Self.number(text) ?? 0
            default: break
            }
        }
        guard let key, key.count > 0 else { throw .missingSecret }
        self.key = key
    }

    /// The non-empty ranges between separators within `range`.
    private static func ranges(of bytes: UnsafeRawBufferPointer, in range: Range<Int>, separatedBy separator: UInt8)
        -> [Range<Int>]
    {
        var ranges: [Range<Int>] = []
        var start = range.lowerBound
        for index in range where bytes[index] == separator {
            if index > start { ranges.append(start..<index) }
            start = index + 1
        }
        if range.upperBound > start { ranges.append(start..<range.upperBound) }
        return ranges
    }

    private static func number(_ text: Slice<UnsafeRawBufferPointer>) -> Int? {
        guard (1...5).contains(text.count), text.allSatisfy({ (0x30...0x39).contains($0) }) else { return nil }
        return text.reduce(0) { $0 * 10 + Int($1 - 0x30) }
    }

    /// RFC 4648 base32, case-insensitive, `=` padding and spaces (which
    /// people type) skipped, `%XX` escapes undone first. Decoded in secret
    /// memory: the key never passes through an ordinary buffer.
    static func base32(percentDecoding text: UnsafeRawBufferPointer) throws(OneTimePasswordError) -> SecureBytes {
        guard let scratch = try? SecureBytes(count: text.count * 5 / 8 + 1) else { throw .badSecret }
        var accumulator: UInt32 = 0
        var bits = 0
        var count = 0
        var index = 0
        while index < text.count {
            var byte = text[index]
            index += 1
            if byte == UInt8(ascii: "%") {
                guard index + 2 <= text.count, let high = hexValue(text[index]), let low = hexValue(text[index + 1])
                else { throw .badSecret }
                byte = high << 4 | low
                index += 2
            }
            let value: UInt32
            switch lowercased(byte) {
            case UInt8(ascii: "a")...UInt8(ascii: "z"): value = UInt32(lowercased(byte) - UInt8(ascii: "a"))
            case UInt8(ascii: "2")...UInt8(ascii: "7"): value = UInt32(byte - UInt8(ascii: "2")) + 26
            case UInt8(ascii: "="), UInt8(ascii: " "): continue
            default: throw .badSecret
            }
            accumulator = (accumulator << 5 | value) & 0xffff
            bits += 5
            if bits >= 8 {
                bits -= 8
                scratch.mutableBytes[count] = UInt8(truncatingIfNeeded: accumulator >> UInt32(bits))
                count += 1
            }
        }
        guard let key = try? SecureBytes(copying: UnsafeRawBufferPointer(rebasing: scratch.mutableBytes[0..<count]))
        else { throw .badSecret }
        return key
    }
}

private func lowercased(_ byte: UInt8) -> UInt8 {
    (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) ? byte | 0x20 : byte
}

private func hexValue(_ byte: UInt8) -> UInt8? {
    switch lowercased(byte) {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
    case UInt8(ascii: "a")...UInt8(ascii: "f"): lowercased(byte) - UInt8(ascii: "a") + 10
    default: nil
    }
}
