internal import CSodium

/// A growable buffer of secret bytes (a value being written through an open
/// file), held in the locked secret arena. Growing moves the bytes to a larger
/// slot and wipes the old one. Not thread-safe: its owner serializes access.
public final class SecureBuffer {
    private var slot: ArenaSlot
    private var pointer: UnsafeMutableRawPointer { slot.pointer }
    /// Number of bytes held.
    public private(set) var count = 0
    /// The most bytes it may hold: a value's limit, unless made for more.
    private let limit: Int

    /// An empty buffer of at most `limit` bytes (past it, ``KeychainError/valueTooLarge``).
    public init(limit: Int = ItemLimits.maximumValueSize) {
        slot = try! ArenaSlot(capacity: 1)
        self.limit = limit
    }

    /// A buffer holding a copy of `bytes`.
    public convenience init(copying bytes: SecureBytes) throws(KeychainError) {
        self.init()
        try bytes.withUnsafeBytes { (raw: UnsafeRawBufferPointer) throws(KeychainError) in try write(raw, at: 0) }
    }

    private func reserve(_ needed: Int) throws(KeychainError) {
        guard needed > slot.capacity else { return }
        guard needed <= limit else { throw .valueTooLarge }
        let grown = try ArenaSlot(capacity: needed, used: count)
        grown.pointer.copyMemory(from: pointer, byteCount: count)
        slot = grown  // the old slot is wiped and released
    }

    /// Writes `bytes` at `offset`, zero-filling any gap (as a sparse write
    /// past the end of a file reads back as zeros). ``KeychainError/valueTooLarge``
    /// when the result would pass its limit (a value's: 1 MiB); then nothing changes.
    public func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(KeychainError) {
        guard offset >= 0 else { throw .param }
        let (end, overflow) = offset.addingReportingOverflow(bytes.count)
        guard !overflow, end <= limit else { throw .valueTooLarge }
        try reserve(end)
        if offset > count { (pointer + count).initializeMemory(as: UInt8.self, repeating: 0, count: offset - count) }
        if let base = bytes.baseAddress, bytes.count > 0 {
            (pointer + offset).copyMemory(from: base, byteCount: bytes.count)
        }
        count = max(count, end)
        slot.used = max(slot.used, count)
    }

    /// Appends at the end.
    public func append(_ bytes: UnsafeRawBufferPointer) throws(KeychainError) {
        try write(bytes, at: count)
    }

    /// Shortens (wiping the cut bytes) or extends with zeros.
    public func resize(to newCount: Int) throws(KeychainError) {
        guard newCount >= 0 else { throw .param }
        guard newCount <= limit else { throw .valueTooLarge }
        if newCount < count {
            sodium_memzero(pointer + newCount, count - newCount)
            count = newCount
        } else if newCount > count {
            try reserve(newCount)
            (pointer + count).initializeMemory(as: UInt8.self, repeating: 0, count: newCount - count)
            count = newCount
            slot.used = max(slot.used, count)
        }
    }

    /// Wipes every byte and empties the buffer.
    public func wipe() {
        sodium_memzero(pointer, slot.used)
        count = 0
    }

    /// Lends up to `length` bytes from `offset` (empty past the end).
    public func withBytes<R>(from offset: Int, length: Int, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        let start = min(max(offset, 0), count)
        let end = min(count, start + max(length, 0))
        return body(UnsafeRawBufferPointer(start: pointer + start, count: end - start))
    }

    /// A copy of the contents as immutable secret bytes (what a commit stores).
    public func snapshot() throws(KeychainError) -> SecureBytes {
        try SecureBytes(copying: UnsafeRawBufferPointer(start: pointer, count: count))
    }
}
