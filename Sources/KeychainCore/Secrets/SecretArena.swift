internal import CSodium
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One locked, never-dumped region from which per-request plaintext buffers
/// are cut in size classes.
///
/// Why not `sodium_malloc` per request: it costs 32-35 µs here (two guard
/// pages and an mprotect each time), more than a whole FUSE read. Slots are
/// `mlock`ed so they never reach swap (within RLIMIT_MEMLOCK; past it they are
/// still excluded from core dumps), and zeroed when released.
final class SecretArena: Sendable {
    /// The process-wide arena.
    static let shared = SecretArena()

    /// Slot sizes: 64 B to 1 MiB in powers of four (1 MiB is the value
    /// limit), and 2 MiB for a protocol frame carrying a whole value and its names.
    static let classSizes: [Int] = [64, 256, 1024, 4096, 16384, 65536, 262_144, 1_048_576, 2_097_152]
    /// The most bytes a fresh mapping for the small classes is cut into.
    private static let slabSize = 65536
    /// Slots per fresh mapping of a small class, within a page and ``slabSize``.
    private static let slotsPerSlab = 16
    /// Free large slots kept mapped for reuse; more are unmapped on release.
    private static let keptLargeSlots = 4

    private struct State: ~Copyable {
        // Addresses as integers: raw pointers are not Sendable into the Mutex.
        var free: [[UInt]] = Array(repeating: [], count: SecretArena.classSizes.count)
        /// Per class, the addresses of its newest slab no slot was cut from
        /// yet: slots are cut when asked for, so a process that needs one
        /// slot does not list the slab's 1,023 others.
        var uncut: [Addresses] = Array(repeating: Addresses(start: 0, end: 0), count: SecretArena.classSizes.count)
        var lockedBytes = 0
        var unlockedBytes = 0
        /// The large slots (each a mapping of its own) that `mlock` could
        /// not pin: when one is unmapped, it leaves the unlocked count, not
        /// the locked one.
        var unlockedLarge: Set<UInt> = []
    }
    private let state = Mutex(State())
    /// Pins a fresh mapping (`mlock`); false past RLIMIT_MEMLOCK.
    private let lock: @Sendable (UnsafeMutableRawPointer, Int) -> Bool
    /// Unpins a mapping before it is unmapped (`munlock`).
    private let unlock: @Sendable (UnsafeMutableRawPointer, Int) -> Void
    /// Whether a large slot that cannot be pinned is refused rather than
    /// handed out in memory that may reach swap: the service sets it
    /// (``refuseUnlockedLargeSlots()``), where a flood of requests announcing
    /// large bodies once left every user's later large request in swappable
    /// memory. Small slots are never refused: every command needs a few.
    private let refusesUnlocked = Atomic<Bool>(false)

    /// An arena whose fresh mappings `lock` pins and `unlock` unpins (a
    /// test's stand-ins for `mlock` and `munlock`).
    init(
        lock: @escaping @Sendable (UnsafeMutableRawPointer, Int) -> Bool = { mlock($0, $1) == 0 },
        unlock: @escaping @Sendable (UnsafeMutableRawPointer, Int) -> Void = { munlock($0, $1) }
    ) {
        self.lock = lock
        self.unlock = unlock
    }

    /// From now on a large slot (a request's or reply's body, 64 KiB and
    /// more) that cannot be pinned is refused (``allocate(capacity:)`` is nil).
    package func refuseUnlockedLargeSlots() {
        refusesUnlocked.store(true, ordering: .relaxed)
    }

    /// `start..<end`, as a struct of its own: `Range<UInt>`'s metadata is
    /// made at run time from its mangled name, which looks up `UInt:
    /// Comparable` by scanning every protocol conformance of the program,
    /// and the arena is made by every `keychainfs get` (14 of its 175 page
    /// faults, docs/BENCHMARKS.md).
    private struct Addresses {
        var start: UInt
        var end: UInt
    }

