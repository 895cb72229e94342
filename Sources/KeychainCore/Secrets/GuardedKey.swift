internal import CSodium
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A long-lived 32-byte key in libsodium guarded memory: guard pages around
/// it, `mlock`ed, and `PROT_NONE` while idle, so a stray read elsewhere in
/// the process cannot reach it.
///
/// "Idle" is ``idleMilliseconds`` after the last use: the first use makes
/// the page readable, and a background thread takes that back once nobody
/// used the key for that long. Protecting it again after every single use
/// cost two `mprotect`s per item read, each a TLB flush (8 µs of a 32 µs
/// read on these VMs, docs/BENCHMARKS.md); a burst of reads now pays for
/// one pair, and a key no one uses is unreadable as before.
final class GuardedKey: Sendable {
    static let size = 32
    /// How long a key stays readable after its last use.
    static let idleMilliseconds: Int64 = 50

    // nonisolated(unsafe): the pointer itself never changes; access to the
    // memory behind it is what `use` serializes.
    nonisolated(unsafe) let pointer: UnsafeMutableRawPointer

    private struct Use {
        /// How many callers are inside `withKey`.
        var users = 0
        var readable = false
        /// When the last caller left `withKey`, monotonic ms.
        var lastUse: Int64 = 0
    }
    private let use = Mutex(Use())

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
        let madeReadable = use.withLock { use -> Bool in
            use.users += 1
            guard !use.readable else { return false }
            sodium_mprotect_readonly(pointer)
            use.readable = true
            return true
        }
        if madeReadable { IdleKeys.watch(self) }
        defer {
            let now = MonotonicClock.milliseconds()
            use.withLock { use in
                use.users -= 1
                use.lastUse = now
            }
        }
        return try body(UnsafePointer(pointer.assumingMemoryBound(to: UInt8.self)))
    }

    /// Makes the key unreadable if nobody has used it for ``idleMilliseconds``
    /// by `now`; returns when to look again (nil: it is unreadable).
    func protectIfIdle(now: Int64) -> Int64? {
        use.withLock { use -> Int64? in
            guard use.readable else { return nil }
            let idleFrom = use.users > 0 ? now : use.lastUse
            guard now - idleFrom >= Self.idleMilliseconds else { return idleFrom + Self.idleMilliseconds }
            sodium_mprotect_noaccess(pointer)
            use.readable = false
            return nil
        }
    }
}

/// The keys made readable and not yet idle, and the one thread per process
/// that makes them unreadable again.
enum IdleKeys {
    private struct Watched {
        weak var key: GuardedKey?
    }
    private struct State {
        var keys: [Watched] = []
        var thread: WakeableThread?
    }
    private static let state = Mutex(State())

    /// Starts watching a key that was just made readable.
    static func watch(_ key: GuardedKey) {
        let thread = state.withLock { state -> WakeableThread? in
            state.keys.append(Watched(key: key))
            if state.thread == nil { state.thread = WakeableThread("key protection") { protectIdleKeys() } }
            return state.thread
        }
        if let thread {
            thread.wake()
        } else {
            // No thread: protect at once rather than leave the key readable.
            _ = key.protectIfIdle(now: Int64.max / 2)
        }
    }

    /// Protects the idle keys; returns when to look again.
    static func protectIdleKeys() -> WakeableThread.Next {
        let now = MonotonicClock.milliseconds()
        let watched = state.withLock { $0.keys }
        var next: Int64?
        var stillReadable: [Watched] = []
        for entry in watched {
            guard let key = entry.key, let due = key.protectIfIdle(now: now) else { continue }
            stillReadable.append(entry)
            next = min(next ?? due, due)
        }
        // Keys watched meanwhile were appended after the ones looked at here.
        let added = state.withLock { state -> Bool in
            state.keys = stillReadable + state.keys[watched.count...]
            return state.keys.count > stillReadable.count
        }
        if added { return .after(milliseconds: 0) }
        guard let next else { return .whenWoken }
        return .after(milliseconds: Int32(clamping: max(1, next - now)))
    }
}
