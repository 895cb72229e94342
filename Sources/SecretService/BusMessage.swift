internal import CSystemd
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// A D-Bus error reply: its name (`org.freedesktop.Secret.Error.IsLocked`,
/// `org.freedesktop.DBus.Error.InvalidArgs`) and a sentence. Never a secret.
public struct BusError: Error, Equatable, CustomStringConvertible {
    public let name: String
    public let message: String

    public init(_ name: String, _ message: String) {
        self.name = name
        self.message = message
    }

    public var description: String { "\(name): \(message)" }

    static func invalidArguments(_ message: String) -> BusError {
        BusError("org.freedesktop.DBus.Error.InvalidArgs", message)
    }
    static func failed(_ message: String) -> BusError { BusError("org.freedesktop.DBus.Error.Failed", message) }
    static func unknownMethod(_ message: String) -> BusError {
        BusError("org.freedesktop.DBus.Error.UnknownMethod", message)
    }
    static func notSupported(_ message: String) -> BusError {
        BusError("org.freedesktop.DBus.Error.NotSupported", message)
    }
    static func accessDenied(_ message: String) -> BusError {
        BusError("org.freedesktop.DBus.Error.AccessDenied", message)
    }
    static func noSuchObject(_ message: String) -> BusError {
        BusError("org.freedesktop.Secret.Error.NoSuchObject", message)
    }
    static func isLocked(_ message: String) -> BusError { BusError("org.freedesktop.Secret.Error.IsLocked", message) }
    static func noSession(_ message: String) -> BusError { BusError("org.freedesktop.Secret.Error.NoSession", message) }

    /// What a failed sd-bus call on a message means: a request whose
    /// arguments did not have the types read (EINVAL, ENXIO, EBADMSG).
    static func malformed(_ result: Int32) -> BusError {
        invalidArguments("the arguments do not have the method's signature (\(String(cString: strerror(-result))))")
    }
}

/// The spec's secret struct as a client sent it: its session's path, the
/// parameters (a DH session's IV), the value as sealed in that session,
/// and the content type.
struct SentSecret: MethodArguments {
    let session: String
    let parameters: [UInt8]
    let sealed: SecureBytes
    let contentType: String
    /// Nothing in it has a limit of its own: the value's is the session's to keep.
    var parts: [ArgumentPart] { [] }
}

/// Reads a message's arguments in order, each as the type the method's
/// signature says; a mismatch is ``BusError/invalidArguments(_:)``.
struct BusMessageReader {
    let message: OpaquePointer
    /// What holds the message's reference (a reply), kept while the reader
    /// is: Swift may release a reply after its last use, which
    /// `reply.arguments.string()` would otherwise make before the read.
    private let owner: AnyObject?

    init(message: OpaquePointer, owner: AnyObject? = nil) {
        self.message = message
        self.owner = owner
    }

    private func check(_ result: Int32) throws(BusError) {
        if result < 0 { throw .malformed(result) }
    }

    func string() throws(BusError) -> String { try text("s") }
    func objectPath() throws(BusError) -> String { try text("o") }

    private func text(_ type: Character) throws(BusError) -> String {
        var pointer: UnsafePointer<CChar>?
        let result = withUnsafeMutablePointer(to: &pointer) {
            CSystemd_sd_bus_message_read_basic(message, CChar(type.asciiValue!), $0)
        }
        guard result > 0, let pointer else { throw .malformed(result == 0 ? -EBADMSG : result) }
        return String(cString: pointer)
    }

    func uint64() throws(BusError) -> UInt64 {
        var value: UInt64 = 0
        let result = CSystemd_sd_bus_message_read_basic(message, CChar(UInt8(ascii: "t")), &value)
        guard result > 0 else { throw .malformed(result == 0 ? -EBADMSG : result) }
        return value
    }

    func uint32() throws(BusError) -> UInt32 {
        var value: UInt32 = 0
        try check(CSystemd_sd_bus_message_read_basic(message, CChar(UInt8(ascii: "u")), &value))
        return value
    }

    func bool() throws(BusError) -> Bool {
        var value: Int32 = 0
        let result = CSystemd_sd_bus_message_read_basic(message, CChar(UInt8(ascii: "b")), &value)
        guard result > 0 else { throw .malformed(result == 0 ? -EBADMSG : result) }
        return value != 0
    }

    /// An `ay`, copied into secret memory (it may be a secret).
    func secretBytes() throws(BusError) -> SecureBytes {
        var pointer: UnsafeRawPointer?
        var size = 0
        try check(CSystemd_sd_bus_message_read_array(message, CChar(UInt8(ascii: "y")), &pointer, &size))
        do {
            return try SecureBytes(copying: UnsafeRawBufferPointer(start: pointer, count: size))
        } catch {
            throw .failed("no memory for the secret")
        }
    }

