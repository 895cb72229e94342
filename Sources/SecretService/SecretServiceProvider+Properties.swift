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
        if interface == Self.collectionInterface, name == "Label" {
            return try setCollectionLabel(call, object: object, value: value)
        }
        guard case .item(let group, let identifier) = object, interface == Self.itemInterface,
            name == "Attributes" || ItemAttribute(busProperty: name)?.isWritable == true
        else {
            throw .notSupported("only an item's Label and Attributes, and a collection's Label, can be set")
        }
        let item = try listedItem(group, identifier, for: call).view
        let details: ItemDetails, verb: String
        switch try PropertyValue.itemProperty(name, value) {
        case .attributes(let attributes):
            details = item.writableDetails {
                $0.attributes = attributes.filter { !$0.key.hasPrefix(Self.attributePrefix) }
            }
            verb = "change the attributes of"
        case .string(let text):
            guard let attribute = ItemAttribute(busProperty: name), let written = attribute.writeVerb,
                case .details(let changed)? = attribute.change(written: text, to: item)
            else { throw .notSupported("only an item's Label and Attributes can be set") }
            (details, verb) = (changed, written)
        case .bool, .uint64, .objectPaths, .bytes: throw .notSupported("only an item's Label and Attributes can be set")
        }
        try validated(details)
        let written = details
        return try withConsent(call, to: verb, items: [(group, identifier)]) {
            [self] call throws(BusError) in
            try perform(
                .setDetails(group: group, identifier: identifier, details: written), for: call,
                about: .item(path: call.path))
            return EmptyReply()
        }
    }

    /// A collection's `Label` (the spec declares it read-write; seahorse and
    /// clients that restore a label after using a collection set it): kept
    /// beside its group's name, which stays what the mount and the command
    /// line call it. Who may list the collection may name it; an empty label
    /// gives it its group's name again.
    private func setCollectionLabel(_ call: BusCall, object: ObjectPaths.Object, value: PropertyValue?)
        throws(BusError) -> MethodAnswer
    {
        let group: String
        switch object {
        case .collection(let named): group = named
        case .alias(let alias):
            guard let aliased = Self.group(ofAlias: alias) else { throw .noSuchObject("no alias \(alias)") }
            group = aliased
        default: throw .noSuchObject("no collection at \(call.path)")
        }
        guard case .string(let label)? = value else { throw .invalidArguments("a collection's Label is a string") }
        // The listing refuses a group the caller may not use, or that is gone.
        _ = try items(of: group, for: call)
        if group == SessionCollection.group {
            sessionCollection.label = label.isEmpty ? nil : label
            return .reply(EmptyReply())
        }
        do throws(KeychainError) {
            try store.setCollectionLabel(label.isEmpty ? nil : label, of: group)
        } catch .param {
            throw .invalidArguments(
                "a collection's label is \(KeychainDirectory.maximumCollectionLabelBytes) bytes at most, and "
                    + "\(KeychainDirectory.maximumCollectionLabels) collections at most have one")
        } catch {
            throw .failed("the label could not be kept: \(error)")
        }
        return .reply(EmptyReply())
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
            let item = try listedItem(group, identifier, for: call)
            var properties: [String: PropertyValue] = [
                "Locked": .bool(!store.isAvailable(item.protectionClass)),
                "Attributes": .attributes(item.shownAttributes),
                "Created": .uint64(item.details?.created ?? 0), "Modified": .uint64(item.details?.modified ?? 0)
            ]
            for attribute in ItemAttribute.allCases {
                guard let name = attribute.busProperty else { continue }
                properties[name] = .string(attribute.value(of: item.view))
            }
            return properties
        default:
            return [:]
        }
    }

    /// An item as its properties are read: its class and its details.
    func listedItem(_ group: String, _ identifier: String, for call: BusCall) throws(BusError) -> ListedItem {
        let protectionClass = try perform(
            .info(group: group, identifier: identifier), for: call,
            about: .item(path: ObjectPaths.item(group, identifier)), audit: .failures
        ).protectionClass
        return ListedItem(
            group: group, identifier: identifier, protectionClass: protectionClass,
            details: try itemDetails(group, identifier, for: call))
    }

    func collectionProperties(_ group: String, caller call: BusCall) throws(BusError) -> [String: PropertyValue] {
        // The listing below refuses a group the caller may not use, or that is gone.
        let items = try self.items(of: group, for: call).map(\.path)
        return [
            "Items": .objectPaths(items), "Label": .string(label(of: group)),
            // The session collection never locks, as gnome-keyring's; every other is the keychain's lock.
            "Locked": .bool(group == SessionCollection.group ? false : store.isLocked),
            "Created": .uint64(0), "Modified": .uint64(0)
        ]
    }

    /// What a collection is called: the label given it, else its group's name.
    func label(of group: String) -> String {
        if group == SessionCollection.group { return sessionCollection.label ?? group }
        return store.collectionLabels()[group] ?? group
    }
}