    /// The largest buffer the arena hands out.
    static var maximumSize: Int { classSizes[classSizes.count - 1] }

    /// Bytes of the arena that `mlock` pinned, and bytes it could not pin.
    var residency: (locked: Int, unlocked: Int) {
        state.withLock { ($0.lockedBytes, $0.unlockedBytes) }
    }

    static func sizeClass(for capacity: Int) -> Int? {
        classSizes.firstIndex { $0 >= capacity }
    }

    /// A zeroed slot of at least `capacity` bytes; nil past ``maximumSize``,
    /// or for a large one that cannot be pinned once the arena refuses those.
    func allocate(capacity: Int) -> (pointer: UnsafeMutableRawPointer, sizeClass: Int)? {
        guard let sizeClass = Self.sizeClass(for: max(capacity, 1)) else { return nil }
        let slotSize = Self.classSizes[sizeClass]
        return state.withLock { state in
            if let address = state.free[sizeClass].popLast() {
                return (UnsafeMutableRawPointer(bitPattern: address)!, sizeClass)
            }
            let uncut = state.uncut[sizeClass]
            if uncut.start < uncut.end {
                state.uncut[sizeClass].start = uncut.start + UInt(slotSize)
                return (UnsafeMutableRawPointer(bitPattern: uncut.start)!, sizeClass)
            }
            // A fresh mapping is zeroed (mmap(2)); its first slot is this one.
            let mapping = Self.mappingSize(forSlotsOf: slotSize)
            let refusing = slotSize >= Self.slabSize && refusesUnlocked.load(ordering: .relaxed)
            // Free large slots of other sizes are a cache: under the limit they give way first (a
            // flood once left 8 MiB of them pinned, and every later large request was refused).
            guard
                let (pointer, locked) = mapSecretRegion(bytes: mapping, refusingUnlocked: refusing, state: &state)
                    ?? (evictFreeLargeSlots(&state)
                        ? mapSecretRegion(bytes: mapping, refusingUnlocked: refusing, state: &state, log: true) : nil)
            else { return nil }
            if !locked, slotSize >= Self.slabSize { state.unlockedLarge.insert(UInt(bitPattern: pointer)) }
            state.uncut[sizeClass] = Addresses(
                start: UInt(bitPattern: pointer + slotSize), end: UInt(bitPattern: pointer + mapping))
            return (pointer, sizeClass)
        }
    }

    /// How many bytes a fresh mapping for slots of `slotSize` takes: a few
    /// slots, not a whole slab per class, because `mlock` makes the kernel
    /// fault in and zero every page of it at once. A `keychainfs get` cuts
    /// one slot of each of two classes: two 64 KiB slabs were 32 pages
    /// zeroed for 2 slots, 6% of the command's time (perf, docs/BENCHMARKS.md).
    static func mappingSize(forSlotsOf slotSize: Int) -> Int {
        guard slotSize < slabSize else { return slotSize }
        return min(max(slotSize * slotsPerSlab, Int(sysconf(Int32(_SC_PAGESIZE)))), slabSize)
    }

    /// Wipes the first `used` bytes of a slot and takes it back.
    func release(_ pointer: UnsafeMutableRawPointer, sizeClass: Int, used: Int) {
        sodium_memzero(pointer, min(used, Self.classSizes[sizeClass]))
        let slotSize = Self.classSizes[sizeClass]
        let address = UInt(bitPattern: pointer)
        let unmap = state.withLock { state -> (unmap: Bool, locked: Bool) in
            if slotSize >= Self.slabSize && state.free[sizeClass].count >= Self.keptLargeSlots {
                // Counted where it was counted when mapped: locked, or not.
                if state.unlockedLarge.remove(address) != nil {
                    state.unlockedBytes -= slotSize
                    return (true, false)
                }
                state.lockedBytes -= slotSize
                return (true, true)
            }
            state.free[sizeClass].append(address)
            return (false, false)
        }
        if unmap.unmap {
            if unmap.locked { unlock(pointer, slotSize) }
            munmap(pointer, slotSize)
        }
    }

