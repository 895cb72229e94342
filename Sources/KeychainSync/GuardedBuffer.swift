internal import CSodium

/// A buffer in libsodium's guarded memory (locked, fenced, wiped when
/// freed), of any size: a record's plaintext is assembled and opened here,
/// never in ordinary heap memory that Swift may copy or leave behind.
func withGuardedBuffer<R, E: Error>(count: Int, _ body: (UnsafeMutableRawBufferPointer) throws(E) -> R) throws(E) -> R {
    let size = max(count, 1)
    guard let memory = sodium_malloc(size) else { fatalError("sodium_malloc(\(size)) failed: out of memory") }
    defer {
        sodium_memzero(memory, size)
        sodium_free(memory)
    }
    return try body(UnsafeMutableRawBufferPointer(start: memory, count: count))
}

/// XChaCha20-Poly1305 between raw buffers (libsodium's, as the core's items use).
enum SyncCipher {
    static let nonceSize = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    static let tagSize = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)

    static func randomBytes(_ count: Int) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        randombytes_buf(&bytes, count)
        return bytes
    }

    static func seal(_ plaintext: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer, associatedData: [UInt8])
        -> [UInt8]
    {
        let nonce = randomBytes(nonceSize)
        var sealed = [UInt8](repeating: 0, count: plaintext.count + tagSize)
        var length: UInt64 = 0
        let status = crypto_aead_xchacha20poly1305_ietf_encrypt(
            &sealed, &length, plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count),
            associatedData, UInt64(associatedData.count), nil, nonce,
            key.baseAddress!.assumingMemoryBound(to: UInt8.self))
        precondition(status == 0, "XChaCha20-Poly1305 encryption cannot fail")
        return nonce + sealed
    }

    /// The plaintext length of `nonce | sealed`; nil when too short to be one.
    static func plaintextCount(_ sealed: ArraySlice<UInt8>) -> Int? {
        sealed.count >= nonceSize + tagSize ? sealed.count - nonceSize - tagSize : nil
    }

    /// Opens `nonce | sealed` into `output` (of ``plaintextCount(_:)`` bytes); false when it does not open.
    static func open(
        _ sealed: ArraySlice<UInt8>, key: UnsafeRawBufferPointer, associatedData: [UInt8],
        into output: UnsafeMutableRawBufferPointer
    ) -> Bool {
        guard let count = plaintextCount(sealed), output.count == count else { return false }
        let bytes = Array(sealed)
        var length: UInt64 = 0
        let status = bytes.withUnsafeBufferPointer { all in
            crypto_aead_xchacha20poly1305_ietf_decrypt(
                output.baseAddress?.assumingMemoryBound(to: UInt8.self), &length, nil,
                all.baseAddress! + nonceSize, UInt64(all.count - nonceSize), associatedData,
                UInt64(associatedData.count), all.baseAddress!, key.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
        return status == 0 && Int(length) == count
    }
}
