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
    /// The item's inode: renames move it to the new name (``NodeTable/move(_:to:)``),
    /// so a commit lands wherever the file is now.
    let inode: UInt64
    let writable: Bool
    let appends: Bool
    /// The item's class when opened: its key must stay available.
    let protectionClass: ProtectionClass?
    /// The class a commit will give the item: its key must stay available too.
    let targetClass: ProtectionClass?

    // Guarded by `lock`.
    let lock = Lock()
    private(set) var value: SecureBytes?
    private(set) var buffer: SecureBuffer?
    /// Written since the last commit.
    var dirty = false
    /// Opened with O_TRUNC and not committed yet: release empties the item.
    var truncatePending = false
    /// A write failed (EFBIG): nothing of this descriptor may be committed.
    var poisoned = false
    /// The device locked away a key this descriptor needs.
    private(set) var revoked = false

    init(inode: UInt64, value: SecureBytes?, buffer: SecureBuffer?, appends: Bool,
         protectionClass: ProtectionClass?, targetClass: ProtectionClass?) {
        self.inode = inode
        self.value = value
        self.buffer = buffer
        self.writable = buffer != nil
        self.appends = appends
        self.protectionClass = protectionClass
        self.targetClass = targetClass
    }

    /// Whether the keys this descriptor needs are still in memory; if not,
    /// wipes its plaintext for good. Call with `lock` held.
    func checkAccess(_ device: Device) throws(FSError) {
        if !revoked {
            let classes = [protectionClass, targetClass].compactMap { $0 }
            if classes.allSatisfy(device.isAvailable) { return }
            revoked = true
            value = nil
            buffer?.wipe()
            buffer = nil
        }
        throw FSError(EACCES)
    }
}

/// The open descriptors of one mount, so that a lock can wipe them at once.
final class OpenFiles: Sendable {
    private let files = Mutex<[ObjectIdentifier: OpenFile]>([:])

    func add(_ file: OpenFile) -> UInt64 {
        files.withLock { $0[ObjectIdentifier(file)] = file }
        return FileHandle.make(file)
    }

    /// The descriptor behind a file handle (fuse_file_info.fh).
    static func file(_ handle: UInt64) -> OpenFile? {
        FileHandle.object(handle, as: OpenFile.self)
    }

    func remove(_ handle: UInt64) {
        guard let file = FileHandle.take(handle, as: OpenFile.self) else { return }
        _ = files.withLock { $0.removeValue(forKey: ObjectIdentifier(file)) }
    }

    /// After a lock: wipes every descriptor whose keys are gone.
    func revokeUnavailable(_ device: Device) {
        let open = files.withLock { Array($0.values) }
        for file in open {
            file.lock.withLock { _ = try? file.checkAccess(device) }
        }
    }
}
