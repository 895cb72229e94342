internal import COpenSSL
import KeychainCore

/// How secrets cross the bus in one session of a client (the spec's
/// transfer algorithms): `plain` as they are, or
/// `dh-ietf1024-sha256-aes128-cbc-pkcs7` (libsecret asks for it first):
/// a Diffie-Hellman exchange at OpenSession gives an AES-128 key, and each
/// secret travels AES-CBC-encrypted under a fresh random IV (its
/// "parameters"). A session belongs to the connection that opened it.
final class TransferSession {
    static let plain = "plain"
    static let diffieHellman = "dh-ietf1024-sha256-aes128-cbc-pkcs7"

    let owner: String
    let path: String
    /// The AES key of a DH session (nil: plain), in secret memory.
    private let key: SecureBytes?

    private init(owner: String, path: String, key: SecureBytes?) {
        self.owner = owner
        self.path = path
        self.key = key
    }

    /// A session for `algorithm`, given the client's input (a variant), and
    /// the output to send back (nil: the empty string of `plain`; our public
    /// key for DH).
    static func open(algorithm: String, input: BusMessageReader, owner: String,
                     path: String) throws(BusError) -> (TransferSession, [UInt8]?) {
        switch algorithm {
        case plain:
            try input.enter("v", "s")
            _ = try input.string()
            try input.exit()
            return try server(algorithm: algorithm, peer: nil, owner: owner, path: path)
        case diffieHellman:
            try input.enter("v", "ay")
            let peer = try input.bytes()
            try input.exit()
            return try server(algorithm: algorithm, peer: peer, owner: owner, path: path)
        default:
            throw .notSupported("the transfer algorithm \(algorithm) is not supported (\(plain) and \(diffieHellman) are)")
        }
    }

    /// The provider's end of a session, given the client's public key for
    /// DH (nil for plain); with the output to send back.
    static func server(algorithm: String, peer: [UInt8]?, owner: String,
                       path: String) throws(BusError) -> (TransferSession, [UInt8]?) {
        guard algorithm == diffieHellman else { return (TransferSession(owner: owner, path: path, key: nil), nil) }
        guard let peer, (1...128).contains(peer.count) else { throw .invalidArguments("a DH public key has 1 to 128 bytes") }
        let (publicKey, key) = try exchange(exponent: SecureBytes.random(count: 128), peer: peer)
        return (TransferSession(owner: owner, path: path, key: key), publicKey)
    }

    /// Appends a secret as the spec's (oayays): session, parameters, value, content type.
    func append(_ value: SecureBytes, contentType: String, to reply: BusMessageWriter) throws(BusError) {
        try reply.open("r", "oayays")
        try reply.objectPath(path)
        let (parameters, sealed) = try seal(value)
        try reply.bytes(parameters)
        try sealed.withUnsafeBytes { (raw) throws(BusError) in try reply.bytes(raw) }
        try reply.string(contentType)
        try reply.close()
    }

    /// A secret as it crosses the bus in this session: its parameters (a
    /// fresh IV for DH, none for plain) and its bytes.
    func seal(_ value: SecureBytes) throws(BusError) -> (parameters: [UInt8], sealed: SecureBytes) {
        guard let key else { return ([], value) }
        let iv = Crypto.randomBytes(16)
        return (iv, try Self.aes(encrypt: true, key: key, iv: iv, value))
    }

    /// The client's half of a DH session with another provider: a private
    /// exponent and its public key (the same exchange as ``open``, against
    /// the generator 2, whose power is the public key).
    static func clientKeyPair() throws(BusError) -> (exponent: SecureBytes, publicKey: [UInt8]) {
        let exponent = SecureBytes.random(count: 128)
        let (publicKey, _) = try exchange(exponent: exponent, peer: [2])
        return (exponent, publicKey)
    }

    /// The client's session at `path` once the provider sent its public key.
    static func client(path: String, exponent: SecureBytes, peer: [UInt8]) throws(BusError) -> TransferSession {
        guard (1...128).contains(peer.count) else { throw .failed("the provider's DH public key is not 1 to 128 bytes") }
        return TransferSession(owner: "", path: path, key: try exchange(exponent: exponent, peer: peer).key)
    }

    /// A plain client session at `path`.
    static func plainClient(path: String) -> TransferSession { TransferSession(owner: "", path: path, key: nil) }

    /// Our public key for `exponent` and the AES key shared with `peer`'s:
    /// the arithmetic, HKDF and the cleanup are libcrypto's (COpenSSL).
    private static func exchange(exponent: SecureBytes, peer: [UInt8]) throws(BusError) -> (publicKey: [UInt8], key: SecureBytes) {
        var publicKey = [UInt8](repeating: 0, count: 128)
        var publicLength = 0
        let key: SecureBytes
        do { key = try SecureBytes(count: 16) } catch { throw .failed("no memory for the session key") }
        let status = exponent.withUnsafeBytes { exponent in
            COpenSSL_dh_ietf1024(peer, peer.count, exponent.baseAddress?.assumingMemoryBound(to: UInt8.self), exponent.count,
                                 &publicKey, &publicLength, key.mutableBytes.baseAddress?.assumingMemoryBound(to: UInt8.self))
        }
        switch status {
        case 0: return (Array(publicKey[..<publicLength]), key)
        case -2: throw .invalidArguments("the DH public key is not an element of the group (it is 0, 1, p-1 or larger)")
        default: throw .failed("the DH exchange failed (is libcrypto, libssl3, installed?)")
        }
    }

    /// The value a client sent in this session.
    func open(_ sealed: SecureBytes, parameters: [UInt8]) throws(BusError) -> SecureBytes {
        guard let key else {
            guard parameters.isEmpty else { throw .invalidArguments("a plain session's secrets have no parameters") }
            return sealed
        }
        guard parameters.count == 16 else { throw .invalidArguments("a DH session's parameters are a 16-byte IV") }
        return try Self.aes(encrypt: false, key: key, iv: parameters, sealed)
    }

    /// AES-128-CBC-PKCS7 of `input`, into secret memory either way (the
    /// output of a decryption is the secret).
    private static func aes(encrypt: Bool, key: SecureBytes, iv: [UInt8], _ input: SecureBytes) throws(BusError) -> SecureBytes {
        let output: SecureBytes
        do { output = try SecureBytes(count: input.count + 16) } catch { throw .failed("no memory for the secret") }
        var length = 0
        let status = key.withUnsafeBytes { key in
            input.withUnsafeBytes { input in
                COpenSSL_aes128_cbc(encrypt ? 1 : 0, key.baseAddress?.assumingMemoryBound(to: UInt8.self), iv,
                                    input.baseAddress?.assumingMemoryBound(to: UInt8.self), input.count,
                                    output.mutableBytes.baseAddress?.assumingMemoryBound(to: UInt8.self), &length)
            }
        }
        guard status == 0 else {
            throw encrypt ? .failed("could not encrypt the secret") : .invalidArguments("the secret does not decrypt in this session")
        }
        do {
            return try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: output.mutableBytes[..<length]))
        } catch {
            throw .failed("no memory for the secret")
        }
    }
}
