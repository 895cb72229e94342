/// An item's attributes, one table for every door: the name each door
/// gives it (a mount's extended attribute, a Secret Service lookup
/// attribute), how it is read, and, for those a program may write, the
/// class a written value gives the item, the question the person is asked
/// and the audit log's operation (docs/FILESYSTEM.md, "Extended
/// attributes"; docs/SECRET-SERVICE.md, "Mapping"). A new attribute is a
/// case here; the mount's xattr handlers and the bus's lookups go through it.
package enum ItemAttribute: CaseIterable, Sendable {
    /// The item's protection class, by its full name (`alwaysThisDeviceOnly`).
    case accessible
    /// Whether the class lets the item leave the device (`yes`, `no`).
    case migratable
    /// The item's access group.
    case group
    /// The item's name in its group.
    case identifier

    /// Its name as a mount's extended attribute (nil: a mount shows it as the path).
    package var extendedAttributeName: String? {
        switch self {
        case .accessible: "user.keychain.accessible"
        case .migratable: "user.keychain.migratable"
        case .group, .identifier: nil
        }
    }

    /// Its name as a Secret Service lookup attribute, which every item
    /// answers to (nil: the bus shows it through another).
    package var busName: String? {
        switch self {
        case .accessible: "keychainfs:accessible"
        case .group: "keychainfs:group"
        case .identifier: "keychainfs:identifier"
        case .migratable: nil
        }
    }

    package init?(extendedAttributeName name: String) {
        guard let found = Self.allCases.first(where: { $0.extendedAttributeName == name }) else { return nil }
        self = found
    }

    /// Its value for an item.
    package func value(group: String, identifier: String, protectionClass: ProtectionClass) -> String {
        switch self {
        case .accessible: protectionClass.name
        case .migratable: protectionClass.isMigratable ? "yes" : "no"
        case .group: group
        case .identifier: identifier
        }
    }

    /// Whether a program may write it: the class attributes, which re-encrypt
    /// the item (the name and group change by a rename, not a write).
    package var isWritable: Bool { self == .accessible || self == .migratable }

    /// The class that writing `text` gives an item of class `current`; nil
    /// when `text` is no value of it (or it cannot be written).
    package func protectionClass(written text: String, over current: ProtectionClass) -> ProtectionClass? {
        switch self {
        case .accessible: ProtectionClass(name: text)
        case .migratable:
            text == "yes" || text == "no" ? ProtectionClass(mode: current.mode, migratable: text == "yes") : nil
        case .group, .identifier: nil
        }
    }

    /// What the person is asked before a program writes a class attribute
    /// of an item another program owns, and the audit log's operation.
    package static let writeVerb = "change the protection of"
    package static let writeOperation = "set-class"
}
