import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// The filesystem view of one keychain (or of one access group of it): maps
/// paths to core calls and core errors to errno. No crypto and no storage
/// here; every FUSE session of a keychain shares one ``PasswordManager``, so
/// the lock is device-wide.
public final class FileSystem: Sendable {
    /// What a mount shows at its root.
    public enum MountRoot: Sendable, Equatable {
        /// Every access group, as directories.
        case keychain
        /// One group's items, at the root.
        case group(String)

        /// The group at the root; nil for the whole keychain.
        public var group: String? {
            guard case .group(let group) = self else { return nil }
            return group
        }
    }

    let manager: PasswordManager
    package let scope: MountRoot
    /// The device's inodes and open descriptors, shared by all its mounts.
    let nodes: NodeTable
    let owner: (uid: uid_t, gid: gid_t)
    let startTime = time(nil)
    private let lockObserver: Int
    /// Whether another mount serves this group at its root (it cannot be removed then).
    let isGroupMounted: @Sendable (String) -> Bool

    /// How long the kernel may keep a name. Renames and removals make every
    /// other mount forget the names at once (``NodeTable/forgetNames(_:except:)``);
    /// the timeout bounds only a listing that raced such a change.
    static let entryTimeout = 10.0
    /// How long the kernel may keep attributes it asked for (GETATTR). Every
    /// committed change makes every mount forget the item's attributes
    /// (`fuse_lowlevel_notify_inval_inode`), and the kernel drops a reply
    /// that such a notice overtook, so sizes stay exact. Content is never
    /// cached (direct I/O).
    static let attributeTimeout = 600.0
    /// How long the kernel may keep the attributes of a reply that makes it
    /// a new inode (lookup, readdirplus, create). A notice for an inode the
    /// kernel does not have yet is lost: a commit in the instant between
    /// such a reply and the kernel taking it in would leave the old size
    /// shown for this long. Long enough for `ls -l` of a large directory to
    /// stat every name it listed without asking again.
    static let newInodeAttributeTimeout = 10.0
    /// Handed to every mount's kernel by FuseMount: told of changes.
    let kernelCache: KernelCache
    /// The open `.events` descriptors of this mount.
    package let eventStreams = EventStreams()
    /// The files every mount has at its root.
    static let specialFiles: [String: Node] = [".control": .control, ".events": .events]

    /// A view of `manager`'s keychain; `group` limits it to that access group.
    /// `isGroupMounted` tells whether a group is the root of some mount.
    /// Every mount of one device shares `nodes`.
    /// Its files belong to `owner` (the keychain's user: in service mode
    /// not the device's account).
    package init(
        manager: PasswordManager, group: String? = nil, nodes: NodeTable,
        owner: (uid: uid_t, gid: gid_t) = (getuid(), getgid()),
        isGroupMounted: @escaping @Sendable (String) -> Bool = { _ in false }
    ) throws(KeychainError) {
        self.manager = manager
        self.nodes = nodes
        self.isGroupMounted = isGroupMounted
        if let group {
            guard try manager.groupExists(group) else { throw .itemNotFound }
            scope = .group(group)
        } else {
            scope = .keychain
        }
        self.owner = owner
        let kernelCache = KernelCache(scope: scope)
        self.kernelCache = kernelCache
        // Weak: the device holds this closure; a strong capture would keep it alive forever.
        lockObserver = manager.localDevice.addObserver {
            [nodes, eventStreams, weak device = manager.localDevice] event in
            if let device { Self.deliver(event, to: eventStreams, device: device) }
            switch event {
            case .locked:
                guard let device else { return }
                // After a lock: wipe every descriptor whose keys are gone.
                for file in nodes.allOpenFiles() {
                    file.lock.withLock { _ = try? file.checkAccess(device) }
                }
            case .changed(let change):
                for node in change.itemNodes {
                    if let inode = nodes.existingInode(for: node) { kernelCache.forgetAttributes(inode) }
                }
            case .entitlementsChanged(let group):
                // Names and attributes the kernel kept were decided without
                // the new policy: every one of the group must be asked for again.
                for (node, inode) in nodes.inodes(inGroup: group) {
                    kernelCache.forgetAttributes(inode)
                    if let name = kernelCache.cachedName(of: node, in: nodes) {
                        kernelCache.forgetName(name.name, inDirectory: name.parent)
                    }
                }
            case .unlocked, .willLock:
                break
            }
        }
    }

