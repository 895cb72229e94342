import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// What one round of sync did.
package struct SyncReport: Sendable, Equatable {
    /// Items changed or removed here from the circle's versions.
    package var received = 0
    /// Records this device added to the remote.
    package var sent = 0
    /// `group/name` of each conflict copy made.
    package var conflicts: [String] = []
    /// Items that wait for their class key (locked) before they sync.
    package var waiting = 0

    package init() {}
}

/// A keychain's sync with its circle (docs/SYNC.md): the device runs it,
/// one operation at a time, reading and writing items through the
/// keychain's manager like any door, and the remote through git. The
/// core knows nothing of it.
package final class SyncEngine: Sendable {
    let manager: PasswordManager
    /// `KEYCHAIN/sync`: the state, the joining state, the local repository.
    let directory: String
    let hostName: String
    let clock: @Sendable () -> UInt64
    /// One operation at a time; held across git's work (never by a read or write of an item).
    let operation = Mutex<Void>(())
    /// The state as last saved or read, for status without waiting on a round.
    let saved = Mutex<SyncState?>(nil)
    /// `sync/state.db`, opened when the keychain has one (or makes one: `sync init`, `sync join`).
    let store = Mutex<SyncStateStore?>(nil)
    /// The items changed here since the last round, as the device announced
    /// them (`all`: list every item, as the first round after a start does),
    /// so that a round looks at what changed, not at every item.
    let changedHere = Mutex<Changes>(Changes(keys: [], all: true, reread: false))

    /// What changed here since the last round.
    struct Changes {
        var keys: Set<ItemKey>
        /// Look at every item (the first round after a start, a group removed).
        var all: Bool
        /// Read the remote whole too (a policy changed: a group may sync again).
        var reread: Bool
    }
    private let observer = Mutex<Int?>(nil)
    /// Join requests this device answered: each one's request and our nonce (lost with the process: ask again).
    let answered = Mutex<[UInt64: (request: JoinRequest, nonce: [UInt8])]>([:])
    /// Called at each step of a round: a test's crash (it throws, and the
    /// round stops there as a killed process would) or another device's
    /// push in between. Nil outside tests.
    let interruption: (@Sendable (SyncStep) throws(SyncFailure) -> Void)?

    /// Where a round can be cut short (by a crash, or a push from elsewhere).
    package enum SyncStep: Sendable, CaseIterable {
        /// The remote was read and checked.
        case fetched
        /// The circle's changes were written here; the state not saved yet.
        case applied
        /// The commit to push was built.
        case committed
        /// The push went through; the state not saved yet.
        case pushed
    }

    package init(
        manager: PasswordManager, keychainPath: String, hostName: String,
        clock: @escaping @Sendable () -> UInt64 = SyncEngine.now,
        interruption: (@Sendable (SyncStep) throws(SyncFailure) -> Void)? = nil
    ) {
        self.manager = manager
        self.directory = keychainPath + "/sync"
        self.hostName = hostName
        self.clock = clock
        self.interruption = interruption
        if access(keychainPath + "/sync/state.db", F_OK) == 0 { _ = try? storedState() }
        let token = manager.localDevice.addObserver { [weak self] event in
            switch event {
            case .changed(.written(let group, let identifier)), .changed(.removed(let group, let identifier)):
                self?.noteChange(ItemKey(group: group, identifier: identifier))
            case .changed(.renamed(let group, let from, let to)):
                self?.noteChange(ItemKey(group: group, identifier: from))
                self?.noteChange(ItemKey(group: group, identifier: to))
            case .changed(.groupRemoved):
                self?.changedHere.withLock { $0.all = true }
            case .entitlementsChanged:
                self?.changedHere.withLock {
                    $0.all = true
                    $0.reread = true
                }
            case .changed(.groupCreated), .unlocked, .locked, .willLock:
                break
            }
        }
        observer.withLock { $0 = token }
    }

    deinit {
        if let token = observer.withLock({ $0 }) { manager.localDevice.removeObserver(token) }
    }

    private func noteChange(_ key: ItemKey) {
        changedHere.withLock { _ = $0.keys.insert(key) }
    }

    /// The changes noted so far, taken for a round (given back if it fails).
    func takeChanges() -> Changes {
        changedHere.withLock { noted in
            defer { noted = Changes(keys: [], all: false, reread: false) }
            return noted
        }
    }

    func giveBack(_ changes: Changes) {
        changedHere.withLock {
            $0.keys.formUnion(changes.keys)
            $0.all = $0.all || changes.all
            $0.reread = $0.reread || changes.reread
        }
    }

    package static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return UInt64(max(0, time.tv_sec)) * 1000 + UInt64(max(0, time.tv_nsec)) / 1_000_000
    }

    var statePath: String { directory + "/state.db" }
    var repositoryPath: String { directory + "/repository.git" }

    /// Whether this keychain is in a circle.
    package var isInCircle: Bool { saved.withLock { $0 != nil } }

    /// The state in `sync/state.db`; nil when the keychain is in no circle.
    func storedState() throws(SyncFailure) -> SyncState? {
        let state = try store.withLock { store throws(SyncFailure) -> SyncState? in
            if store == nil {
                guard access(statePath, F_OK) == 0 else { return nil }
                store = try SyncStateStore(path: statePath)
            }
            return try store?.load()
        }
        saved.withLock { $0 = state }
        return state
    }

    func loadState() throws(SyncFailure) -> SyncState {
        guard let state = try storedState() else {
            throw SyncFailure(
                .notInCircle,
                "this keychain syncs with no circle: start one with `keychainfs sync init REMOTE`, "
                    + "or join one with `keychainfs sync join REMOTE`")
        }
        return state
    }

    func save(_ state: SyncState) throws(SyncFailure) {
        try makeDirectory()
        try store.withLock { store throws(SyncFailure) in
            if store == nil { store = try SyncStateStore(path: statePath) }
            try store?.save(state)
        }
        saved.withLock { $0 = state }
    }

    func makeDirectory() throws(SyncFailure) {
        do throws(Errno) {
            try makeDirectoryUnlessPresent(directory, mode: 0o700)
        } catch {
            throw SyncFailure(.store(.io), "\(directory) could not be made (\(error))")
        }
    }

    // MARK: Secrets

    /// The sync key and the device's secret key, sealed under the
    /// device's own class key (``SyncState/secretClass``).
    func sealSecrets(_ key: SyncKey, deviceSecret: SecureBytes, circle: [UInt8], device: UInt64)
        throws(SyncFailure) -> [UInt8]
    {
        let plain = try! SecureBytes(count: 2 * SyncKey.size)
        key.secret.withUnsafeBytes { plain.mutableBytes.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: 32) }
        deviceSecret.withUnsafeBytes {
            (plain.mutableBytes.baseAddress! + 32).copyMemory(from: $0.baseAddress!, byteCount: 32)
        }
        do throws(KeychainError) {
            return try manager.localDevice.sealBlob(
                plain, under: SyncState.secretClass,
                context: SyncState.secretsContext(circle: circle, device: device))
        } catch {
            throw SyncFailure.store(error)
        }
    }

    func openSecrets(_ state: SyncState) throws(SyncFailure) -> (key: SyncKey, deviceSecret: SecureBytes) {
        let plain: SecureBytes
        do throws(KeychainError) {
            plain = try manager.localDevice.openBlob(
                state.sealedSecrets, under: SyncState.secretClass,
                context: SyncState.secretsContext(circle: state.circle, device: state.device))
        } catch .interactionNotAllowed {
            throw SyncFailure(.locked, "the keychain has not been unlocked since the device started: unlock it to sync")
        } catch {
            throw SyncFailure(.store(.decode), "this device's sync keys do not open: \(directory)/state was altered")
        }
        guard plain.count == 64 else { throw SyncFailure(.store(.decode), "this device's sync keys are damaged") }
        return plain.withUnsafeBytes { bytes in
            (
                SyncKey(
                    secret: try! SecureBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[..<32])),
                    circle: state.circle, epoch: state.epoch),
                try! SecureBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[32...]))
            )
        }
    }

    // MARK: Sync now

    /// One round: fetch, check, merge record by record, apply here, push.
    package func sync() throws(SyncFailure) -> SyncReport {
        try operation.withLock { _ throws(SyncFailure) -> SyncReport in
            var state = try loadState()
            do throws(SyncFailure) {
                return try round(&state)
            } catch {
                if error.reason != .removed, var latest = try? loadState() {
                    latest.lastProblem = error.sentence
                    try? save(latest)
                }
                throw error
            }
        }
    }

    /// What the remote holds, checked against the manifest (docs/SYNC.md,
    /// "What a remote can do"): every record the manifest lists is there,
    /// and every record read is the one it lists.
    struct Remote {
        let head: String?
        let manifest: Manifest?
        let manifestBytes: [UInt8]
        let manifestDigest: [UInt8]
        /// Every bucket's entries (record name to record digest), as the manifest lists them.
        var indexes: [UInt8: [[UInt8]: [UInt8]]]
        /// Every record the manifest lists, with its digest.
        var listed: [[UInt8]: [UInt8]]
        /// The records read: those this device has not agreed with yet (all, when asked for everything).
        var records: [ItemKey: (name: [UInt8], record: SyncRecord, digest: [UInt8])]
    }

    /// Reads and checks the remote at its branch's head: what changed
    /// since the commit this device last checked (git diff-tree; the whole
    /// tree when it has none), the index files whose digest moved, and the
    /// records it has not agreed with yet (`everything`: all of them).
    /// Takes a newer epoch's key when one was granted to this device
    /// (`state` and `key` change then).
    func readRemote(
        _ git: GitRepository, _ state: inout SyncState, _ key: inout SyncKey, secret: SecureBytes,
        everything: Bool = false
    ) throws(SyncFailure) -> Remote {
        guard let head = try git.fetch() else {
            if state.sequence > 0 {
                throw SyncFailure.refused(
                    "\(state.remote) has no keychainfs branch any more (emptied, or another repository)")
            }
            return Remote(
                head: nil, manifest: nil, manifestBytes: [], manifestDigest: [], indexes: [:], listed: [:],
                records: [:])
        }
        // What changed since the commit checked last; nil: read the whole tree.
        let changed = state.verifiedHead.isEmpty ? nil : try git.changes(from: state.verifiedHead, to: head)
        // Every changed file a round may read, in one `git cat-file` (most rounds need no other).
        var prefetched: [String: [UInt8]] = [:]
        if let changed {
            let wanted = changed.compactMap { path, id -> (String, String)? in
                guard let id, path == Manifest.path || path.hasPrefix("index/") || path.hasPrefix("records/") else {
                    return nil
                }
                return (path, id)
            }
            for ((path, _), bytes) in zip(wanted, try git.contents(wanted.map(\.1))) { prefetched[path] = bytes }
        }
        /// The files at `head`, from those read already or in one more `git cat-file`.
        func read(_ paths: [String]) throws(SyncFailure) -> [[UInt8]?] {
            let missing = paths.filter { prefetched[$0] == nil }
            for (path, bytes) in zip(missing, try git.contents(missing.map { head + ":" + $0 })) {
                prefetched[path] = bytes
            }
            return paths.map { prefetched[$0] }
        }
        let manifestBytes: [UInt8]
        if let changed, changed[Manifest.path] == nil, !state.manifestBytes.isEmpty {
            manifestBytes = state.manifestBytes
        } else {
            guard let read = try read([Manifest.path])[0] else {
                throw SyncFailure.refused("it has no manifest (not a keychainfs circle's repository)")
            }
            manifestBytes = read
        }
        guard let header = Manifest.header(manifestBytes) else {
            throw SyncFailure.refused("its manifest is not one keychainfs writes")
        }
        guard header.circle == state.circle else {
            throw SyncFailure.refused(
                "it serves another circle's repository (circle \(Hex.string(header.circle)); "
                    + "this device's circle is \(Hex.string(state.circle)))")
        }
        if header.epoch < key.epoch {
            throw SyncFailure.refused(
                "its manifest is sealed with the circle's key \(header.epoch), older than this device's "
                    + "\(key.epoch): an old copy of the repository (a rollback)")
        }
        if header.epoch > key.epoch {
            key = try adoptKey(
                epoch: header.epoch, head: head, manifest: manifestBytes, git: git, state: &state, secret: secret)
        }
        guard let manifest = Manifest.decode(manifestBytes, key: key) else {
            throw SyncFailure.refused("its manifest does not open with the circle's key (altered, or not the circle's)")
        }
        let digest = Crypto.hash(manifestBytes)
        if manifest.sequence < state.sequence {
            throw SyncFailure.refused(
                "it serves an older manifest (number \(manifest.sequence); this device has seen number "
                    + "\(state.sequence)): a replay or a rollback of the repository")
        }
        if manifest.sequence == state.sequence, state.sequence > 0, digest != state.manifestDigest {
            throw SyncFailure.refused(
                "two different manifests carry number \(manifest.sequence): the remote forked the circle's history")
        }
        // The index files the manifest names, each exactly as it says; one read before is not read again.
        var indexes: [UInt8: [[UInt8]: [UInt8]]] = [:]
        var unread: [UInt8] = []
        for (bucket, indexDigest) in manifest.indexes {
            if let known = state.indexes[bucket], known.digest == indexDigest {
                indexes[bucket] = known.entries
            } else {
                unread.append(bucket)
            }
        }
        let indexBytes = try read(unread.map { IndexFile.path($0) })
        for (bucket, bytes) in zip(unread, indexBytes) {
            guard let bytes else {
                throw SyncFailure.refused("index \(IndexFile.path(bucket)) that the manifest lists is missing")
            }
            guard Crypto.hash(bytes) == manifest.indexes[bucket],
                let entries = IndexFile.decode(bytes, bucket: bucket, key: key)
            else {
                throw SyncFailure.refused("index \(IndexFile.path(bucket)) does not match the manifest")
            }
            indexes[bucket] = entries
        }
        // Every listed record is there: those read below are, and the others were at the commit checked
        // last, so they are unless the diff removes them (without one, the whole tree is listed).
        let present: Set<String>? = changed == nil ? Set(try git.files(of: head).keys) : nil
        var listed: [[UInt8]: [UInt8]] = [:]
        var wanted: [(name: [UInt8], digest: [UInt8])] = []
        for entries in indexes.values {
            for (name, recordDigest) in entries {
                listed[name] = recordDigest
                let path = RecordPath.of(name)
                let removed = changed.map { $0[path] == .some(nil) } ?? !(present?.contains(path) ?? true)
                if removed {
                    throw SyncFailure.refused("a record the manifest lists is missing (\(path)): the remote dropped it")
                }
                if everything || state.processed[name] != recordDigest { wanted.append((name, recordDigest)) }
            }
        }
        let recordBytes = try read(wanted.map { RecordPath.of($0.name) })
        var records: [ItemKey: (name: [UInt8], record: SyncRecord, digest: [UInt8])] = [:]
        for (entry, bytes) in zip(wanted, recordBytes) {
            guard let bytes else {
                throw SyncFailure.refused(
                    "a record the manifest lists is missing (\(RecordPath.of(entry.name))): the remote dropped it")
            }
            guard Crypto.hash(bytes) == entry.digest else {
                throw SyncFailure.refused(
                    "record \(RecordPath.of(entry.name)) is not the one the manifest lists "
                        + "(another record, or an older version of it, in its place)")
            }
            guard let record = RecordFile.decode(bytes, name: entry.name, key: key) else {
                throw SyncFailure.refused("record \(RecordPath.of(entry.name)) does not open with the circle's key")
            }
            records[record.key] = (entry.name, record, entry.digest)
        }
        return Remote(
            head: head, manifest: manifest, manifestBytes: manifestBytes, manifestDigest: digest, indexes: indexes,
            listed: listed, records: records)
    }

    /// The remote as this device last checked it (no git at all): what a
    /// round that has changes to push assumes first, as `git push` does; a
    /// branch that moved since refuses the push, and the round reads it then.
    /// Nil when this device has checked no commit yet, or has not agreed
    /// with every record of it (one it skipped, its class locked, must be
    /// read and merged: assumed agreed, it would be overwritten unseen).
    func checkedRemote(_ state: SyncState, key: SyncKey) -> Remote? {
        guard !state.verifiedHead.isEmpty, let manifest = Manifest.decode(state.manifestBytes, key: key) else {
            return nil
        }
        var listed: [[UInt8]: [UInt8]] = [:]
        for index in state.indexes.values {
            for (name, digest) in index.entries {
                guard state.processed[name] == digest else { return nil }
                listed[name] = digest
            }
        }
        return Remote(
            head: state.verifiedHead, manifest: manifest, manifestBytes: state.manifestBytes,
            manifestDigest: state.manifestDigest, indexes: state.indexes.mapValues(\.entries), listed: listed,
            records: [:])
    }

    /// The key of a newer epoch, from the grant a member made to this device.
    private func adoptKey(
        epoch: UInt32, head: String, manifest: [UInt8], git: GitRepository, state: inout SyncState,
        secret: SecureBytes
    ) throws(SyncFailure) -> SyncKey {
        // One key at a time: a machine away while the key changed twice joins again. A later
        // key granted straight to it would be anyone's word (a removed machine can push one).
        guard epoch == state.epoch + 1 else {
            throw SyncFailure.refused(
                "its manifest claims the circle's key \(epoch), more than one after this device's \(state.epoch): "
                    + "if another machine shows that key in `sync status`, join again from it; otherwise the "
                    + "remote is not to be trusted")
        }
        guard let grant = try git.contents([head + ":" + KeyGrant.path(epoch: epoch, device: state.device)])[0] else {
            throw SyncFailure(
                .removed,
                "the circle's key changed (key \(epoch)) and none was granted to this device: another machine "
                    + "removed it, or the remote serves a key of its own. Check `sync devices` on another machine "
                    + "before joining again")
        }
        guard let granter = KeyGrant.granter(grant).flatMap({ state.member($0) }),
            let key = KeyGrant.open(
                grant, granterPublic: granter.publicKey, secret: secret, circle: state.circle, epoch: epoch),
            let members = Manifest.decode(manifest, key: key)?.members,
            members.contains(where: { $0.id == granter.id && $0.publicKey == granter.publicKey }),
            members.contains(where: { $0.id == state.device && $0.publicKey == state.publicKey })
        else {
            throw SyncFailure.refused(
                "the grant of the circle's new key (key \(epoch)) is from no machine of the circle that stays in it")
        }
        state.epoch = epoch
        state.sealedSecrets = try sealSecrets(key, deviceSecret: secret, circle: state.circle, device: state.device)
        // Names and seals are the new key's: nothing read under the old one stands.
        state.indexes = [:]
        state.processed = [:]
        return key
    }
}
