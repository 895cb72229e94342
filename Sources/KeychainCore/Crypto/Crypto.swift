import Synchronization
internal import CSodium
#if canImport(Glibc)
import Glibc
#endif

/// The few primitives the keychain uses, each written once: XChaCha20-Poly1305
/// (items and wrapped keys), Argon2id (passcodes), BLAKE2b (key derivation, MACs).
package enum Crypto {
    package static let keySize = 32
    package static let nonceSize = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    package static let tagSize = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)
    package static let saltSize = Int(crypto_pwhash_SALTBYTES)
    package static let macSize = 32

    package static func randomBytes(_ count: Int) -> [UInt8] {
        Sodium.ensureInitialized()
        var bytes = [UInt8](repeating: 0, count: count)
        randombytes_buf(&bytes, count)
        return bytes
    }

    /// Encrypts `plaintext` under `key`; returns ciphertext followed by the 16-byte tag.
    package static func seal(
        _ plaintext: UnsafeRawBufferPointer, key: UnsafePointer<UInt8>,
        nonce: [UInt8], associatedData: [UInt8]
    ) -> [UInt8] {
        precondition(nonce.count == nonceSize)
        var sealed = [UInt8](repeating: 0, count: plaintext.count + tagSize)
        var sealedCount: UInt64 = 0
        let status = crypto_aead_xchacha20poly1305_ietf_encrypt(
            &sealed, &sealedCount,
            plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count),
            associatedData, UInt64(associatedData.count), nil, nonce, key)
        precondition(status == 0 && Int(sealedCount) == sealed.count, "XChaCha20-Poly1305 encryption cannot fail")
        return sealed
    }

    /// Decrypts and authenticates into secret memory; ``KeychainError/decode``
    /// if the bytes, nonce, associated data or key are not the ones sealed.
    package static func open(
        _ sealed: [UInt8], key: UnsafePointer<UInt8>,
        nonce: [UInt8], associatedData: [UInt8]
    ) throws(KeychainError) -> SecureBytes {
        guard sealed.count >= tagSize, nonce.count == nonceSize else { throw .decode }
        let plaintext = try SecureBytes(count: sealed.count - tagSize)
        var plaintextCount: UInt64 = 0
        let status = crypto_aead_xchacha20poly1305_ietf_decrypt(
            plaintext.mutableBytes.baseAddress?.assumingMemoryBound(to: UInt8.self), &plaintextCount, nil,
            sealed, UInt64(sealed.count), associatedData, UInt64(associatedData.count), nonce, key)
        guard status == 0 else { throw .decode }
        return plaintext
    }

    /// Argon2id of a passcode (libsodium's crypto_pwhash, algorithm ARGON2ID13).
    package static func stretch(passcode: SecureBytes, salt: [UInt8], parameters: KDFParameters) throws(KeychainError)
        -> SecureBytes
    {
        precondition(salt.count == saltSize)
        let output = try SecureBytes(count: keySize)
        try PasswordHashingBudget.shared.take(parameters.memLimit)
        defer { PasswordHashingBudget.shared.give(parameters.memLimit) }
        let status = passcode.withUnsafeBytes { secret in
            crypto_pwhash(
                output.mutableBytes.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(keySize),
                secret.baseAddress!.assumingMemoryBound(to: CChar.self), UInt64(secret.count),
                salt, parameters.opsLimit, Int(parameters.memLimit), crypto_pwhash_ALG_ARGON2ID13)
        }
        // crypto_pwhash fails only when it cannot allocate memLimit bytes.
        guard status == 0 else { throw .io }
        return output
    }

    /// Keyed BLAKE2b-256 of the concatenated parts: MACs and key combination.
    package static func mac(key: UnsafePointer<UInt8>, _ parts: [UnsafeRawBufferPointer]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: macSize)
        out.withUnsafeMutableBytes { blake2b(key: key, parts, into: $0) }
        return out
    }

    /// Unkeyed BLAKE2b-256 (a digest of what is not secret: an item's sealed details).
    package static func hash(_ bytes: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: macSize)
        out.withUnsafeMutableBytes { output in
            bytes.withUnsafeBytes { blake2b(key: nil, [$0], into: output) }
        }
        return out
    }

    /// Keyed BLAKE2b-256 into secret memory (for derived keys).
    package static func deriveKey(key: UnsafePointer<UInt8>, _ parts: [UnsafeRawBufferPointer]) -> SecureBytes {
        let out = try! SecureBytes(count: keySize)
        blake2b(key: key, parts, into: out.mutableBytes)
        return out
    }

    private static func blake2b(
        key: UnsafePointer<UInt8>?, _ parts: [UnsafeRawBufferPointer],
        into output: UnsafeMutableRawBufferPointer
    ) {
        // The state is a 64-byte-aligned struct Swift imports as opaque: own
        // its memory, and wipe it, since it holds the key.
        let stateSize = crypto_generichash_statebytes()
        let state = UnsafeMutableRawPointer.allocate(byteCount: stateSize, alignment: 64)
        defer {
            sodium_memzero(state, stateSize)
            state.deallocate()
        }
        let handle = OpaquePointer(state)
        crypto_generichash_init(handle, key, key == nil ? 0 : keySize, output.count)
        for part in parts {
            crypto_generichash_update(handle, part.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(part.count))
        }
        crypto_generichash_final(handle, output.baseAddress!.assumingMemoryBound(to: UInt8.self), output.count)
    }

    /// Subkey `id` of a master key under an 8-character context (crypto_kdf, BLAKE2b).
    package static func subkey(of master: UnsafePointer<UInt8>, id: UInt64, context: StaticString) -> SecureBytes {
        precondition(context.utf8CodeUnitCount == 8)
        let out = try! SecureBytes(count: keySize)
        let status = context.withUTF8Buffer { ctx in
            ctx.withMemoryRebound(to: CChar.self) { ctx in
                crypto_kdf_derive_from_key(
                    out.mutableBytes.baseAddress!.assumingMemoryBound(to: UInt8.self), keySize,
                    id, ctx.baseAddress!, master)
            }
        }
        precondition(status == 0)
        return out
    }

    package static let shortHashKeySize = Int(crypto_shorthash_siphashx24_KEYBYTES)

    /// SipHash-2-4 with 128 bits of output: a fast keyed hash for tables
    /// (no MAC: 16-byte key, 128-bit result).
    package static func shortHash128(_ message: UnsafeRawBufferPointer, key: [UInt8]) -> (UInt64, UInt64) {
        precondition(key.count == shortHashKeySize)
        var words: (UInt64, UInt64) = (0, 0)
        withUnsafeMutableBytes(of: &words) { out in
            _ = crypto_shorthash_siphashx24(
                out.baseAddress!.assumingMemoryBound(to: UInt8.self),
                message.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(message.count), key)
        }
        return words
    }

    package static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        a.count == b.count && sodium_memcmp(a, b, a.count) == 0
    }
}

