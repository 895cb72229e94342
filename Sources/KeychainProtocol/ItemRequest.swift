import KeychainCore
/// An item or a group of items: the library's operations, under the
/// caller policy (a group's entitlement, the owner rule) and audited.
public enum ItemRequest: Equatable, Sendable {
    /// An item's value (the reply is ``DeviceReply/value(_:)``).
    case get(group: String, identifier: String)
    /// Add or replace an item under `protectionClass` (nil: the device's
    /// current access mode and migrate setting), as `condition` allows,
    /// with `details` (nil: an item replaced keeps its own).
    case set(
        group: String, identifier: String, value: SecureBytes,
        protectionClass: ProtectionClass? = nil, condition: PasswordManager.WriteCondition = .always,
        details: ItemDetails? = nil)
    /// The details of one item, or of every item of `group` that has some:
    /// per item its identifier, then ``ItemDetails/fields`` (needs no key).
    case details(group: String, identifier: String?)
    /// Replace an item's details (its value stays; needs its class key).
    case setDetails(group: String, identifier: String, details: ItemDetails)
    /// Delete an item (works while locked).
    case remove(group: String, identifier: String)
    /// The groups (nil), or a group's items as (identifier, class, size) triples.
    case list(group: String?)
    /// An item's class and size, as two fields (needs no key).
    case info(group: String, identifier: String)
    /// Re-encrypt an item under another class.
    case setClass(group: String, identifier: String, protectionClass: ProtectionClass)
    /// Rename an item within its group.
    case rename(group: String, from: String, to: String, replacing: Bool)
    /// Create an empty access group.
    case createGroup(String)
    /// Remove an empty access group.
    case removeGroup(String)
}

extension ItemRequest {
    /// The audit log's name of the request (nil: a listing of the groups, which names no item).
    public var auditOperation: String? {
        switch self {
        case .get: "get"
        case .set: "set"
        case .details: "details"
        case .setDetails: "set-details"
        case .remove: "remove"
        case .info: "info"
        case .setClass: "set-class"
        case .rename: "rename"
        case .list(let group): group == nil ? nil : "list"
        case .createGroup: "create-group"
        case .removeGroup: "remove-group"
        }
    }

    /// The request with no owner or access list in the details it carries
    /// (docs/SECRET-SERVICE.md, "Whose an item is"): what a client of the
    /// socket sends is taken so.
    public var withoutOwner: ItemRequest {
        switch self {
        case .set(let group, let identifier, let value, let protectionClass, let condition, let details?):
            .set(
                group: group, identifier: identifier, value: value, protectionClass: protectionClass,
                condition: condition, details: details.ownerless)
        case .setDetails(let group, let identifier, let details):
            .setDetails(group: group, identifier: identifier, details: details.ownerless)
        case .set(_, _, _, _, _, nil), .get, .details, .remove, .list, .info, .setClass, .rename, .createGroup,
            .removeGroup:
            self
        }
    }

    /// What the request does to an item another program may own, as the
    /// person's question says it (docs/SECRET-SERVICE.md, "Whose an item is");
    /// nil for a request that hands out no secret and changes no item (a
    /// listing, details, a group).
    public var consentVerb: String? {
        switch self {
        case .get: "read the secret of"
        case .set: "change the secret of"
        case .remove: "delete"
        case .rename: "rename or replace"
        case .setClass: "change the protection of"
        case .setDetails: "change the label or attributes of"
        case .details, .list, .info, .createGroup, .removeGroup: nil
        }
    }

    /// The items of ``group`` whose owner the request needs the leave of:
    /// the item it reads or changes, and the one a rename would replace.
    public var ownedIdentifiers: [String] {
        switch self {
        case .get(_, let identifier), .set(_, let identifier, _, _, _, _), .remove(_, let identifier),
            .setClass(_, let identifier, _), .setDetails(_, let identifier, _):
            [identifier]
        case .rename(_, let from, let to, _):
            [from, to]
        // No ``consentVerb``: nothing to ask about.
        case .details, .list, .info, .createGroup, .removeGroup:
            []
        }
    }

    /// The item the request is about, for the audit log (nil: a group's).
    public var identifier: String? {
        switch self {
        case .get(_, let identifier), .set(_, let identifier, _, _, _, _), .remove(_, let identifier),
            .info(_, let identifier), .setClass(_, let identifier, _), .setDetails(_, let identifier, _),
            .rename(_, let identifier, _, _):
            identifier
        case .details(_, let identifier): identifier
        case .list, .createGroup, .removeGroup: nil
        }
    }

