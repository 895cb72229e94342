internal import CLinux
internal import CSodium

/// Secret bytes (a key or a plaintext value) held in the locked secret arena,
/// wiped when the last reference goes away.
///
/// It is deliberately not a `[UInt8]` or `String`, which Swift may copy into
/// ordinary heap memory at any time; convert only at the edge where a caller
/// asks for one (``string()``, ``withUnsafeBytes(_:)``).
public final class SecureBytes: @unchecked Sendable, Equatable {
    // Immutable after init: safe to share between threads.
    private let slot: ArenaSlot
    var pointer: UnsafeMutableRawPointer { slot.pointer }
    /// Number of bytes.
    public let count: Int

    /// Copies bytes into secret memory. Throws ``KeychainError/valueTooLarge`` past 1 MiB.
    public convenience init(copying bytes: UnsafeRawBufferPointer) throws(KeychainError) {
        try self.init(count: bytes.count)
        if bytes.count > 0 { mutableBytes.copyMemory(from: bytes) }
    }

    /// Copies the UTF-8 bytes of a string (the caller's copy stays theirs to manage).
    public convenience init(_ string: String) throws(KeychainError) {
        var string = string
        try self.init(count: string.utf8.count)
        string.withUTF8 { mutableBytes.copyMemory(from: UnsafeRawBufferPointer($0)) }
    }

    /// Copies a byte array.
    public convenience init(_ bytes: [UInt8]) throws(KeychainError) {
        try self.init(count: bytes.count)
        bytes.withUnsafeBytes { mutableBytes.copyMemory(from: $0) }
    }

    /// `count` zero bytes, for the core to fill at once through ``mutableBytes``.
    package init(count: Int) throws(KeychainError) {
        slot = try ArenaSlot(capacity: count, used: count)
        self.count = count
    }

    /// Writable view for filling a buffer right after ``init(count:)``, before
    /// it is shared; afterwards the bytes never change.
    package var mutableBytes: UnsafeMutableRawBufferPointer {
        UnsafeMutableRawBufferPointer(start: pointer, count: count)
    }

    /// `count` random bytes from the system's CSPRNG.
    package static func random(count: Int) -> SecureBytes {
        let bytes = try! SecureBytes(count: count)
        randombytes_buf(bytes.pointer, count)
        return bytes
    }

    /// Lends the bytes; do not let the pointer escape.
    public func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try body(UnsafeRawBufferPointer(start: pointer, count: count))
    }

    /// The bytes as a `String` (the edge where a caller asks for one); nil if not UTF-8.
    public func string() -> String? {
        let bytes = UnsafeRawBufferPointer(start: pointer, count: count)
        return String(validating: bytes.bindMemory(to: UInt8.self), as: UTF8.self)
    }

    /// The bytes as an array (the edge where a caller asks for one).
    public func bytes() -> [UInt8] {
        Array(UnsafeRawBufferPointer(start: pointer, count: count))
    }

    /// Compares in constant time for equal lengths (sodium_memcmp), so that
    /// timing does not reveal how much of a guessed key is right.
    public func constantTimeEquals(_ other: UnsafeRawBufferPointer) -> Bool {
        guard other.count == count else { return false }
        if count == 0 { return true }
        return sodium_memcmp(pointer, other.baseAddress!, count) == 0
    }

    /// Equal bytes, compared in constant time.
    public static func == (lhs: SecureBytes, rhs: SecureBytes) -> Bool {
        rhs.withUnsafeBytes { lhs.constantTimeEquals($0) }
    }
}

/// Zeroes memory that held a secret (sodium_memzero: not optimised away).
public func wipeMemory(_ buffer: UnsafeMutableRawBufferPointer) {
    guard let base = buffer.baseAddress, buffer.count > 0 else { return }
    sodium_memzero(base, buffer.count)
}

/// Stops this process from ever writing a core dump (RLIMIT_CORE 0 and
/// PR_SET_DUMPABLE 0, which also keeps other processes of the same user
/// from attaching to it with ptrace).
/// From now on, a large buffer of secret memory (64 KiB and more: a
/// request's or reply's body) that RLIMIT_MEMLOCK would leave unpinned is
/// refused instead of handed out: what the service sets, whose memory every
/// user's requests share.
package func refuseUnlockedLargeSecretMemory() {
    SecretArena.shared.refuseUnlockedLargeSlots()
}

public func disableCoreDumps() -> Bool {
    CLinux_disable_core_dumps() == 0
}

/// Stops this process from writing a core file (RLIMIT_CORE 0), leaving it
/// readable in `/proc` by its own user: a client of the device must stay
/// so, or the device (of that user) cannot tell which program asks.
public func disableCoreFiles() -> Bool {
    CLinux_disable_core_files() == 0
}
