import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The freedesktop Secret Service API (`org.freedesktop.secrets`, spec
/// 0.2) over the device's keychain: a collection is an access group (the
/// alias `default`, and `login`, name the group `default`), an item an
/// identifier. Every item access is a request of the device, as through a
/// mount or the socket: decided by the entitlement rules for the program
/// that sent it and recorded in the audit log. docs/SECRET-SERVICE.md
/// lists every method with what it does when locked or policed.
///
/// Runs on its bus connection's thread; all its state is that thread's.
public final class SecretServiceProvider: @unchecked Sendable {
    public static let busName = "org.freedesktop.secrets"
    static let serviceInterface = "org.freedesktop.Secret.Service"
    static let collectionInterface = "org.freedesktop.Secret.Collection"
    static let itemInterface = "org.freedesktop.Secret.Item"
    static let sessionInterface = "org.freedesktop.Secret.Session"
    static let promptInterface = "org.freedesktop.Secret.Prompt"
    static let propertiesInterface = "org.freedesktop.DBus.Properties"
    /// The lookup attributes every item answers to: its group and identifier.
    static let groupAttribute = "keychainfs:group"
    static let identifierAttribute = "keychainfs:identifier"
    /// The attribute by which CreateItem asks for a protection class (a
    /// class's name); the device's access mode otherwise.
    static let accessibleAttribute = "keychainfs:accessible"
    /// What every `keychainfs:` attribute starts with: ours to answer, never stored.
    static let attributePrefix = "keychainfs:"
    static let itemLabelProperty = "org.freedesktop.Secret.Item.Label"
    static let itemAttributesProperty = "org.freedesktop.Secret.Item.Attributes"
    static let collectionLabelProperty = "org.freedesktop.Secret.Collection.Label"

    let store: SecretStore
    let bus: BusConnection
    private var sessions: [String: TransferSession] = [:]
    private var nextSession = 1
    private var observer: Int?
    /// The items clients have been told of (by signals or a listing at
    /// start): a `written` event of one of them is ItemChanged, of another
    /// ItemCreated (the device's events do not tell the two apart).
    private var knownItems: Set<String> = []
    private var prompts: [String: UnlockPrompt] = [:]
    /// The program behind each connection at its first policed request,
    /// and whether its process was then found to hold it alone (bus thread only).
    fileprivate var firstIdentities: [String: (identity: ProgramIdentity, heldAlone: Bool)] = [:]
    private var nextPrompt = 1

    /// The bus it serves (nil: the one `$DBUS_SESSION_BUS_ADDRESS` named at its start).
    public let address: String?

    /// Connects to the session bus at `address` (nil: the one
    /// `$DBUS_SESSION_BUS_ADDRESS` names), owns `org.freedesktop.secrets`
    /// (with `replace`, taking it over from another provider) and serves it.
    public init(store: SecretStore, replace: Bool, address: String? = nil) throws(BusError) {
        self.store = store
        self.address = address
        bus = try BusConnection(address: address)
        try bus.serve(prefix: ObjectPaths.service) { [unowned self] message in handle(message) }
        // A session ends with the connection that opened it.
        try bus.watch("type='signal',sender='org.freedesktop.DBus',member='NameOwnerChanged'") { [unowned self] message in
            let arguments = BusMessageReader(message: message)
            guard let name = try? arguments.string(), (try? arguments.string()) != nil, let owner = try? arguments.string(),
                  owner.isEmpty else { return }
            sessions = sessions.filter { $0.value.owner != name }
            firstIdentities[name] = nil
            // A client gone during a prompt: its pinentry goes too.
            for (path, prompt) in prompts where prompt.owner == name {
                prompt.cancel()
                prompts[path] = nil
            }
        }
        for group in store.itemNames() {
            for identifier in group.value { knownItems.insert(ObjectPaths.item(group.key, identifier)) }
        }
        // The name is never given up on request (BusConnection.requestName);
        // lost all the same (the bus daemon's word), it is said where a
        // person looks: the log, the journal, and `isServing`.
        try bus.watch("type='signal',sender='org.freedesktop.DBus',member='NameLost',arg0='\(Self.busName)'") { [unowned self] _ in
            nameLost.store(true, ordering: .sequentiallyConsistent)
            let sentence = "lost \(Self.busName) on the session bus to another program: no longer serving the Secret Service"
            store.setSecretServiceState("lost: " + sentence)
            Diagnostics.log(sentence)
            SystemdNotify.send("STATUS=" + sentence)
        }
        try bus.requestName(Self.busName, replace: replace)
        try bus.start()
        store.setSecretServiceState("serving \(Self.busName)")
        // The device's events, whoever made the change (a mount, the
        // socket, this bus): the observer runs on the committing thread and
        // only hands the event to the bus thread.
        observer = store.addObserver { [weak self] event in
            guard let self else { return }
            bus.perform { [self] in signal(event) }
        }
    }

    /// Whether it still serves its bus (false once the bus went away or the name was lost).
    public var isServing: Bool { bus.isServing && !nameLost.load(ordering: .sequentiallyConsistent) }
    private let nameLost = Atomic<Bool>(false)

    /// Releases the name and stops serving.
    public func stop() {
        if let observer { store.removeObserver(observer) }
        store.setSecretServiceState(nil)
        bus.stop()
    }

    // MARK: Signals

    /// The spec's signals for one device event. Policed groups' item
    /// changes are announced too (names only, as `ls` shows them; the
    /// values stay behind the policy).
    private func signal(_ event: DeviceEvent) {
        guard case .changed(let change) = event else { return }
        switch change {
        case .written(let group, let identifier):
            itemWritten(group, identifier)
        case .removed(let group, let identifier):
            itemRemoved(group, identifier)
        case .renamed(let group, let from, let to):
            itemRemoved(group, from)
            itemWritten(group, to)
        case .groupCreated(let group):
            emit(Self.serviceInterface, "CollectionCreated", at: ObjectPaths.service, naming: ObjectPaths.collection(group))
        case .groupRemoved(let group):
            emit(Self.serviceInterface, "CollectionDeleted", at: ObjectPaths.service, naming: ObjectPaths.collection(group))
        }
    }

    private func itemWritten(_ group: String, _ identifier: String) {
        let path = ObjectPaths.item(group, identifier)
        let created = knownItems.insert(path).inserted
        emit(Self.collectionInterface, created ? "ItemCreated" : "ItemChanged", at: ObjectPaths.collection(group), naming: path)
        if created { collectionChanged(group) }
    }

    private func itemRemoved(_ group: String, _ identifier: String) {
        let path = ObjectPaths.item(group, identifier)
        knownItems.remove(path)
        emit(Self.collectionInterface, "ItemDeleted", at: ObjectPaths.collection(group), naming: path)
        collectionChanged(group)
    }

    /// Its `Items` changed.
    private func collectionChanged(_ group: String) {
        let collection = ObjectPaths.collection(group)
        emit(Self.serviceInterface, "CollectionChanged", at: ObjectPaths.service, naming: collection)
    }

    private func emit(_ interface: String, _ member: String, at path: String, naming object: String) {
        bus.emit(path: path, interface: interface, member: member) { (signal) throws(BusError) in try signal.objectPath(object) }
    }

    // MARK: Dispatch

    private func handle(_ message: OpaquePointer) -> Bool {
        guard let call = BusCall(message) else { return false }
        // Introspection and peer calls are sd-bus's own.
        guard call.interface != "org.freedesktop.DBus.Introspectable", call.interface != "org.freedesktop.DBus.Peer" else {
            return false
        }
        do throws(BusError) {
            guard let object = ObjectPaths.object(at: call.path) else { throw BusError.noSuchObject("no object at \(call.path)") }
            if call.interface == Self.propertiesInterface {
                try answerProperties(call, object: object)
                return true
            }
            switch object {
            case .service: try answerService(call)
            case .collection(let group): try answerCollection(call, group: group)
            case .alias(let alias):
                guard let group = Self.group(ofAlias: alias) else { throw BusError.noSuchObject("no alias \(alias)") }
                try answerCollection(call, group: group)
            case .item(let group, let identifier): try answerItem(call, group: group, identifier: identifier)
            case .session(let id): try answerSession(call, id: id)
            case .prompt: try answerPrompt(call)
            }
        } catch {
            bus.reply(to: message, error: error)
        }
        return true
    }

    /// The group an alias names: `default` and `login` (gnome-keyring's
    /// login keyring, which programs ask for by that name) name `default`.
    static func group(ofAlias alias: String) -> String? {
        alias == "default" || alias == "login" ? ItemLimits.defaultGroup : nil
    }

    private func requireSignature(_ call: BusCall, _ signature: String) throws(BusError) {
        guard call.signature == signature else {
            throw .invalidArguments("\(call.member) takes (\(signature)), not (\(call.signature))")
        }
    }

    // MARK: org.freedesktop.Secret.Service

    private func answerService(_ call: BusCall) throws(BusError) {
        guard call.interface == Self.serviceInterface || call.interface.isEmpty else {
            throw .unknownMethod("no interface \(call.interface) at \(call.path)")
        }
        switch call.member {
        case "OpenSession":
            try requireSignature(call, "sv")
            let algorithm = try call.arguments.string()
            let path = ObjectPaths.sessionPrefix + String(nextSession)
            let (session, output) = try TransferSession.open(algorithm: algorithm, input: call.arguments, owner: call.sender,
                                                             path: path)
            nextSession += 1
            sessions[path] = session
            try bus.reply(to: call.message) { (reply) throws(BusError) in
                try reply.open("v", output == nil ? "s" : "ay")
                if let output {
                    try reply.bytes(output)
                } else {
                    try reply.string("")
                }
                try reply.close()
                try reply.objectPath(path)
            }
        case "SearchItems":
            try requireSignature(call, "a{ss}")
            let attributes = try call.arguments.stringDictionary()
            let found = try search(attributes, in: nil, caller: call)
            try bus.reply(to: call.message) { (reply) throws(BusError) in
                try reply.objectPaths(found.unlocked)
                try reply.objectPaths(found.locked)
            }
        case "GetSecrets":
            try requireSignature(call, "aoo")
            let paths = try call.arguments.objectPaths()
            let session = try self.session(try call.arguments.objectPath(), of: call)
            let items = paths.compactMap { path -> (group: String, identifier: String)? in
                guard case .item(let group, let identifier)? = ObjectPaths.object(at: path) else { return nil }
                return (group, identifier)
            }
            // Items of other programs the person denied are left out, as locked ones are.
            try withConsent(call, to: "read the secrets of", items: items, denied: { [self] call, asked throws(BusError) in
                let refused = Set(asked.map { ObjectPaths.item($0.group, $0.identifier) })
                try replySecrets(call, items.filter { !refused.contains(ObjectPaths.item($0.group, $0.identifier)) }, session: session)
            }) { [self] call throws(BusError) in try replySecrets(call, items, session: session) }
        case "CreateCollection":
            try requireSignature(call, "a{sv}s")
            let label: String
            if case .string(let given)? = try call.arguments.properties()[Self.collectionLabelProperty] { label = given } else { label = "" }
            let alias = try call.arguments.string()
            let group: String
            if !alias.isEmpty {
                // The spec: a collection for a well-known alias that exists is returned as it is.
                guard let aliased = Self.group(ofAlias: alias) else {
                    throw .notSupported("aliases other than default and login cannot be made (they name the group default)")
                }
                group = aliased
            } else {
                guard (try? ItemLimits.validate(name: label)) != nil else {
                    throw .invalidArguments("a collection's label is its access group's name: 1 to 255 bytes, no '/'")
                }
                group = label
                // An existing group of that name is that collection.
                switch perform(.createGroup(group), for: call) {
                case .ok, .keychainError(.duplicateItem, _): break
                case .keychainError(let error, let message): throw error == .missingEntitlement
                    ? .accessDenied(message) : .failed(message)
                default: throw .failed("cannot create the collection \(group)")
                }
            }
            try bus.reply(to: call.message) { (reply) throws(BusError) in
                try reply.objectPath(ObjectPaths.collection(group))
                try reply.objectPath(ObjectPaths.none)
            }
        case "ReadAlias":
            try requireSignature(call, "s")
            let alias = try call.arguments.string()
            let path = Self.group(ofAlias: alias).map(ObjectPaths.collection) ?? ObjectPaths.none
            try bus.reply(to: call.message) { (reply) throws(BusError) in try reply.objectPath(path) }
        case "SetAlias":
            // Aliases are fixed: `default` and `login` name the group
            // default. Setting one to what it names already is done;
            // anything else would have to outlive the device and is refused.
            try requireSignature(call, "so")
            let alias = try call.arguments.string(), path = try call.arguments.objectPath()
            guard let group = Self.group(ofAlias: alias), path == ObjectPaths.collection(group) else {
                throw .notSupported("aliases are fixed: default and login name the collection default")
            }
            try bus.reply(to: call.message) { _ throws(BusError) in }
        case "Lock":
            try requireSignature(call, "ao")
            let paths = try call.arguments.objectPaths()
            _ = perform(.lock, for: call)
            try bus.reply(to: call.message) { (reply) throws(BusError) in
                try reply.objectPaths(paths)
                try reply.objectPath(ObjectPaths.none)
            }
        case "Unlock":
            try requireSignature(call, "ao")
            let paths = try call.arguments.objectPaths()
            guard store.isLocked else {
                try bus.reply(to: call.message) { (reply) throws(BusError) in
                    try reply.objectPaths(paths)
                    try reply.objectPath(ObjectPaths.none)
                }
                return
            }
            // Locked: the passcode is asked for when the client calls Prompt.
            let path = ObjectPaths.promptPrefix + String(nextPrompt)
            nextPrompt += 1
            prompts[path] = UnlockPrompt(owner: call.sender, objects: paths)
            try bus.reply(to: call.message) { (reply) throws(BusError) in
                try reply.objectPaths([])
                try reply.objectPath(path)
            }
        default:
            throw .unknownMethod("no method \(call.member) in \(Self.serviceInterface)")
        }
    }

    /// GetSecrets' answer: the secrets of the items that are unlocked and
    /// whose group admits the caller; locked, absent or not entitled ones
    /// left out, as the spec's "secrets of the unlocked items".
    private func replySecrets(_ call: BusCall, _ items: [(group: String, identifier: String)],
                              session: TransferSession) throws(BusError) {
        var secrets: [(String, SecureBytes, String)] = []
        for (group, identifier) in items {
            if case .value(let value, _) = perform(.get(group: group, identifier: identifier), for: call) {
                secrets.append((ObjectPaths.item(group, identifier), value, contentType(of: group, identifier, for: call)))
            }
        }
        try bus.reply(to: call.message, sensitive: true) { (reply) throws(BusError) in
            try reply.open("a", "{o(oayays)}")
            for (path, value, contentType) in secrets {
                try reply.open("e", "o(oayays)")
                try reply.objectPath(path)
                try session.append(value, contentType: contentType, to: reply)
                try reply.close()
            }
            try reply.close()
        }
    }

    // MARK: org.freedesktop.Secret.Collection

    private func answerCollection(_ call: BusCall, group: String) throws(BusError) {
        guard call.interface == Self.collectionInterface || call.interface.isEmpty else {
            throw .unknownMethod("no interface \(call.interface) at \(call.path)")
        }
        try requireGroup(group, for: call)
        switch call.member {
        case "SearchItems":
            try requireSignature(call, "a{ss}")
            let found = try search(try call.arguments.stringDictionary(), in: group, caller: call)
            try bus.reply(to: call.message) { (reply) throws(BusError) in try reply.objectPaths(found.unlocked + found.locked) }
        case "Delete":
            try requireSignature(call, "")
            // As rmdir: a group that holds items is refused, never emptied by one call.
            switch perform(.removeGroup(group), for: call) {
            case .ok: break
            case .keychainError(.badRequest, _):
                throw .failed("the collection \(group) still holds items (or is mounted): remove them first; nothing was deleted")
            case .keychainError(.missingEntitlement, let message): throw .accessDenied(message)
            case .keychainError(_, let message), .systemError(_, let message): throw .failed(message)
            default: throw .failed("cannot delete the collection \(group)")
            }
            try bus.reply(to: call.message) { (reply) throws(BusError) in try reply.objectPath(ObjectPaths.none) }
        case "CreateItem":
            try requireSignature(call, "a{sv}(oayays)b")
            try createItem(call, in: group) { [self] call, path throws(BusError) in
                try bus.reply(to: call.message) { (reply) throws(BusError) in
                    try reply.objectPath(path)
                    try reply.objectPath(ObjectPaths.none)
                }
            }
        default:
            throw .unknownMethod("no method \(call.member) in \(Self.collectionInterface)")
        }
    }

    /// The spec's CreateItem. With `replace`, the item of the collection
    /// whose lookup attributes are exactly the ones given gets the new
    /// value, label and type (one that also names `keychainfs:identifier`
    /// must be that item; with no attribute of its program's, none is
    /// replaced: an empty set would otherwise pick any item). Otherwise a
    /// new item, named after its label (`keychainfs:identifier` names it
    /// exactly), made unique with " (2)", " (3)"... The class is the one
    /// `keychainfs:accessible` names, else the device's access mode.
    /// The new item belongs to the caller (``ItemDetails/owner``); an item
    /// it replaces keeps its owner, who must be the caller or allow it.
    private func createItem(_ call: BusCall, in group: String,
                            then answer: @escaping (BusCall, String) throws(BusError) -> Void) throws(BusError) {
        let properties = try call.arguments.properties()
        let (value, contentType) = try secret(from: call)
        let replace = try call.arguments.bool()
        var label = "", attributes: [String: String] = [:]
        if case .string(let given)? = properties[Self.itemLabelProperty] { label = given }
        if case .attributes(let given)? = properties[Self.itemAttributesProperty] { attributes = given }
        var protectionClass: ProtectionClass?
        if let name = attributes[Self.accessibleAttribute] {
            guard let named = ProtectionClass(name: name) else {
                throw .invalidArguments("\(Self.accessibleAttribute) names no protection class: \(name)")
            }
            protectionClass = named
        }
        let stored = attributes.filter { !$0.key.hasPrefix(Self.attributePrefix) }
        var details = ItemDetails(label: label, contentType: contentType.isEmpty ? ItemDetails.defaultContentType : contentType,
                                  attributes: stored)
        // A process that cannot be taken for its program owns nothing.
        if let caller = callerIdentity(call), caller.distrust == nil { details.owner = ProgramClaim(caller) }
        try validated(details)
        let named = attributes[Self.identifierAttribute]
        if let named, (try? ItemLimits.validate(name: named)) == nil {
            throw .invalidArguments("\(Self.identifierAttribute) is no valid item name: 1 to 255 bytes, no '/'")
        }
        if replace, !stored.isEmpty || named != nil,
           let existing = try items(of: group, for: call).first(where: { item in
               (item.details?.attributes ?? [:]) == stored && item.attributes.matches(attributes.filter { $0.key != Self.accessibleAttribute })
           }) {
            let written = details
            return try withConsent(call, to: "replace", items: [(group, existing.identifier)]) { [self] call throws(BusError) in
                let reply = perform(.set(group: group, identifier: existing.identifier, value: value, protectionClass: protectionClass,
                                         details: written), for: call)
                _ = try self.value(of: reply, at: existing.path, expectingValue: false)
                try answer(call, existing.path)
            }
        }
        for identifier in ItemLimits.candidateNames(named ?? ItemLimits.name(from: label) ?? "item") {
            let reply = perform(.set(group: group, identifier: identifier, value: value, protectionClass: protectionClass,
                                     condition: .ifAbsent, details: details), for: call)
            if case .keychainError(.duplicateItem, _) = reply, named == nil { continue }
            let path = ObjectPaths.item(group, identifier)
            _ = try self.value(of: reply, at: path, expectingValue: false)
            return try answer(call, path)
        }
        throw .failed("too many items are named after the label \(label)")
    }

    // MARK: org.freedesktop.Secret.Item

    private func answerItem(_ call: BusCall, group: String, identifier: String) throws(BusError) {
        guard call.interface == Self.itemInterface || call.interface.isEmpty else {
            throw .unknownMethod("no interface \(call.interface) at \(call.path)")
        }
        switch call.member {
        case "GetSecret":
            try requireSignature(call, "o")
            let session = try self.session(try call.arguments.objectPath(), of: call)
            try withConsent(call, to: "read the secret of", items: [(group, identifier)]) { [self] call throws(BusError) in
                let value = try value(of: perform(.get(group: group, identifier: identifier), for: call), at: call.path)
                let contentType = contentType(of: group, identifier, for: call)
                try bus.reply(to: call.message, sensitive: true) { (reply) throws(BusError) in
                    try session.append(value, contentType: contentType, to: reply)
                }
            }
        case "SetSecret":
            try requireSignature(call, "(oayays)")
            let (value, contentType) = try secret(from: call)
            // A new content type is kept with the item's details (made for
            // an item that had none); otherwise the item keeps its own.
            let current = try itemDetails(group, identifier, for: call)
            var details: ItemDetails?
            if contentType != current?.contentType ?? ItemDetails.defaultContentType {
                details = current ?? ItemDetails(label: identifier, attributes: [:])
                details?.contentType = contentType
                details?.modified = 0
                try validated(details)
            }
            let written = details
            try withConsent(call, to: "change the secret of", items: [(group, identifier)]) { [self] call throws(BusError) in
                let reply = perform(.set(group: group, identifier: identifier, value: value, condition: .ifPresent, details: written),
                                    for: call)
                _ = try self.value(of: reply, at: call.path, expectingValue: false)
                try bus.reply(to: call.message) { _ throws(BusError) in }
            }
        case "Delete":
            try requireSignature(call, "")
            try withConsent(call, to: "delete", items: [(group, identifier)]) { [self] call throws(BusError) in
                _ = try value(of: perform(.remove(group: group, identifier: identifier), for: call), at: call.path, expectingValue: false)
                try bus.reply(to: call.message) { (reply) throws(BusError) in try reply.objectPath(ObjectPaths.none) }
            }
        default:
            throw .unknownMethod("no method \(call.member) in \(Self.itemInterface)")
        }
    }

    // MARK: org.freedesktop.Secret.Session

    private func answerSession(_ call: BusCall, id: String) throws(BusError) {
        guard call.member == "Close", call.interface == Self.sessionInterface || call.interface.isEmpty else {
            throw .unknownMethod("no method \(call.member) in \(Self.sessionInterface)")
        }
        try requireSignature(call, "")
        _ = try session(call.path, of: call)
        sessions[call.path] = nil
        try bus.reply(to: call.message) { _ throws(BusError) in }
    }

    /// The next argument of `call`, a secret struct, opened in its
    /// session (the caller's own), and its content type.
    private func secret(from call: BusCall) throws(BusError) -> (value: SecureBytes, contentType: String) {
        let secret = try call.arguments.secretStruct()
        let session = try self.session(secret.session, of: call)
        return (try session.open(secret.sealed, parameters: secret.parameters), secret.contentType)
    }

    /// The open session at `path`, which must be the caller's own.
    private func session(_ path: String, of call: BusCall) throws(BusError) -> TransferSession {
        guard let session = sessions[path], session.owner == call.sender else {
            throw .noSession("no open session \(path) of this connection")
        }
        return session
    }

    // MARK: org.freedesktop.Secret.Prompt

    private func answerPrompt(_ call: BusCall) throws(BusError) {
        guard call.interface == Self.promptInterface || call.interface.isEmpty else {
            throw .unknownMethod("no interface \(call.interface) at \(call.path)")
        }
        guard let prompt = prompts[call.path], prompt.owner == call.sender else {
            throw .noSuchObject("no prompt at \(call.path) for this connection")
        }
        switch call.member {
        case "Prompt":
            try requireSignature(call, "s")
            _ = try call.arguments.string()  // the window to place it over: pinentry places itself
            guard let program = Pinentry.program() else {
                throw .failed("no pinentry program: install pinentry-curses or pinentry-gnome3, or set KEYCHAINFS_PINENTRY")
            }
            guard prompt.start() else { throw .failed("the prompt is showing already") }
            let sender = bus.senderProcess(of: call.message)
            let path = call.path
            try bus.reply(to: call.message) { _ throws(BusError) in }
            let started = Threads.start { [self] in
                let unlocked = prompt.run(program: program, program: sender?.pid) { passcode in
                    store.perform(.unlock(passcode: passcode), program: { nil },
                                  subject: { sender.map { ProgramIdentities.subject(thread: $0.pid, uid: $0.uid) } },
                                  audit: .always)
                }
                bus.perform { [self] in completePrompt(path, dismissed: !unlocked, objects: unlocked ? prompt.objects : []) }
            }
            if started == nil { completePrompt(path, dismissed: true, objects: []) }
        case "Dismiss":
            try requireSignature(call, "")
            try bus.reply(to: call.message) { _ throws(BusError) in }
            if prompt.cancel() == false { completePrompt(call.path, dismissed: true, objects: []) }
        default:
            throw .unknownMethod("no method \(call.member) in \(Self.promptInterface)")
        }
    }

    /// The spec's Completed(dismissed, result): the objects unlocked.
    private func completePrompt(_ path: String, dismissed: Bool, objects: [String]) {
        guard prompts.removeValue(forKey: path) != nil else { return }
        bus.emit(path: path, interface: Self.promptInterface, member: "Completed") { (signal) throws(BusError) in
            try signal.bool(dismissed)
            try signal.variant(.objectPaths(objects))
        }
    }

    // MARK: Properties

    private func answerProperties(_ call: BusCall, object: ObjectPaths.Object) throws(BusError) {
        switch call.member {
        case "Get":
            try requireSignature(call, "ss")
            let interface = try call.arguments.string(), name = try call.arguments.string()
            guard let value = try properties(of: object, interface: interface, caller: call)[name] else {
                throw .invalidArguments("no property \(name) in \(interface)")
            }
            try bus.reply(to: call.message) { (reply) throws(BusError) in try reply.variant(value) }
        case "GetAll":
            try requireSignature(call, "s")
            let all = try properties(of: object, interface: try call.arguments.string(), caller: call)
            try bus.reply(to: call.message) { (reply) throws(BusError) in
                try reply.open("a", "{sv}")
                for (name, value) in all.sorted(by: { $0.key < $1.key }) {
                    try reply.open("e", "sv")
                    try reply.string(name)
                    try reply.variant(value)
                    try reply.close()
                }
                try reply.close()
            }
        case "Set":
            try requireSignature(call, "ssv")
            let interface = try call.arguments.string(), name = try call.arguments.string()
            guard case .item(let group, let identifier) = object, interface == Self.itemInterface,
                  name == "Label" || name == "Attributes" else {
                throw .notSupported("only an item's Label and Attributes can be set (a collection's label is its group's name)")
            }
            var details = try itemDetails(group, identifier, for: call) ?? ItemDetails(label: identifier, attributes: [:])
            let type = name == "Label" ? "s" : "a{ss}"
            guard try call.arguments.peek()?.contents == type else { throw .invalidArguments("\(name) is of type \(type)") }
            try call.arguments.enter("v", type)
            if name == "Label" {
                details.label = try call.arguments.string()
            } else {
                details.attributes = try call.arguments.stringDictionary(limit: ItemDetails.maximumAttributes,
                                                                         textLimit: ItemDetails.maximumText)
                    .filter { !$0.key.hasPrefix(Self.attributePrefix) }
            }
            try call.arguments.exit()
            details.modified = 0
            try validated(details)
            let written = details
            try withConsent(call, to: "change the \(name == "Label" ? "label" : "attributes") of", items: [(group, identifier)]) {
                [self] call throws(BusError) in
                let reply = perform(.setDetails(group: group, identifier: identifier, details: written), for: call)
                _ = try value(of: reply, at: call.path, expectingValue: false)
                try bus.reply(to: call.message) { _ throws(BusError) in }
            }
        default:
            throw .unknownMethod("no method \(call.member) in \(Self.propertiesInterface)")
        }
    }

    private func properties(of object: ObjectPaths.Object, interface: String,
                            caller call: BusCall) throws(BusError) -> [String: PropertyValue] {
        switch object {
        case .service where interface == Self.serviceInterface:
            return ["Collections": .objectPaths(try groups(for: call).map(ObjectPaths.collection))]
        case .collection(let group) where interface == Self.collectionInterface:
            return try collectionProperties(group, caller: call)
        case .alias(let alias) where interface == Self.collectionInterface:
            guard let group = Self.group(ofAlias: alias) else { throw .noSuchObject("no alias \(alias)") }
            return try collectionProperties(group, caller: call)
        case .item(let group, let identifier) where interface == Self.itemInterface:
            let reply = perform(.info(group: group, identifier: identifier), for: call, audit: .failures)
            guard case .ok(let fields) = reply, let className = fields.first, let protectionClass = ProtectionClass(name: className) else {
                _ = try value(of: reply, at: ObjectPaths.item(group, identifier))
                throw .failed("unexpected reply from the device")
            }
            let item = ListedItem(group: group, identifier: identifier, protectionClass: protectionClass,
                                  details: try itemDetails(group, identifier, for: call))
            return ["Locked": .bool(!store.isAvailable(protectionClass)), "Attributes": .attributes(item.attributes),
                    "Label": .string(item.label), "Type": .string(item.contentType),
                    "Created": .uint64(item.details?.created ?? 0), "Modified": .uint64(item.details?.modified ?? 0)]
        default:
            return [:]
        }
    }

    private func collectionProperties(_ group: String, caller call: BusCall) throws(BusError) -> [String: PropertyValue] {
        // The listing below refuses a group the caller may not use, or that is gone.
        let items = try self.items(of: group, for: call).map(\.path)
        return ["Items": .objectPaths(items), "Label": .string(group), "Locked": .bool(store.isLocked),
                "Created": .uint64(0), "Modified": .uint64(0)]
    }

    // MARK: The keychain

    /// The items that carry every attribute asked for, unlocked (their key
    /// is there) and locked apart: a locked item is found, never "absent".
    private func search(_ attributes: [String: String], in onlyGroup: String?,
                        caller call: BusCall) throws(BusError) -> (unlocked: [String], locked: [String]) {
        var found: (unlocked: [String], locked: [String]) = ([], [])
        let groups: [String]
        if let onlyGroup { groups = [onlyGroup] } else { groups = try self.groups(for: call) }
        for group in groups {
            if let wanted = attributes[Self.groupAttribute], wanted != group { continue }
            // A group whose policy does not admit the caller shows nothing.
            guard let items = try? self.items(of: group, for: call) else { continue }
            for item in items where item.attributes.matches(attributes) {
                if store.isAvailable(item.protectionClass) { found.unlocked.append(item.path) } else { found.locked.append(item.path) }
            }
        }
        return found
    }

    private func groups(for call: BusCall) throws(BusError) -> [String] {
        guard case .ok(let groups) = perform(.list(group: nil), for: call, audit: .failures) else {
            throw .failed("cannot list the collections")
        }
        return groups
    }

    /// The items of a group with their classes and details.
    private func items(of group: String, for call: BusCall) throws(BusError) -> [ListedItem] {
        let fields = try listing(of: group, for: call)
        var details: [String: ItemDetails] = [:]
        if case .ok(let detailFields) = perform(.details(group: group, identifier: nil), for: call, audit: .failures),
           let found = try? PasswordManager.details(fromFields: detailFields) {
            for (identifier, itemDetails) in found { details[identifier] = itemDetails }
        }
        return stride(from: 0, to: fields.count - fields.count % 3, by: 3).compactMap { index in
            ProtectionClass(name: fields[index + 1]).map {
                ListedItem(group: group, identifier: fields[index], protectionClass: $0, details: details[fields[index]])
            }
        }
    }

    /// A group's listing as the device answers it: (identifier, class, size) fields.
    private func listing(of group: String, for call: BusCall) throws(BusError) -> [String] {
        switch perform(.list(group: group), for: call, audit: .failures) {
        case .ok(let fields):
            return fields
        case .keychainError(.missingEntitlement, _):
            throw .accessDenied("this program is not entitled to the access group \(group)")
        case .keychainError(.itemNotFound, _):
            throw .noSuchObject("no collection \(group)")
        default:
            throw .failed("cannot list the collection \(group)")
        }
    }

    /// The details of one item (nil: it has none).
    private func itemDetails(_ group: String, _ identifier: String, for call: BusCall) throws(BusError) -> ItemDetails? {
        let reply = perform(.details(group: group, identifier: identifier), for: call, audit: .failures)
        guard case .ok(let fields) = reply else {
            _ = try value(of: reply, at: ObjectPaths.item(group, identifier))
            throw .failed("unexpected reply from the device")
        }
        guard let found = try? PasswordManager.details(fromFields: fields) else { throw .failed("unexpected reply from the device") }
        return found.first?.details
    }

    /// The content type a secret is sent with: the one kept with the
    /// item, else `text/plain`.
    private func contentType(of group: String, _ identifier: String, for call: BusCall) -> String {
        ((try? itemDetails(group, identifier, for: call)) ?? nil)?.contentType ?? ItemDetails.defaultContentType
    }

    private func validated(_ details: ItemDetails?) throws(BusError) {
        guard (try? details?.validate()) != nil else {
            throw .invalidArguments("at most \(ItemDetails.maximumAttributes) attributes; names of 1-\(ItemDetails.maximumAttributeName) bytes; values, label and content type of at most \(ItemDetails.maximumText) bytes; \(ItemDetails.maximumEncodedSize) bytes in all")
        }
    }

    private func requireGroup(_ group: String, for call: BusCall) throws(BusError) {
        _ = try listing(of: group, for: call)
    }

    /// The value of a `get` reply, or the error the reply means on the bus.
    private func value(of reply: DeviceReply, at path: String, expectingValue: Bool = true) throws(BusError) -> SecureBytes {
        switch reply {
        case .value(let value, _): return value
        case .ok where !expectingValue: return try! SecureBytes([])
        case .keychainError(.interactionNotAllowed, _): throw .isLocked("\(path) is locked")
        case .keychainError(.itemNotFound, _): throw .noSuchObject("no item at \(path)")
        case .keychainError(.missingEntitlement, _): throw .accessDenied("this program is not entitled to the item's access group")
        case .keychainError(_, let message), .systemError(_, let message): throw .failed(message)
        default: throw .failed("unexpected reply from the device")
        }
    }

    /// Carries out a request of the program behind the call's sender.
    func perform(_ request: DeviceRequest, for call: BusCall, audit: AuditPolicy = .always) -> DeviceReply {
        let sender = bus.senderProcess(of: call.message)
        // The bus daemon's pid of the sender, checked against a pidfd: the
        // process must still be the one that sent the call.
        return store.perform(request, program: { [self] in callerIdentity(call) },
                             subject: { sender.map { ProgramIdentities.subject(thread: $0.pid, uid: $0.uid) } }, audit: audit)
    }
}

extension SecretServiceProvider {
    /// Why the program the bus daemon names may not be the one that sent
    /// a call of `sender` (nil: nothing says so). The daemon names the
    /// process that connected, which is not always the one asking: a child
    /// forked after connecting asks on the same socket once its parent
    /// exec'd a granted program (issue 29). So the named process must hold
    /// its bus connections alone, and run the program it ran at its first
    /// policed request on this connection.
    ///
    /// A connection found held by its process alone is not examined again
    /// while it lives (the scan of every process's descriptors was most of
    /// a policed lookup's cost): from then on only that process, running
    /// the same program, can have made another process share it, by
    /// forking or passing its descriptor, as it could pass any file it opened.
    func connectionDoubt(_ sender: String, pid: pid_t, _ identity: ProgramIdentity) -> String? {
        if let first = firstIdentities[sender] {
            if first.identity.executable != identity.executable || first.identity.digest != identity.digest {
                return "its program changed since its first request on this connection (it was \(first.identity.executable))"
            }
            if first.heldAlone { return nil }
        }
        guard let address = bus.peerAddress else { return "its bus connection cannot be examined" }
        let sharing = SocketHolders.sharing(of: pid, connectedTo: address)
        firstIdentities[sender] = (firstIdentities[sender]?.identity ?? identity, sharing == nil)
        return sharing
    }
}

/// An item as searches and properties see it: its name, class and details.
struct ListedItem {
    let group: String
    let identifier: String
    let protectionClass: ProtectionClass
    let details: ItemDetails?

    var path: String { ObjectPaths.item(group, identifier) }
    /// The lookup attributes it answers to: those its program stored, and
    /// its group, identifier and class.
    var attributes: [String: String] {
        var all = details?.attributes ?? [:]
        all[SecretServiceProvider.groupAttribute] = group
        all[SecretServiceProvider.identifierAttribute] = identifier
        all[SecretServiceProvider.accessibleAttribute] = protectionClass.name
        return all
    }
    /// Its label: the one stored, else its identifier.
    var label: String { details?.label ?? identifier }
    var contentType: String { details?.contentType ?? ItemDetails.defaultContentType }
}

private extension Dictionary where Key == String, Value == String {
    /// Whether every pair of `wanted` is here.
    func matches(_ wanted: [String: String]) -> Bool {
        wanted.allSatisfy { self[$0.key] == $0.value }
    }
}
