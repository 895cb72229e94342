import KeychainCore

/// How secrets cross the bus in one session of a client (the spec's
/// transfer algorithms): `plain` as they are; the DH algorithm later in
/// this file's history. A session belongs to the connection that opened it.
final class TransferSession {
    static let plain = "plain"

    let owner: String
    let path: String

    private init(owner: String, path: String) {
        self.owner = owner
        self.path = path
    }

    /// A session for `algorithm`, given the client's input (a variant), and
    /// the output to send back (nil: the empty string of `plain`).
    static func open(algorithm: String, input: BusMessageReader, owner: String,
                     path: String) throws(BusError) -> (TransferSession, [UInt8]?) {
        switch algorithm {
        case plain:
            try input.enter("v", "s")
            _ = try input.string()
            try input.exit()
            return (TransferSession(owner: owner, path: path), nil)
        default:
            throw .notSupported("the transfer algorithm \(algorithm) is not supported (plain is)")
        }
    }

    /// Appends a secret as the spec's (oayays): session, parameters, value, content type.
    func append(_ value: SecureBytes, to reply: BusMessageWriter) throws(BusError) {
        try reply.open("r", "oayays")
        try reply.objectPath(path)
        try reply.bytes(UnsafeRawBufferPointer(start: nil, count: 0))
        try value.withUnsafeBytes { (raw) throws(BusError) in try reply.bytes(raw) }
        try reply.string("text/plain")
        try reply.close()
    }

    /// The value a client sent in this session.
    func open(_ sealed: SecureBytes, parameters: [UInt8]) throws(BusError) -> SecureBytes {
        guard parameters.isEmpty else { throw .invalidArguments("a plain session's secrets have no parameters") }
        return sealed
    }
}