    /// An `ay` that is not secret (parameters, a public key).
    func bytes() throws(BusError) -> [UInt8] {
        var pointer: UnsafeRawPointer?
        var size = 0
        try check(CSystemd_sd_bus_message_read_array(message, CChar(UInt8(ascii: "y")), &pointer, &size))
        return Array(UnsafeRawBufferPointer(start: pointer, count: size))
    }

    func enter(_ type: Character, _ contents: String) throws(BusError) {
        let result = CSystemd_sd_bus_message_enter_container(message, CChar(type.asciiValue!), contents)
        guard result > 0 else { throw .malformed(result == 0 ? -EBADMSG : result) }
    }

    /// Enters the next element of an array; false at its end.
    func enterElement(_ type: Character, _ contents: String) throws(BusError) -> Bool {
        let result = CSystemd_sd_bus_message_enter_container(message, CChar(type.asciiValue!), contents)
        try check(result)
        return result > 0
    }

    func exit() throws(BusError) {
        try check(CSystemd_sd_bus_message_exit_container(message))
    }

    /// An `ao`.
    func objectPaths() throws(BusError) -> [String] {
        try enter("a", "o")
        var paths: [String] = []
        while CSystemd_sd_bus_message_at_end(message, 0) == 0 { paths.append(try objectPath()) }
        try exit()
        return paths
    }

    /// The spec's secret struct `(oayays)`: its session's path, the
    /// parameters (a DH session's IV), the value as sent (into secret
    /// memory) and the content type.
    func secretStruct() throws(BusError) -> SentSecret {
        try enter("r", "oayays")
        let session = try objectPath(), parameters = try bytes(), sealed = try secretBytes(), contentType = try string()
        try exit()
        return SentSecret(session: session, parameters: parameters, sealed: sealed, contentType: contentType)
    }

    /// An `a{ss}` (lookup attributes), at most `limit` pairs of at most `textLimit` bytes each.
    func stringDictionary(limit: Int = 256, textLimit: Int = 4096) throws(BusError) -> [String: String] {
        try enter("a", "{ss}")
        var dictionary: [String: String] = [:]
        while try enterElement("e", "ss") {
            let key = try string(), value = try string()
            try exit()
            guard dictionary.count < limit, key.utf8.count <= textLimit, value.utf8.count <= textLimit else {
                throw .invalidArguments("at most \(limit) attributes of at most \(textLimit) bytes each")
            }
            dictionary[key] = value
        }
        try exit()
        return dictionary
    }

    /// An `a{sv}` (properties), keeping the values of the types of
    /// ``PropertyValue`` and skipping the others (a property this service
    /// does not keep is read past, not refused). `a{ss}` values are held to
    /// `attributeLimit` pairs of at most ``ItemDetails/maximumText`` bytes.
    func properties(attributeLimit: Int = ItemDetails.maximumAttributes) throws(BusError) -> [String: PropertyValue] {
        try enter("a", "{sv}")
        var properties: [String: PropertyValue] = [:]
        while try enterElement("e", "sv") {
            let name = try string()
            if let value = try variant(attributeLimit: attributeLimit) { properties[name] = value }
            try exit()
        }
        try exit()
        return properties
    }

    /// A `v`: its value when it is of a type ``PropertyValue`` holds, nil
    /// (read past) for any other. `a{ss}` values are held to
    /// `attributeLimit` pairs of at most ``ItemDetails/maximumText`` bytes.
    func variant(attributeLimit: Int = ItemDetails.maximumAttributes) throws(BusError) -> PropertyValue? {
        guard let contents = try peek()?.contents else { throw .invalidArguments("a variant without a value") }
        try enter("v", contents)
        let value: PropertyValue?
        switch contents {
        case "s": value = .string(try string())
        case "b": value = .bool(try bool())
        case "t": value = .uint64(try uint64())
        case "ao": value = .objectPaths(try objectPaths())
        case "ay": value = .bytes(try bytes())
        case "a{ss}":
            value = .attributes(try stringDictionary(limit: attributeLimit, textLimit: ItemDetails.maximumText))
        default:
            try skip(contents)
            value = nil
        }
        try exit()
        return value
    }

    /// The type signature of the next argument, or nil at the end.
    func peek() throws(BusError) -> (type: Character, contents: String?)? {
        var type: CChar = 0
        var contents: UnsafePointer<CChar>?
        let result = CSystemd_sd_bus_message_peek_type(message, &type, &contents)
        try check(result)
        guard result > 0 else { return nil }
        return (Character(UnicodeScalar(UInt8(bitPattern: type))), contents.map { String(cString: $0) })
    }

    /// A descriptor the message carries (`h`); the message owns it, and
    /// closes it with itself.
    func unixFD() throws(BusError) -> BorrowedDescriptor {
        var fd: Int32 = -1
        try check(CSystemd_sd_bus_message_read_basic(message, CChar(UInt8(ascii: "h")), &fd))
        guard fd >= 0 else { throw .invalidArguments("no descriptor came with the call") }
        return BorrowedDescriptor(kept: fd)
    }

