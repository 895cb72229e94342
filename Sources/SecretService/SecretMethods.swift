/// Every method the provider answers, each described once: the object it
/// is called on, its interface, member and signature, and its handler.
/// The dispatcher checks the interface, the signature and the object
/// before a handler runs, so that no handler repeats those checks.
struct SecretMethod: Sendable {
    /// What kind of object a method is called on.
    enum Kind: Sendable {
        case service, collection, item, session, prompt
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
    let handler: @Sendable (SecretServiceProvider, BusCall, Target) throws(BusError) -> Void

    init(
        _ kind: Kind, _ interface: String, _ member: String, _ signature: String,
        _ handler: @escaping @Sendable (SecretServiceProvider, BusCall, Target) throws(BusError) -> Void
    ) {
        self.kind = kind
        self.interface = interface
        self.member = member
        self.signature = signature
        self.handler = handler
    }

    typealias Provider = SecretServiceProvider

    /// The Secret Service API 0.2 as this provider answers it (docs/SECRET-SERVICE.md, "Methods").
    static let all: [SecretMethod] = [
        SecretMethod(.service, Provider.serviceInterface, "OpenSession", "sv") { p, call, _ throws(BusError) in
            try p.openSession(call)
        },
        SecretMethod(.service, Provider.serviceInterface, "SearchItems", "a{ss}") { p, call, _ throws(BusError) in
            try p.searchItems(call)
        },
        SecretMethod(.service, Provider.serviceInterface, "GetSecrets", "aoo") { p, call, _ throws(BusError) in
            try p.getSecrets(call)
        },
        SecretMethod(.service, Provider.serviceInterface, "CreateCollection", "a{sv}s") { p, call, _ throws(BusError) in
            try p.createCollection(call)
        },
        SecretMethod(.service, Provider.serviceInterface, "ReadAlias", "s") { p, call, _ throws(BusError) in
            try p.readAlias(call)
        },
        SecretMethod(.service, Provider.serviceInterface, "SetAlias", "so") { p, call, _ throws(BusError) in
            try p.setAlias(call)
        },
        SecretMethod(.service, Provider.serviceInterface, "Lock", "ao") { p, call, _ throws(BusError) in
            try p.lock(call)
        },
        SecretMethod(.service, Provider.serviceInterface, "Unlock", "ao") { p, call, _ throws(BusError) in
            try p.unlock(call)
        },
        SecretMethod(.collection, Provider.collectionInterface, "SearchItems", "a{ss}") {
            p, call, target throws(BusError) in
            try p.searchCollection(call, group: target.group)
        },
        SecretMethod(.collection, Provider.collectionInterface, "Delete", "") { p, call, target throws(BusError) in
            try p.deleteCollection(call, group: target.group)
        },
        SecretMethod(.collection, Provider.collectionInterface, "CreateItem", "a{sv}(oayays)b") {
            p, call, target throws(BusError) in
            try p.createItem(call, group: target.group)
        },
        SecretMethod(.item, Provider.itemInterface, "GetSecret", "o") { p, call, target throws(BusError) in
            try p.getSecret(call, group: target.group, identifier: target.identifier)
        },
        SecretMethod(.item, Provider.itemInterface, "SetSecret", "(oayays)") { p, call, target throws(BusError) in
            try p.setSecret(call, group: target.group, identifier: target.identifier)
        },
        SecretMethod(.item, Provider.itemInterface, "Delete", "") { p, call, target throws(BusError) in
            try p.deleteItem(call, group: target.group, identifier: target.identifier)
        },
        SecretMethod(.session, Provider.sessionInterface, "Close", "") { p, call, _ throws(BusError) in
            try p.closeSession(call)
        },
        SecretMethod(.prompt, Provider.promptInterface, "Prompt", "s") { p, call, target throws(BusError) in
            try p.showPrompt(call, prompt: target.prompt!)
        },
        SecretMethod(.prompt, Provider.promptInterface, "Dismiss", "") { p, call, target throws(BusError) in
            try p.dismissPrompt(call, prompt: target.prompt!)
        },
        SecretMethod(.properties, Provider.propertiesInterface, "Get", "ss") { p, call, target throws(BusError) in
            try p.getProperty(call, object: target.object)
        },
        SecretMethod(.properties, Provider.propertiesInterface, "GetAll", "s") { p, call, target throws(BusError) in
            try p.getAllProperties(call, object: target.object)
        },
        SecretMethod(.properties, Provider.propertiesInterface, "Set", "ssv") { p, call, target throws(BusError) in
            try p.setProperty(call, object: target.object)
        }
    ]
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
        case .service, .item, .session, .properties:
            break
        }
        guard let method = methods.first(where: { $0.member == call.member }) else {
            throw .unknownMethod("no method \(call.member) in \(interface)")
        }
        try requireSignature(call, method.signature)
        try method.handler(self, call, target)
    }
}
