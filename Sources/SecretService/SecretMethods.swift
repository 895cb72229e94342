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

    /// The object a call is on, as a handler needs it.
    struct Target {
        let object: ObjectPaths.Object
        var group = ""
        var identifier = ""
        var prompt: UnlockPrompt?
    }

    let kind: Kind
    let interface: String
    let member: String
    let signature: String
    /// The method's arguments read from a call, in the signature's order
    /// (for the fuzz target, which looks into them).
    let readArguments: @Sendable (BusMessageReader) throws(BusError) -> Any
    /// Reads the arguments and runs the handler.
    let run: @Sendable (SecretServiceProvider, BusCall, Target) throws(BusError) -> Void

    init<Arguments>(
        _ kind: Kind, _ interface: String, _ member: String, _ signature: String,
        reading read: @escaping @Sendable (BusMessageReader) throws(BusError) -> Arguments,
        _ handler: @escaping @Sendable (SecretServiceProvider, BusCall, Target, Arguments) throws(BusError) -> Void
    ) {
        self.kind = kind
        self.interface = interface
        self.member = member
        self.signature = signature
        readArguments = { (arguments) throws(BusError) in try read(arguments) }
        run = { (provider, call, target) throws(BusError) in
            try handler(provider, call, target, try read(call.arguments))
        }
    }

    /// A method without arguments.
    init(
        _ kind: Kind, _ interface: String, _ member: String,
        _ handler: @escaping @Sendable (SecretServiceProvider, BusCall, Target) throws(BusError) -> Void
    ) {
        self.init(kind, interface, member, "", reading: { _ throws(BusError) in () }) {
            p, call, target, _ throws(BusError) in
            try handler(p, call, target)
        }
    }

    typealias Provider = SecretServiceProvider

    /// The Secret Service API 0.2 as this provider answers it (docs/SECRET-SERVICE.md, "Methods").
    static let all: [SecretMethod] = [
        SecretMethod(
            .service, Provider.serviceInterface, "OpenSession", "sv",
            reading: { (arguments) throws(BusError) in
                (algorithm: try arguments.string(), input: try arguments.variant())
            }
        ) { p, call, _, request throws(BusError) in
            try p.openSession(call, algorithm: request.algorithm, input: request.input)
        },
        SecretMethod(
            .service, Provider.serviceInterface, "SearchItems", "a{ss}",
            reading: { (arguments) throws(BusError) in try arguments.stringDictionary() }
        ) { p, call, _, attributes throws(BusError) in
            try p.searchItems(call, attributes: attributes)
        },
        SecretMethod(
            .service, Provider.serviceInterface, "GetSecrets", "aoo",
            reading: { (arguments) throws(BusError) in
                (items: try arguments.objectPaths(), session: try arguments.objectPath())
            }
        ) { p, call, _, request throws(BusError) in
            try p.getSecrets(call, items: request.items, session: request.session)
        },
        SecretMethod(
            .service, Provider.serviceInterface, "CreateCollection", "a{sv}s",
            reading: { (arguments) throws(BusError) in
                (properties: try arguments.properties(), alias: try arguments.string())
            }
        ) { p, call, _, request throws(BusError) in
            try p.createCollection(call, properties: request.properties, alias: request.alias)
        },
        SecretMethod(
            .service, Provider.serviceInterface, "ReadAlias", "s",
            reading: { (arguments) throws(BusError) in try arguments.string() }
        ) { p, call, _, alias throws(BusError) in
            try p.readAlias(call, alias: alias)
        },
        SecretMethod(
            .service, Provider.serviceInterface, "SetAlias", "so",
            reading: { (arguments) throws(BusError) in (alias: try arguments.string(), path: try arguments.objectPath())
            }
        ) { p, call, _, request throws(BusError) in
            try p.setAlias(call, alias: request.alias, path: request.path)
        },
        SecretMethod(
            .service, Provider.serviceInterface, "Lock", "ao",
            reading: { (arguments) throws(BusError) in try arguments.objectPaths() }
        ) { p, call, _, objects throws(BusError) in
            try p.lock(call, objects: objects)
        },
        SecretMethod(
            .service, Provider.serviceInterface, "Unlock", "ao",
            reading: { (arguments) throws(BusError) in try arguments.objectPaths() }
        ) { p, call, _, objects throws(BusError) in
            try p.unlock(call, objects: objects)
        },
        SecretMethod(
            .collection, Provider.collectionInterface, "SearchItems", "a{ss}",
            reading: { (arguments) throws(BusError) in try arguments.stringDictionary() }
        ) { p, call, target, attributes throws(BusError) in
            try p.searchCollection(call, group: target.group, attributes: attributes)
        },
        SecretMethod(.collection, Provider.collectionInterface, "Delete") { p, call, target throws(BusError) in
            try p.deleteCollection(call, group: target.group)
        },
        SecretMethod(
            .collection, Provider.collectionInterface, "CreateItem", "a{sv}(oayays)b",
            reading: { (arguments) throws(BusError) in
                NewItem(
                    properties: try arguments.properties(), secret: try arguments.secretStruct(),
                    replace: try arguments.bool())
            }
        ) { p, call, target, item throws(BusError) in
            try p.createItem(call, group: target.group, item)
        },
        SecretMethod(
            .item, Provider.itemInterface, "GetSecret", "o",
            reading: { (arguments) throws(BusError) in try arguments.objectPath() }
        ) { p, call, target, session throws(BusError) in
            try p.getSecret(call, group: target.group, identifier: target.identifier, session: session)
        },
        SecretMethod(
            .item, Provider.itemInterface, "SetSecret", "(oayays)",
            reading: { (arguments) throws(BusError) in try arguments.secretStruct() }
        ) { p, call, target, secret throws(BusError) in
            try p.setSecret(call, group: target.group, identifier: target.identifier, secret)
        },
        SecretMethod(.item, Provider.itemInterface, "Delete") { p, call, target throws(BusError) in
            try p.deleteItem(call, group: target.group, identifier: target.identifier)
        },
        SecretMethod(.session, Provider.sessionInterface, "Close") { p, call, _ throws(BusError) in
            try p.closeSession(call)
        },
        SecretMethod(
            .prompt, Provider.promptInterface, "Prompt", "s",
            // The window to place it over: pinentry places itself.
            reading: { (arguments) throws(BusError) in _ = try arguments.string() }
        ) { p, call, target, _ throws(BusError) in
            try p.showPrompt(call, prompt: target.prompt!)
        },
        SecretMethod(.prompt, Provider.promptInterface, "Dismiss") { p, call, target throws(BusError) in
            try p.dismissPrompt(call, prompt: target.prompt!)
        },
        SecretMethod(
            .properties, Provider.propertiesInterface, "Get", "ss",
            reading: { (arguments) throws(BusError) in (interface: try arguments.string(), name: try arguments.string())
            }
        ) { p, call, target, property throws(BusError) in
            try p.getProperty(call, object: target.object, interface: property.interface, name: property.name)
        },
        SecretMethod(
            .properties, Provider.propertiesInterface, "GetAll", "s",
            reading: { (arguments) throws(BusError) in try arguments.string() }
        ) { p, call, target, interface throws(BusError) in
            try p.getAllProperties(call, object: target.object, interface: interface)
        },
        SecretMethod(
            .properties, Provider.propertiesInterface, "Set", "ssv",
            reading: { (arguments) throws(BusError) in
                (interface: try arguments.string(), name: try arguments.string(), value: try arguments.variant())
            }
        ) { p, call, target, change throws(BusError) in
            try p.setProperty(
                call, object: target.object, interface: change.interface, name: change.name, value: change.value)
        },
        SecretMethod(
            .portal, Provider.portalInterface, "RetrieveSecret", "osha{sv}",
            reading: { (arguments) throws(BusError) in
                let handle = try arguments.objectPath(), appID = try arguments.string()
                let fd = try arguments.unixFD()
                try arguments.skip("a{sv}")  // the portal passes no option the backend uses
                return (handle: handle, appID: appID, fd: fd)
            }
        ) { p, call, _, request throws(BusError) in
            try p.retrieveSecret(call, appID: request.appID, fd: request.fd)
        }
    ]
}

