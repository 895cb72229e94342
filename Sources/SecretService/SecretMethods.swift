import KeychainCore

/// Every method the provider answers, each described once: the object it
/// is called on, its interface, member and signature, the reader of its
/// arguments and its handler. The dispatcher checks the interface, the
/// signature and the object before the arguments are read, so that no
/// handler repeats those checks; the `busmessage` fuzz target runs each
/// row's reader, so that what it tries is what the handler gets.
struct SecretMethod: Sendable {
    /// What kind of object a method is called on.
    enum Kind: Sendable {
        case service, collection, item, session, prompt, portal
        /// `org.freedesktop.DBus.Properties`, on any object.
        case properties
    }

    /// The object a call is on, as its handler needs it: resolved by the
    /// dispatcher from the call's path (``ObjectPaths``) before any handler
    /// runs, an alias to its collection and a prompt to the caller's own.
    enum Target {
        case service
        case collection(group: String)
        case item(group: String, identifier: String)
        case session
        case prompt(UnlockPrompt)
        case portal
        /// `org.freedesktop.DBus.Properties`, on whichever object.
        case properties(ObjectPaths.Object)

        var kind: Kind {
            switch self {
            case .service: .service
            case .collection: .collection
            case .item: .item
            case .session: .session
            case .prompt: .prompt
            case .portal: .portal
            case .properties: .properties
            }
        }

        /// What the handler of each kind gets of it (nil: another kind).
        var collectionGroup: String? {
            guard case .collection(let group) = self else { return nil }
            return group
        }
        var item: ItemAddress? {
            guard case .item(let group, let identifier) = self else { return nil }
            return ItemAddress(group: group, identifier: identifier)
        }
        var prompt: UnlockPrompt? {
            guard case .prompt(let prompt) = self else { return nil }
            return prompt
        }
        var propertiesObject: ObjectPaths.Object? {
            guard case .properties(let object) = self else { return nil }
            return object
        }
    }

    /// An item a call is on: its group and identifier.
    struct ItemAddress {
        let group: String
        let identifier: String
    }

    let kind: Kind
    let interface: String
    let member: String
    let signature: String
    /// The method's arguments read from a call, as its handler gets them
    /// (for the fuzz target, which checks the limits of their parts).
    let readArguments: @Sendable (BusMessageReader) throws(BusError) -> any MethodArguments
    /// Reads the arguments and runs the handler on the call's object: its typed reply, or none yet.
    let run: @Sendable (SecretServiceProvider, BusCall, Target) throws(BusError) -> MethodAnswer

    /// A method of objects of `kind`, whose handler gets what `object` takes
    /// of the call's target (its group, its item, its prompt: typed, never a
    /// default for another kind's).
    init<Object, Arguments: MethodArguments>(
        _ kind: Kind, _ interface: String, _ member: String, _ signature: String,
        reading read: @escaping @Sendable (BusMessageReader) throws(BusError) -> Arguments,
        on object: @escaping @Sendable (Target) -> Object?,
        _ handler:
            @escaping @Sendable (SecretServiceProvider, BusCall, Object, Arguments) throws(BusError) ->
            MethodAnswer
    ) {
        self.kind = kind
        self.interface = interface
        self.member = member
        self.signature = signature
        readArguments = { (arguments) throws(BusError) in try read(arguments) }
        run = { (provider, call, target) throws(BusError) in
            // The dispatcher picks methods by the target's kind: another never reaches here.
            guard let object = object(target) else { throw .unknownMethod("no method \(member) at \(call.path)") }
            return try handler(provider, call, object, try read(call.arguments))
        }
    }

    /// A method whose handler needs nothing of its object (the service, a session, the portal).
    init<Arguments: MethodArguments>(
        _ kind: Kind, _ interface: String, _ member: String, _ signature: String,
        reading read: @escaping @Sendable (BusMessageReader) throws(BusError) -> Arguments,
        _ handler: @escaping @Sendable (SecretServiceProvider, BusCall, Arguments) throws(BusError) -> MethodAnswer
    ) {
        self.init(
            kind, interface, member, signature, reading: read, on: { $0.kind == kind ? () : nil }
        ) { p, call, _, arguments throws(BusError) in
            try handler(p, call, arguments)
        }
    }