    /// The access group the request is about (nil: the list of groups).
    /// `createGroup`'s group is none yet: no policy can name it.
    public var group: String? {
        switch self {
        case .get(let group, _), .set(let group, _, _, _, _, _), .remove(let group, _), .info(let group, _),
            .details(let group, _), .setDetails(let group, _, _), .setClass(let group, _, _),
            .rename(let group, _, _, _), .removeGroup(let group):
            group
        case .list(let group): group
        case .createGroup: nil
        }
    }
}

extension ItemRequest {
    /// The `kind` byte of each request of this group: unique among all
    /// groups (``DeviceRequest/kindsOfEachGroup``, checked by the protocol's tests),
    /// and never reused, since a byte means one request to every version.
    enum Kind: UInt8, CaseIterable {
        case get = 7, set = 8, remove = 9, list = 10, info = 11, setClass = 12, rename = 13, createGroup = 14,
            removeGroup = 15, details = 30, setDetails = 31
    }

    /// The request's kind and fields (details encoded in secret memory).
    func frameParts() throws(KeychainError) -> (Kind, [FrameField]) {
        switch self {
        case .get(let group, let identifier):
            return (.get, [.text(group), .text(identifier)])
        case .set(let group, let identifier, let value, let protectionClass, let condition, let details):
            return (
                .set,
                [
                    .text(group), .text(identifier), .optionalSecret(value), .optionalText(protectionClass?.name),
                    .text(condition.rawValue),
                    .optionalSecret(
                        try details.map { (details) throws(KeychainError) in
                            try SecureBytes(details.encoded())
                        })
                ]
            )
        case .details(let group, let identifier):
            return (.details, [.text(group), .optionalText(identifier)])
        case .setDetails(let group, let identifier, let details):
            return (.setDetails, [.text(group), .text(identifier), .optionalSecret(try SecureBytes(details.encoded()))])
        case .remove(let group, let identifier):
            return (.remove, [.text(group), .text(identifier)])
        case .list(let group):
            return (.list, [.optionalText(group)])
        case .info(let group, let identifier):
            return (.info, [.text(group), .text(identifier)])
        case .setClass(let group, let identifier, let protectionClass):
            return (.setClass, [.text(group), .text(identifier), .text(protectionClass.name)])
        case .rename(let group, let from, let to, let replacing):
            return (.rename, [.text(group), .text(from), .text(to), .text(replacing ? "1" : "0")])
        case .createGroup(let group):
            return (.createGroup, [.text(group)])
        case .removeGroup(let group):
            return (.removeGroup, [.text(group)])
        }
    }

    /// The request of `kind`, read from its fields.
    static func parsing(_ kind: Kind, _ reader: inout ByteReader<UnsafeRawBufferPointer>)
        throws(KeychainError) -> Self
    {
        switch kind {
        case .get:
            return .get(group: try reader.text(), identifier: try reader.text())
        case .set:
            let group = try reader.text(), identifier = try reader.text()
            guard let value = try reader.optionalSecret() else { throw .param }
            let protectionClass = try reader.optionalText().map { (name) throws(KeychainError) in
                try DeviceRequest.protectionClass(name)
            }
            guard let condition = PasswordManager.WriteCondition(rawValue: try reader.text()) else { throw .param }
            let details = try reader.optionalSecret().map { (encoded) throws(KeychainError) in
                try ItemDetails(decoding: encoded.bytes(), malformed: .param)
            }
            return .set(
                group: group, identifier: identifier, value: value, protectionClass: protectionClass,
                condition: condition, details: details)
        case .details:
            return .details(group: try reader.text(), identifier: try reader.optionalText())
        case .setDetails:
            let group = try reader.text(), identifier = try reader.text()
            guard let encoded = try reader.optionalSecret() else { throw .param }
            return .setDetails(
                group: group, identifier: identifier,
                details: try ItemDetails(decoding: encoded.bytes(), malformed: .param))
        case .remove:
            return .remove(group: try reader.text(), identifier: try reader.text())
        case .list:
            return .list(group: try reader.optionalText())
        case .info:
            return .info(group: try reader.text(), identifier: try reader.text())
        case .setClass:
            return .setClass(
                group: try reader.text(), identifier: try reader.text(),
                protectionClass: try DeviceRequest.protectionClass(try reader.text()))
        case .rename:
            let group = try reader.text(), from = try reader.text(), to = try reader.text()
            return .rename(group: group, from: from, to: to, replacing: try DeviceRequest.flag(try reader.text()))
        case .createGroup:
            return .createGroup(try reader.text())
        case .removeGroup:
            return .removeGroup(try reader.text())
        }
    }
}
