import KeychainCore
/// The device's lock and its settings: lock, unlock, status, sync, the
/// passcode, auto-lock.
public enum DeviceStateRequest: Equatable, Sendable {
    /// Lock the device.
    case lock
    /// Unlock the device (nil: a keychain without a passcode).
    case unlock(passcode: SecureBytes?)
    /// The device's state (``DeviceStatus``), as the mount at `mountpoint`
    /// shows it (its group; nil: the keychain's device itself).
    case status(mountpoint: String?)
    /// Make every acknowledged write durable against power loss.
    case sync
    /// Change the passcode (nil: none), as ``Device/changePasscode(from:to:)``.
    case changePasscode(old: SecureBytes?, new: SecureBytes?)
    /// Set the auto-lock delay and grace (nil: keep it), in seconds; the
    /// reply is both as they are now.
    case autoLock(after: Int?, grace: Int?)
    /// Wipe the cache of the last access (UYLPasswordManager's `purge`).
    case purge
    /// What iOS does when an app goes to the background: purge the cache.
    case background
    /// The class that items written from now on get (UYLPasswordManager's `accessMode`).
    case accessMode(AccessMode)
    /// Whether items written from now on may leave the device (`false`: the `ThisDeviceOnly` form).
    case migrate(Bool)
}

extension DeviceStateRequest {
    /// The `kind` byte of each request of this group: unique among all
    /// groups (``DeviceRequest/kindsOfEachGroup``, checked by the protocol's tests),
    /// and never reused, since a byte means one request to every version.
    enum Kind: UInt8, CaseIterable {
        case changePasscode = 4, lock = 16, unlock = 17, status = 18, sync = 19, autoLock = 29, purge = 55, background =
            56, accessMode = 57, migrate = 58
    }

    /// The request's kind and fields.
    var frameParts: (Kind, [FrameField]) {
        switch self {
        case .lock: return (.lock, [])
        case .unlock(let passcode): return (.unlock, [.optionalSecret(passcode)])
        case .status(let mountpoint): return (.status, [.optionalText(mountpoint)])
        case .sync: return (.sync, [])
        case .changePasscode(let old, let new): return (.changePasscode, [.optionalSecret(old), .optionalSecret(new)])
        case .autoLock(let after, let grace):
            return (.autoLock, [.optionalText(after.map { String($0) }), .optionalText(grace.map { String($0) })])
        case .purge: return (.purge, [])
        case .background: return (.background, [])
        case .accessMode(let mode): return (.accessMode, [.text(mode.rawValue)])
        case .migrate(let migrate): return (.migrate, [.text(migrate ? "1" : "0")])
        }
    }

    /// The request of `kind`, read from its fields.
    static func parsing(_ kind: Kind, _ reader: inout ByteReader<UnsafeRawBufferPointer>)
        throws(KeychainError) -> Self
    {
        switch kind {
        case .lock: return .lock
        case .unlock: return .unlock(passcode: try reader.optionalSecret())
        case .status: return .status(mountpoint: try reader.optionalText())
        case .sync: return .sync
        case .changePasscode: return .changePasscode(old: try reader.optionalSecret(), new: try reader.optionalSecret())
        case .autoLock:
            return .autoLock(
                after: try DeviceRequest.seconds(try reader.optionalText()),
                grace: try DeviceRequest.seconds(try reader.optionalText()))
        case .purge: return .purge
        case .background: return .background
        case .accessMode:
            guard let mode = AccessMode(rawValue: try reader.text()) else { throw .param }
            return .accessMode(mode)
        case .migrate: return .migrate(try DeviceRequest.flag(try reader.text()))
        }
    }
}
