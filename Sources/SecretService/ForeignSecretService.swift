import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// Another Secret Service provider on the session bus (gnome-keyring,
/// KWallet, KeePassXC), read as a client does: what `keychainfs import
/// secret-service` brings over. Secrets cross the bus in a DH session
/// (`dh-ietf1024-sha256-aes128-cbc-pkcs7`), as libsecret's do, and are
/// opened into secret memory.
public final class ForeignSecretService {
    /// One of its collections.
    public struct Collection: Sendable {
        public let path: String
        /// Its label, or the last element of its path for one without
        /// (gnome-keyring's in-memory `session` collection).
        public let label: String
        /// Whether the alias `default` names it (gnome-keyring's login keyring).
        public let isDefault: Bool
        public let isLocked: Bool
    }

    /// One of its items, with everything but the secret.
    public struct Item: Sendable {
        public let path: String
        public let details: ItemDetails
    }

    private let bus: BusConnection
    private let session: TransferSession
    private static let service = SecretServiceProvider.busName
    private static let root = ObjectPaths.service
    private static let properties = SecretServiceProvider.propertiesInterface

    /// Connects to the provider that owns `org.freedesktop.secrets` on the
    /// session bus. Fails when there is none, or when it is this program
    /// (keychainfs serving the bus: nothing to import).
    public init() throws(BusError) {
        bus = try BusConnection()
        guard let owner = bus.ownerProcess(of: Self.service) else {
            throw .failed("no program provides \(Self.service) on this session bus (is gnome-keyring running?)")
        }
        if let theirs = Self.executable(of: owner), let ours = Self.executable(of: getpid()), theirs == ours {
            throw .failed("the Secret Service on this bus is keychainfs itself: nothing to import")
        }
        let (exponent, publicKey) = try TransferSession.clientKeyPair()
        let opened = try bus.call(Self.service, Self.root, SecretServiceProvider.serviceInterface, "OpenSession") {
            (call) throws(BusError) in
            try call.string(TransferSession.diffieHellman)
            try call.open("v", "ay")
            try call.bytes(publicKey)
            try call.close()
        }
        let output = opened.arguments
        try output.enter("v", "ay")
        let peer = try output.bytes()
        try output.exit()
        session = try TransferSession.client(path: try output.objectPath(), exponent: exponent, peer: peer)
    }

    /// The real path of a process's executable.
    private static func executable(of pid: pid_t) -> String? {
        guard let resolved = realpath("/proc/\(pid)/exe", nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    /// Its collections, the default one first.
    public func collections() throws(BusError) -> [Collection] {
        let aliased = try bus.call(Self.service, Self.root, SecretServiceProvider.serviceInterface, "ReadAlias") {
            (call) throws(BusError) in
            try call.string("default")
        }
        let defaultPath = try aliased.arguments.objectPath()
        guard
            case .objectPaths(let paths)? = try properties(of: Self.root, SecretServiceProvider.serviceInterface)[
                "Collections"]
        else {
            throw .failed("the provider lists no Collections")
        }
        var collections: [Collection] = []
        for path in paths {
            let properties = try properties(of: path, SecretServiceProvider.collectionInterface)
            guard case .string(let label)? = properties["Label"], case .bool(let locked)? = properties["Locked"] else {
                throw .failed("the collection \(path) has no Label or Locked")
            }
            let name = label.isEmpty ? String(path.split(separator: "/").last.flatMap(ObjectPaths.name) ?? path) : label
            collections.append(Collection(path: path, label: name, isDefault: path == defaultPath, isLocked: locked))
        }
        return collections.sorted { $0.isDefault && !$1.isDefault }
    }

    /// The items of an unlocked collection, with their details; an item
    /// whose details are past keychainfs's bounds is in `refused`.
    public func items(of collection: Collection) throws(BusError) -> (items: [Item], refused: [String]) {
        guard
            case .objectPaths(let paths)? = try properties(
                of: collection.path, SecretServiceProvider.collectionInterface)["Items"]
        else {
            throw .failed("the collection \(collection.label) lists no Items")
        }
        var items: [Item] = [], refused: [String] = []
        for path in paths {
            // Past the bounds: read whole, refused by validate below.
            let properties = try properties(of: path, SecretServiceProvider.itemInterface, attributeLimit: 4096)
            var details = ItemDetails(label: "", attributes: [:])
            if case .string(let label)? = properties["Label"] { details.label = label }
            if case .attributes(let attributes)? = properties["Attributes"] { details.attributes = attributes }
            if case .uint64(let created)? = properties["Created"] { details.created = created }
            if case .uint64(let modified)? = properties["Modified"] { details.modified = modified }
            if (try? details.validate()) == nil {
                refused.append(details.label.isEmpty ? path : details.label)
                continue
            }
            items.append(Item(path: path, details: details))
        }
        return (items, refused)
    }

    /// An item's secret and its content type.
    public func secret(of item: Item) throws(BusError) -> (value: SecureBytes, contentType: String) {
        let reply = try bus.call(Self.service, item.path, SecretServiceProvider.itemInterface, "GetSecret") {
            (call) throws(BusError) in
            try call.objectPath(session.path)
        }
        let secret = try reply.arguments.secretStruct()
        return (try session.open(secret.sealed, parameters: secret.parameters), secret.contentType)
    }

    private func properties(
        of path: String, _ interface: String,
        attributeLimit: Int = ItemDetails.maximumAttributes
    ) throws(BusError) -> [String: PropertyValue] {
        let reply = try bus.call(Self.service, path, Self.properties, "GetAll") { (call) throws(BusError) in
            try call.string(interface)
        }
        return try reply.arguments.properties(attributeLimit: attributeLimit)
    }
}
