import KeychainCore

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
    /// What a device reply that is not the answer a method wanted means on
    /// the bus, the same for every method (the spec's errors: a locked
    /// item is IsLocked, an absent one NoSuchObject; a group's policy that
    /// does not admit the program is AccessDenied). Never the value a
    /// `.value` reply carries.
    init(reply: DeviceReply, about subject: BusErrorSubject) {
        switch reply {
        case .keychainError(.interactionNotAllowed, _):
            self = .isLocked("\(Self.naming(subject)) is locked")
        case .keychainError(.itemNotFound, _):
            self = .noSuchObject("no \(Self.naming(subject))")
        case .keychainError(.missingEntitlement, _):
            self = .accessDenied("this program is not entitled to \(Self.groupNaming(subject))")
        case .keychainError(.ownerDenied, _):
            self = .accessDenied("the person denied this program an item another program owns")
        case .keychainError(_, let message), .systemError(_, let message):
            self = .failed(message)
        case .ok, .value:
            self = .unexpectedReply
        }
    }

    /// A reply of the wrong kind, or fields that do not read as the
    /// method's answer: another keychainfs build at the other end.
    static let unexpectedReply = BusError.failed("unexpected reply from the device (another keychainfs build?)")

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

extension DeviceReply {
    /// The value a `get` answered, or the error the reply means on the bus.
    func secret(about subject: BusErrorSubject) throws(BusError) -> SecureBytes {
        guard case .value(let value, _) = self else { throw BusError(reply: self, about: subject) }
        return value
    }

    /// The fields of an `ok`, or the error the reply means on the bus.
    @discardableResult
    func fields(about subject: BusErrorSubject) throws(BusError) -> [String] {
        guard case .ok(let fields) = self else { throw BusError(reply: self, about: subject) }
        return fields
    }
}