    /// A method without arguments.
    init<Object>(
        _ kind: Kind, _ interface: String, _ member: String, on object: @escaping @Sendable (Target) -> Object?,
        _ handler: @escaping @Sendable (SecretServiceProvider, BusCall, Object) throws(BusError) -> MethodAnswer
    ) {
        self.init(kind, interface, member, "", reading: { _ throws(BusError) in NoArguments() }, on: object) {
            p, call, object, _ throws(BusError) in
            try handler(p, call, object)
        }
    }

    typealias Provider = SecretServiceProvider

    /// The Secret Service API 0.2 as this provider answers it (docs/SECRET-SERVICE.md, "Methods").
    static let all: [SecretMethod] = [
        SecretMethod(
            .service, Provider.serviceInterface, "OpenSession", "sv",
            reading: { (arguments) throws(BusError) in
                SessionRequest(algorithm: try arguments.string(), input: try arguments.variant())
            }
        ) { p, call, request throws(BusError) in
            .reply(try p.openSession(call, algorithm: request.algorithm, input: request.input))
        },
        SecretMethod(
            .service, Provider.serviceInterface, "SearchItems", "a{ss}",
            reading: { (arguments) throws(BusError) in try arguments.stringDictionary() }
        ) { p, call, attributes throws(BusError) in
            .reply(try p.searchItems(call, attributes: attributes))
        },
        SecretMethod(
            .service, Provider.serviceInterface, "GetSecrets", "aoo",
            reading: { (arguments) throws(BusError) in
                SecretsRequest(items: try arguments.objectPaths(), session: try arguments.objectPath())
            }
        ) { p, call, request throws(BusError) in
            try p.getSecrets(call, items: request.items, session: request.session)
        },
        SecretMethod(
            .service, Provider.serviceInterface, "CreateCollection", "a{sv}s",
            reading: { (arguments) throws(BusError) in
                NewCollection(properties: try arguments.properties(), alias: try arguments.string())
            }
        ) { p, call, request throws(BusError) in
            .reply(try p.createCollection(call, properties: request.properties, alias: request.alias))
        },
        SecretMethod(
            .service, Provider.serviceInterface, "ReadAlias", "s",
            reading: { (arguments) throws(BusError) in try arguments.string() }
        ) { p, call, alias throws(BusError) in
            .reply(try p.readAlias(call, alias: alias))
        },
        SecretMethod(
            .service, Provider.serviceInterface, "SetAlias", "so",
            reading: { (arguments) throws(BusError) in
                AliasChange(alias: try arguments.string(), path: try arguments.objectPath())
            }
        ) { p, call, request throws(BusError) in
            .reply(try p.setAlias(call, alias: request.alias, path: request.path))
        },
        SecretMethod(
            .service, Provider.serviceInterface, "Lock", "ao",
            reading: { (arguments) throws(BusError) in try arguments.objectPaths() }
        ) { p, call, objects throws(BusError) in
            .reply(try p.lock(call, objects: objects))
        },
        SecretMethod(
            .service, Provider.serviceInterface, "Unlock", "ao",
            reading: { (arguments) throws(BusError) in try arguments.objectPaths() }
        ) { p, call, objects throws(BusError) in
            .reply(try p.unlock(call, objects: objects))
        },
        SecretMethod(
            .collection, Provider.collectionInterface, "SearchItems", "a{ss}",
            reading: { (arguments) throws(BusError) in try arguments.stringDictionary() }, on: \.collectionGroup
        ) { p, call, group, attributes throws(BusError) in
            .reply(try p.searchCollection(call, group: group, attributes: attributes))
        },
        SecretMethod(.collection, Provider.collectionInterface, "Delete", on: \.collectionGroup) {
            p, call, group throws(BusError) in
            .reply(try p.deleteCollection(call, group: group))
        },
        SecretMethod(
            .collection, Provider.collectionInterface, "CreateItem", "a{sv}(oayays)b",
            reading: { (arguments) throws(BusError) in
                NewItem(
                    properties: try arguments.properties(), secret: try arguments.secretStruct(),
                    replace: try arguments.bool())
            }, on: \.collectionGroup
        ) { p, call, group, item throws(BusError) in
            try p.createItem(call, group: group, item)
        },
        SecretMethod(
            .item, Provider.itemInterface, "GetSecret", "o",
            reading: { (arguments) throws(BusError) in try arguments.objectPath() }, on: \.item
        ) { p, call, item, session throws(BusError) in
            try p.getSecret(call, group: item.group, identifier: item.identifier, session: session)
        },
        SecretMethod(
            .item, Provider.itemInterface, "SetSecret", "(oayays)",
            reading: { (arguments) throws(BusError) in try arguments.secretStruct() }, on: \.item
        ) { p, call, item, secret throws(BusError) in
            try p.setSecret(call, group: item.group, identifier: item.identifier, secret)
        },
        SecretMethod(.item, Provider.itemInterface, "Delete", on: \.item) { p, call, item throws(BusError) in
            try p.deleteItem(call, group: item.group, identifier: item.identifier)
        },
        SecretMethod(.session, Provider.sessionInterface, "Close", on: { $0.kind == .session ? () : nil }) {
            p, call, _ throws(BusError) in
            .reply(try p.closeSession(call))
        },
        SecretMethod(
            .prompt, Provider.promptInterface, "Prompt", "s",
            // The window to place it over: pinentry places itself.
            reading: { (arguments) throws(BusError) in
                _ = try arguments.string()
                return NoArguments()
            }, on: \.prompt
        ) { p, call, prompt, _ throws(BusError) in
            .reply(try p.showPrompt(call, prompt: prompt))
        },
        SecretMethod(.prompt, Provider.promptInterface, "Dismiss", on: \.prompt) { p, call, prompt throws(BusError) in
            .reply(try p.dismissPrompt(call, prompt: prompt))
        },
        SecretMethod(
            .properties, Provider.propertiesInterface, "Get", "ss",
            reading: { (arguments) throws(BusError) in
                PropertyName(interface: try arguments.string(), name: try arguments.string())
            }, on: \.propertiesObject
        ) { p, call, object, property throws(BusError) in
            .reply(try p.getProperty(call, object: object, interface: property.interface, name: property.name))
        },
        SecretMethod(
            .properties, Provider.propertiesInterface, "GetAll", "s",
            reading: { (arguments) throws(BusError) in try arguments.string() }, on: \.propertiesObject
        ) { p, call, object, interface throws(BusError) in
            .reply(try p.getAllProperties(call, object: object, interface: interface))
        },
        SecretMethod(
            .properties, Provider.propertiesInterface, "Set", "ssv",
            reading: { (arguments) throws(BusError) in
                PropertyChange(
                    interface: try arguments.string(), name: try arguments.string(), value: try arguments.variant())
            }, on: \.propertiesObject
        ) { p, call, object, change throws(BusError) in
            try p.setProperty(
                call, object: object, interface: change.interface, name: change.name, value: change.value)
        },
        SecretMethod(
            .portal, Provider.portalInterface, "RetrieveSecret", "osha{sv}",
            reading: { (arguments) throws(BusError) in
                let handle = try arguments.objectPath(), appID = try arguments.string()
                let fd = try arguments.unixFD()
                try arguments.skip("a{sv}")  // the portal passes no option the backend uses
                return PortalRequest(handle: handle, appID: appID, fd: fd)
            }
        ) { p, call, request throws(BusError) in
            .reply(try p.retrieveSecret(call, appID: request.appID, fd: request.fd))
        }
    ]
}

