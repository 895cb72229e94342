import KeychainCore
/// The device process itself: whether it answers, its end, its events,
/// the bus it serves, a user's keychain in the service.
public enum ProcessRequest: Equatable, Sendable {
    /// Is a device serving this socket?
    case ping
    /// Stop the per-user device: unmount everything and exit (as SIGTERM).
    case stop
    /// Follow the device's events: after the `ok` reply the connection
    /// carries `.events` lines until the client closes it.
    case watch
    /// A per-user device: serve the Secret Service on the session bus at
    /// `address` too (with `replace`, taking the name over), as if started
    /// with `--secret-service`.
    case serveBus(address: String, replace: Bool)
    /// Service mode: create the caller's keychain (nil: no passcode).
    case create(passcode: SecureBytes?)
}

extension ProcessRequest {
    /// The `kind` byte of each request of this group: unique among all
    /// groups (``DeviceRequest/kindsOfEachGroup``, checked by the protocol's tests),
    /// and never reused, since a byte means one request to every version.
    enum Kind: UInt8, CaseIterable {
        case ping = 1, create = 23, stop = 27, watch = 28, serveBus = 32
    }

    /// The request's kind and fields.
    var frameParts: (Kind, [FrameField]) {
        switch self {
        case .ping: return (.ping, [])
        case .stop: return (.stop, [])
        case .watch: return (.watch, [])
        case .serveBus(let address, let replace): return (.serveBus, [.text(address), .text(replace ? "1" : "0")])
        case .create(let passcode): return (.create, [.optionalSecret(passcode)])
        }
    }

    /// The request of `kind`, read from its fields.
    static func parsing(_ kind: Kind, _ reader: inout ByteReader<UnsafeRawBufferPointer>)
        throws(KeychainError) -> Self
    {
        switch kind {
        case .ping: return .ping
        case .stop: return .stop
        case .watch: return .watch
        case .serveBus:
            let address = try reader.text()
            return .serveBus(address: address, replace: try DeviceRequest.flag(try reader.text()))
        case .create: return .create(passcode: try reader.optionalSecret())
        }
    }
}
