/// The Secret Service's object paths for the keychain's names: a collection
/// is an access group, an item an identifier in it. A path element holds
/// only `[A-Za-z0-9_]`: every other byte, and `_` itself, is written `_XX`
/// (two lowercase hex digits), as gnome-keyring escapes, so that every name
/// has exactly one path and back.
enum ObjectPaths {
    static let service = "/org/freedesktop/secrets"
    static let collectionPrefix = service + "/collection/"
    static let sessionPrefix = service + "/session/"
    static let aliasPrefix = service + "/aliases/"
    static let promptPrefix = service + "/prompt/"
    /// No object (an absent prompt, an unknown alias).
    static let none = "/"

    static func element(_ name: String) -> String {
        var out = ""
        for byte in name.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"):
                out.unicodeScalars.append(UnicodeScalar(byte))
            default:
                let hex = String(byte, radix: 16)
                out += "_" + (hex.count < 2 ? "0" : "") + hex
            }
        }
        return out
    }

    /// The name an element stands for; nil when it is not exactly what
    /// ``element(_:)`` makes of some name (one spelling per name).
    static func name(_ element: Substring) -> String? {
        var bytes: [UInt8] = []
        var rest = Array(element.utf8)[...]
        while let byte = rest.popFirst() {
            guard byte == UInt8(ascii: "_") else {
                bytes.append(byte)
                continue
            }
            guard rest.count >= 2, let value = UInt8(String(decoding: rest.prefix(2), as: UTF8.self), radix: 16) else {
                return nil
            }
            bytes.append(value)
            rest = rest.dropFirst(2)
        }
        guard let name = String(validating: bytes, as: UTF8.self), !name.isEmpty, Self.element(name) == element else {
            return nil
        }
        return name
    }

    static func collection(_ group: String) -> String { collectionPrefix + element(group) }
    static func item(_ group: String, _ identifier: String) -> String { collection(group) + "/" + element(identifier) }

    /// What a path names.
    enum Object: Equatable {
        case service
        case collection(String)
        case item(group: String, identifier: String)
        case session(String)
        case alias(String)
        case prompt(String)
        /// The Secret portal's backend (``SecretServiceProvider/portalPath``).
        case portal
    }

    static func object(at path: String) -> Object? {
        if path == service { return .service }
        if path == SecretServiceProvider.portalPath { return .portal }
        if path.hasPrefix(collectionPrefix) {
            let parts = path.dropFirst(collectionPrefix.count).split(separator: "/", omittingEmptySubsequences: false)
            switch parts.count {
            case 1: return name(parts[0]).map { .collection($0) }
            case 2:
                guard let group = name(parts[0]), let identifier = name(parts[1]) else { return nil }
                return .item(group: group, identifier: identifier)
            default: return nil
            }
        }
        for (prefix, make) in [
            (sessionPrefix, Object.session), (aliasPrefix, Object.alias), (promptPrefix, Object.prompt)
        ]
        where path.hasPrefix(prefix) {
            let rest = path.dropFirst(prefix.count)
            guard !rest.isEmpty, !rest.contains("/") else { return nil }
            return make(String(rest))
        }
        return nil
    }
}
