import KeychainCore
/// The device's answer.
public enum DeviceReply: Equatable, Sendable {
    /// Done; `fields` are the operation's results.
    case ok([String])
    /// A core error, as the core threw it, with a sentence for the user.
    case keychainError(KeychainError, String)
    /// A system error (an errno), with a sentence for the user.
    case systemError(Int32, String)
    /// An item's value, in secret memory, with the class it is stored under.
    case value(SecureBytes, ProtectionClass)

    /// The reply as a frame.
    public func frame() throws(KeychainError) -> SecureBytes {
        switch self {
        case .value(let value, let protectionClass):
            return try FrameField.frame(kind: 3, code: 0, [.optionalSecret(value), .text(protectionClass.name)])
        case .ok(let fields): return try FrameField.frame(kind: 0, code: 0, fields.map(FrameField.text))
        case .keychainError(let error, let message):
            return try FrameField.frame(kind: 1, code: error.rawValue, [.text(message)])
        case .systemError(let code, let message): return try FrameField.frame(kind: 2, code: code, [.text(message)])
        }
    }

    /// Parses a reply body.
    public init(body: UnsafeRawBufferPointer) throws(KeychainError) {
        var reader = ByteReader(frame: body)
        guard try reader.readByte() == DeviceProtocol.version else { throw .param }
        let kind = try reader.readByte(), code = try reader.readInt32()
        if kind == 3 {
            guard code == 0, let value = try reader.optionalSecret(),
                let protectionClass = ProtectionClass(name: try reader.text()),
                reader.isAtEnd
            else { throw .param }
            self = .value(value, protectionClass)
            return
        }
        var fields: [String] = []
        while !reader.isAtEnd { fields.append(try reader.text()) }
        switch kind {
        case 0: self = .ok(fields)
        case 1: self = .keychainError(KeychainError(rawValue: code), fields.first ?? "")
        case 2: self = .systemError(code, fields.first ?? "")
        default: throw .param
        }
    }
}
