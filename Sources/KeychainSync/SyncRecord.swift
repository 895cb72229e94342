import KeychainCore

/// An item's place in the keychain: its group and identifier.
package struct ItemKey: Hashable, Comparable, Sendable, CustomStringConvertible {
    package let group: String
    package let identifier: String

    package init(group: String, identifier: String) {
        self.group = group
        self.identifier = identifier
    }

    package static func < (a: ItemKey, b: ItemKey) -> Bool { (a.group, a.identifier) < (b.group, b.identifier) }

    package var description: String { group + "/" + identifier }
}

/// What a synced item holds: its class (always a migratable one), value and details.
package struct SyncedContent: Sendable {
    package let protectionClass: ProtectionClass
    package let value: SecureBytes
    package let details: ItemDetails?

    package init(protectionClass: ProtectionClass, value: SecureBytes, details: ItemDetails?) {
        self.protectionClass = protectionClass
        self.value = value
        self.details = details
    }

    /// Whether the two hold the same secret under the same class (details
    /// may differ: then no copy is needed, the newer details win).
    package func sameSecret(as other: SyncedContent) -> Bool {
        protectionClass == other.protectionClass && value.count == other.value.count
            && other.value.withUnsafeBytes { value.constantTimeEquals($0) }
    }
}

/// One version of one item as it travels: the item, or the tombstone that
/// says it was removed, with the version vector that orders it.
package struct SyncRecord: Sendable {
    package enum Body: Sendable {
        case item(SyncedContent)
        case tombstone
    }

    package var key: ItemKey
    package var vector: VersionVector
    package var body: Body
    /// When the change was made (milliseconds since 1970), on its device's clock.
    package var changed: UInt64
    /// The device that made the change.
    package var origin: UInt64

    package init(key: ItemKey, vector: VersionVector, body: Body, changed: UInt64, origin: UInt64) {
        self.key = key
        self.vector = vector
        self.body = body
        self.changed = changed
        self.origin = origin
    }

    package var content: SyncedContent? {
        if case .item(let content) = body { return content }
        return nil
    }

    package var isTombstone: Bool { content == nil }
}
