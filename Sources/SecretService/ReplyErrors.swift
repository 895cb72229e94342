import KeychainCore
import KeychainProtocol

/// What the object a request was about is, as an error names it.
enum BusErrorSubject: Equatable, Sendable {
    /// An item, by its object path.
    case item(path: String)
    /// A collection, by its access group.
    case collection(group: String)
    /// The list of every collection.
    case collections
}

extension BusError {
    /// What a device's refusal means on the bus, the same for every
    /// method (the spec's errors: a locked item is IsLocked, an absent one
    /// NoSuchObject; a group's policy that does not admit the program is
    /// AccessDenied).
    init(refusal: DeviceRefusal, about subject: BusErrorSubject) {
        switch refusal {
        case .keychain(.interactionNotAllowed, _):
            self = .isLocked("\(Self.naming(subject)) is locked")
        case .keychain(.itemNotFound, _):
            self = .noSuchObject("no \(Self.naming(subject))")
        case .keychain(.missingEntitlement, _):
            self = .accessDenied("this program is not entitled to \(Self.groupNaming(subject))")
        case .keychain(.ownerDenied, _):
            self = .accessDenied("the person denied this program an item another program owns")
        case .keychain(_, let message), .system(_, let message):
            self = .failed(message)
        case .unexpected:
            self = .unexpectedReply
        }
    }

    /// An answer the method never gets: another keychainfs build at the other end.
    static let unexpectedReply = BusError.failed(DeviceRefusal.unexpectedSentence)

    private static func naming(_ subject: BusErrorSubject) -> String {
        switch subject {
        case .item(let path): "item at \(path)"
        case .collection(let group): "collection \(group)"
        case .collections: "collections"
        }
    }

    private static func groupNaming(_ subject: BusErrorSubject) -> String {
        switch subject {
        case .item: "the item's access group"
        case .collection(let group): "the access group \(group)"
        case .collections: "the access groups"
        }
    }
}

extension Swift.Result where Success: DeviceResult, Failure == DeviceRefusal {
    /// The answer, or the error its refusal means on the bus.
    @discardableResult
    func answer(about subject: BusErrorSubject) throws(BusError) -> Success {
        try get(orThrow: { BusError(refusal: $0, about: subject) })
    }
}
