import KeychainCore

/// Item names made from text that may hold what names cannot (a URL's `/`,
/// control characters): those bytes, and `%` itself, percent-encoded
/// (RFC 3986 style), so that every text has exactly one name and back.
enum ItemName {
    /// `text` as a name; the characters of `separators` are encoded too, so
    /// that names joined with one of them split back one way only.
    static func encoded(_ text: String, escaping separators: String = "") -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            let value = scalar.value
            if scalar == "%" || scalar == "/" || value < 0x20 || (0x7f...0x9f).contains(value)
                || separators.unicodeScalars.contains(scalar)
            {
                for byte in String(scalar).utf8 {
                    let hex = String(byte, radix: 16, uppercase: true)
                    out += "%" + (hex.count < 2 ? "0" : "") + hex
                }
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// The text ``encoded(_:)`` was given; nil for a malformed name.
    static func decoded(_ name: String) -> String? {
        var bytes: [UInt8] = []
        var utf8 = Array(name.utf8)[...]
        while let byte = utf8.popFirst() {
            guard byte == UInt8(ascii: "%") else { bytes.append(byte); continue }
            guard utf8.count >= 2, let value = UInt8(String(decoding: utf8.prefix(2), as: UTF8.self), radix: 16) else {
                return nil
            }
            bytes.append(value)
            utf8 = utf8.dropFirst(2)
        }
        return String(validating: bytes, as: UTF8.self)
    }
}

/// A name as the terminal shows it: control characters (an escape
/// sequence in a pass entry's file name or a Secret Service label could
/// clear or rewrite the screen) and backslashes escaped, on one line.
func shown(_ name: String) -> String { LineEscaping.escaped(name) }