    deinit {
        manager.localDevice.removeObserver(lockObserver)
    }

    /// Writes an event's line to every open `.events` of this mount; an item
    /// change of a group with an entitlement policy only to readers it admits.
    private static func deliver(_ event: DeviceEvent, to streams: EventStreams, device: Device) {
        let streams = streams.all
        guard !streams.isEmpty else { return }
        let (text, group) = event.eventLine
        let line = Array(text.utf8)
        for stream in streams {
            if let group, (try? device.checkEntitlement(group, program: { stream.reader })) == nil { continue }
            stream.deliver(line)
        }
    }

    // MARK: Names

    /// The node `name` stands for inside `parent`, if it exists.
    func child(of parent: Node, named name: String) throws(Errno) -> Node {
        if let special = Self.specialFiles[name] {
            guard parent == .root else { throw Errno(ENOENT) }
            return special
        }
        // Names are checked by the core call that uses them (EINVAL, ENAMETOOLONG).
        if parent == .root, scope == .keychain {
            guard try core({ () throws(KeychainError) in try manager.groupExists(name) }) else { throw Errno(ENOENT) }
            return .group(name)
        }
        guard let directory = itemDirectory(of: parent) else { throw Errno(ENOTDIR) }
        // An item, or a folder when no item has the name (the caller asks: ``folder(for:)``).
        return .item(group: directory.group, identifier: directory.folder + name)
    }

    /// The group whose items are the children of `node`, and the folder
    /// they are in, ending with `/` (empty at the group's top), if it is
    /// such a directory.
    func itemDirectory(of node: Node) -> (group: String, folder: String)? {
        switch (node, scope) {
        case (.root, .group(let group)), (.group(let group), .keychain): return (group, "")
        case (.folder(let group, let path), _): return (group, path + "/")
        default: return nil
        }
    }

    /// The group whose items are the children of `node`, if it is such a directory.
    func itemGroup(of node: Node) -> String? { itemDirectory(of: node)?.group }

    /// The folder an item node that names no item stands for, when items
    /// sit below it or it was made (`mkdir`); nil otherwise.
    func folder(for node: Node) -> Node? {
        guard case .item(let group, let identifier) = node, isFolder(identifier, inGroup: group) else { return nil }
        return .folder(group: group, path: identifier)
    }

    func isFolder(_ path: String, inGroup group: String) -> Bool {
        nodes.isMadeFolder(path, inGroup: group)
            || (try? manager.holdsItems(below: path, inGroup: group)) == true
    }

    /// For the few decisions taken before any core call sees the name
    /// (rename's EXDEV); everywhere else the core call checks it.
    func validate(_ name: String) throws(Errno) {
        try core { () throws(KeychainError) in try ItemLimits.validate(name: name) }
    }

    /// The node an inode names. ESTALE for one that was removed or replaced
    /// (its name may belong to a new inode): the kernel then looks the name
    /// up again, which matters for the name caches of other mounts.
    func node(_ inode: UInt64) throws(Errno) -> Node {
        guard let node = nodes.node(for: inode) else { throw Errno(ESTALE) }
        return node
    }

    // MARK: Attributes

    /// `stat` of a node; works while locked (docs/FILESYSTEM.md, "Operations and errno": listing and stat).
    /// `inode` is the number the caller took for it.
    func attributes(of node: Node, inode: UInt64) throws(Errno) -> stat {
        var size = 0
        switch node {
        case .group(let name):
            guard try core({ () throws(KeychainError) in try manager.groupExists(name) }) else { throw Errno(ENOENT) }
        case .folder(let group, let path):
            guard isFolder(path, inGroup: group) else { throw Errno(ENOENT) }
        case .item(let group, let identifier):
            guard
                let item = try core({ () throws(KeychainError) in
                    try manager.info(forIdentifier: identifier, inGroup: group)
                })
            else { throw Errno(ENOENT) }
            size = item.size
        case .root, .control, .events:
            break
        }
        return attributes(of: node, inode: inode, size: size)
    }