/// What of a method's arguments has a limit its reader must have kept
/// (the `busmessage` fuzz target checks each part of what a reader returns).
enum ArgumentPart {
    /// Lookup attributes (`a{ss}`): at most 256 pairs of at most 4096 bytes each.
    case lookup([String: String])
    /// A property or a variant as sent: its attributes within an item's limits.
    case property(PropertyValue)
    /// A session's algorithm and key-exchange input, which the exchange reads.
    case session(algorithm: String, input: PropertyValue?)
}

/// A method's arguments as its reader returns them, typed: what its
/// handler gets, and the parts of it that have limits.
protocol MethodArguments: SendableMetatype {
    var parts: [ArgumentPart] { get }
}

/// A method that takes nothing (or nothing it uses).
struct NoArguments: MethodArguments {
    var parts: [ArgumentPart] { [] }
}

/// An object path, an alias, an interface's name.
extension String: MethodArguments {
    var parts: [ArgumentPart] { [] }
}

/// Object paths (`ao`).
extension Array: MethodArguments where Element == String {
    var parts: [ArgumentPart] { [] }
}

/// Lookup attributes (`a{ss}`).
extension Dictionary: MethodArguments where Key == String, Value == String {
    var parts: [ArgumentPart] { [.lookup(self)] }
}