/// Argon2id cost parameters, stored with the keychain.
public struct KDFParameters: Sendable, Equatable {
    /// Passes over memory (libsodium opslimit).
    public var opsLimit: UInt64
    /// Memory in bytes (libsodium memlimit).
    public var memLimit: UInt64

    /// Parameters as libsodium names them.
    public init(opsLimit: UInt64, memLimit: UInt64) {
        self.opsLimit = opsLimit
        self.memLimit = memLimit
    }

    /// libsodium's INTERACTIVE level: 2 passes over 64 MiB, 75-97 ms on the
    /// reference machine (docs/BENCHMARKS.md), the "about 100 ms" the design asks.
    public static let interactive = KDFParameters(opsLimit: 2, memLimit: 64 << 20)
    /// libsodium's MODERATE level: 3 passes over 256 MiB, ~0.65 s. For backups,
    /// which leave the device and face offline guessing with no device secret.
    public static let moderate = KDFParameters(opsLimit: 3, memLimit: 256 << 20)
    /// The cheapest parameters libsodium accepts: for tests only.
    public static let insecureFastForTests = KDFParameters(opsLimit: 1, memLimit: 8192)

    /// At least libsodium's minimum (one pass, 8 KiB) and at most `ceiling` in passes and in memory.
    public func isWithin(_ ceiling: KDFParameters) -> Bool {
        (1...ceiling.opsLimit).contains(opsLimit) && (8192...ceiling.memLimit).contains(memLimit)
    }
}

extension Crypto {
    /// Keyed BLAKE2b-256 with the key's block absorbed once, for hashing many
    /// short messages under one key: keyed BLAKE2b spends a compression on
    /// the key's block, half the work for a short message. The absorbed
    /// state stands for the key: it lives in the secret arena (locked,
    /// wiped on release), and the working copy is wiped after each message.
    /// One thread at a time: the working copy is shared (libsodium's state
    /// must be 64-byte aligned, which Swift's stack allocations are not).
    final class KeyedHash: @unchecked Sendable {
        private static let stateSize = crypto_generichash_statebytes()
        /// The absorbed state, then the working copy, then the MAC.
        private let memory: SecureBytes
        private var absorbed: UnsafeMutableRawPointer { memory.pointer }
        private var working: UnsafeMutableRawPointer { memory.pointer + Self.stateSize }