    /// `stat` of a node known to exist, with its item's size.
    func attributes(of node: Node, inode: UInt64, size: Int) -> stat {
        var info = fixedAttributes(inode: inode)
        switch node {
        case .root, .group, .folder:
            info.st_mode = S_IFDIR | 0o700
            info.st_nlink = 2
        case .control:
            break
        case .events:
            info.st_mode = S_IFREG | 0o400
        case .item:
            info.st_size = off_t(size)
            info.st_blocks = blkcnt_t((size + 511) / 512)
        }
        return info
    }

    /// What every node shares: owner, times, block size, and a regular file's mode.
    private func fixedAttributes(inode: UInt64) -> stat {
        var info = stat()
        info.st_ino = ino_t(inode)
        info.st_uid = owner.uid
        info.st_gid = owner.gid
        info.st_blksize = 4096
        info.st_mode = S_IFREG | 0o600
        info.st_nlink = 1
        // Items keep no timestamps (docs/FILESYSTEM.md): show the mount's start.
        info.st_mtim = timespec(tv_sec: startTime, tv_nsec: 0)
        info.st_ctim = info.st_mtim
        info.st_atim = info.st_mtim
        return info
    }

    /// `stat` of an inode as the caller should see it: a descriptor sees its
    /// own unwritten length (`file`, when the kernel names it, as for
    /// `lseek(SEEK_END)`; otherwise the caller's own writers, as for `fstat`);
    /// everyone else sees the stored value. A removed item that descriptors
    /// still hold answers with `st_nlink` 0 (POSIX).
    func attributes(ofInode inode: UInt64, file: OpenFile?, caller: ProcessIdentity) throws(Errno) -> stat {
        var info: stat
        if let node = nodes.node(for: inode) {
            info = try attributes(of: node, inode: inode)
            guard case .item = node else { return info }
        } else if nodes.detachedItem(inode) != nil {
            // Removed: what its descriptors hold is all that is left of it.
            info = fixedAttributes(inode: inode)
            info.st_nlink = 0
            info.st_size = off_t(
                nodes.openFiles(of: inode).compactMap { file in file.lock.withLock { file.length } }.max() ?? 0)
        } else {
            throw Errno(ESTALE)
        }
        if let length = ownLength(inode: inode, file: file, caller: caller) {
            info.st_size = off_t(length)
        }
        info.st_blocks = blkcnt_t((Int(info.st_size) + 511) / 512)
        return info
    }

    /// The length the caller's descriptor sees, when it differs from the store's.
    private func ownLength(inode: UInt64, file: OpenFile?, caller: ProcessIdentity) -> Int? {
        if let file { return file.lock.withLock { file.length } }
        let detached = nodes.node(for: inode) == nil
        // Readers of a live item see the store's size; of a removed one, what they read.
        let open = nodes.openFiles(of: inode).filter { $0.writable || detached }
        guard !open.isEmpty else { return nil }
        let mine = open.filter { $0.opener.sameProcess(as: caller) }
        // A live item's descriptor counts only while it holds what the store
        // does not: once committed (flush at close) the store is as new or
        // newer. A descriptor whose RELEASE has not arrived yet (the kernel
        // sends it after close returns) must not show its old length over a
        // later commit: `printf abc > f; : > f; stat f` saw 3 under load.
        let latest = mine.compactMap { file in
            file.lock.withLock { detached || file.hasUncommittedChanges ? (file.lastWrite, file.length) : nil }
        }.max { $0.0 < $1.0 }
        return latest?.1
    }

