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

    /// A session for `algorithm`, given the client's input (the variant's
    /// value; nil for a type no property takes), and
    /// the output to send back (nil: the empty string of `plain`; our public
    /// key for DH).
    static func open(
        algorithm: String, input: PropertyValue?, owner: String,
        path: String
    ) throws(BusError) -> (TransferSession, [UInt8]?) {
        switch algorithm {
        case plain:
            guard case .string? = input else { throw .invalidArguments("\(plain) takes an empty string (s)") }
            return try server(algorithm: algorithm, peer: nil, owner: owner, path: path)
        case diffieHellman:
            guard case .bytes(let peer)? = input else {
                throw .invalidArguments("\(diffieHellman) takes the client's public key (ay)")
            }
            return try server(algorithm: algorithm, peer: peer, owner: owner, path: path)
        default:
            throw .notSupported(
                "the transfer algorithm \(algorithm) is not supported (\(plain) and \(diffieHellman) are)")
        }
    }

    /// The provider's end of a session, given the client's public key for
    /// DH (nil for plain); with the output to send back.
    static func server(
        algorithm: String, peer: [UInt8]?, owner: String,
        path: String
    ) throws(BusError) -> (TransferSession, [UInt8]?) {
        guard algorithm == diffieHellman else { return (TransferSession(owner: owner, path: path, key: nil), nil) }
        guard let peer, (1...128).contains(peer.count) else {
            throw .invalidArguments("a DH public key has 1 to 128 bytes")
        }
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
        guard (1...128).contains(peer.count) else {
            throw .failed("the provider's DH public key is not 1 to 128 bytes")
        }
        return TransferSession(owner: "", path: path, key: try exchange(exponent: exponent, peer: peer).key)
    }

    /// A plain client session at `path`.
    static func plainClient(path: String) -> TransferSession { TransferSession(owner: "", path: path, key: nil) }

    /// RFC 2409's second Oakley group (1024-bit MODP), whose generator is 2.
    private static let prime = Hex.bytes(
        "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD"
            + "EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED"
            + "EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE65381FFFFFFFFFFFFFFFF", count: 128)!

    private static let unavailable = BusError.failed("the DH exchange failed (is libcrypto, libssl3, installed?)")

    /// Our public key for `exponent` (g^x mod p) and the AES key shared with
    /// `peer`'s: HKDF-SHA256 (RFC 5869) of the shared secret padded to 128
    /// bytes, no salt, no info, as libsecret and gnome-keyring derive it.
    /// The arithmetic and HKDF are libcrypto's; the shared secret lives in
    /// secret memory, and the big numbers are cleared when freed.
    private static func exchange(exponent: SecureBytes, peer: [UInt8]) throws(BusError) -> (
        publicKey: [UInt8], key: SecureBytes
    ) {
        let key: SecureBytes, shared: SecureBytes
        do {
            key = try SecureBytes(count: 16)
            shared = try SecureBytes(count: 128)
        } catch {
            throw .failed("no memory for the session key")
        }
        guard let context = COpenSSL_BN_CTX_new() else { throw unavailable }
        var numbers: [OpaquePointer] = []
        defer {
            for number in numbers { COpenSSL_BN_clear_free(number) }
            COpenSSL_BN_CTX_free(context)
        }
        func number(_ bytes: UnsafeRawBufferPointer) -> OpaquePointer? {
            let made = COpenSSL_BN_bin2bn(
                bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), Int32(bytes.count), nil)
            if let made { numbers.append(made) }
            return made
        }
        func word(_ value: UInt) throws(BusError) -> OpaquePointer {
            guard let made = COpenSSL_BN_new() else { throw unavailable }
            numbers.append(made)
            guard COpenSSL_BN_set_word(made, value) == 1 else { throw unavailable }
            return made
        }
        guard let p = prime.withUnsafeBytes(number), let limit = prime.withUnsafeBytes(number),
            let x = exponent.withUnsafeBytes(number), let peerKey = peer.withUnsafeBytes(number)
        else { throw unavailable }
        let g = try word(2), y = try word(0), secret = try word(0)
        guard COpenSSL_BN_sub_word(limit, 1) == 1 else { throw unavailable }
        // A peer key of 0, 1 or p-1 (or more) would make the secret known.
        guard COpenSSL_BN_num_bits(peerKey) >= 2, COpenSSL_BN_cmp(peerKey, limit) < 0 else {
            throw .invalidArguments("the DH public key is not an element of the group (it is 0, 1, p-1 or larger)")
        }
        guard COpenSSL_BN_mod_exp(y, g, x, p, context) == 1, COpenSSL_BN_mod_exp(secret, peerKey, x, p, context) == 1
        else {
            throw unavailable
        }
        var publicKey = [UInt8](repeating: 0, count: 128)
        let length = Int(COpenSSL_BN_bn2bin(y, &publicKey))
        let sharedBase = shared.mutableBytes.baseAddress?.assumingMemoryBound(to: UInt8.self)
        guard length > 0, COpenSSL_BN_bn2binpad(secret, sharedBase, 128) == 128 else { throw unavailable }
        guard let kdf = COpenSSL_EVP_PKEY_CTX_new_id(COpenSSL_hkdf_id(), nil) else { throw unavailable }
        defer { COpenSSL_EVP_PKEY_CTX_free(kdf) }
        var keyLength = 16
        guard COpenSSL_EVP_PKEY_derive_init(kdf) > 0, COpenSSL_EVP_PKEY_CTX_set_hkdf_md(kdf, COpenSSL_EVP_sha256()) > 0,
            COpenSSL_EVP_PKEY_CTX_set1_hkdf_key(kdf, sharedBase, 128) > 0,
            COpenSSL_EVP_PKEY_derive(kdf, key.mutableBytes.baseAddress?.assumingMemoryBound(to: UInt8.self), &keyLength)
                > 0,
            keyLength == 16
        else { throw unavailable }
        return (Array(publicKey[..<length]), key)
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
    /// output of a decryption is the secret); a wrong key or tampered bytes
    /// fail the padding check.
    private static func aes(encrypt: Bool, key: SecureBytes, iv: [UInt8], _ input: SecureBytes) throws(BusError)
        -> SecureBytes
    {
        let output: SecureBytes
        do { output = try SecureBytes(count: input.count + 16) } catch { throw .failed("no memory for the secret") }
        guard input.count <= Int(Int32.max) - 16, let context = COpenSSL_EVP_CIPHER_CTX_new() else { throw unavailable }
        // Freeing the context clears its key schedule.
        defer { COpenSSL_EVP_CIPHER_CTX_free(context) }
        var written: Int32 = 0, last: Int32 = 0
        let out = output.mutableBytes.baseAddress!.assumingMemoryBound(to: UInt8.self)
        let done = key.withUnsafeBytes { key in
            input.withUnsafeBytes { input in
                COpenSSL_EVP_CipherInit_ex(
                    context, COpenSSL_EVP_aes_128_cbc(), nil, key.baseAddress?.assumingMemoryBound(to: UInt8.self),
                    iv, encrypt ? 1 : 0) > 0
                    && COpenSSL_EVP_CipherUpdate(
                        context, out, &written, input.baseAddress?.assumingMemoryBound(to: UInt8.self),
                        Int32(input.count)) > 0
                    && COpenSSL_EVP_CipherFinal_ex(context, out + Int(written), &last) > 0
            }
        }
        guard done else {
            throw encrypt
                ? .failed("could not encrypt the secret")
                : .invalidArguments("the secret does not decrypt in this session")
        }
        do {
            return try SecureBytes(
                copying: UnsafeRawBufferPointer(rebasing: output.mutableBytes[..<(Int(written) + Int(last))]))
        } catch {
            throw .failed("no memory for the secret")
        }
    }
}
