import KeychainCore
import Testing
@testable import SecretService

/// The reader of method arguments, on messages made in this process: what
/// any program of the user can send reads back as sent, or is refused with
/// InvalidArgs, and a limit is never read past.
@Suite struct BusMessageReaderTests {
    static let invalidArguments = "org.freedesktop.DBus.Error.InvalidArgs"

    static func message(_ build: (BusMessageWriter) throws(BusError) -> Void) throws -> LocalBusMessage {
        try #require(try LocalBusMessage(build))
    }

    @Test func attributesReadBackAsSent() throws {
        let sent = ["application": "chromium", "xdg:schema": "chrome_libsecret_os_crypt_password_v2", "": "empty name"]
        let message = try Self.message { (writer) throws(BusError) in try writer.stringDictionary(sent) }
        #expect(message.signature == "a{ss}")
        #expect(try message.arguments.stringDictionary() == sent)
        try message.arguments.requireEnd()
    }

    /// Past a limit: InvalidArgs, whatever was read before it.
    @Test func attributesPastTheirLimitsAreRefused() throws {
        let many = Dictionary(uniqueKeysWithValues: (0..<257).map { ("key\($0)", "value") })
        let tooMany = try Self.message { (writer) throws(BusError) in try writer.stringDictionary(many) }
        #expect(throws: BusError.self) { try tooMany.arguments.stringDictionary() }
        let long = try Self.message { (writer) throws(BusError) in
            try writer.stringDictionary(["k": String(repeating: "v", count: 4097)])
        }
        let error = #expect(throws: BusError.self) { try long.arguments.stringDictionary() }
        #expect(error?.name == Self.invalidArguments)
    }

    /// CreateItem's properties: the types the service keeps are read, any
    /// other is read past, and attributes are held to an item's limits.
    @Test func propertiesKeepTheirTypesAndSkipOthers() throws {
        let message = try Self.message { (writer) throws(BusError) in
            try writer.open("a", "{sv}")
            for (name, value) in [
                ("org.freedesktop.Secret.Item.Label", PropertyValue.string("Mail")),
                ("org.freedesktop.Secret.Item.Attributes", .attributes(["user": "ana"])),
                ("locked", .bool(true)), ("created", .uint64(7)), ("items", .objectPaths(["/a/b"]))
            ] {
                try writer.open("e", "sv")
                try writer.string(name)
                try writer.variant(value)
                try writer.close()
            }
            // A property of a type the service does not keep: a (dd) struct.
            try writer.open("e", "sv")
            try writer.string("org.example.Position")
            try writer.open("v", "(dd)")
            try writer.open("r", "dd")
            var x: UInt64 = 0, y: UInt64 = 0
            try writer.basic("d", &x)
            try writer.basic("d", &y)
            try writer.close()
            try writer.close()
            try writer.close()
            try writer.close()
            try writer.string("after")
        }
        let arguments = message.arguments
        let properties = try arguments.properties()
        #expect(
            properties == [
                "org.freedesktop.Secret.Item.Label": .string("Mail"),
                "org.freedesktop.Secret.Item.Attributes": .attributes(["user": "ana"]),
                "locked": .bool(true), "created": .uint64(7), "items": .objectPaths(["/a/b"])
            ])
        #expect(try arguments.string() == "after")
        let tooMany = try Self.message { (writer) throws(BusError) in
            try writer.open("a", "{sv}")
            try writer.open("e", "sv")
            try writer.string("org.freedesktop.Secret.Item.Attributes")
            try writer.variant(
                .attributes(
                    Dictionary(uniqueKeysWithValues: (0...ItemDetails.maximumAttributes).map { ("k\($0)", "v") })))
            try writer.close()
            try writer.close()
        }
        #expect(throws: BusError.self) { try tooMany.arguments.properties() }
    }

    /// The secret struct: its value comes out in secret memory, as sent.
    @Test func theSecretStructReadsBackIntoSecretMemory() throws {
        let message = try Self.message { (writer) throws(BusError) in
            try writer.open("r", "oayays")
            try writer.objectPath("/org/freedesktop/secrets/session/1")
            try writer.bytes([1, 2, 3])
            try writer.bytes(Array("hunter2".utf8))
            try writer.string("text/plain")
            try writer.close()
        }
        let secret = try message.arguments.secretStruct()
        #expect(secret.session == "/org/freedesktop/secrets/session/1" && secret.parameters == [1, 2, 3])
        #expect(secret.sealed.bytes() == Array("hunter2".utf8) && secret.contentType == "text/plain")
    }

    /// A program that sends other types than the method's is refused with
    /// InvalidArgs, and so is one argument more than the method takes.
    @Test func wrongTypesAndExtraArgumentsAreInvalidArgs() throws {
        let number = try Self.message { (writer) throws(BusError) in
            var value: UInt64 = 42
            try writer.basic("u", &value)
        }
        let wrongType = #expect(throws: BusError.self) { try number.arguments.string() }
        #expect(wrongType?.name == Self.invalidArguments)
        let extra = try Self.message { (writer) throws(BusError) in
            try writer.string("Label")
            try writer.string("one more")
        }
        _ = try extra.arguments.string()
        let more = #expect(throws: BusError.self) { try extra.arguments.requireEnd() }
        #expect(more?.name == Self.invalidArguments)
    }

    /// `Set`: a Label must be `s` and Attributes `a{ss}`, held to an item's limits.
    @Test func anItemPropertyMustHaveItsType() throws {
        let label = try Self.message { (writer) throws(BusError) in try writer.variant(.string("New label")) }
        #expect(try PropertyValue.itemProperty("Label", label.arguments.variant()) == .string("New label"))
        let wrong = try Self.message { (writer) throws(BusError) in try writer.variant(.bool(true)) }
        let error = #expect(throws: BusError.self) {
            try PropertyValue.itemProperty("Attributes", wrong.arguments.variant())
        }
        #expect(error == BusError(Self.invalidArguments, "Attributes is of type a{ss}"))
        let tooMany = try Self.message { (writer) throws(BusError) in
            let attributes = Dictionary(
                uniqueKeysWithValues: (0...ItemDetails.maximumAttributes).map { ("k\($0)", "v") })
            try writer.variant(.attributes(attributes))
        }
        let refused = #expect(throws: BusError.self) { _ = try tooMany.arguments.variant() }
        #expect(refused?.name == Self.invalidArguments)
    }

    /// `OpenSession`: its row reads the algorithm and the variant, and the
    /// session takes `plain` with a string and DH with a key (`ay`) only.
    @Test func aSessionIsOpenedFromItsRowsArguments() throws {
        let openSession = try #require(SecretMethod.all.first { $0.member == "OpenSession" })
        for (algorithm, input, opens) in [
            (TransferSession.plain, PropertyValue.string(""), true),
            (TransferSession.plain, .bytes([2]), false),
            (TransferSession.diffieHellman, .bytes([2]), true),
            (TransferSession.diffieHellman, .string(""), false),
            ("no-such-algorithm", .string(""), false)
        ] {
            let call = try Self.message { (writer) throws(BusError) in
                try writer.string(algorithm)
                try writer.variant(input)
            }
            let request = try #require(try openSession.readArguments(call.arguments) as? SessionRequest)
            #expect(request.algorithm == algorithm && request.input == input)
            let opened = try? TransferSession.open(
                algorithm: request.algorithm, input: request.input, owner: ":1.1",
                path: ObjectPaths.sessionPrefix + "1")
            #expect((opened != nil) == opens, "\(algorithm) with \(input)")
        }
    }
}
