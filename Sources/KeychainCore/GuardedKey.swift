internal import CSodium
import Synchronization

/// A long-lived 32-byte key in libsodium guarded memory: guard pages around
/// it, `mlock`ed, and `PROT_NONE` except while a caller is using it, so a
/// stray read elsewhere in the process cannot reach it.
final class GuardedKey: Sendable {
    static let size = 32

    // nonisolated(unsafe): the pointer itself never changes; access to the
    // memory behind it is what `users` serializes.
    nonisolated(unsafe) let pointer: UnsafeMutableRawPointer
    /// How many callers are inside `withKey`; the page is readable while > 0.
    private let users = Mutex(0)

    /// A fresh random key.
    static func random() -> GuardedKey {
        GuardedKey { randombytes_buf($0, GuardedKey.size) }
    }

    /// A key copied from 32 bytes of secret memory.
    convenience init(copying bytes: SecureBytes) {
        precondition(bytes.count == GuardedKey.size, "a class key is 32 bytes")
        self.init { destination in
            bytes.withUnsafeBytes { destination.copyMemory(from: $0.baseAddress!, byteCount: GuardedKey.size) }
        }
    }

    private init(fill: (UnsafeMutableRawPointer) -> Void) {
        Sodium.ensureInitialized()
        guard let memory = sodium_malloc(GuardedKey.size) else {
            preconditionFailure("sodium_malloc failed for a 32-byte key")
        }
        fill(memory)
        sodium_mprotect_noaccess(memory)
        pointer = memory
    }

    deinit {
        // sodium_free zeroes the memory before unmapping it.
        sodium_mprotect_readwrite(pointer)
        sodium_free(pointer)
    }

    /// Lends the key bytes while `body` runs.
    func withKey<R, E: Error>(_ body: (UnsafePointer<UInt8>) throws(E) -> R) throws(E) -> R {
        users.withLock { count in
            if count == 0 { sodium_mprotect_readonly(pointer) }
            count += 1
        }
        defer {
            users.withLock { count in
                count -= 1
                if count == 0 { sodium_mprotect_noaccess(pointer) }
            }
        }
        return try body(UnsafePointer(pointer.assumingMemoryBound(to: UInt8.self)))
    }
}

/// libsodium's one-time initialisation.
enum Sodium {
    private static let initialized: Bool = sodium_init() >= 0

    static func ensureInitialized() {
        precondition(initialized, "libsodium failed to initialise")
    }
}