    /// How long the kernel may keep the attributes of a GETATTR or SETATTR
    /// reply: none while a writer is open (each caller sees its own length)
    /// or once the item was removed.
    func attributeTimeout(ofInode inode: UInt64) -> Double {
        guard let node = nodes.node(for: inode), !isPoliced(node) else { return 0 }
        if case .item = node, nodes.hasWriters(inode) { return 0 }
        return Self.attributeTimeout
    }

    // MARK: Listing

    /// The entries of a directory, `.` and `..` first, with the sizes of
    /// items as listed (one query for the whole directory).
    func listing(of node: Node) throws(Errno) -> [DirectoryListing.Entry] {
        var entries: [DirectoryListing.Entry] = [
            .init(name: ".", node: node, mode: S_IFDIR),
            .init(name: "..", node: .root, mode: S_IFDIR)
        ]
        if node == .root {
            entries.append(.init(name: ".control", node: .control, mode: S_IFREG))
            entries.append(.init(name: ".events", node: .events, mode: S_IFREG))
        }
        if node == .root, scope == .keychain {
            for group in try core({ () throws(KeychainError) in try manager.groups() }) {
                entries.append(.init(name: group, node: .group(group), mode: S_IFDIR))
            }
        } else if let (group, folder) = itemDirectory(of: node) {
            var folders = Set(nodes.madeFolders(in: folder, ofGroup: group))
            for item in try core({ () throws(KeychainError) in try manager.items(inGroup: group) })
            where item.identifier.hasPrefix(folder) {
                let name = item.identifier.dropFirst(folder.count)
                // An item further down shows as the folder it is in.
                if let slash = name.firstIndex(of: "/") {
                    folders.insert(String(name[..<slash]))
                    continue
                }
                entries.append(
                    .init(
                        name: String(name), node: .item(group: group, identifier: item.identifier),
                        mode: S_IFREG, size: item.info.size))
            }
            for name in folders.sorted() {
                entries.append(.init(name: name, node: .folder(group: group, path: folder + name), mode: S_IFDIR))
            }
        } else {
            throw Errno(ENOTDIR)
        }
        return entries
    }

    /// The attribute timeout of a reply that may make the kernel a new
    /// inode: none for an item being written (each caller sees its own length).
    func newInodeAttributeTimeout(for node: Node, inode: UInt64) -> Double {
        guard case .item = node else { return Self.attributeTimeout }
        return nodes.hasWriters(inode) || isPoliced(node) ? 0 : Self.newInodeAttributeTimeout
    }

    // MARK: Entitlements

    /// The caller policy's steps 1 and 2 (``PasswordManager/admit(_:group:items:verb:)``,
    /// the same as on the socket and the bus): EPERM unless the calling
    /// program may use `group` (it has no policy, or a rule of it admits
    /// the program; the program is identified only for a group with a
    /// policy); then, with a `verb`, EACCES unless the caller may `verb`
    /// the items `identifiers` (the owner rule, docs/FILESYSTEM.md, "Items another
    /// program owns": an item another program owns is the person's to allow, and asking
    /// blocks only this request's worker). A refusal is recorded in the audit log as
    /// `operation` on `identifier` (else the first of `identifiers`).
    func admit(
        _ group: String, items identifiers: [String] = [], verb: String? = nil, caller: ProcessIdentity,
        operation: String, identifier: String? = nil
    ) throws(Errno) {
        let policyCaller = PolicyCaller(
            program: { caller.program }, consent: verb == nil ? nil : caller.consentCaller
        ) { [self] result, doubt in
            audit(
                operation, group: group, identifier: identifier ?? identifiers.first, detail: doubt, caller: caller,
                result: result)
        }
        try core { () throws(KeychainError) in
            try manager.admit(policyCaller, group: group, items: identifiers, verb: verb)
        }
    }

    /// Step 4: the entitlement check again, unrecorded (the caller records
    /// the outcome): what was true when a request arrived must still be
    /// true when its reply hands out a value.
    func recheckEntitlement(_ group: String, caller: ProcessIdentity) throws(Errno) {
        try core { () throws(KeychainError) in
            try manager.confirm(group: group) { caller.program }
        }
    }

