import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One open descriptor of an item. Reads are served from the value decrypted
/// at open; writes go to a buffer committed at flush/release (SPEC, commit
/// rule). When the device locks and the item's class key goes, the plaintext
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
    /// The device locked away a key this descriptor needs.
    private(set) var revoked = false

    init(inode: UInt64, value: SecureBytes?, buffer: SecureBuffer?, appends: Bool,
         protectionClass: ProtectionClass?, targetClass: ProtectionClass?, opener: ProcessIdentity) {
        self.inode = inode
        self.value = value
        self.buffer = buffer
        self.writable = buffer != nil
        self.appends = appends
        self.protectionClass = protectionClass
        self.targetClass = targetClass
        self.opener = opener
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
}

/// The process behind a FUSE request. The kernel names the calling thread;
/// its process (thread group) is read from `/proc` only when needed.
struct ProcessIdentity: Sendable, Equatable {
    let thread: pid_t
    /// The uid the kernel ran the request as.
    var uid: uid_t = getuid()

    /// The process a thread belongs to (itself if /proc cannot tell).
    var process: pid_t {
        let fd = ProgramIdentities.withProcPath(thread, "status") { open($0, O_RDONLY | O_CLOEXEC) }
        guard fd >= 0 else { return thread }
        defer { close(fd) }
        // The `Tgid:` line is among the first few (proc(5)); read bytes, not Strings: this runs per audited request.
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 512) { buffer in
            let count = read(fd, buffer.baseAddress, buffer.count)
            guard count > 0 else { return thread }
            let bytes = UnsafeBufferPointer(rebasing: buffer[0..<count])
            let key = Array("\nTgid:".utf8)
            guard var index = (0...max(0, count - key.count)).first(where: { start in
                (0..<key.count).allSatisfy { bytes[start + $0] == key[$0] }
            }).map({ $0 + key.count }) else { return thread }
            var value: pid_t = 0
            while index < count, bytes[index] == UInt8(ascii: "\t") || bytes[index] == UInt8(ascii: " ") { index += 1 }
            while index < count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) {
                value = value * 10 + pid_t(bytes[index] - UInt8(ascii: "0"))
                index += 1
            }
            return value > 0 ? value : thread
        }
    }

    /// The program making the request, for entitlement decisions.
    var program: ProgramIdentity? { ProgramIdentities.of(thread: thread, uid: uid) }

    /// Who made the request, for the audit log.
    var auditSubject: AuditSubject { ProgramIdentities.subject(thread: thread, uid: uid) }

    /// Whether two requests came from the same process.
    func sameProcess(as other: ProcessIdentity) -> Bool {
        thread == other.thread || process == other.process
    }
}
