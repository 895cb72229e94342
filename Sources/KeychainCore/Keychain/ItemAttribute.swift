/// An item as its attributes are read: its name, its class and the details
/// kept with it (nil: none, as an item made through a mount has).
package struct ItemView: Sendable {
    package let group: String
    package let identifier: String
    package let protectionClass: ProtectionClass
    package let details: ItemDetails?

    package init(group: String, identifier: String, protectionClass: ProtectionClass, details: ItemDetails?) {
        self.group = group
        self.identifier = identifier
        self.protectionClass = protectionClass
        self.details = details
    }
}

/// An item's attributes, one table for every door: the name each door
/// gives it (a mount's extended attribute, a Secret Service lookup
/// attribute or item property), how it is read from an ``ItemView``, and,
/// for those a program may write, what a written value changes, the
/// question the person is asked and the audit log's operation
/// (docs/FILESYSTEM.md, "Extended attributes"; docs/SECRET-SERVICE.md,
/// "Mapping"). A new attribute is a case here (and its field in
/// ``ItemDetails`` if it is kept there); the mount's xattr handlers, the
/// bus's lookups and its item properties go through it.
package enum ItemAttribute: CaseIterable, Sendable {
    /// The item's protection class, by its full name (`alwaysThisDeviceOnly`).
    case accessible
    /// Whether the class lets the item leave the device (`yes`, `no`).
    case migratable
    /// The item's access group.
    case group
    /// The item's name in its group.
    case identifier
    /// What a person calls the item (kept in its details; its identifier
    /// when it has none).
    case label
    /// The value's MIME type (kept in its details; `text/plain` when it has none).
    case contentType

    /// Its name as a mount's extended attribute (nil: a mount shows it as the path).
    package var extendedAttributeName: String? {
        switch self {
        case .accessible: "user.keychain.accessible"
        case .migratable: "user.keychain.migratable"
        case .label: "user.keychain.label"
        case .contentType: "user.keychain.type"
        case .group, .identifier: nil
        }
    }

    /// Its name as a Secret Service lookup attribute, which every item
    /// answers to (nil: the bus shows it through another, or as a property).
    package var busName: String? {
        switch self {
        case .accessible: "keychainfs:accessible"
        case .group: "keychainfs:group"
        case .identifier: "keychainfs:identifier"
        case .migratable, .label, .contentType: nil
        }
    }

    /// Its name as a property of `org.freedesktop.Secret.Item`, a string
    /// (nil: not one).
    package var busProperty: String? {
        switch self {
        case .label: "Label"
        case .contentType: "Type"
        case .accessible, .migratable, .group, .identifier: nil
        }
    }

    package init?(extendedAttributeName name: String) {
        guard let found = Self.allCases.first(where: { $0.extendedAttributeName == name }) else { return nil }
        self = found
    }

    package init?(busProperty name: String) {
        guard let found = Self.allCases.first(where: { $0.busProperty == name }) else { return nil }
        self = found
    }

    /// Whether reading it needs the item's details (else its name and class do).
    package var isKeptInDetails: Bool { self == .label || self == .contentType }

    /// Its value for an item.
    package func value(of item: ItemView) -> String {
        switch self {
        case .accessible: item.protectionClass.name
        case .migratable: item.protectionClass.isMigratable ? "yes" : "no"
        case .group: item.group
        case .identifier: item.identifier
        case .label: item.details?.label ?? item.identifier
        case .contentType: item.details?.contentType ?? ItemDetails.defaultContentType
        }
    }

    /// What writing one changes of an item.
    package enum Change: Equatable, Sendable {
        /// The item is sealed again under this class (needs both keys).
        case protectionClass(ProtectionClass)
        /// The item's details are replaced by these (needs its class key).
        case details(ItemDetails)
    }

    /// What writing `text` changes of `item`; nil when `text` is no value of
    /// it, or it cannot be written (the name and group change by a rename,
    /// the content type with the value).
    package func change(written text: String, to item: ItemView) -> Change? {
        switch self {
        case .accessible, .migratable:
            protectionClass(written: text, over: item.protectionClass).map(Change.protectionClass)
        case .label:
            .details(item.writableDetails { $0.label = text })
        case .group, .identifier, .contentType: nil
        }
    }

    /// Whether a program may write it.
    package var isWritable: Bool { writeVerb != nil }

    /// The class that writing `text` gives an item of class `current`; nil
    /// when `text` is no value of it (or it cannot be written).
    package func protectionClass(written text: String, over current: ProtectionClass) -> ProtectionClass? {
        switch self {
        case .accessible: ProtectionClass(name: text)
        case .migratable:
            text == "yes" || text == "no" ? ProtectionClass(mode: current.mode, migratable: text == "yes") : nil
        case .group, .identifier, .label, .contentType: nil
        }
    }

    /// What the person is asked before a program writes it to an item
    /// another program owns (nil: it cannot be written).
    package var writeVerb: String? {
        switch self {
        case .accessible, .migratable: "change the protection of"
        case .label: "change the label of"
        case .group, .identifier, .contentType: nil
        }
    }

    /// The audit log's operation for a write of it (the device's own name
    /// for the request it becomes).
    package var writeOperation: String {
        switch self {
        case .accessible, .migratable: "set-class"
        case .label, .group, .identifier, .contentType: "set-details"
        }
    }
}

extension ItemView {
    /// The item's details with `edit` made, as a write keeps them: those
    /// it has (else new ones named after it), stamped by the device when it
    /// writes them.
    package func writableDetails(_ edit: (inout ItemDetails) -> Void) -> ItemDetails {
        var written = details ?? ItemDetails(label: identifier, attributes: [:])
        edit(&written)
        written.modified = 0
        return written
    }
}
