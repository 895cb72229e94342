internal import CFuse
import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A private directory of files held only in the locked secret arena, for
/// `keychainfs edit`: the editor works on a real file at a real path, and
/// the plaintext never reaches a disk, swap or the page cache.
///
/// It is a FUSE mount served by the editing process itself: readable by its
/// user only (no `allow_other`: the kernel refuses every other user, root's
/// processes included), every file `direct_io` (no page cache), each file's
/// bytes a ``SecureBuffer`` (locked memory, wiped when freed). The editor
/// may create what it likes beside the file (swap, backup and undo files,
/// a new file renamed over the old one): it all lives and dies here.
/// ``close()`` unmounts it and wipes every byte.
public final class ScratchDirectory: Sendable {
    /// The mount point.
    public let path: String
    private let files: ScratchFiles
    private let session: FuseSession<ScratchFiles>
    private let loopThread = Mutex<pthread_t?>(nil)

    /// Mounts an empty scratch directory at `path` (an empty directory of
    /// ours) and puts `value` in it as the file `name`.
    public init(at path: String, file name: String, value: SecureBytes) throws(MountError) {
        self.path = path
        files = ScratchFiles()
        do {
            try files.create(name, value: value)
        } catch {
            throw MountError("cannot hold the value for editing: \(error)")
        }
        var ops = ScratchOperations.table()
        let strings: [String] = ["keychainfs", "-o", "fsname=keychainfs-edit,subtype=keychainfs"]
        let arguments = strings.map { strdup($0) }
        defer { arguments.forEach { free($0) } }
        var argv = arguments + [nil]
        let userdata = Unmanaged.passRetained(files)
        let made = argv.withUnsafeMutableBufferPointer { argv in
            var args = fuse_args(argc: 3, argv: argv.baseAddress, allocated: 0)
            defer { fuse_opt_free_args(&args) }
            return fuse_session_new(&args, &ops, MemoryLayout<fuse_lowlevel_ops>.size, userdata.toOpaque())
        }
        guard let made else {
            userdata.release()
            throw MountError("could not create a FUSE session")
        }
        guard fuse_session_mount(made, path) == 0 else {
            fuse_session_destroy(made)
            userdata.release()
            throw MountError(
                "could not mount a private directory at \(path) (is /dev/fuse usable and fusermount3 installed?)")
        }
        session = FuseSession(made, userdata: userdata)
        let session = session
        // One thread: an editor makes one request at a time.
        guard let thread = Threads.start({ _ = fuse_session_loop(session.raw) }) else {
            session.tearDown()
            throw MountError("could not start the FUSE loop thread")
        }
        loopThread.withLock { $0 = thread }
    }

    /// A copy of the file `name` as it is now; nil when there is none.
    public func value(of name: String) throws(KeychainError) -> SecureBytes? {
        try files.snapshot(name)
    }

    /// Unmounts (lazily: a process the editor left behind cannot keep it),
    /// waits for the loop to end and wipes every file.
    public func close() {
        _ = MountTable.unmount(path, lazy: true)
        if let thread = loopThread.withLock({ value -> pthread_t? in
            defer { value = nil }
            return value
        }) {
            pthread_join(thread, nil)
        }
        session.tearDown()
        files.wipeAll()
    }
}

/// The files of a scratch directory: one flat directory (inode 1).
final class ScratchFiles: @unchecked Sendable {
    struct File {
        var name: String?  // nil once unlinked (kept while open)
        let bytes: SecureBuffer
        var mode: mode_t
        var modified: timespec
        var openCount = 0
    }

    struct State {
        var byInode: [UInt64: File] = [:]
        var byName: [String: UInt64] = [:]
        var nextInode: UInt64 = 2
    }

    // SecureBuffer is not thread-safe: every use of the state is under the lock.
    private var state = State()
    private let lock = Mutex(())

    func withState<R, E: Error>(_ body: (inout State) throws(E) -> R) throws(E) -> R {
        try lock.withLock { (_) throws(E) -> R in try body(&state) }
    }

    static func now() -> timespec {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return time
    }

    /// A new file `name` holding `value` (replacing none).
    func create(_ name: String, value: SecureBytes) throws(KeychainError) {
        let buffer = SecureBuffer()
        try value.withUnsafeBytes { (raw) throws(KeychainError) in try buffer.write(raw, at: 0) }
        withState { state in _ = Self.add(name, bytes: buffer, mode: 0o600, to: &state) }
    }

    /// Adds a file; returns its inode.
    static func add(_ name: String, bytes: SecureBuffer, mode: mode_t, to state: inout State) -> UInt64 {
        let inode = state.nextInode
        state.nextInode += 1
        state.byInode[inode] = File(name: name, bytes: bytes, mode: mode & 0o7777, modified: now())
        state.byName[name] = inode
        return inode
    }

    func snapshot(_ name: String) throws(KeychainError) -> SecureBytes? {
        try withState { (state) throws(KeychainError) -> SecureBytes? in
            guard let inode = state.byName[name], let file = state.byInode[inode] else { return nil }
            return try file.bytes.snapshot()
        }
    }

    /// Drops an unlinked file nobody holds open.
    static func dropIfUnused(_ inode: UInt64, in state: inout State) {
        guard let file = state.byInode[inode], file.name == nil, file.openCount == 0 else { return }
        file.bytes.wipe()
        state.byInode[inode] = nil
    }

    func wipeAll() {
        withState { state in
            for file in state.byInode.values { file.bytes.wipe() }
            state = State()
        }
    }
}
