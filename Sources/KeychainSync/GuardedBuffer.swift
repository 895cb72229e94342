internal import CSodium
import KeychainCore

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

/// XChaCha20-Poly1305 as the core's items use it (``Crypto``), opened into a
/// guarded buffer of any size: a padded record may exceed the secret arena's largest slot.
enum SyncCipher {
    static let nonceSize = Crypto.nonceSize
    static let tagSize = Crypto.tagSize

    /// `nonce | sealed`, under a fresh random nonce.
    static func seal(_ plaintext: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer, associatedData: [UInt8])
        -> [UInt8]
    {
        let nonce = Crypto.randomBytes(nonceSize)
        return nonce
            + Crypto.seal(
                plaintext, key: key.baseAddress!.assumingMemoryBound(to: UInt8.self), nonce: nonce,
                associatedData: associatedData)
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
