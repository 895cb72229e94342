import KeychainCore
import KeychainProtocol
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
    /// The lookup attributes every item answers to (``ItemAttribute``): its group and identifier.
    static let groupAttribute = ItemAttribute.group.busName ?? ""
    static let identifierAttribute = ItemAttribute.identifier.busName ?? ""
    /// The attribute by which CreateItem asks for a protection class (a
    /// class's name); the device's access mode otherwise.
    static let accessibleAttribute = ItemAttribute.accessible.busName ?? ""
    /// What every `keychainfs:` attribute starts with: ours to answer, never stored.
    static let attributePrefix = "keychainfs:"
    static let itemLabelProperty = "org.freedesktop.Secret.Item.Label"
    static let itemAttributesProperty = "org.freedesktop.Secret.Item.Attributes"
    static let collectionLabelProperty = "org.freedesktop.Secret.Collection.Label"

    let store: SecretStore
    let bus: BusConnection
    var sessions: [String: TransferSession] = [:]
    var nextSession = 1
    private var observer: Int?
    /// The items clients have been told of (by signals or a listing at
    /// start): a `written` event of one of them is ItemChanged, of another
    /// ItemCreated (the device's events do not tell the two apart).
    var knownItems: Set<String> = []
    var prompts: [String: UnlockPrompt] = [:]
    /// Callers waiting for the person's answer to an owner question.
    let waitingCallers = WaitingCallers()
    /// libsecret's `session` collection, in memory: gone when the device stops.
    let sessionCollection = SessionCollection()
    /// The program behind each connection at its first policed request,
    /// and whether its process was then found to hold it alone (bus thread only).
    var firstIdentities: [String: (identity: ProgramIdentity, heldAlone: Bool)] = [:]
    var nextPrompt = 1

    /// The bus it serves (nil: the one `$DBUS_SESSION_BUS_ADDRESS` named at its start).
    public let address: String?

    /// Connects to the session bus at `address` (nil: the one
    /// `$DBUS_SESSION_BUS_ADDRESS` names), owns `org.freedesktop.secrets`
    /// (with `replace`, taking it over from another provider) and serves it.
    public init(store: SecretStore, replace: Bool, address: String? = nil) throws(BusError) {
        self.store = store
        self.address = address
        bus = try BusConnection(address: address)
        try serveObjects()
        // A session ends with the connection that opened it.
        try bus.watch("type='signal',sender='org.freedesktop.DBus',member='NameOwnerChanged'") {
            [unowned self] message in
            let arguments = BusMessageReader(message: message)
            guard let name = try? arguments.string(), (try? arguments.string()) != nil,
                let owner = try? arguments.string(),
                owner.isEmpty
            else { return }
            sessions = sessions.filter { $0.value.owner != name }
            firstIdentities[name] = nil
            waitingCallers.departed(name)
            // A client gone during a prompt: its pinentry goes too.
            for (path, prompt) in prompts where prompt.owner == name {
                prompt.cancel()
                prompts[path] = nil
            }
        }
        // The name is never given up on request (BusConnection.requestName);
        // lost all the same (the bus daemon's word), it is said where a
        // person looks: the log, the journal, and `isServing`.
        try bus.watch("type='signal',sender='org.freedesktop.DBus',member='NameLost',arg0='\(Self.busName)'") {
            [unowned self] _ in
            nameLost.store(true, ordering: .sequentiallyConsistent)
            let sentence =
                "lost \(Self.busName) on the session bus to another program: no longer serving the Secret Service"
            store.setSecretServiceState("lost: " + sentence)
            Diagnostics.log(sentence)
            SystemdNotify.send("STATUS=" + sentence)
        }
        try bus.requestName(Self.busName, replace: replace)
        try startServing()
    }

    /// Serves the other end of `peer` alone, with no bus daemon: no name
    /// to own, nobody else to watch leave. The unit tests run the handlers
    /// in their own process over a socketpair this way (docs/CONTRIBUTING.md,
    /// "Where a new piece goes").
    init(store: SecretStore, peer: consuming FileDescriptor) throws(BusError) {
        self.store = store
        address = nil
        bus = try BusConnection(peer: peer, serving: true)
        try serveObjects()
        try startServing()
    }

    private func serveObjects() throws(BusError) {
        try bus.serve(prefix: ObjectPaths.service) { [unowned self] message in handle(message) }
        try bus.serve(prefix: Self.portalPath) { [unowned self] message in handle(message) }
        // Every other path, as gnome-keyring's GDBus answers it (below).
        try bus.serve(prefix: "/") { [unowned self] message in handle(message) }
        for group in store.itemNames() {
            for identifier in group.value { knownItems.insert(ObjectPaths.item(group.key, identifier)) }
        }
    }

    private func startServing() throws(BusError) {
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
    func signal(_ event: DeviceEvent) {
        let change: ItemChange
        switch event {
        case .locked: return lockStateChanged(locked: true)
        case .unlocked: return lockStateChanged(locked: false)
        case .willLock, .entitlementsChanged: return
        case .changed(let changed): change = changed
        }
        switch change {
        case .written(let group, let identifier):
            itemWritten(group, identifier)
        case .removed(let group, let identifier):
            itemRemoved(group, identifier)
        case .renamed(let group, let from, let to):
            itemRemoved(group, from)
            itemWritten(group, to)
        case .groupCreated(let group):
            emit(
                Self.serviceInterface, "CollectionCreated", at: ObjectPaths.service,
                naming: ObjectPaths.collection(group))
        case .groupRemoved(let group):
            emit(
                Self.serviceInterface, "CollectionDeleted", at: ObjectPaths.service,
                naming: ObjectPaths.collection(group))
        }
    }

    func itemWritten(_ group: String, _ identifier: String) {
        let path = ObjectPaths.item(group, identifier)
        let created = knownItems.insert(path).inserted
        emit(
            Self.collectionInterface, created ? "ItemCreated" : "ItemChanged", at: ObjectPaths.collection(group),
            naming: path)
        if created { collectionChanged(group) }
    }

    func itemRemoved(_ group: String, _ identifier: String) {
        let path = ObjectPaths.item(group, identifier)
        knownItems.remove(path)
        emit(Self.collectionInterface, "ItemDeleted", at: ObjectPaths.collection(group), naming: path)
        collectionChanged(group)
    }

    /// The device locked or unlocked: every collection's `Locked` changed,
    /// said as gnome-keyring says it (the spec's signals name no lock
    /// change): `PropertiesChanged` of the collection's `Locked`, and the
    /// service's `CollectionChanged`. A client that shows a lock (seahorse,
    /// a panel applet) follows the session's lock through these.
    func lockStateChanged(locked: Bool) {
        for group in store.itemNames().keys.sorted() {
            let collection = ObjectPaths.collection(group)
            bus.emit(path: collection, interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged") {
                (signal) throws(BusError) in
                try signal.string(Self.collectionInterface)
                try signal.open("a", "{sv}")
                try signal.open("e", "sv")
                try signal.string("Locked")
                try signal.variant(.bool(locked))
                try signal.close()
                try signal.close()
                try signal.open("a", "s")
                try signal.close()
            }
            emit(Self.serviceInterface, "CollectionChanged", at: ObjectPaths.service, naming: collection)
        }
    }

    /// Its `Items` changed.
    func collectionChanged(_ group: String) {
        let collection = ObjectPaths.collection(group)
        emit(Self.serviceInterface, "CollectionChanged", at: ObjectPaths.service, naming: collection)
    }

    func emit(_ interface: String, _ member: String, at path: String, naming object: String) {
        bus.emit(path: path, interface: interface, member: member) { (signal) throws(BusError) in
            try signal.objectPath(object)
        }
    }

    // MARK: Dispatch

    private func handle(_ message: OpaquePointer) -> Bool {
        guard let call = BusCall(message) else { return false }
        // Introspection and peer calls are sd-bus's own.
        guard call.interface != "org.freedesktop.DBus.Introspectable", call.interface != "org.freedesktop.DBus.Peer"
        else {
            return false
        }
        send(
            Result { () throws(BusError) in
                guard let object = ObjectPaths.object(at: call.path) else {
                    guard
                        call.path == ObjectPaths.service || call.path.hasPrefix(ObjectPaths.service + "/")
                            || call.path.hasPrefix(Self.portalPath)
                    else {
                        // A path outside ours: GDBus's UnknownMethod, which clients take for "no such item"
                        // (secretstorage 3.3, Debian 12's, knew no UnknownObject, sd-bus's answer).
                        throw BusError.unknownMethod(
                            "No such interface '\(call.interface)' on object at path \(call.path)")
                    }
                    throw BusError.noSuchObject("no object at \(call.path)")
                }
                return try dispatch(call, to: object)
            }, to: call)
        return true
    }

    /// The one place a call's answer goes to the bus: its reply, written as
    /// its type says, or the error; nothing yet while the person is asked.
    func send(_ answer: Result<MethodAnswer, BusError>, to call: BusCall) {
        switch answer {
        case .success(.waitingForConsent):
            return
        case .success(.reply(let reply)):
            do throws(BusError) {
                try bus.reply(to: call.message, sensitive: reply.isSensitive) { (message) throws(BusError) in
                    try reply.write(to: message)
                }
            } catch {
                bus.reply(to: call.message, error: error)
            }
        case .failure(let error):
            bus.reply(to: call.message, error: error)
        }
    }

    /// The group an alias names: `default` and `login` (gnome-keyring's
    /// login keyring, which programs ask for by that name) name `default`.
    static func group(ofAlias alias: String) -> String? {
        if alias == SessionCollection.group { return SessionCollection.group }
        return alias == "default" || alias == "login" ? ItemLimits.defaultGroup : nil
    }

    func requireSignature(_ call: BusCall, _ signature: String) throws(BusError) {
        guard call.signature == signature else {
            throw .invalidArguments("\(call.member) takes (\(signature)), not (\(call.signature))")
        }
    }

    // MARK: The keychain

    /// The items that carry every attribute asked for, unlocked (their key
    /// is there) and locked apart: a locked item is found, never "absent".
    /// The caller's own items come first, then those whose list it is on,
    /// then the rest (docs/SECRET-SERVICE.md, "Whose an item is"): libsecret's
    /// lookup reads the first match, so an item another program planted with
    /// the caller's attributes, in any collection, never answers the lookup of
    /// a program that owns one. A search of every collection by a program that
    /// a policed group admits looks in the policed groups that admit it only,
    /// as an iOS app's query sees its access groups only: an item another
    /// program planted with its attributes in an open collection never answers
    /// it. It reaches another collection by naming it (Collection.SearchItems,
    /// or `keychainfs:group`).
    func search(
        _ attributes: [String: String], in onlyGroup: String?,
        caller call: BusCall
    ) throws(BusError) -> (unlocked: [String], locked: [String]) {
        var matches: [ListedItem] = []
        let groups: [String]
        if let onlyGroup { groups = [onlyGroup] } else { groups = try self.groups(for: call) }
        for group in groups {
            if let wanted = attributes[Self.groupAttribute], wanted != group { continue }
            // A group whose policy does not admit the caller shows nothing.
            guard let items = try? self.items(of: group, for: call) else { continue }
            matches += items.filter { $0.attributes.matches(attributes) }
        }
        if onlyGroup == nil, attributes[Self.groupAttribute] == nil {
            // By the policies, not by the groups listed: a granted program
            // whose group holds nothing yet (not even made) looks nowhere else.
            let admitting = store.policedGroups { [self] in callerIdentity(call) }
            if !admitting.isEmpty { matches.removeAll { !admitting.contains($0.group) } }
        }
        if matches.contains(where: { $0.details?.owner != nil }) {
            // Only the order depends on it (the secret still needs the owner
            // rule), so the caller's executable is enough: no scan of who
            // holds its connection.
            let caller = bus.senderProcess(of: call.message).flatMap {
                ProgramIdentities.of(thread: $0.pid, uid: $0.uid)
            }
            let rank = { (item: ListedItem) -> Int in
                guard let caller, let details = item.details, let owner = details.owner else { return 2 }
                if owner.admits(caller) { return 0 }
                return details.allowed.contains { $0.admits(caller) } ? 1 : 2
            }
            matches = matches.enumerated().sorted { (rank($0.element), $0.offset) < (rank($1.element), $1.offset) }
                .map(\.element)
        }
        var found: (unlocked: [String], locked: [String]) = ([], [])
        for item in matches {
            if store.isAvailable(item.protectionClass) {
                found.unlocked.append(item.path)
            } else {
                found.locked.append(item.path)
            }
        }
        return found
    }

    func groups(for call: BusCall) throws(BusError) -> [String] {
        let groups = try outcome(.groups, for: call, audit: .failures).answer(about: .collections).groups
        return groups.contains(SessionCollection.group) ? groups : groups + [SessionCollection.group]
    }

    /// The items of a group with their classes and details.
    func items(of group: String, for call: BusCall) throws(BusError) -> [ListedItem] {
        let listed = try listing(of: group, for: call)
        var details: [String: ItemDetails] = [:]
        if case .success(let found) = outcome(.details(group: group, identifier: nil), for: call, audit: .failures) {
            for (identifier, itemDetails) in found.entries { details[identifier] = itemDetails }
        }
        return listed.map {
            ListedItem(
                group: group, identifier: $0.identifier, protectionClass: $0.info.protectionClass,
                details: details[$0.identifier])
        }
    }

    /// A group's items as the device lists them: identifier, class, size.
    func listing(of group: String, for call: BusCall) throws(BusError) -> [ItemListing] {
        try outcome(.items(inGroup: group), for: call, audit: .failures).answer(about: .collection(group: group)).items
    }

    /// The details of one item (nil: it has none).
    func itemDetails(_ group: String, _ identifier: String, for call: BusCall) throws(BusError) -> ItemDetails? {
        try outcome(.details(group: group, identifier: identifier), for: call, audit: .failures)
            .answer(about: .item(path: ObjectPaths.item(group, identifier))).entries.first?.details
    }

    /// The content type a secret is sent with: the one kept with the
    /// item, else `text/plain`.
    func contentType(of group: String, _ identifier: String, for call: BusCall) -> String {
        ((try? itemDetails(group, identifier, for: call)) ?? nil)?.contentType ?? ItemDetails.defaultContentType
    }

    func validated(_ details: ItemDetails?) throws(BusError) {
        guard (try? details?.validate()) != nil else {
            throw .invalidArguments(
                "at most \(ItemDetails.maximumAttributes) attributes; names of 1-\(ItemDetails.maximumAttributeName) bytes; values, label and content type of at most \(ItemDetails.maximumText) bytes; \(ItemDetails.maximumEncodedSize) bytes in all"
            )
        }
    }

    func requireGroup(_ group: String, for call: BusCall) throws(BusError) {
        _ = try listing(of: group, for: call)
    }

    /// Carries out a request of the program behind the call's sender.
    func outcome<Result>(_ request: DeviceCall<Result>, for call: BusCall, audit: AuditPolicy = .always)
        -> DeviceOutcome<Result>
    {
        // The session collection answers for itself, in memory (SessionCollection).
        if case .item(let item) = request.request, let reply = sessionCollection.answer(item) {
            return request.outcome(of: reply)
        }
        let sender = bus.senderProcess(of: call.message)
        // The bus daemon's pid of the sender, checked against a pidfd: the
        // process must still be the one that sent the call.
        return store.perform(
            request, program: { [self] in callerIdentity(call) },
            subject: { sender.map { ProgramIdentities.subject(process: $0.pid, uid: $0.uid) } }, audit: audit)
    }

    /// ``outcome(_:for:audit:)``'s answer, or the error its refusal means on the bus.
    @discardableResult
    func perform<Result>(
        _ request: DeviceCall<Result>, for call: BusCall, about subject: BusErrorSubject, audit: AuditPolicy = .always
    ) throws(BusError) -> Result {
        try outcome(request, for: call, audit: audit).answer(about: subject)
    }
}