/// `OpenSession`'s arguments: the algorithm and its input.
struct SessionRequest: MethodArguments {
    let algorithm: String
    let input: PropertyValue?
    var parts: [ArgumentPart] { [.session(algorithm: algorithm, input: input)] }
}

/// `GetSecrets`'s arguments: the items and the session to send them in.
struct SecretsRequest: MethodArguments {
    let items: [String]
    let session: String
    var parts: [ArgumentPart] { [] }
}

/// `CreateCollection`'s arguments: its properties and the alias it takes.
struct NewCollection: MethodArguments {
    let properties: [String: PropertyValue]
    let alias: String
    var parts: [ArgumentPart] { properties.values.map { .property($0) } }
}

/// `SetAlias`'s arguments: the alias and the collection it names.
struct AliasChange: MethodArguments {
    let alias: String
    let path: String
    var parts: [ArgumentPart] { [] }
}

/// `CreateItem`'s arguments: the properties, the secret as sent, and
/// whether an item with the same attributes is replaced.
struct NewItem: MethodArguments {
    let properties: [String: PropertyValue]
    let secret: SentSecret
    let replace: Bool
    var parts: [ArgumentPart] { properties.values.map { .property($0) } }
}

/// `Properties.Get`'s arguments.
struct PropertyName: MethodArguments {
    let interface: String
    let name: String
    var parts: [ArgumentPart] { [] }
}

/// `Properties.Set`'s arguments.
struct PropertyChange: MethodArguments {
    let interface: String
    let name: String
    let value: PropertyValue?
    var parts: [ArgumentPart] { value.map { [.property($0)] } ?? [] }
}

/// The Secret portal's `RetrieveSecret` arguments: the request's handle,
/// the app's id and the descriptor to write the secret to.
struct PortalRequest: MethodArguments {
    let handle: String
    let appID: String
    let fd: BorrowedDescriptor
    var parts: [ArgumentPart] { [] }
}

extension SecretServiceProvider {
    /// Finds the method a call names on `object` and runs it, once the
    /// interface (a call may leave it out), the object and the signature
    /// are the method's; returns what its handler answered.
    func dispatch(_ call: BusCall, to object: ObjectPaths.Object) throws(BusError) -> MethodAnswer {
        let target = try self.target(of: call, on: object)
        let methods = SecretMethod.all.filter { $0.kind == target.kind }
        guard let method = methods.first(where: { $0.member == call.member }) else {
            throw .unknownMethod("no method \(call.member) in \(methods.first?.interface ?? call.interface)")
        }
        try requireSignature(call, method.signature)
        return try method.run(self, call, target)
    }

    /// The object `call` is on, as its method's handler gets it, once the
    /// interface (a call may leave it out) is the object's: an alias as its
    /// collection, a collection the caller may use, a prompt of the caller's.
    private func target(of call: BusCall, on object: ObjectPaths.Object) throws(BusError) -> SecretMethod.Target {
        let target: SecretMethod.Target
        if call.interface == Self.propertiesInterface {
            target = .properties(object)
        } else {
            switch object {
            case .service: target = .service
            case .collection(let group): target = .collection(group: group)
            case .alias(let alias):
                guard let group = Self.group(ofAlias: alias) else { throw .noSuchObject("no alias \(alias)") }
                target = .collection(group: group)
            case .item(let group, let identifier): target = .item(group: group, identifier: identifier)
            case .session: target = .session
            case .prompt:
                guard let prompt = prompts[call.path], prompt.owner == call.sender else {
                    throw .noSuchObject("no prompt at \(call.path) for this connection")
                }
                target = .prompt(prompt)
            case .portal: target = .portal
            }
        }
        let interface = SecretMethod.all.first { $0.kind == target.kind }?.interface
        guard let interface, call.interface == interface || call.interface.isEmpty else {
            throw .unknownMethod("no interface \(call.interface) at \(call.path)")
        }
        // A group gone, or one the caller may not use, is no object for it.
        if case .collection(let group) = target { try requireGroup(group, for: call) }
        return target
    }
}