/// `CreateItem`'s arguments: the properties, the secret as sent, and
/// whether an item with the same attributes is replaced.
struct NewItem {
    let properties: [String: PropertyValue]
    let secret: SentSecret
    let replace: Bool
}

extension SecretServiceProvider {
    /// Finds the method a call names on `object` and runs it, once the
    /// interface (a call may leave it out), the object and the signature
    /// are the method's.
    func dispatch(_ call: BusCall, to object: ObjectPaths.Object) throws(BusError) {
        var target = SecretMethod.Target(object: object)
        let kind: SecretMethod.Kind
        if call.interface == Self.propertiesInterface {
            kind = .properties
        } else {
            switch object {
            case .service:
                kind = .service
            case .collection(let group):
                kind = .collection
                target.group = group
            case .alias(let alias):
                guard let group = Self.group(ofAlias: alias) else { throw .noSuchObject("no alias \(alias)") }
                kind = .collection
                target.group = group
            case .item(let group, let identifier):
                kind = .item
                target.group = group
                target.identifier = identifier
            case .session:
                kind = .session
            case .prompt:
                kind = .prompt
            case .portal:
                kind = .portal
            }
        }
        let methods = SecretMethod.all.filter { $0.kind == kind }
        guard let interface = methods.first?.interface, call.interface == interface || call.interface.isEmpty else {
            throw .unknownMethod("no interface \(call.interface) at \(call.path)")
        }
        switch kind {
        case .collection:
            // A group gone, or one the caller may not use, is no object for it.
            try requireGroup(target.group, for: call)
        case .prompt:
            guard let prompt = prompts[call.path], prompt.owner == call.sender else {
                throw .noSuchObject("no prompt at \(call.path) for this connection")
            }
            target.prompt = prompt
        case .service, .item, .session, .properties, .portal:
            break
        }
        guard let method = methods.first(where: { $0.member == call.member }) else {
            throw .unknownMethod("no method \(call.member) in \(interface)")
        }
        try requireSignature(call, method.signature)
        try method.run(self, call, target)
    }
}
