import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// `org.freedesktop.DBus.Properties` of every object.
extension SecretServiceProvider {
    /// `Get` (ss).
    func getProperty(_ call: BusCall, object: ObjectPaths.Object, interface: String, name: String)
        throws(BusError) -> PropertyReply
    {
        guard let value = try properties(of: object, interface: interface, caller: call)[name] else {
            throw .invalidArguments("no property \(name) in \(interface)")
        }
        return PropertyReply(value: value)
    }

    /// `GetAll` (s).
    func getAllProperties(_ call: BusCall, object: ObjectPaths.Object, interface: String) throws(BusError)
        -> PropertiesReply
    {
        PropertiesReply(properties: try properties(of: object, interface: interface, caller: call))
    }

    /// `Set` (ssv).
    func setProperty(
        _ call: BusCall, object: ObjectPaths.Object, interface: String, name: String, value: PropertyValue?
    ) throws(BusError) -> MethodAnswer {
        guard case .item(let group, let identifier) = object, interface == Self.itemInterface,
            name == "Label" || name == "Attributes"
        else {
            throw .notSupported(
                "only an item's Label and Attributes can be set (a collection's label is its group's name)")
        }
        var details = try itemDetails(group, identifier, for: call) ?? ItemDetails(label: identifier, attributes: [:])
        switch try PropertyValue.itemProperty(name, value) {
        case .string(let label): details.label = label
        case .attributes(let attributes):
            details.attributes = attributes.filter { !$0.key.hasPrefix(Self.attributePrefix) }
        case .bool, .uint64, .objectPaths, .bytes: throw .notSupported("only an item's Label and Attributes can be set")
        }
        details.modified = 0
        try validated(details)
        let written = details
        return try withConsent(
            call, to: "change the \(name == "Label" ? "label" : "attributes") of", items: [(group, identifier)]
        ) {
            [self] call throws(BusError) in
            try perform(
                .setDetails(group: group, identifier: identifier, details: written), for: call,
                about: .item(path: call.path))
            return EmptyReply()
        }
    }

    func properties(
        of object: ObjectPaths.Object, interface: String,
        caller call: BusCall
    ) throws(BusError) -> [String: PropertyValue] {
        switch object {
        case .service where interface == Self.serviceInterface:
            return ["Collections": .objectPaths(try groups(for: call).map(ObjectPaths.collection))]
        case .collection(let group) where interface == Self.collectionInterface:
            return try collectionProperties(group, caller: call)
        case .alias(let alias) where interface == Self.collectionInterface:
            guard let group = Self.group(ofAlias: alias) else { throw .noSuchObject("no alias \(alias)") }
            return try collectionProperties(group, caller: call)
        case .item(let group, let identifier) where interface == Self.itemInterface:
            let protectionClass = try perform(
                .info(group: group, identifier: identifier), for: call,
                about: .item(path: ObjectPaths.item(group, identifier)),
                audit: .failures
            ).protectionClass
            let item = ListedItem(
                group: group, identifier: identifier, protectionClass: protectionClass,
                details: try itemDetails(group, identifier, for: call))
            return [
                "Locked": .bool(!store.isAvailable(protectionClass)), "Attributes": .attributes(item.attributes),
                "Label": .string(item.label), "Type": .string(item.contentType),
                "Created": .uint64(item.details?.created ?? 0), "Modified": .uint64(item.details?.modified ?? 0)
            ]
        default:
            return [:]
        }
    }

    func collectionProperties(_ group: String, caller call: BusCall) throws(BusError) -> [String: PropertyValue] {
        // The listing below refuses a group the caller may not use, or that is gone.
        let items = try self.items(of: group, for: call).map(\.path)
        return [
            "Items": .objectPaths(items), "Label": .string(group),
            // The session collection never locks, as gnome-keyring's; every other is the keychain's lock.
            "Locked": .bool(group == SessionCollection.group ? false : store.isLocked),
            "Created": .uint64(0), "Modified": .uint64(0)
        ]
    }
}
