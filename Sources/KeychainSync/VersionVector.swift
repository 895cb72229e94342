import KeychainCore

/// Which device made which change of an item: one counter per device
/// that changed it. Two versions are ordered when one's counters are all
/// at least the other's; otherwise they were made without knowing of each
/// other (concurrent), and the merge rule decides (``MergeRule``).
package struct VersionVector: Equatable, Sendable {
    package private(set) var counters: [UInt64: UInt64]

    package init(_ counters: [UInt64: UInt64] = [:]) { self.counters = counters.filter { $0.value > 0 } }

    package enum Order: Equatable, Sendable { case equal, before, after, concurrent }

    /// How this version stands to `other`: `.before` when `other` saw it.
    package func compare(_ other: VersionVector) -> Order {
        var less = false
        var greater = false
        for device in Set(counters.keys).union(other.counters.keys) {
            let mine = counters[device] ?? 0
            let theirs = other.counters[device] ?? 0
            if mine < theirs { less = true }
            if mine > theirs { greater = true }
        }
        switch (less, greater) {
        case (false, false): return .equal
        case (true, false): return .before
        case (false, true): return .after
        case (true, true): return .concurrent
        }
    }

    /// The least version that saw both.
    package func merged(with other: VersionVector) -> VersionVector {
        VersionVector(counters.merging(other.counters, uniquingKeysWith: max))
    }

    /// This version with `device`'s counter set to `counter` (a change by it).
    package func advanced(by device: UInt64, to counter: UInt64) -> VersionVector {
        var next = self
        next.counters[device] = max(counter, counters[device] ?? 0)
        return next
    }

    func encode(into writer: inout ByteWriter) {
        writer.append(UInt16(counters.count))
        for (device, counter) in counters.sorted(by: { $0.key < $1.key }) {
            writer.append(device)
            writer.append(counter)
        }
    }

    init<Bytes>(reading reader: inout ByteReader<Bytes>) throws(KeychainError) {
        let count = Int(try reader.readUInt16())
        var counters: [UInt64: UInt64] = [:]
        var previous: UInt64? = nil
        for _ in 0..<count {
            let device = try reader.readUInt64(), counter = try reader.readUInt64()
            // One spelling only: ascending devices, no zero counter.
            guard counter > 0, previous.map({ $0 < device }) ?? true else { throw .decode }
            previous = device
            counters[device] = counter
        }
        self.counters = counters
    }
}
