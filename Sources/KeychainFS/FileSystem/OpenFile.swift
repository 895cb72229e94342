import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One open descriptor of an item. Reads are served from the value decrypted
/// at open; writes go to a buffer committed at flush/release (the commit
/// rule: docs/FILESYSTEM.md, What "closed" means). When the device locks and
/// the item's class key goes, the plaintext
/// is wiped and every later read, write and commit fails with EACCES.
final class OpenFile: @unchecked Sendable {
    /// The item's inode: renames move it to the new name (``NodeTable/move(_:to:replacedInfo:)``),
    /// so a commit lands wherever the file is now; a removal detaches it, so a
    /// commit then goes nowhere.
    let inode: UInt64
    let writable: Bool
    let appends: Bool
    /// The item's class when opened: its key must stay available.
    let protectionClass: ProtectionClass?
    /// The class a commit will give the item: its key must stay available too.
    let targetClass: ProtectionClass?
    /// The process that opened it: `fstat` from there sees its unwritten
    /// length (the kernel sends `fstat` without the file handle).
    let opener: ProcessIdentity
    /// What a reader's value holds of its owner's share of the service's
    /// locked memory (nil: a writer, whose buffer holds ``lockedMemoryPlace``,
    /// or a per-user device). Set once, so that its release takes no lock.
    let readPlace: LockedMemoryShares.Place?

    // Guarded by `lock`.
    let lock = Lock()
    private(set) var value: SecureBytes?
    private(set) var buffer: SecureBuffer?
    /// Written since the last commit.
    var dirty = false
    /// Opened with O_TRUNC and not committed yet: the first flush empties the item.
    var truncatePending = false
    /// Why nothing more of this descriptor may be committed (0: it may): a
    /// write failed (EFBIG), or a commit or update failed and was reported.
    /// Later writes and commits repeat it.
    var failure: Int32 = 0
    /// The emptying by O_TRUNC committed at a flush before any data: taken
    /// back if a later write through this descriptor fails, so that a failed
    /// update never loses the old value.
    var pendingRevert: PasswordManager.WriteReceipt?
    /// When this descriptor last wrote (orders several writers of one process).
    var lastWrite: UInt64 = 0
    /// What its buffer holds of its owner's share of the service's locked
    /// memory (nil: nothing yet, or a per-user device, which keeps no shares).
    var lockedMemoryPlace: LockedMemoryShares.Place?
    /// The slot size its buffer is covered for; a write looks at the shares
    /// only when the buffer outgrows it.
    var lockedMemoryHeld = 0
    /// The device locked away a key this descriptor needs.
    private(set) var revoked = false

    init(
        inode: UInt64, value: SecureBytes?, buffer: SecureBuffer?, appends: Bool,
        protectionClass: ProtectionClass?, targetClass: ProtectionClass?, opener: ProcessIdentity,
        readPlace: LockedMemoryShares.Place? = nil
    ) {
        self.inode = inode
        self.value = value
        self.buffer = buffer
        self.writable = buffer != nil
        self.appends = appends
        self.protectionClass = protectionClass
        self.targetClass = targetClass
        self.opener = opener
        self.readPlace = readPlace
    }

    /// The length this descriptor sees: its buffer, or the value it read.
    /// Call with `lock` held.
    var length: Int? {
        if let buffer { return buffer.count }
        return value?.count
    }

    /// Whether the keys this descriptor needs are still in memory; if not,
    /// wipes its plaintext for good. Call with `lock` held.
    func checkAccess(_ device: Device) throws(Errno) {
        if !revoked {
            if device.areAvailable(protectionClass, targetClass) { return }
            revoked = true
            value = nil
            buffer?.wipe()
            buffer = nil
        }
        throw Errno(EACCES)
    }

    private static let writeClock = Atomic<UInt64>(0)

    /// Marks a successful write. Call with `lock` held.
    func noteWrite() {
        dirty = true
        lastWrite = Self.writeClock.add(1, ordering: .relaxed).newValue
    }

    /// Marks an open with O_TRUNC (POSIX empties at open): the emptying is
    /// as recent as a write. Call with `lock` held, or before the descriptor is shared.
    func noteTruncation() {
        truncatePending = true
        lastWrite = Self.writeClock.add(1, ordering: .relaxed).newValue
    }

    /// Whether it holds what the store does not have yet (written or
    /// emptied, not committed). Call with `lock` held.
    var hasUncommittedChanges: Bool { dirty || truncatePending }
}
