import KeychainCore
import Synchronization

/// What an inode number stands for. Groups are directories, identifiers files.
package enum Node: Hashable, Sendable {
    case root
    case control
    /// `.events`: the device's events, as lines (every mount's root).
    case events
    case group(String)
    case item(group: String, identifier: String)
    /// A folder in a group: the part of item names before a `/` (pass's
    /// `email/work/imap` is the item `work/imap` of `email`, shown in the
    /// folder `work`): docs/FILESYSTEM.md, "Names with a /".
    case folder(group: String, path: String)
}

/// The inodes of one device, shared by every mount of it, and the open
/// descriptors of each.
///
/// A name is bound to one inode at a time. `unlink` and rename-over detach
/// the inode from its name (POSIX: the file lives on, nameless, while
/// descriptors are open), so that nothing written through an old descriptor
/// can reach an item created later under the same name; a lookup of the
/// name then gets a new number. Numbers are never reused while the device
/// lives. Shared across mounts, so that a removal through one mount detaches
/// the inode that another mount's writer holds.
///
/// It learns of removals and renames from the device's store as they
/// commit (``Device/addCommitObserver(_:)``), whoever made them: a mount,
/// the socket, the bus, the library. Nobody else rebinds a name, and the
/// bindings agree with the store at every commit; the other mounts' kernels
/// are then told to forget the names (``forgetNames(_:except:)``).
package final class NodeTable: Sendable {
    private let device: Device?
    private let observers = Mutex<(commit: Int, event: Int)?>(nil)

    /// A table that follows `device`'s changes (nil: none, for the tests of the table alone).
    package init(following device: Device? = nil) {
        self.device = device
        guard let device else { return }
        let commit = device.addCommitObserver { [weak self] change in self?.committed(change) }
        let event = device.addObserver { [weak self] event in
            guard case .changed(let change) = event else { return }
            self?.forgetNames(of: change)
        }
        observers.withLock { $0 = (commit, event) }
    }

    deinit {
        if let device, let tokens = observers.withLock({ $0 }) {
            device.removeCommitObserver(tokens.commit)
            device.removeObserver(tokens.event)
        }
    }

    /// The mount whose request is making a change on this thread (a FUSE
    /// request's `unlink`, `rename`, `rmdir`), bound by
    /// ``FileSystem/changingNames(_:)``: its kernel keeps its own names right,
    /// and holds the directory's lock until the reply.
    @TaskLocal static var changingMount: KernelCache?

    /// Rebinds names as the store commits their change: under the store's
    /// lock, so that no write can land between a name's removal and its
    /// inode's. Every change is counted (``changeCount``).
    private func committed(_ change: ItemChange) {
        changes.add(1, ordering: .sequentiallyConsistent)
        switch change {
        case .removed(let group, let identifier):
            detach(.item(group: group, identifier: identifier))
        case .renamed(let group, let from, let to):
            guard from != to else { return }
            move(.item(group: group, identifier: from), to: .item(group: group, identifier: to))
        case .groupRemoved(let group):
            madeFolders.withLock { $0 = $0.filter { !$0.hasPrefix(group + "\u{0}") } }
        case .written, .groupCreated:
            break
        }
    }

    /// Folders made with `mkdir` (by `group NUL path`), which hold no item
    /// yet, or no more: a folder with items exists by them alone. In
    /// memory: the store keeps items, not folders (an empty folder is gone
    /// when the device stops, as git keeps no empty directory).
    private let madeFolders = Mutex<Set<String>>([])

    /// Keeps folder `path` of `group` (and the folders above it) while it holds nothing.
    func makeFolder(_ path: String, inGroup group: String) {
        madeFolders.withLock { folders in
            for folder in ItemLimits.folders(of: path) + [path] { folders.insert(group + "\u{0}" + folder) }
        }
    }

    /// Forgets the made folder `path` of `group`; whether there was one.
    func removeFolder(_ path: String, inGroup group: String) -> Bool {
        madeFolders.withLock { $0.remove(group + "\u{0}" + path) != nil }
    }

    func isMadeFolder(_ path: String, inGroup group: String) -> Bool {
        madeFolders.withLock { $0.contains(group + "\u{0}" + path) }
    }

    /// The names of the made folders right inside `folder` of `group` (`folder` ends with `/`, or is empty: the top).
    func madeFolders(in folder: String, ofGroup group: String) -> [String] {
        let prefix = group + "\u{0}" + folder
        return madeFolders.withLock { folders in
            folders.compactMap { key -> String? in
                guard key.hasPrefix(prefix) else { return nil }
                let rest = key.dropFirst(prefix.count)
                return rest.isEmpty || rest.contains("/") ? nil : String(rest)
            }
        }
    }

    /// The names a committed change took away, forgotten by every mount's
    /// kernel but that of the mount making it (``changingMount``).
    private func forgetNames(of change: ItemChange) {
        switch change {
        case .removed, .renamed: forgetNames(change.itemNodes, except: Self.changingMount)
        case .groupRemoved(let group): forgetNames([.group(group)], except: Self.changingMount)
        case .written, .groupCreated: return
        }
    }

    static let rootInode: UInt64 = 1
    static let controlInode: UInt64 = 2
    static let eventsInode: UInt64 = 3

    /// `.control` and `.events`: files whose handles are not item descriptors.
    static func isSpecial(_ inode: UInt64) -> Bool { inode == controlInode || inode == eventsInode }

    /// One per inode a kernel or a descriptor holds: a keychain of 100,000
    /// items listed once has 100,000 of them, so it stays small (48 bytes);
    /// what only a few inodes have is in ``State/opened``.
    private struct Entry {
        var node: Node
        /// The name now belongs to another inode, or to none.
        var detached = false
        /// References the kernels of the mounts hold (replies that gave them
        /// the number, minus FORGETs): the entry goes when none is left and
        /// no descriptor is open.
        var lookups: UInt64 = 0
    }

    /// What inodes with open descriptors, or detached ones, carry besides.
    private struct Opened {
        /// Usually one: an array is the cheapest to add to and remove from.
        var files: [OpenFile] = []
    }

    private struct State {
        var entries: [UInt64: Entry] = [
            NodeTable.rootInode: Entry(node: .root),
            NodeTable.controlInode: Entry(node: .control),
            NodeTable.eventsInode: Entry(node: .events)
        ]
        var byNode = HashIndex<Node>([
            .root: NodeTable.rootInode, .control: NodeTable.controlInode,
            .events: NodeTable.eventsInode
        ])
        var opened: [UInt64: Opened] = [:]
        var next: UInt64 = 4

        mutating func detach(_ inode: UInt64) {
            guard var entry = entries.removeValue(forKey: inode) else { return }
            if !entry.detached { byNode.remove(entry.node, boundTo: inode) }
            entry.detached = true
            put(entry, at: inode)
        }

        func inode(boundTo node: Node) -> UInt64? {
            byNode.inode(of: node) { entries[$0]?.node }
        }

        func isUnused(_ entry: Entry, at inode: UInt64) -> Bool {
            entry.lookups == 0 && opened[inode]?.files.isEmpty ?? true
        }

        /// Puts `entry` back at `inode`, or drops it once nothing holds it
        /// (no kernel reference, no descriptor), with the name bound to it.
        mutating func put(_ entry: Entry, at inode: UInt64) {
            guard isUnused(entry, at: inode) else {
                entries[inode] = entry
                return
            }
            drop(entry, at: inode)
        }

        /// Forgets an inode nothing holds any more, and its name's binding.
        mutating func drop(_ entry: Entry, at inode: UInt64) {
            entries.removeValue(forKey: inode)
            opened.removeValue(forKey: inode)
            if !entry.detached { byNode.remove(entry.node, boundTo: inode) }
            NodeTable.shrinkIfSparse(&entries)
        }
    }
    private let state = Mutex(State())

    /// Swift's dictionaries keep their largest size: after the kernel
    /// forgot a listing of 100,000 items, the table would hold 30 MB of
    /// empty buckets until the device stops. Rebuilt at an eighth full,
    /// so the cost is amortised over the removals that emptied it.
    static func shrinkIfSparse<Key, Value>(_ table: inout [Key: Value]) {
        guard table.capacity > 4096, table.count < table.capacity / 8 else { return }
        table = Dictionary(minimumCapacity: table.count * 2).merging(table) { $1 }
    }
    private let caches = Mutex<[ObjectIdentifier: KernelCache]>([:])
    private let changes = Atomic<UInt64>(0)

    /// How many changes the device's store committed (only equality
    /// matters: a listing made across a change is not taken as current).
    var changeCount: UInt64 { changes.load(ordering: .sequentiallyConsistent) }

    /// The inode currently bound to `node`, numbered on first sight.
    func inode(for node: Node) -> UInt64 {
        state.withLock { state in Self.bind(node, in: &state) }
    }

    /// ``inode(for:)`` for a reply that hands the number to the kernel of
    /// `cache`'s mount (lookup, create, mkdir, readdirplus): it counts as a
    /// reference until that kernel FORGETs it.
    func lookedUp(_ node: Node, by cache: KernelCache) -> UInt64 {
        let inode = state.withLock { state in
            let inode = Self.bind(node, in: &state)
            state.entries[inode]?.lookups += 1
            return inode
        }
        cache.took(inode)
        return inode
    }

    /// The kernel of `cache`'s mount dropped `count` references (FORGET).
    func forget(_ inode: UInt64, count: UInt64, by cache: KernelCache) {
        cache.dropped(inode, count: count)
        release(inode, count: count)
    }

    /// Forgets `inode` if nothing holds it: one numbered by ``inode(for:)``
    /// for an open that then failed.
    func dropIfUnused(_ inode: UInt64) {
        release(inode, count: 0)
    }

    /// An inode no kernel knows and no descriptor holds is forgotten here
    /// too, so that the table stays as large as the kernels' caches, not as
    /// the keychain; its name gets a new number at the next lookup.
    private func release(_ inode: UInt64, count: UInt64) {
        guard inode > Self.eventsInode else { return }
        state.withLock { state in
            guard var entry = state.entries.removeValue(forKey: inode) else { return }
            entry.lookups -= min(count, entry.lookups)
            state.put(entry, at: inode)
        }
    }

    private static func bind(_ node: Node, in state: inout State) -> UInt64 {
        if let inode = state.inode(boundTo: node) { return inode }
        let inode = state.next
        state.next += 1
        state.byNode.insert(node, boundTo: inode)
        state.entries[inode] = Entry(node: node)
        return inode
    }

    /// The inode bound to `node`, if it has one (the kernel may know it).
    func existingInode(for node: Node) -> UInt64? {
        state.withLock { $0.inode(boundTo: node) }
    }

    /// The items of `group` that have an inode, with it.
    func inodes(inGroup group: String) -> [(Node, UInt64)] {
        state.withLock { state in
            state.entries.compactMap { inode, entry in
                if !entry.detached, case .item(group, _) = entry.node { return (entry.node, inode) }
                return nil
            }
        }
    }

    /// The node an inode is bound to; nil once it was detached or never existed.
    func node(for inode: UInt64) -> Node? {
        state.withLock { state in
            guard let entry = state.entries[inode], !entry.detached else { return nil }
            return entry.node
        }
    }

    /// A detached inode that descriptors still hold: its old node.
    func detachedItem(_ inode: UInt64) -> Node? {
        state.withLock { state in
            guard let entry = state.entries[inode], entry.detached else { return nil }
            return entry.node
        }
    }

    /// Unbinds `node` from its inode (unlink).
    func detach(_ node: Node) {
        state.withLock { state in
            guard let inode = state.inode(boundTo: node) else { return }
            state.detach(inode)
        }
    }

    /// After a rename the kernel keeps the inode under its new name: the
    /// number now stands for the new node. The inode that was at the target
    /// is detached (rename(2) replaces it).
    func move(_ old: Node, to new: Node) {
        state.withLock { state in
            if let replaced = state.inode(boundTo: new) { state.detach(replaced) }
            guard let inode = state.inode(boundTo: old) else { return }
            state.byNode.remove(old, boundTo: inode)
            state.byNode.insert(new, boundTo: inode)
            state.entries[inode]?.node = new
        }
    }

    // MARK: Open descriptors

    /// Registers an open descriptor on its inode; returns the file handle for
    /// the kernel. ESTALE if the inode was detached meanwhile (a removal raced
    /// the open): the kernel then looks the name up again.
    func add(_ file: OpenFile) throws(Errno) -> UInt64 {
        try state.withLock { (state: inout State) throws(Errno) in
            guard state.entries[file.inode]?.detached == false else {
                throw Errno(ESTALE)
            }
            state.opened[file.inode, default: Opened()].files.append(file)
        }
        return FuseHandle.make(file)
    }

    /// The descriptor behind a file handle (fuse_file_info.fh).
    static func file(_ handle: UInt64) -> OpenFile? {
        FuseHandle.object(handle, as: OpenFile.self)
    }

    /// Ends a descriptor's handle; a detached inode goes with its last descriptor.
    func remove(_ handle: UInt64) {
        guard let file = FuseHandle.take(handle, as: OpenFile.self) else { return }
        // Every close comes here: two hash lookups, the entry left in place.
        state.withLock { state in
            guard let entry = state.entries[file.inode] else { return }
            var othersOpen = false
            if let index = state.opened.index(forKey: file.inode) {
                state.opened.values[index].files.removeAll { $0 === file }
                othersOpen = !state.opened.values[index].files.isEmpty
                if !othersOpen, !entry.detached { state.opened.remove(at: index) }
            }
            if entry.lookups == 0, !othersOpen { state.drop(entry, at: file.inode) }
        }
    }

    /// Whether a writing descriptor is open on an inode.
    func hasWriters(_ inode: UInt64) -> Bool {
        state.withLock { state in state.opened[inode]?.files.contains { $0.writable } ?? false }
    }

    /// The descriptors open on an inode.
    func openFiles(of inode: UInt64) -> [OpenFile] {
        state.withLock { state in state.opened[inode]?.files ?? [] }
    }

    /// Every open descriptor of every mount (a lock revokes them).
    func allOpenFiles() -> [OpenFile] {
        state.withLock { state in state.opened.values.flatMap { $0.files } }
    }

    // MARK: The mounts' kernel caches

    func register(_ cache: KernelCache) {
        caches.withLock { $0[ObjectIdentifier(cache)] = cache }
    }

    /// A mount ended: its kernel's references go with it (it sends no FORGET then).
    func unregister(_ cache: KernelCache) {
        _ = caches.withLock { $0.removeValue(forKey: ObjectIdentifier(cache)) }
        for (inode, count) in cache.droppedAll() { release(inode, count: count) }
    }

    /// Makes every mount but `origin` forget the names of `changed` (renamed
    /// or removed items, removed groups), so that none finds them under a
    /// name they no longer have. Called after the change committed, on the
    /// thread that made it and outside the store's lock (a request of
    /// another mount may be waiting for that lock while the kernel holds
    /// that mount's directory lock).
    ///
    /// `origin` is the mount whose request made the change: its kernel keeps
    /// its own names right, and while it waits for the reply it holds that
    /// directory's lock. The other mounts are then told on a thread of their
    /// own, which the reply does not wait for: a request of another mount,
    /// holding its directory's lock, may at the same moment be telling
    /// `origin` of a change of its own (each would wait for the other's lock).
    /// Changes through the socket (`origin` nil) hold no kernel lock and are
    /// told before the caller returns.
    private func forgetNames(_ changed: [Node], except origin: KernelCache?) {
        let others = caches.withLock { Array($0.values) }.filter { $0 !== origin }
        guard !others.isEmpty else { return }
        let names = others.flatMap { cache in
            changed.compactMap { node in cache.cachedName(of: node, in: self).map { (cache, $0.parent, $0.name) } }
        }
        let tell: @Sendable () -> Void = {
            for (cache, parent, name) in names { cache.forgetName(name, inDirectory: parent) }
        }
        if origin == nil {
            tell()
        } else if let thread = Threads.start(tell) {
            pthread_detach(thread)
        } else {
            Diagnostics.log("could not start a thread to refresh the other mounts' names; they expire on their own")
        }
    }
}