extension SecretServiceProvider {
    /// Why the program the bus daemon names may not be the one that sent
    /// a call of `sender` (nil: nothing says so). The daemon names the
    /// process that connected, which is not always the one asking: a child
    /// forked after connecting asks on the same socket once its parent
    /// exec'd a granted program (docs/SECURITY.md, "Service mode under
    /// attack"). So the named process must hold its bus connections alone, and
    /// run the program it ran at its first policed request on this connection.
    ///
    /// A connection found held by its process alone is not examined again
    /// while it lives (the scan of every process's descriptors was most of
    /// a policed lookup's cost): from then on only that process, running
    /// the same program, can have made another process share it, by
    /// forking or passing its descriptor, as it could pass any file it opened.
    func connectionDoubt(_ sender: String, pid: pid_t, _ identity: ProgramIdentity) -> String? {
        if let first = firstIdentities[sender] {
            if !first.identity.program.sameBytes(identity.program) || first.identity.digest != identity.digest {
                return
                    "its program changed since its first request on this connection (it was \(first.identity.program.encoded))"
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
    var view: ItemView {
        ItemView(group: group, identifier: identifier, protectionClass: protectionClass, details: details)
    }
    /// The lookup attributes it answers to: those its program stored, and
    /// its group, identifier and class.
    var attributes: [String: String] {
        var all = details?.attributes ?? [:]
        for attribute in ItemAttribute.allCases {
            guard let name = attribute.busName else { continue }
            all[name] = attribute.value(of: view)
        }
        return all
    }
    /// Its `Attributes` property: those its program stored, as gnome-keyring
    /// shows them, since a client hands them back to libsecret, which
    /// refuses an attribute its schema does not name (keyring's libsecret
    /// backend could delete nothing: `secret_password_clearv_sync: invalid
    /// keychainfs:accessible attribute`). An item made through a mount or
    /// the command line has none: it shows the `keychainfs:` ones, by which
    /// every item is found (``attributes``).
    var shownAttributes: [String: String] {
        guard let stored = details?.attributes, !stored.isEmpty else { return attributes }
        return stored
    }

    /// Its label: the one stored, else its identifier.
    var label: String { ItemAttribute.label.value(of: view) }
}

extension Dictionary where Key == String, Value == String {
    /// Whether every pair of `wanted` is here.
    func matches(_ wanted: [String: String]) -> Bool {
        wanted.allSatisfy { self[$0.key] == $0.value }
    }
}