    /// Unmaps every free large slot (unpinning it); whether there was one.
    private func evictFreeLargeSlots(_ state: inout State) -> Bool {
        var evicted = false
        for (sizeClass, slotSize) in Self.classSizes.enumerated() where slotSize >= Self.slabSize {
            for address in state.free[sizeClass] {
                let pointer = UnsafeMutableRawPointer(bitPattern: address)!
                if state.unlockedLarge.remove(address) != nil {
                    state.unlockedBytes -= slotSize
                } else {
                    state.lockedBytes -= slotSize
                    unlock(pointer, slotSize)
                }
                munmap(pointer, slotSize)
                evicted = true
            }
            state.free[sizeClass] = []
        }
        return evicted
    }

    /// A fresh zeroed mapping of `bytes`, and whether it is pinned; nil when
    /// it could not be pinned and `refusingUnlocked` says to refuse it then
    /// (said in the log when `log`, or when nothing can give way).
    private func mapSecretRegion(bytes: Int, refusingUnlocked: Bool, state: inout State, log: Bool? = nil) -> (
        UnsafeMutableRawPointer, Bool
    )? {
        guard let raw = mmap(nil, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
            raw != MAP_FAILED
        else {
            preconditionFailure("out of memory mapping \(bytes) bytes for secrets")
        }
        // MADV_DONTDUMP: never part of a core dump, even where dumps are enabled.
        _ = madvise(raw, bytes, MADV_DONTDUMP)
        if lock(raw, bytes) {
            state.lockedBytes += bytes
            return (raw, true)
        }
        if refusingUnlocked {
            munmap(raw, bytes)
            let freeLarge = Self.classSizes.indices.contains {
                Self.classSizes[$0] >= Self.slabSize && !state.free[$0].isEmpty
            }
            guard log ?? !freeLarge else { return nil }
            Diagnostics.log(
                "refused \(bytes) bytes of secret memory that RLIMIT_MEMLOCK would leave unlocked "
                    + "(\(state.lockedBytes) bytes locked): the request that needed them is refused, not swapped")
            return nil
        }
        if state.unlockedBytes == 0 {
            Diagnostics.log(
                "cannot mlock secret memory past RLIMIT_MEMLOCK (\(state.lockedBytes) bytes locked): "
                    + "further secrets may reach swap; raise the limit (ulimit -l)")
        }
        state.unlockedBytes += bytes
        return (raw, false)
    }
}

/// One slot of the secret arena, owned by one buffer (``SecureBytes``,
/// ``SecureBuffer``): when it goes away, the bytes it ever held are wiped
/// and the slot goes back to the arena. Not copyable, so a slot has exactly
/// one owner and is released exactly once.
struct ArenaSlot: ~Copyable {
    let pointer: UnsafeMutableRawPointer
    private let sizeClass: Int
    /// How many bytes from the start have ever held data: what release wipes.
    var used: Int

    /// A zeroed slot of at least `capacity` bytes; ``KeychainError/valueTooLarge``
    /// past ``SecretArena/maximumSize``.
    init(capacity: Int, used: Int = 0) throws(KeychainError) {
        guard let slot = SecretArena.shared.allocate(capacity: capacity) else {
            // Past the largest class, or a large slot the service refused to leave unlocked.
            throw capacity > SecretArena.maximumSize ? .valueTooLarge : .io
        }
        pointer = slot.pointer
        sizeClass = slot.sizeClass
        self.used = used
    }

    /// The bytes the slot holds (its size class).
    var capacity: Int { SecretArena.classSizes[sizeClass] }

    deinit {
        SecretArena.shared.release(pointer, sizeClass: sizeClass, used: used)
    }
}
