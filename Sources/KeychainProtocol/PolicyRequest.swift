import KeychainCore
/// What an ``PolicyRequest/access(group:identifier:executable:change:passcode:)`` does.
public enum AccessChange: String, Sendable, Equatable, CaseIterable {
    /// Put the program on the item's access list.
    case add = "0"
    /// Take every program at the path off the list.
    case remove = "1"
    /// Make an item of no program (imported, made through a mount or the
    /// command line) the program's, as if it had made it over the bus.
    case claim = "2"
}

/// Who may use a group or an item: entitlement rules and access lists
/// (changes need the passcode).
public enum PolicyRequest: Equatable, Sendable {
    /// Allow the executable at `executable` (absolute; the device resolves
    /// and hashes it), optionally only in `unit` and as `uid`, to use `group`
    /// (``Device/grant(_:toGroup:passcode:)``), with JIT code when `allowJIT`.
    /// The reply's field is the digest.
    case grant(
        group: String, executable: String, unit: String?, uid: UInt32?, passcode: SecureBytes?, allowJIT: Bool = false)
    /// Remove rules of `group`, or (`all`) its whole policy (``Device/revoke(group:executable:unit:uid:all:passcode:)``).
    /// The reply's field is the number of rules removed.
    case revoke(group: String, executable: String?, unit: String?, uid: UInt32?, all: Bool, passcode: SecureBytes?)
    /// Change who may use an item over the bus (``AccessChange``;
    /// docs/SECRET-SERVICE.md, "Whose an item is") with the program at
    /// `executable`. Needs the passcode, as `grant` does. The reply's fields:
    /// the executable and its SHA-256 in hex (add, claim), the number removed
    /// (remove).
    case access(group: String, identifier: String, executable: String, change: AccessChange, passcode: SecureBytes?)
    /// Whether programs own the items they make in `group` over the bus
    /// (`own`, the default) or its items are every program's (`open`):
    /// set to `open` (with the passcode), or read (nil; the reply's field is
    /// `own` or `open`).
    case apps(group: String, open: Bool?, passcode: SecureBytes?)
    /// The rules of one group (or of every group with a policy), six fields
    /// each: group, executable, SHA-256 in hex, unit, uid, `jit` (the last three empty when not set).
    case policy(group: String?)
}

extension PolicyRequest {
    /// The `kind` byte of each request of this group: unique among all
    /// groups (``DeviceRequest/kindsOfEachGroup``, checked by the protocol's tests),
    /// and never reused, since a byte means one request to every version.
    enum Kind: UInt8, CaseIterable {
        case grant = 20, revoke = 21, policy = 22, access = 33, apps = 34
    }

    /// The request's kind and fields.
    var frameParts: (Kind, [FrameField]) {
        switch self {
        case .grant(let group, let executable, let unit, let uid, let passcode, let allowJIT):
            return (
                .grant,
                [
                    .text(group), .text(executable), .optionalText(unit), .optionalText(uid.map { String($0) }),
                    .optionalSecret(passcode), .text(allowJIT ? "1" : "0")
                ]
            )
        case .revoke(let group, let executable, let unit, let uid, let all, let passcode):
            return (
                .revoke,
                [
                    .text(group), .optionalText(executable), .optionalText(unit),
                    .optionalText(uid.map { String($0) }), .text(all ? "1" : "0"), .optionalSecret(passcode)
                ]
            )
        case .access(let group, let identifier, let executable, let change, let passcode):
            return (
                .access,
                [.text(group), .text(identifier), .text(executable), .text(change.rawValue), .optionalSecret(passcode)]
            )
        case .apps(let group, let open, let passcode):
            return (.apps, [.text(group), .optionalText(open.map { $0 ? "1" : "0" }), .optionalSecret(passcode)])
        case .policy(let group):
            return (.policy, [.optionalText(group)])
        }
    }

    /// The request of `kind`, read from its fields.
    static func parsing(_ kind: Kind, _ reader: inout ByteReader<UnsafeRawBufferPointer>)
        throws(KeychainError) -> Self
    {
        switch kind {
        case .grant:
            let group = try reader.text(), executable = try reader.text(), unit = try reader.optionalText()
            let uid = try DeviceRequest.uid(try reader.optionalText())
            let passcode = try reader.optionalSecret()
            return .grant(
                group: group, executable: executable, unit: unit, uid: uid, passcode: passcode,
                allowJIT: try DeviceRequest.flag(try reader.text()))
        case .revoke:
            let group = try reader.text(), executable = try reader.optionalText(), unit = try reader.optionalText()
            let uid = try DeviceRequest.uid(try reader.optionalText()), all = try DeviceRequest.flag(try reader.text())
            return .revoke(
                group: group, executable: executable, unit: unit, uid: uid, all: all,
                passcode: try reader.optionalSecret())
        case .access:
            let group = try reader.text(), identifier = try reader.text(), executable = try reader.text()
            guard let change = AccessChange(rawValue: try reader.text()) else { throw .param }
            return .access(
                group: group, identifier: identifier, executable: executable, change: change,
                passcode: try reader.optionalSecret())
        case .apps:
            let group = try reader.text()
            let open = try reader.optionalText().map { (text) throws(KeychainError) in try DeviceRequest.flag(text) }
            return .apps(group: group, open: open, passcode: try reader.optionalSecret())
        case .policy:
            return .policy(group: try reader.optionalText())
        }
    }
}
