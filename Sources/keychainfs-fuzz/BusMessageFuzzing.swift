// Debug builds only, as FuzzTargets.swift (@testable).
#if DEBUG
@testable import KeychainCore
@testable import SecretService

/// The fuzz target `busmessage`: any program of the user can send the provider
/// any well-formed message, so each method's arguments are read here by the
/// method's own reader (``SecretMethod/readArguments``, the one its handler
/// gets them from), from messages whose types and values come from the fuzzer's
/// bytes. sd-bus checks the wire format as a message arrives; what reaches the
/// reader is a well-formed message of any signature, with variants of any type,
/// arrays of any length and texts of any size. That is what is made here.
enum BusMessageFuzzing {
    /// Reads one message made from `input`; a sentence if a reader broke
    /// a rule (a limit not kept), nil otherwise. A crash is a finding too.
    static func violation(_ input: UnsafeRawBufferPointer) -> String? {
        var bytes = FuzzBytes(input)
        let method = SecretMethod.all[Int(bytes.next()) % SecretMethod.all.count]
        // Mostly the method's own signature (what the dispatcher lets
        // through); sometimes any, to read a wrong one.
        let types =
            bytes.next() % 8 == 0 ? [ArgumentType.arbitrary(&bytes, depth: 3)] : ArgumentType.parse(method.signature)
        var budget = 4096
        let made: LocalBusMessage?
        do {
            made = try LocalBusMessage(member: method.member) { (writer) throws(BusError) in
                for type in types { try type.append(to: writer, from: &bytes, depth: 3, budget: &budget) }
            }
        } catch {
            return nil  // sd-bus refused to make it (a text that is not UTF-8): it would never arrive
        }
        guard let made else { return nil }
        let arguments: any MethodArguments
        do {
            arguments = try method.readArguments(made.arguments)
            try made.arguments.requireEnd()
        } catch {
            return nil  // refused with an error reply: what a bad message should get
        }
        return arguments.parts.lazy.compactMap { violation(in: $0) }.first
    }

    /// A limit broken by one part of what a reader returned: lookup
    /// attributes past 256 pairs or 4096 bytes, an item's attributes (in
    /// properties or a variant) past an item's limits. A session request
    /// runs the real key exchange, with whatever key was sent.
    private static func violation(in part: ArgumentPart) -> String? {
        switch part {
        case .lookup(let attributes):
            return violation(of: attributes, limit: 256, textLimit: 4096)
        case .property(let value):
            return violation(in: value)
        case .session(let algorithm, let input):
            _ = try? TransferSession.open(
                algorithm: algorithm, input: input, owner: ":1.1", path: ObjectPaths.sessionPrefix + "1")
            return input.flatMap { violation(in: $0) }
        }
    }

    private static func violation(in value: PropertyValue) -> String? {
        guard case .attributes(let attributes) = value else { return nil }
        return violation(of: attributes, limit: ItemDetails.maximumAttributes, textLimit: ItemDetails.maximumText)
    }

    private static func violation(of dictionary: [String: String], limit: Int, textLimit: Int) -> String? {
        guard dictionary.count <= limit else {
            return "\(dictionary.count) attributes read where at most \(limit) are allowed"
        }
        guard dictionary.allSatisfy({ $0.key.utf8.count <= textLimit && $0.value.utf8.count <= textLimit }) else {
            return "an attribute of more than \(textLimit) bytes was read"
        }
        return nil
    }
}

/// The fuzzer's bytes, read in order; zeros once they are used up.
struct FuzzBytes {
    private let bytes: [UInt8]
    private var index = 0

    init(_ input: UnsafeRawBufferPointer) { bytes = Array(input) }

    mutating func next() -> UInt8 {
        guard index < bytes.count else { return 0 }
        defer { index += 1 }
        return bytes[index]
    }

    mutating func next<Number: FixedWidthInteger>(_: Number.Type) -> Number {
        (0..<MemoryLayout<Number>.size).reduce(Number.zero) { number, _ in
            number << 8 | Number(truncatingIfNeeded: next())
        }
    }

    /// A length: mostly short, sometimes past the readers' limits.
    mutating func length() -> Int {
        let choice = next()
        return choice >= 0xF0 ? 4000 + Int(next()) * 2 : Int(choice % 64)
    }

    /// A text of `length()` bytes; D-Bus texts hold no NUL (a NUL byte is read as 1).
    mutating func text() -> String {
        String(decoding: (0..<length()).map { _ in max(next(), 1) }, as: UTF8.self)
    }

    /// An element count: mostly a few, sometimes up to a DH key's 128
    /// bytes and past, sometimes past 256 (the attribute limit).
    mutating func count() -> Int {
        let choice = next()
        return choice >= 0xF8 ? 250 + Int(next() % 16) : choice >= 0xE0 ? Int(next() % 140) : Int(choice % 5)
    }
}