    func skip(_ types: String) throws(BusError) {
        try check(CSystemd_sd_bus_message_skip(message, types))
    }

    /// Nothing left: an argument more than the signature says is refused.
    func requireEnd() throws(BusError) {
        guard CSystemd_sd_bus_message_at_end(message, 1) > 0 else {
            throw .invalidArguments("more arguments than the method takes")
        }
    }
}

/// Appends a reply's or signal's arguments in order.
struct BusMessageWriter {
    let message: OpaquePointer

    private func check(_ result: Int32) throws(BusError) {
        if result < 0 { throw .failed("could not build the reply (\(String(cString: strerror(-result))))") }
    }

    func string(_ text: String) throws(BusError) { try basic("s", text) }
    func objectPath(_ path: String) throws(BusError) { try basic("o", path) }

    private func basic(_ type: Character, _ text: String) throws(BusError) {
        try check(text.withCString { CSystemd_sd_bus_message_append_basic(message, CChar(type.asciiValue!), $0) })
    }

    func signature(_ types: String) throws(BusError) { try basic("g", types) }

    /// A fixed-size basic value of `type` (y n q i u x t d) from the
    /// first bytes of `value`, in the machine's order as sd-bus reads it.
    func basic(_ type: Character, _ value: inout UInt64) throws(BusError) {
        try check(CSystemd_sd_bus_message_append_basic(message, CChar(type.asciiValue!), &value))
    }

    func bool(_ value: Bool) throws(BusError) {
        var flag: Int32 = value ? 1 : 0
        try check(CSystemd_sd_bus_message_append_basic(message, CChar(UInt8(ascii: "b")), &flag))
    }

    func uint64(_ value: UInt64) throws(BusError) {
        var number = value
        try check(CSystemd_sd_bus_message_append_basic(message, CChar(UInt8(ascii: "t")), &number))
    }

    func bytes(_ bytes: UnsafeRawBufferPointer) throws(BusError) {
        try check(
            CSystemd_sd_bus_message_append_array(message, CChar(UInt8(ascii: "y")), bytes.baseAddress, bytes.count))
    }

    func bytes(_ bytes: [UInt8]) throws(BusError) {
        try check(
            bytes.withUnsafeBytes {
                CSystemd_sd_bus_message_append_array(message, CChar(UInt8(ascii: "y")), $0.baseAddress, $0.count)
            })
    }

    func open(_ type: Character, _ contents: String) throws(BusError) {
        try check(CSystemd_sd_bus_message_open_container(message, CChar(type.asciiValue!), contents))
    }

    func close() throws(BusError) {
        try check(CSystemd_sd_bus_message_close_container(message))
    }

    func objectPaths(_ paths: [String]) throws(BusError) {
        try open("a", "o")
        for path in paths { try objectPath(path) }
        try close()
    }

    func stringDictionary(_ dictionary: [String: String]) throws(BusError) {
        try open("a", "{ss}")
        for (key, value) in dictionary.sorted(by: { $0.key < $1.key }) {
            try open("e", "ss")
            try string(key)
            try string(value)
            try close()
        }
        try close()
    }

    /// A property value as a variant.
    func variant(_ value: PropertyValue) throws(BusError) {
        try open("v", value.signature)
        switch value {
        case .string(let text): try string(text)
        case .bool(let flag): try bool(flag)
        case .uint64(let number): try uint64(number)
        case .objectPaths(let paths): try objectPaths(paths)
        case .bytes(let data): try bytes(data)
        case .attributes(let attributes): try stringDictionary(attributes)
        }
        try close()
    }
}

/// The values the Secret Service's properties and variant arguments take
/// (`ay`: a DH session's public key, `OpenSession`'s input).
enum PropertyValue: Equatable {
    case string(String)
    case bool(Bool)
    case uint64(UInt64)
    case objectPaths([String])
    case bytes([UInt8])
    case attributes([String: String])

    var signature: String {
        switch self {
        case .string: "s"
        case .bool: "b"
        case .uint64: "t"
        case .objectPaths: "ao"
        case .bytes: "ay"
        case .attributes: "a{ss}"
        }
    }

    /// The new value of an item's settable property `name`, the `v` of
    /// `Set`: the Attributes (`a{ss}`, read to the limits of an item's
    /// details) or a string of ``ItemAttribute`` (`Label`, `s`); any other
    /// type is refused.
    static func itemProperty(_ name: String, _ value: PropertyValue?) throws(BusError) -> PropertyValue {
        let type = name == "Attributes" ? "a{ss}" : "s"
        guard let value, value.signature == type else { throw .invalidArguments("\(name) is of type \(type)") }
        return value
    }
}