        init(key: UnsafePointer<UInt8>) {
            memory = try! SecureBytes(count: 2 * Self.stateSize + macSize)
            precondition(
                Int(bitPattern: memory.pointer) % 64 == 0, "the secret arena's slots are aligned to their size")
            crypto_generichash_init(OpaquePointer(absorbed), key, keySize, macSize)
        }

        /// The MAC of the concatenated `parts` into `output` (``macSize`` bytes).
        func mac(_ parts: UnsafeRawBufferPointer..., into output: UnsafeMutableRawBufferPointer) {
            precondition(output.count == macSize)
            defer { sodium_memzero(working, Self.stateSize) }
            working.copyMemory(from: absorbed, byteCount: Self.stateSize)
            for part in parts {
                crypto_generichash_update(
                    OpaquePointer(working), part.baseAddress?.assumingMemoryBound(to: UInt8.self),
                    UInt64(part.count))
            }
            crypto_generichash_final(
                OpaquePointer(working), output.baseAddress!.assumingMemoryBound(to: UInt8.self), macSize)
        }

        /// XORs the MAC of `message` into `output` (``macSize`` bytes).
        func xorDigest(of message: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer) {
            let mac = UnsafeMutableRawBufferPointer(start: working + Self.stateSize, count: macSize)
            defer { sodium_memzero(mac.baseAddress, macSize) }
            self.mac(message, into: mac)
            for index in 0..<macSize { output[index] ^= mac[index] }
        }
    }
}

/// The memory Argon2id may use at once in this process: a hashing that
/// would go past it waits for others to end. A service hashes for
/// every user (unlocks, restores, passcode changes): without a bound, many
/// at once, each of up to ``BackupFile/costCeiling``'s 256 MiB, took the
/// service to 5 GiB and another user's `get` from 17 ms to 13 s
/// (docs/SECURITY.md, "What an ordinary user of the machine can try"). 512 MiB: two backups'
/// hashing, or eight unlocks', at once, on two cores.
package final class PasswordHashingBudget: @unchecked Sendable {
    package static let shared = PasswordHashingBudget(bytes: 512 << 20)

    private let capacity: UInt64
    private var inUse: UInt64 = 0
    private var mutex = pthread_mutex_t()
    private var freed = pthread_cond_t()

    init(bytes: UInt64) {
        capacity = bytes
        pthread_mutex_init(&mutex, nil)
        pthread_cond_init(&freed, nil)
    }

    /// For each thread hashing for a client (``forClient(_:_:)``): whether
    /// that client is still there.
    private static let clients = Mutex<[pthread_t: @Sendable () -> Bool]>([:])

    /// Runs `body`, whose password hashing on this thread is for a client
    /// that `present` says is still connected: a hashing that waits for
    /// room gives up once the client has left, and none starts after
    /// (``KeychainError/badRequest``): nobody would read its answer, and a
    /// client that hangs up must not leave its cost behind. (A hashing that
    /// runs cannot be stopped: libsodium's `crypto_pwhash` is one call.)
    package static func forClient<R>(
        _ present: @escaping @Sendable () -> Bool, _ body: () throws(KeychainError) -> R
    ) throws(KeychainError) -> R {
        let thread = pthread_self()
        clients.withLock { $0[thread] = present }
        defer { _ = clients.withLock { $0.removeValue(forKey: thread) } }
        return try body()
    }

    /// Waits until `bytes` fit beside what runs (one larger than the whole
    /// budget runs alone), then counts them; gives up when the client this
    /// thread hashes for has left (checked every 100 ms while it waits).
    func take(_ bytes: UInt64) throws(KeychainError) {
        let present = Self.clients.withLock { $0[pthread_self()] }
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        while inUse > 0 && inUse + bytes > capacity {
            guard let present else {
                pthread_cond_wait(&freed, &mutex)
                continue
            }
            guard present() else { throw .badRequest }
            var deadline = timespec()
            clock_gettime(CLOCK_REALTIME, &deadline)
            deadline.tv_nsec += 100_000_000
            if deadline.tv_nsec >= 1_000_000_000 {
                deadline.tv_sec += 1
                deadline.tv_nsec -= 1_000_000_000
            }
            pthread_cond_timedwait(&freed, &mutex, &deadline)
        }
        if let present, !present() { throw .badRequest }
        inUse += bytes
    }

    func give(_ bytes: UInt64) {
        pthread_mutex_lock(&mutex)
        inUse -= bytes
        pthread_cond_broadcast(&freed)
        pthread_mutex_unlock(&mutex)
    }
}