/// A D-Bus type, as a signature names it.
indirect enum ArgumentType {
    case basic(Character)
    case array(ArgumentType)
    case dictionary(key: Character, value: ArgumentType)
    case structure([ArgumentType])
    case variant

    static let basics: [Character] = ["y", "b", "n", "q", "i", "u", "x", "t", "d", "s", "o", "g"]

    var signature: String {
        switch self {
        case .basic(let type): String(type)
        case .array(let element): "a" + element.signature
        case .dictionary(let key, let value): "a{\(key)\(value.signature)}"
        case .structure(let fields): "(" + fields.map(\.signature).joined() + ")"
        case .variant: "v"
        }
    }

    /// The types of a (valid) signature.
    static func parse(_ signature: String) -> [ArgumentType] {
        var rest = Substring(signature)
        var types: [ArgumentType] = []
        while !rest.isEmpty { types.append(parseOne(&rest)) }
        return types
    }

    private static func parseOne(_ rest: inout Substring) -> ArgumentType {
        let first = rest.removeFirst()
        switch first {
        case "a" where rest.first == "{":
            rest.removeFirst()
            let key = rest.removeFirst()
            let value = parseOne(&rest)
            rest.removeFirst()  // }
            return .dictionary(key: key, value: value)
        case "a": return .array(parseOne(&rest))
        case "(":
            var fields: [ArgumentType] = []
            while rest.first != ")" { fields.append(parseOne(&rest)) }
            rest.removeFirst()
            return .structure(fields)
        case "v": return .variant
        default: return .basic(first)
        }
    }

    /// A type drawn from the bytes, nested at most `depth` deep.
    static func arbitrary(_ bytes: inout FuzzBytes, depth: Int) -> ArgumentType {
        let choice = Int(bytes.next())
        guard depth > 0, choice % 16 >= basics.count else { return .basic(basics[choice % basics.count]) }
        switch choice % 4 {
        case 0: return .array(arbitrary(&bytes, depth: depth - 1))
        case 1:
            return .dictionary(
                key: basics[Int(bytes.next()) % basics.count], value: arbitrary(&bytes, depth: depth - 1))
        case 2: return .structure((0...Int(bytes.next() % 3)).map { _ in arbitrary(&bytes, depth: depth - 1) })
        default: return .variant
        }
    }

    /// Appends a value of this type drawn from the bytes; `budget` bounds
    /// the values of one message.
    func append(to writer: BusMessageWriter, from bytes: inout FuzzBytes, depth: Int, budget: inout Int)
        throws(BusError)
    {
        budget -= 1
        switch self {
        case .basic(let type): try Self.appendBasic(type, to: writer, from: &bytes)
        case .array(let element):
            try writer.open("a", element.signature)
            for _ in 0..<(budget > 0 ? bytes.count() : 0) {
                try element.append(to: writer, from: &bytes, depth: depth, budget: &budget)
            }
            try writer.close()
        case .dictionary(let key, let value):
            let entry = String(key) + value.signature
            try writer.open("a", "{\(entry)}")
            for index in 0..<(budget > 0 ? bytes.count() : 0) {
                try writer.open("e", entry)
                // Text keys made distinct, as a client's many attributes
                // are: a count limit is met by the count sent, not lost to
                // keys that repeat once the fuzzer's bytes run out.
                if key == "s" {
                    try writer.string(bytes.text() + String(index))
                } else {
                    try Self.appendBasic(key, to: writer, from: &bytes)
                }
                try value.append(to: writer, from: &bytes, depth: depth, budget: &budget)
                try writer.close()
            }
            try writer.close()
        case .structure(let fields):
            try writer.open("r", fields.map(\.signature).joined())
            for field in fields { try field.append(to: writer, from: &bytes, depth: depth, budget: &budget) }
            try writer.close()
        case .variant:
            let contents = Self.arbitrary(&bytes, depth: max(depth - 1, 0))
            try writer.open("v", contents.signature)
            try contents.append(to: writer, from: &bytes, depth: max(depth - 1, 0), budget: &budget)
            try writer.close()
        }
    }

    private static func appendBasic(_ type: Character, to writer: BusMessageWriter, from bytes: inout FuzzBytes)
        throws(BusError)
    {
        switch type {
        case "s": try writer.string(bytes.text())
        case "o":
            // A group's name is never empty (an empty element is no path).
            let group = bytes.text() + "g"
            try writer.objectPath(
                bytes.next() % 2 == 0 ? ObjectPaths.collection(group) : ObjectPaths.item(group, "item"))
        case "g": try writer.signature(["s", "ay", "a{sv}", "(oayays)", ""][Int(bytes.next()) % 5])
        case "b": try writer.bool(bytes.next() % 2 == 1)
        case "t": try writer.uint64(bytes.next(UInt64.self))
        case "y", "n", "q", "i", "u", "x", "d":
            var number = bytes.next(UInt64.self)
            try writer.basic(type, &number)
        default: try writer.string("")
        }
    }
}
#endif
