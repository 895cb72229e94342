import KeychainCore
import KeychainProtocol
import Synchronization
import Testing
@testable import SecretService

#if canImport(Glibc)
import Glibc
#endif

/// The provider's handlers run in the test's own process, over the two ends
/// of a socketpair and no bus daemon (oo7's tests do the same over a
/// peer-to-peer connection; docs/CONTRIBUTING.md, "Where a new piece goes"):
/// the test's end calls the methods as a client does, with the spec's
/// signatures, and reads the replies as the spec types them. The store is
/// the test's own (``FakeStore``).
@Suite struct InProcessProviderTests {
    /// A provider serving one end of a socketpair, and a client at the other.
    final class DirectBus {
        let provider: SecretServiceProvider
        let client: BusConnection

        init(store: SecretStore) throws {
            var ends: [Int32] = [0, 0]
            try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &ends) == 0)
            guard let served = FileDescriptor(ends[0]), let calling = FileDescriptor(ends[1]) else {
                throw BusError.failed("no socketpair")
            }
            provider = try SecretServiceProvider(store: store, peer: served)
            client = try BusConnection(peer: calling, serving: false)
        }

        deinit { provider.stop() }

        func call(
            _ path: String, _ interface: String, _ member: String,
            _ build: (BusMessageWriter) throws(BusError) -> Void = { _ throws(BusError) in }
        ) throws(BusError) -> BusReply {
            try client.call(nil, path, interface, member, build)
        }

        /// A `plain` session's path.
        func openPlainSession() throws -> String {
            let reply = try call(ObjectPaths.service, SecretServiceProvider.serviceInterface, "OpenSession") {
                (call) throws(BusError) in
                try call.string("plain")
                try call.variant(.string(""))
            }
            #expect(reply.signature == "vo")
            #expect(try reply.arguments.variant() == .string(""))
            return try reply.arguments.objectPath()
        }
    }

    static let mail = ObjectPaths.item("work", "mail")

    /// A secret as a client sends it in the plain session `session`: the
    /// spec's (oayays), with no parameters.
    static func plainSecret(_ value: String, session: String, to call: BusMessageWriter) throws(BusError) {
        try call.open("r", "oayays")
        try call.objectPath(session)
        try call.bytes([])
        try call.bytes(Array(value.utf8))
        try call.string(ItemDetails.defaultContentType)
        try call.close()
    }

    static func store() throws -> FakeStore {
        FakeStore(
            get: .success(ItemValue(value: try SecureBytes("from-the-fake"), protectionClass: .whenUnlocked)),
            set: .failure(.keychain(.quotaExceeded, KeychainError.quotaExceeded.description)),
            remove: .failure(.keychain(.missingEntitlement, "not entitled")))
    }

    @Test func aClientGetsWhatTheStoreAnswersWithNoBusDaemon() throws {
        let store = try Self.store()
        let bus = try DirectBus(store: store)
        let session = try bus.openPlainSession()
        #expect(session.hasPrefix(ObjectPaths.sessionPrefix))

        let found = try bus.call(ObjectPaths.service, SecretServiceProvider.serviceInterface, "SearchItems") {
            (call) throws(BusError) in
            try call.stringDictionary([SecretServiceProvider.identifierAttribute: "mail"])
        }
        #expect(found.signature == "aoao")
        #expect(try found.arguments.objectPaths() == [Self.mail])
        #expect(try found.arguments.objectPaths() == [])

        // A plain session sends the value as it is, with the item's content type.
        let secret = try bus.call(Self.mail, SecretServiceProvider.itemInterface, "GetSecret") {
            (call) throws(BusError) in try call.objectPath(session)
        }
        #expect(secret.signature == "(oayays)")
        let sent = try secret.arguments.secretStruct()
        #expect(sent.session == session && sent.contentType == ItemDetails.defaultContentType)
        #expect(Array(sent.sealed.withUnsafeBytes { Array($0) }) == Array("from-the-fake".utf8))

        let all = try bus.call(
            ObjectPaths.collection("work"), SecretServiceProvider.propertiesInterface, "GetAll"
        ) { (call) throws(BusError) in try call.string(SecretServiceProvider.collectionInterface) }
        #expect(all.signature == "a{sv}")
        let properties = try all.arguments.properties()
        #expect(properties["Items"] == .objectPaths([Self.mail]) && properties["Label"] == .string("work"))
        #expect(properties["Locked"] == .bool(false))

        let alias = try bus.call(ObjectPaths.service, SecretServiceProvider.serviceInterface, "ReadAlias") {
            (call) throws(BusError) in try call.string("login")
        }
        #expect(try alias.arguments.objectPath() == ObjectPaths.collection(ItemLimits.defaultGroup))
        #expect(store.asked.withLock { $0 } == ["get"])
    }

    /// A path outside the provider's answers UnknownMethod, as
    /// gnome-keyring's GDBus does (secretstorage 3.3 takes nothing else for
    /// "no such item"); one inside that names nothing, NoSuchObject. An item
    /// made with no attributes of its own (through a mount or the command
    /// line) shows the `keychainfs:` ones it answers to.
    @Test func aPathOutsideOursIsUnknownMethodAndAnItemShowsTheAttributesItAnswersTo() throws {
        let bus = try DirectBus(store: try Self.store())
        let outside = #expect(throws: BusError.self) {
            try bus.call("/not/existing/path", SecretServiceProvider.itemInterface, "Delete")
        }
        #expect(outside?.name == "org.freedesktop.DBus.Error.UnknownMethod")
        #expect(
            outside?.message
                == "No such interface 'org.freedesktop.Secret.Item' on object at path /not/existing/path")
        let inside = #expect(throws: BusError.self) {
            try bus.call(ObjectPaths.service + "/nothing/here", SecretServiceProvider.itemInterface, "Delete")
        }
        #expect(inside?.name == "org.freedesktop.Secret.Error.NoSuchObject")
        let all = try bus.call(Self.mail, SecretServiceProvider.propertiesInterface, "GetAll") {
            (call) throws(BusError) in try call.string(SecretServiceProvider.itemInterface)
        }
        #expect(
            try all.arguments.properties()["Attributes"]
                == .attributes([
                    "keychainfs:group": "work", "keychainfs:identifier": "mail", "keychainfs:accessible": "whenUnlocked"
                ]))
    }

    /// A collection's Label is read-write (the spec; seahorse and libsecret's
    /// own tests set it): set through the collection's path or an alias it
    /// is kept by the store beside the group's name, an empty one gives the
    /// group's name back, and the session collection keeps its own in
    /// memory. A label that is not a string, a property that is not
    /// writable and a collection that is not there are errors that change
    /// nothing.
    @Test func aCollectionsLabelIsSetWhereTheSpecSaysAndNowhereElse() throws {
        let store = try Self.store()
        let bus = try DirectBus(store: store)
        func setLabel(_ path: String, _ value: PropertyValue, name: String = "Label") throws(BusError) {
            _ = try bus.call(path, SecretServiceProvider.propertiesInterface, "Set") { (call) throws(BusError) in
                try call.string(SecretServiceProvider.collectionInterface)
                try call.string(name)
                try call.variant(value)
            }
        }
        func label(_ path: String) throws -> PropertyValue? {
            try bus.call(path, SecretServiceProvider.propertiesInterface, "Get") { (call) throws(BusError) in
                try call.string(SecretServiceProvider.collectionInterface)
                try call.string("Label")
            }.arguments.variant()
        }
        let work = ObjectPaths.collection("work")
        try setLabel(work, .string("Work things"))
        #expect(try label(work) == .string("Work things"))
        #expect(store.labels.withLock { $0 } == ["work": "Work things"])
        try setLabel(ObjectPaths.aliasPrefix + "default", .string("Everyday"))
        #expect(store.labels.withLock { $0[ItemLimits.defaultGroup] } == "Everyday")
        try setLabel(work, .string(""))
        #expect(try label(work) == .string("work"))
        #expect(store.labels.withLock { $0["work"] } == nil)

        let session = ObjectPaths.collection(SessionCollection.group)
        try setLabel(session, .string("For now"))
        #expect(try label(session) == .string("For now"))
        #expect(store.labels.withLock { $0[SessionCollection.group] } == nil)

        let notAString = #expect(throws: BusError.self) { try setLabel(work, .uint64(7)) }
        #expect(notAString?.name == "org.freedesktop.DBus.Error.InvalidArgs")
        let readOnly = #expect(throws: BusError.self) { try setLabel(work, .bool(true), name: "Locked") }
        #expect(readOnly?.name == "org.freedesktop.DBus.Error.NotSupported")
        let absent = #expect(throws: BusError.self) {
            try setLabel(ObjectPaths.service + "/collection/a/b", .string("x"))
        }
        #expect(absent?.name == "org.freedesktop.Secret.Error.NoSuchObject")
        #expect(try label(work) == .string("work"))
        #expect(store.labels.withLock { $0 } == [ItemLimits.defaultGroup: "Everyday"])
    }

    /// Bad input is an error and changes nothing: an item or object that is
    /// not there, arguments of the wrong signature, an algorithm the
    /// provider does not offer, a session never opened, an alias moved.
    @Test func unknownObjectsWrongSignaturesAndUnopenedSessionsAreErrors() throws {
        let store = try Self.store()
        let bus = try DirectBus(store: store)
        let service = ObjectPaths.service
        let serviceInterface = SecretServiceProvider.serviceInterface
        func refusal(
            _ path: String, _ interface: String, _ member: String,
            _ build: @escaping (BusMessageWriter) throws(BusError) -> Void
        ) -> BusError? {
            #expect(throws: BusError.self) { try bus.call(path, interface, member, build) }
        }

        let noItem = refusal(
            ObjectPaths.collection("work") + "/no_5fsuch", SecretServiceProvider.propertiesInterface, "Get"
        ) { (call) throws(BusError) in
            try call.string(SecretServiceProvider.itemInterface)
            try call.string("Label")
        }
        #expect(
            noItem?.message.contains("no item at \(ObjectPaths.collection("work"))/no_5fsuch") == true,
            "\(String(describing: noItem))")
        let noObject = refusal(service + "/nowhere", serviceInterface, "SearchItems") { (call) throws(BusError) in
            try call.stringDictionary([:])
        }
        #expect(noObject?.message.contains("no object at") == true, "\(String(describing: noObject))")
        let wrongSignature = refusal(service, serviceInterface, "SearchItems") { (call) throws(BusError) in
            try call.string("x")
        }
        #expect(wrongSignature?.name == "org.freedesktop.DBus.Error.InvalidArgs")
        #expect(
            wrongSignature?.message.contains("SearchItems takes (a{ss}), not (s)") == true,
            "\(String(describing: wrongSignature))")
        let algorithm = refusal(service, serviceInterface, "OpenSession") { (call) throws(BusError) in
            try call.string("no-such-algorithm")
            try call.variant(.string(""))
        }
        #expect(algorithm?.name == "org.freedesktop.DBus.Error.NotSupported", "\(String(describing: algorithm))")
        let noSession = refusal(service, serviceInterface, "GetSecrets") { (call) throws(BusError) in
            try call.objectPaths([])
            try call.objectPath(ObjectPaths.sessionPrefix + "7")
        }
        #expect(noSession?.message.contains("no open session") == true, "\(String(describing: noSession))")

        // An unknown alias is no object ("/"), not an error.
        func readAlias(_ name: String) throws -> String {
            try bus.call(service, serviceInterface, "ReadAlias") { (call) throws(BusError) in try call.string(name) }
                .arguments.objectPath()
        }
        #expect(try readAlias("nothing") == "/")
        // Aliases are fixed: one that names what it names is done, another
        // refused and not made.
        let moved = refusal(service, serviceInterface, "SetAlias") { (call) throws(BusError) in
            try call.string("work")
            try call.objectPath(ObjectPaths.collection(ItemLimits.defaultGroup))
        }
        #expect(moved?.message.contains("aliases are fixed") == true, "\(String(describing: moved))")
        let kept = try bus.call(service, serviceInterface, "SetAlias") { (call) throws(BusError) in
            try call.string("default")
            try call.objectPath(ObjectPaths.collection(ItemLimits.defaultGroup))
        }
        #expect(kept.signature == "")
        #expect(try readAlias("work") == "/")
        #expect(store.asked.withLock { $0 }.isEmpty)
    }

    /// Locked is never absent: while the keychain is locked a search finds
    /// the item in its locked list, the item says Locked, and its secret is
    /// IsLocked, never NoSuchObject.
    @Test func whileLockedItemsAreFoundLockedAndTheirSecretsRefused() throws {
        let store = FakeStore(
            get: .success(ItemValue(value: try SecureBytes("s3cret"), protectionClass: .whenUnlocked)),
            set: .failure(.keychain(.badRequest, "not in this test")),
            remove: .failure(.keychain(.badRequest, "not in this test")), locked: true)
        let bus = try DirectBus(store: store)
        let found = try bus.call(ObjectPaths.service, SecretServiceProvider.serviceInterface, "SearchItems") {
            (call) throws(BusError) in
            try call.stringDictionary([SecretServiceProvider.identifierAttribute: "mail"])
        }
        #expect(try found.arguments.objectPaths() == [])
        #expect(try found.arguments.objectPaths() == [Self.mail])
        let locked = try bus.call(Self.mail, SecretServiceProvider.propertiesInterface, "Get") {
            (call) throws(BusError) in
            try call.string(SecretServiceProvider.itemInterface)
            try call.string("Locked")
        }
        #expect(try locked.arguments.variant() == .bool(true))
        let session = try bus.openPlainSession()
        let refused = #expect(throws: BusError.self) {
            try bus.call(Self.mail, SecretServiceProvider.itemInterface, "GetSecret") { (call) throws(BusError) in
                try call.objectPath(session)
            }
        }
        #expect(refused?.name == "org.freedesktop.Secret.Error.IsLocked", "\(String(describing: refused))")
    }

    /// An item's details past the limits (too many attributes, a value or
    /// label too long, a control character in a name) are InvalidArgs, and
    /// the store hears nothing of them; an item within them is stored. (A
    /// secret past 1 MiB is the device's to refuse: SecretServiceClientTests.)
    @Test func badItemsAreRefusedAndChangeNothing() throws {
        let store = FakeStore(
            get: .failure(.keychain(.badRequest, "not in this test")), set: .success(Done()),
            remove: .failure(.keychain(.badRequest, "not in this test")))
        let bus = try DirectBus(store: store)
        let session = try bus.openPlainSession()
        func create(attributes: [String: String] = ["app": "test"], label: String = "item") throws(BusError)
            -> BusReply
        {
            try bus.call(ObjectPaths.collection("work"), SecretServiceProvider.collectionInterface, "CreateItem") {
                (call) throws(BusError) in
                try call.open("a", "{sv}")
                for (name, value) in [
                    ("org.freedesktop.Secret.Item.Label", PropertyValue.string(label)),
                    ("org.freedesktop.Secret.Item.Attributes", .attributes(attributes))
                ] {
                    try call.open("e", "sv")
                    try call.string(name)
                    try call.variant(value)
                    try call.close()
                }
                try call.close()
                try Self.plainSecret("x", session: session, to: call)
                try call.bool(false)
            }
        }
        let bad: [(String, () throws(BusError) -> BusReply)] = [
            (
                "many",
                { () throws(BusError) in
                    try create(attributes: Dictionary(uniqueKeysWithValues: (0..<65).map { ("a\($0)", "v") }))
                }
            ),
            (
                "huge value",
                { () throws(BusError) in try create(attributes: ["a": String(repeating: "v", count: 5000)]) }
            ),
            ("huge label", { () throws(BusError) in try create(label: String(repeating: "l", count: 5000)) }),
            ("control in name", { () throws(BusError) in try create(attributes: ["a\nb": "v"]) })
        ]
        for (name, attempt) in bad {
            let refused = #expect(throws: BusError.self, "\(name)") { try attempt() }
            #expect(
                refused?.name == "org.freedesktop.DBus.Error.InvalidArgs", "\(name): \(String(describing: refused))")
        }
        #expect(store.asked.withLock { $0 }.isEmpty)
        let made = try create()
        #expect(made.signature == "oo")
        #expect(try made.arguments.objectPath().hasPrefix(ObjectPaths.collection("work") + "/"))
        #expect(store.asked.withLock { $0 } == ["set"])
    }

    /// Each refusal of the store is the spec's error, with the store's
    /// sentence where it has one; nothing else is asked of it.
    @Test func aStoreRefusalIsTheSpecsErrorAndTheCallChangesNothing() throws {
        let store = try Self.store()
        let bus = try DirectBus(store: store)
        let session = try bus.openPlainSession()

        let quota = #expect(throws: BusError.self) {
            try bus.call(Self.mail, SecretServiceProvider.itemInterface, "SetSecret") { (call) throws(BusError) in
                try Self.plainSecret("new value", session: session, to: call)
            }
        }
        #expect(quota?.name == "org.freedesktop.DBus.Error.Failed")
        #expect(quota?.message.contains("as many items or bytes as its quota allows") == true)

        let denied = #expect(throws: BusError.self) {
            try bus.call(Self.mail, SecretServiceProvider.itemInterface, "Delete")
        }
        #expect(denied?.name == "org.freedesktop.DBus.Error.AccessDenied")
        #expect(store.asked.withLock { $0 } == ["set", "remove"])

        // Checked before any handler runs: the store hears nothing of these.
        let unknown = #expect(throws: BusError.self) {
            try bus.call(Self.mail, SecretServiceProvider.itemInterface, "Explode")
        }
        #expect(unknown?.name == "org.freedesktop.DBus.Error.UnknownMethod")
        let wrongSignature = #expect(throws: BusError.self) {
            try bus.call(Self.mail, SecretServiceProvider.itemInterface, "GetSecret") { (call) throws(BusError) in
                try call.string(session)
            }
        }
        #expect(wrongSignature?.name == "org.freedesktop.DBus.Error.InvalidArgs")
        let closed = try bus.call(session, SecretServiceProvider.sessionInterface, "Close")
        #expect(closed.signature == "")
        let noSession = #expect(throws: BusError.self) {
            try bus.call(Self.mail, SecretServiceProvider.itemInterface, "GetSecret") { (call) throws(BusError) in
                try call.objectPath(session)
            }
        }
        #expect(noSession?.name == "org.freedesktop.Secret.Error.NoSession")
        #expect(store.asked.withLock { $0 } == ["set", "remove"])
    }

    /// An item another program owns: the handler's reply waits for the
    /// person's answer, which comes on a thread of its own, and the call
    /// gets it then (the secret, or AccessDenied), while the bus goes on serving.
    @Test(arguments: [ItemConsent.Answer.allowedOnce, .denied])
    func anOwnedItemsReplyWaitsForThePersonsAnswer(_ consent: ItemConsent.Answer) throws {
        let other = ProgramClaim(
            program: .executable("/usr/bin/another-program"), digest: Array(repeating: 7, count: 32))
        let store = FakeStore(
            get: .success(ItemValue(value: try SecureBytes("owned"), protectionClass: .whenUnlocked)),
            set: .failure(.keychain(.badRequest, "not in this test")),
            remove: .failure(.keychain(.badRequest, "not in this test")), owner: other, consent: consent)
        let bus = try DirectBus(store: store)
        let session = try bus.openPlainSession()
        let getSecret = { () throws(BusError) -> BusReply in
            try bus.call(Self.mail, SecretServiceProvider.itemInterface, "GetSecret") { (call) throws(BusError) in
                try call.objectPath(session)
            }
        }
        if consent == .denied {
            let refused = #expect(throws: BusError.self) { try getSecret() }
            #expect(refused?.name == "org.freedesktop.DBus.Error.AccessDenied")
            #expect(store.asked.withLock { $0 }.isEmpty)
        } else {
            let sent = try getSecret().arguments.secretStruct()
            #expect(Array(sent.sealed.withUnsafeBytes { Array($0) }) == Array("owned".utf8))
            #expect(store.asked.withLock { $0 } == ["get"])
        }
        let questions = store.questions.withLock { $0 }
        #expect(questions.count == 1 && questions[0].contains("another-program"), "\(questions)")
    }

    /// The items of `search` (a service-wide SearchItems, or a collection's
    /// when `collection` is given), unlocked and locked together.
    static func found(
        _ bus: DirectBus, _ search: [String: String], in collection: String? = nil
    ) throws -> [String] {
        let reply = try bus.call(
            collection ?? ObjectPaths.service,
            collection == nil ? SecretServiceProvider.serviceInterface : SecretServiceProvider.collectionInterface,
            "SearchItems"
        ) { (call) throws(BusError) in try call.stringDictionary(search) }
        let unlocked = try reply.arguments.objectPaths()
        return collection == nil ? unlocked + (try reply.arguments.objectPaths()) : unlocked
    }

    /// Items of no program's, with lookup attributes of their own.
    static func mailItems(_ identifiers: [String]) -> [String: ItemDetails?] {
        Dictionary(uniqueKeysWithValues: identifiers.map { ($0, ItemDetails(label: $0, attributes: ["app": "mail"])) })
    }

    /// A collection whose policy does not admit the caller: the store's
    /// refusal is AccessDenied (never "absent"), a search shows nothing of
    /// it and goes on in the others, and CreateItem is refused at the
    /// collection's listing, so no write is tried
    /// (docs/SECRET-SERVICE.md, "Who asks: entitlements and the audit log").
    @Test func aCollectionWhosePolicyRefusesTheCallerIsAccessDeniedAndNothingIsWritten() throws {
        let store = FakeStore(
            get: .success(ItemValue(value: try SecureBytes("s3cret"), protectionClass: .whenUnlocked)),
            set: .success(Done()), remove: .success(Done()),
            contents: ["default": Self.mailItems(["token"]), "secure": ["token": nil]], refusing: ["secure"])
        let bus = try DirectBus(store: store)
        let session = try bus.openPlainSession()
        let secureToken = ObjectPaths.item("secure", "token")

        #expect(try Self.found(bus, [SecretServiceProvider.groupAttribute: "secure"]) == [])
        #expect(
            try Self.found(bus, [SecretServiceProvider.identifierAttribute: "token"])
                == [ObjectPaths.item("default", "token")])
        let read = #expect(throws: BusError.self) {
            try bus.call(secureToken, SecretServiceProvider.itemInterface, "GetSecret") { (call) throws(BusError) in
                try call.objectPath(session)
            }
        }
        #expect(read?.name == "org.freedesktop.DBus.Error.AccessDenied", "\(String(describing: read))")
        let created = #expect(throws: BusError.self) {
            try bus.call(ObjectPaths.collection("secure"), SecretServiceProvider.collectionInterface, "CreateItem") {
                (call) throws(BusError) in
                try call.open("a", "{sv}")
                try call.close()
                try Self.plainSecret("planted", session: session, to: call)
                try call.bool(true)
            }
        }
        #expect(created?.name == "org.freedesktop.DBus.Error.AccessDenied", "\(String(describing: created))")
        let asked = store.asked.withLock { $0 }
        #expect(!asked.contains("set") && !asked.contains("refused set"), "\(asked)")
        #expect(store.contents.withLock { $0["secure"]?.keys.sorted() } == ["token"])
    }

    /// A program that policed groups admit searches those groups only when
    /// it names no collection, as an iOS app's query sees its access groups:
    /// an item of another program's with its attributes in an open
    /// collection never answers its lookup, also when the group it was
    /// granted holds nothing yet. Naming a collection reaches it; a program
    /// no policy admits searches every collection.
    @Test(arguments: [["secure"], ["mail-app"], []])
    func aGrantedProgramsSearchStaysInTheGroupsThatAdmitIt(_ admitting: Set<String>) throws {
        let store = FakeStore(
            get: .failure(.keychain(.badRequest, "not in this test")), set: .success(Done()),
            remove: .success(Done()),
            contents: ["default": Self.mailItems(["server", "token"]), "secure": ["token": nil]],
            admitting: admitting)
        let bus = try DirectBus(store: store)
        let defaultItems = [ObjectPaths.item("default", "server"), ObjectPaths.item("default", "token")]
        let secureToken = ObjectPaths.item("secure", "token")

        let byIdentifier = try Self.found(bus, [SecretServiceProvider.identifierAttribute: "token"])
        let byApp = try Self.found(bus, ["app": "mail"])
        switch admitting {
        case ["secure"]:
            #expect(byIdentifier == [secureToken])
            #expect(byApp == [])
        case ["mail-app"]:
            #expect(byIdentifier == [])
            #expect(byApp == [])
        default:
            #expect(byIdentifier == [ObjectPaths.item("default", "token"), secureToken])
            #expect(byApp == defaultItems)
        }
        #expect(try Self.found(bus, [SecretServiceProvider.groupAttribute: "default", "app": "mail"]) == defaultItems)
        #expect(try Self.found(bus, ["app": "mail"], in: ObjectPaths.collection("default")) == defaultItems)
    }

    /// An item's Label and Attributes are read-write (the spec): a set is
    /// kept as the item's details and read back, the `keychainfs:`
    /// attributes every item answers to are never stored, and a value of
    /// the wrong type, a property that is read-only and an item that is not
    /// there are errors that change nothing.
    @Test func anItemsLabelAndAttributesAreSetThroughPropertiesAndReadBack() throws {
        let store = FakeStore(
            get: .failure(.keychain(.badRequest, "not in this test")), set: .success(Done()),
            remove: .success(Done()), contents: ["work": Self.mailItems(["mail"])])
        let bus = try DirectBus(store: store)
        func set(_ name: String, _ value: PropertyValue, on path: String = Self.mail) throws(BusError) {
            _ = try bus.call(path, SecretServiceProvider.propertiesInterface, "Set") { (call) throws(BusError) in
                try call.string(SecretServiceProvider.itemInterface)
                try call.string(name)
                try call.variant(value)
            }
        }
        func get(_ name: String) throws -> PropertyValue? {
            try bus.call(Self.mail, SecretServiceProvider.propertiesInterface, "Get") { (call) throws(BusError) in
                try call.string(SecretServiceProvider.itemInterface)
                try call.string(name)
            }.arguments.variant()
        }
        try set("Label", .string("Work mail"))
        try set("Attributes", .attributes(["app": "mail", "user": "ann", "keychainfs:group": "elsewhere"]))
        #expect(try get("Label") == .string("Work mail"))
        // Its own attributes; the `keychainfs:` ones are answered to, not stored.
        #expect(try get("Attributes") == .attributes(["app": "mail", "user": "ann"]))
        let kept = store.contents.withLock { $0["work"]?["mail"] ?? nil }
        #expect(kept?.label == "Work mail" && kept?.attributes == ["app": "mail", "user": "ann"])
        #expect(try Self.found(bus, ["user": "ann"]) == [Self.mail])

        let wrongType = #expect(throws: BusError.self) { try set("Label", .uint64(1)) }
        #expect(wrongType?.name == "org.freedesktop.DBus.Error.InvalidArgs", "\(String(describing: wrongType))")
        let readOnly = #expect(throws: BusError.self) { try set("Locked", .bool(false)) }
        #expect(readOnly?.name == "org.freedesktop.DBus.Error.NotSupported", "\(String(describing: readOnly))")
        let absent = #expect(throws: BusError.self) {
            try set("Label", .string("x"), on: ObjectPaths.item("work", "nothing"))
        }
        #expect(absent?.name == "org.freedesktop.Secret.Error.NoSuchObject", "\(String(describing: absent))")
        #expect(store.asked.withLock { $0 } == ["set-details", "set-details"])
        #expect(store.contents.withLock { $0["work"]?["mail"] ?? nil } == kept)
    }
}
