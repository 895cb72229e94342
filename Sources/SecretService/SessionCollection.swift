import KeychainCore
import KeychainProtocol
import Synchronization

/// libsecret's `session` collection (`SECRET_COLLECTION_SESSION`, alias
/// `session`), as gnome-keyring always has it: items a program keeps for
/// the life of the session and never on disk. Its items live in this
/// process's locked secret memory only, are readable whether or not the
/// keychain is locked (their class is `always`, as gnome-keyring's session
/// keyring never locks), and are wiped when the device stops
/// (docs/SECRET-SERVICE.md, "The session collection"). It answers the item
/// requests the provider makes of the group `session` in the device's
/// place, with the device's replies: the provider's handlers cannot tell
/// the two apart, so every method works on it as on any collection.
final class SessionCollection: Sendable {
    static let group = "session"
    /// What it may hold: a flood of items fills no memory.
    static let maximumItems = 1000
    static let maximumBytes = 16 << 20

    private struct Item {
        var value: SecureBytes
        var details: ItemDetails?
    }
    private let items = Mutex<[String: Item]>([:])
    private let givenLabel = Mutex<String?>(nil)
    /// The label a client gave it (nil: its name), in memory as its items are.
    var label: String? {
        get { givenLabel.withLock { $0 } }
        set { givenLabel.withLock { $0 = newValue } }
    }

    /// The reply to `request` when it is about the session collection; nil for any other group.
    func answer(_ request: ItemRequest) -> DeviceReply? {
        switch request {
        case .get(Self.group, let identifier):
            return item(identifier) { ItemValue(value: $0.value, protectionClass: .always).reply }
        case .info(Self.group, let identifier):
            return item(identifier) { ItemInfo(protectionClass: .always, size: $0.value.count).reply }
        case .details(Self.group, let identifier?):
            return item(identifier) { DetailsList($0.details.map { [(identifier, $0)] } ?? []).reply }
        case .details(Self.group, nil):
            let entries = items.withLock { items in
                items.compactMap { identifier, item in item.details.map { (identifier: identifier, details: $0) } }
            }
            return DetailsList(entries.sorted { $0.identifier < $1.identifier }).reply
        case .list(group: Self.group?):
            let listed = items.withLock { items in
                items.map {
                    ItemListing(
                        identifier: $0.key, info: ItemInfo(protectionClass: .always, size: $0.value.value.count))
                }
            }
            return ItemList(listed.sorted { $0.identifier < $1.identifier }).reply
        case .set(Self.group, let identifier, let value, _, let condition, let details):
            return set(identifier, value: value, condition: condition, details: details)
        case .setDetails(Self.group, let identifier, let details):
            return items.withLock { items in
                guard items[identifier] != nil else { return Self.absent(identifier) }
                items[identifier]?.details = details
                return Done().reply
            }
        case .remove(Self.group, let identifier):
            return items.withLock { items in
                items.removeValue(forKey: identifier) == nil ? Self.absent(identifier) : Done().reply
            }
        case .setClass(Self.group, let identifier, _):
            // Every item here is `always`: in memory, it has no class key to move to.
            return item(identifier) { _ in Done().reply }
        case .rename(Self.group, let from, let to, let replacing):
            return items.withLock { items in
                guard let moved = items[from] else { return Self.absent(from) }
                if from == to { return Done().reply }
                if items[to] != nil, !replacing {
                    return .keychainError(.duplicateItem, "\(Self.group)/\(to) exists already")
                }
                items[to] = moved
                items[from] = nil
                return Done().reply
            }
        case .createGroup(Self.group):
            return Done().reply
        case .removeGroup(Self.group):
            return .keychainError(
                .badRequest, "the session collection is always there; its items go when the device stops")
        default:
            return nil
        }
    }

    private func item(_ identifier: String, _ reply: (Item) -> DeviceReply) -> DeviceReply {
        items.withLock { $0[identifier] }.map(reply) ?? Self.absent(identifier)
    }

    private static func absent(_ identifier: String) -> DeviceReply {
        .keychainError(.itemNotFound, "\(group)/\(identifier) does not exist")
    }

    private func set(
        _ identifier: String, value: SecureBytes, condition: PasswordManager.WriteCondition, details: ItemDetails?
    ) -> DeviceReply {
        items.withLock { items in
            let existing = items[identifier]
            switch condition {
            case .ifAbsent where existing != nil:
                return .keychainError(.duplicateItem, "\(Self.group)/\(identifier) exists already")
            case .ifPresent where existing == nil:
                return Self.absent(identifier)
            default: break
            }
            let held = items.values.reduce(0) { $0 + $1.value.count } - (existing?.value.count ?? 0)
            guard existing != nil || items.count < Self.maximumItems, held + value.count <= Self.maximumBytes else {
                return .keychainError(
                    .quotaExceeded,
                    "the session collection holds \(Self.maximumItems) items and \(Self.maximumBytes >> 20) MiB at "
                        + "most; remove some first")
            }
            // An item replaced keeps its details unless new ones came, as the device's do.
            items[identifier] = Item(value: value, details: details ?? existing?.details)
            return Done().reply
        }
    }
}