    /// For requests about one node (lookup, stat, open, access): only an
    /// item is guarded; a group's directory and `.control` are not.
    func requireEntitlement(toItem node: Node, caller: ProcessIdentity, operation: String) throws(Errno) {
        if case .item(let group, let identifier) = node {
            try admit(group, caller: caller, operation: operation, identifier: identifier)
        }
    }

    /// For requests about a directory's items (listing them).
    func requireEntitlement(inDirectory node: Node, caller: ProcessIdentity, operation: String) throws(Errno) {
        if let group = itemGroup(of: node) { try admit(group, caller: caller, operation: operation) }
    }

    /// The node of an inode whose extended attributes the caller asks for:
    /// an item's, or its group's directory's, are guarded.
    func entitledNode(_ inode: UInt64, caller: ProcessIdentity, operation: String) throws(Errno) -> Node {
        let node = try node(inode)
        try requireEntitlement(toItem: node, caller: caller, operation: operation)
        if case .group(let group) = node { try admit(group, caller: caller, operation: operation) }
        if case .folder(let group, _) = node { try admit(group, caller: caller, operation: operation) }
        return node
    }

    // MARK: Audit

    /// EACCES, audited, for a request the kernel made for another user
    /// than the keychain's. The log names the uid and pid only: the device
    /// reads no `/proc` entry of another user's process on a request's
    /// word (its executable's path is that user's to keep).
    func requireOwner(uid: uid_t, pid: pid_t) throws(Errno) {
        guard uid != owner.uid else { return }
        manager.localDevice.audit.record(
            AuditEvent(
                operation: "request", result: "denied",
                subject: AuditSubject(pid: pid, uid: uid, executable: nil, unit: nil),
                detail: "not the keychain's user"))
        throw Errno(EACCES)
    }

    /// Records an access to an item (or its denial) with who asked.
    func audit(
        _ operation: String, group: String, identifier: String?, detail: String? = nil, caller: ProcessIdentity,
        result: String
    ) {
        manager.localDevice.audit.record(
            AuditEvent(
                operation: operation, result: result, group: group, identifier: identifier,
                subject: caller.auditSubject, detail: detail))
    }

    /// Runs an item operation and records its outcome.
    func audited<R>(
        _ operation: String, group: String, identifier: String, detail: String? = nil,
        caller: ProcessIdentity, _ body: () throws(Errno) -> R
    ) throws(Errno) -> R {
        do throws(Errno) {
            let result = try body()
            audit(operation, group: group, identifier: identifier, detail: detail, caller: caller, result: "ok")
            return result
        } catch {
            audit(
                operation, group: group, identifier: identifier, detail: detail, caller: caller,
                result: error.auditResult)
            throw error
        }
    }

    /// Whether `node` is an item of a group with an entitlement policy: the
    /// kernel must then keep neither its name nor its attributes, since
    /// every request of every program needs its own decision.
    func isPoliced(_ node: Node) -> Bool {
        guard case .item(let group, _) = node else { return false }
        return manager.localDevice.hasEntitlementPolicy(group)
    }
}

/// The entries of one open directory, listed at opendir, and the device's
/// change count before the listing: while it stays the same, the listed sizes
/// are current.
final class DirectoryListing: @unchecked Sendable {
    struct Entry {
        let name: String
        let node: Node
        let mode: mode_t
        var size = 0
    }
    // Immutable after init.
    let entries: [Entry]
    let changeCount: UInt64
    init(_ entries: [Entry], changeCount: UInt64) {
        self.entries = entries
        self.changeCount = changeCount
    }
}

extension ItemChange {
    /// The items whose attributes the change made stale.
    var itemNodes: [Node] {
        switch self {
        case .written(let group, let identifier), .removed(let group, let identifier):
            return [.item(group: group, identifier: identifier)]
        case .renamed(let group, let from, let to):
            return [.item(group: group, identifier: from), .item(group: group, identifier: to)]
        case .groupCreated, .groupRemoved:
            return []
        }
    }
}