/// The inode bound to each key (a node), in 16 bytes a name where a
/// `[Node: UInt64]` takes 48: the key is already in the inode's entry, so
/// the index keeps the key's hash and the caller's `keyOf` checks the entry.
/// Swift's hashes are seeded per process (SipHash), so two names sharing
/// one is rare and cannot be arranged from outside; those few go to
/// `colliding`, compared in full.
struct HashIndex<Key: Hashable> {
    private var byHash: [Int: UInt64] = [:]
    private var colliding: [Key: UInt64] = [:]

    init(_ bindings: [Key: UInt64] = [:]) {
        for (key, inode) in bindings { insert(key, boundTo: inode) }
    }

    /// `keyOf` gives the key an inode's entry holds.
    func inode(of key: Key, keyOf: (UInt64) -> Key?) -> UInt64? {
        if let inode = byHash[key.hashValue], keyOf(inode) == key { return inode }
        return colliding.isEmpty ? nil : colliding[key]
    }

    /// Binds `key`, which no inode is bound to.
    mutating func insert(_ key: Key, boundTo inode: UInt64) {
        let hash = key.hashValue
        if byHash[hash] == nil { byHash[hash] = inode } else { colliding[key] = inode }
    }

    /// Unbinds `key` if it is bound to `inode`.
    mutating func remove(_ key: Key, boundTo inode: UInt64) {
        let hash = key.hashValue
        guard byHash[hash] == inode else {
            if colliding[key] == inode { colliding.removeValue(forKey: key) }
            return
        }
        byHash.removeValue(forKey: hash)
        if let (other, otherInode) = colliding.first(where: { $0.key.hashValue == hash }) {
            colliding.removeValue(forKey: other)
            byHash[hash] = otherInode
        }
        NodeTable.shrinkIfSparse(&byHash)
    }
}

#if canImport(Glibc)
import Glibc
#endif
