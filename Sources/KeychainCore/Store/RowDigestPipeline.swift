#if canImport(Glibc)
import Glibc
#endif

/// The boot check's row digests and table of generations, built on a second
/// thread while the caller reads the rows out of SQLite (at 100,000 items the
/// check is nearly all of a mount's wait; reading a row and naming it, on one
/// side, cost about what digesting it and filing its generation do on the
/// other, so two cores halve the wait: docs/BENCHMARKS.md, "2026-11-23 (day):
/// 100,000 items in less memory and a faster mount").
///
/// The caller adds each row (its identity, generation and digest message)
/// to a slot; a full slot goes to the digesting thread, and the caller
/// fills the next. Four slots of 64 KiB are handed back and forth with two
/// semaphores (the posts order the slots' bytes between the threads). The messages are what the database
/// holds in the clear (names, class, generation); the key stays in the
/// ``Crypto/KeyedHash``, which only the digesting thread uses. Without a
/// thread the caller digests each slot itself.
final class RowDigestPipeline: @unchecked Sendable {
    private static let slotCount = 4
    private static let slotSize = 64 << 10

    private let keyed: Crypto.KeyedHash
    private let slots: UnsafeMutableRawPointer
    /// The bytes used in each slot; 0 in the slot after the last: the end.
    private let used: UnsafeMutablePointer<Int>
    private let free: UnsafeMutablePointer<sem_t>
    private let filled: UnsafeMutablePointer<sem_t>
    private var thread: pthread_t?
    /// The digesting side's results, read after the join.
    private var digest = ItemSetState.emptyDigest
    private var generations: [RowIdentity: Int64] = [:]

    // The adding side's place.
    private var slot = 0
    private var fill = 0
    private var finished = false

    /// `expectedRows`: how many rows the table will hold (a capacity, not a
    /// limit). `concurrent: false` digests on the caller's thread, as when
    /// no thread can be made.
    init(keyed: Crypto.KeyedHash, expectedRows: Int, concurrent: Bool = true) {
        self.keyed = keyed
        generations.reserveCapacity(expectedRows)
        slots = UnsafeMutableRawPointer.allocate(byteCount: Self.slotCount * Self.slotSize, alignment: 64)
        used = UnsafeMutablePointer<Int>.allocate(capacity: Self.slotCount)
        used.initialize(repeating: 0, count: Self.slotCount)
        free = UnsafeMutablePointer<sem_t>.allocate(capacity: 1)
        filled = UnsafeMutablePointer<sem_t>.allocate(capacity: 1)
        sem_init(free, 0, UInt32(Self.slotCount - 1))  // the adding side holds slot 0
        sem_init(filled, 0, 0)
        if concurrent { thread = Threads.start(blockingSignals: true) { [self] in digestSlots() } }
    }

    deinit {
        precondition(finished, "finish() joins the digesting thread")
        sem_destroy(free)
        sem_destroy(filled)
        free.deallocate()
        filled.deallocate()
        used.deallocate()
        slots.deallocate()
    }

    /// A row in a slot: message length u16 | identity | generation | message.
    private static let headerSize = 2 + MemoryLayout<RowIdentity>.size + 8

    /// Adds one row (its names as UTF-8 bytes).
    func add(
        _ identity: RowIdentity, group: UnsafeRawBufferPointer, identifier: UnsafeRawBufferPointer,
        protectionClass: Int64, generation: Int64
    ) {
        let length = ItemSetState.rowMessageLength(group: group.count, identifier: identifier.count)
        precondition(length <= ItemSetState.maximumRowMessageLength, "names are checked before they are added")
        if fill + Self.headerSize + length > Self.slotSize { handOver() }
        let base = slots + slot * Self.slotSize + fill
        base.storeBytes(of: UInt16(length), as: UInt16.self)
        base.storeBytes(of: identity, toByteOffset: 2, as: RowIdentity.self)
        base.storeBytes(of: generation, toByteOffset: 2 + MemoryLayout<RowIdentity>.size, as: Int64.self)
        ItemSetState.writeRowMessage(
            to: base + Self.headerSize, group: group, identifier: identifier,
            protectionClass: protectionClass, generation: generation)
        fill += Self.headerSize + length
    }

    /// Digests what is left, ends the digesting thread and returns the XOR
    /// of every added row's digest, and each row's generation by identity
    /// (the last one added wins). Call once.
    func finish() -> (digest: [UInt8], generations: [RowIdentity: Int64]) {
        precondition(!finished)
        if fill > 0 { handOver() }
        used[slot] = 0
        if let thread {
            sem_post(filled)
            pthread_join(thread, nil)
        }
        finished = true
        return (digest, generations)
    }

    /// Gives the current slot to the digesting side and takes the next.
    private func handOver() {
        used[slot] = fill
        if thread != nil {
            sem_post(filled)
            slot = (slot + 1) % Self.slotCount
            while sem_wait(free) != 0 {}  // EINTR only: every signal is blocked here or handled elsewhere
        } else {
            digestSlot(slot)
        }
        fill = 0
    }

    /// The digesting thread: each filled slot in turn, until the end.
    private func digestSlots() {
        var next = 0
        while true {
            while sem_wait(filled) != 0 {}
            if used[next] == 0 { return }
            digestSlot(next)
            sem_post(free)
            next = (next + 1) % Self.slotCount
        }
    }

    private func digestSlot(_ index: Int) {
        let base = slots + index * Self.slotSize
        var offset = 0
        digest.withUnsafeMutableBytes { digest in
            while offset < used[index] {
                let row = base + offset
                let length = Int(row.loadUnaligned(as: UInt16.self))
                let identity = row.loadUnaligned(fromByteOffset: 2, as: RowIdentity.self)
                generations[identity] = row.loadUnaligned(
                    fromByteOffset: 2 + MemoryLayout<RowIdentity>.size, as: Int64.self)
                keyed.xorDigest(of: UnsafeRawBufferPointer(start: row + Self.headerSize, count: length), into: digest)
                offset += Self.headerSize + length
            }
        }
    }
}
