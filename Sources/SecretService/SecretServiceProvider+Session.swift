import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// The `org.freedesktop.Secret.Session` objects: a client's transfer sessions.
extension SecretServiceProvider {
    /// `Close` (no arguments).
    func closeSession(_ call: BusCall) throws(BusError) -> EmptyReply {
        _ = try session(call.path, of: call)
        sessions[call.path] = nil
        return EmptyReply()
    }

    /// A secret struct `call` sent, opened in its session (the caller's
    /// own), and its content type.
    func secret(_ secret: SentSecret, of call: BusCall) throws(BusError) -> (value: SecureBytes, contentType: String) {
        let session = try self.session(secret.session, of: call)
        return (try session.open(secret.sealed, parameters: secret.parameters), secret.contentType)
    }

    /// The open session at `path`, which must be the caller's own.
    func session(_ path: String, of call: BusCall) throws(BusError) -> TransferSession {
        guard let session = sessions[path], session.owner == call.sender else {
            throw .noSession("no open session \(path) of this connection")
        }
        return session
    }
}
