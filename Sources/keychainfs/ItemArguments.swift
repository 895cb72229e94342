import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

/// `GROUP/IDENTIFIER`, checked as the keychain checks names.
struct ItemAddress: ExpressibleByArgument, CustomStringConvertible {
    let group: String
    let identifier: String

    init(group: String, identifier: String) {
        self.group = group
        self.identifier = identifier
    }

    init?(argument: String) {
        let parts = argument.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 2, (try? ItemLimits.validate(name: parts[0])) != nil,
            (try? ItemLimits.validate(identifier: parts[1])) != nil
        else { return nil }
        group = parts[0]
        identifier = parts[1]
    }

    var description: String { group + "/" + identifier }

    /// Why `argument` names no item, said (ArgumentParser shows it after
    /// "The value ... is invalid for '<item>'").
    struct Refusal: Error, CustomStringConvertible {
        let description: String
    }

    /// `argument` as an item; a refusal says which part is wrong and why.
    @Sendable static func parsed(_ argument: String) throws -> ItemAddress {
        if let address = ItemAddress(argument: argument) { return address }
        guard let slash = argument.firstIndex(of: "/") else {
            throw Refusal(
                description: "an item is named GROUP/NAME, its group first (default/\(argument), for example)")
        }
        let group = String(argument[..<slash]), name = String(argument[argument.index(after: slash)...])
        if let problem = ItemLimits.problem(with: group) { throw Refusal(description: "the group: " + problem) }
        throw Refusal(description: "the name: " + (ItemLimits.problem(withIdentifier: name) ?? "it is not valid"))
    }
}

/// JSON string syntax (RFC 8259) for a text.
func jsonString(_ text: String) -> String {
    var out = "\""
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "\n": out += "\\n"
        case "\t": out += "\\t"
        case "\r": out += "\\r"
        case _ where scalar.value < 0x20:
            out +=
                "\\u" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count)
                + String(scalar.value, radix: 16)
        default: out.unicodeScalars.append(scalar)
        }
    }
    return out + "\""
}

/// RFC 4648 base64.
func base64(_ bytes: [UInt8]) -> String {
    let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    var out: [UInt8] = []
    for start in stride(from: 0, to: bytes.count, by: 3) {
        let chunk = Array(bytes[start..<min(start + 3, bytes.count)]) + [0, 0]
        let value = UInt32(chunk[0]) << 16 | UInt32(chunk[1]) << 8 | UInt32(chunk[2])
        let count = min(3, bytes.count - start)
        for index in 0..<4 {
            out.append(index <= count ? alphabet[Int(value >> UInt32(18 - 6 * index)) & 63] : UInt8(ascii: "="))
        }
    }
    return String(decoding: out, as: UTF8.self)
}
