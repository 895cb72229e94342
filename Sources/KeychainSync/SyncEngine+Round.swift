import KeychainCore

extension SyncEngine {
    /// One round (docs/SYNC.md, "A round"): read and check the remote,
    /// merge each item's version here with the remote's, apply what the
    /// circle changed, push what this device changed on top of the commit
    /// read. A branch that moved meanwhile is read again; git never merges.
    func round(_ state: inout SyncState) throws(SyncFailure) -> SyncReport {
        var (key, secret) = try openSecrets(state)
        let git = try GitRepository.prepare(at: repositoryPath, remote: state.remote)
        // The items changed here since the last round: given back unless this one ends well.
        let changes = takeChanges()
        if changes.reread { state.forgetWhatWasRead() }
        var waiting: Set<ItemKey> = []
        var finished = false
        defer {
            giveBack(
                finished
                    ? SyncEngine.Changes(keys: waiting, all: false, reread: false)
                    : SyncEngine.Changes(keys: changes.keys.union(waiting), all: changes.all, reread: changes.reread))
        }
        // With changes to push, first as `git push` does: onto the commit checked last.
        var assumed = !changes.keys.isEmpty
        for _ in 0..<8 {
            let checked = assumed ? checkedRemote(state, key: key) : nil
            let remote: Remote
            if let checked { remote = checked } else { remote = try readRemote(git, &state, &key, secret: secret) }
            assumed = checked != nil
            guard let manifest = remote.manifest, let head = remote.head else {
                throw SyncFailure.refused("\(state.remote) holds no keychainfs circle")
            }
            guard manifest.members.contains(where: { $0.id == state.device }) else {
                throw SyncFailure(
                    .removed, "this device is not in the circle any more (another device removed it)")
            }
            state.members = manifest.members
            state.heard[manifest.writer] = max(state.heard[manifest.writer] ?? 0, manifest.written)
            try interruption?(.fetched)
            var report = SyncReport()
            waiting = []
            let pushes = try merge(remote, &state, key: key, changes: changes, waiting: &waiting, report: &report)
            try interruption?(.applied)
            if assumed && pushes.isEmpty {
                // Nothing to push after all: read what the circle changed.
                assumed = false
                continue
            }
            guard !pushes.isEmpty else {
                state.agree(
                    with: head, manifest: remote.manifestBytes, sequence: manifest.sequence,
                    indexes: manifest.indexes.reduce(into: [:]) {
                        $0[$1.key] = ($1.value, remote.indexes[$1.key] ?? [:])
                    })
                state.lastSync = clock()
                state.lastProblem = ""
                try save(state)
                finished = true
                return report
            }
            // What this round applied here is agreed on even if the push must wait.
            try save(state)
            var next = manifest
            let written = writeRecords(
                pushes.map { ($0.name, $0.bytes) }, indexes: remote.indexes, manifest: &next, key: key, state: state)
            let commit = try git.commit(written.changes, on: head, message: "keychainfs")
            try interruption?(.committed)
            switch try git.push(commit) {
            case .moved:
                assumed = false
                continue
            case .pushed:
                try interruption?(.pushed)
                for push in pushes {
                    state.base[push.key] = SyncState.Base(vector: push.vector, generation: push.generation)
                    state.processed[push.name] = push.digest
                }
                report.sent = pushes.count
                state.agree(with: commit, manifest: written.manifest, sequence: next.sequence, indexes: written.indexes)
                state.heard[state.device] = next.written
                state.lastSync = clock()
                state.lastProblem = ""
                try save(state)
                finished = true
                return report
            }
        }
        throw SyncFailure(.remote, "\(state.remote) kept moving while this device synced: try again")
    }

    /// A record this round pushes, sealed: its item, name, vector, bytes
    /// and their digest, and the item's generation here once it is pushed
    /// (0: none here). The value itself is not kept once sealed.
    struct Push {
        let key: ItemKey
        let name: [UInt8]
        let vector: VersionVector
        let bytes: [UInt8]
        let digest: [UInt8]
        let generation: Int64

        init(_ record: SyncRecord, generation: Int64, key: SyncKey) {
            self.key = record.key
            name = key.recordName(record.key)
            vector = record.vector
            bytes = RecordFile.encode(record, name: name, key: key)
            digest = Crypto.hash(bytes)
            self.generation = generation
        }
    }

    /// The items of the keychain that sync: every group without an
    /// entitlement policy (a policy is this device's; elsewhere nothing
    /// would keep its programs out).
    func localItems() throws(SyncFailure) -> (items: [ItemKey: ItemGeneration], excluded: Set<String>) {
        let device = manager.localDevice
        var items: [ItemKey: ItemGeneration] = [:]
        var excluded: Set<String> = []
        do throws(KeychainError) {
            for group in try manager.groups() {
                if device.hasEntitlementPolicy(group) {
                    excluded.insert(group)
                    continue
                }
                for item in try manager.generations(inGroup: group) {
                    items[ItemKey(group: group, identifier: item.identifier)] = item
                }
            }
        } catch {
            throw SyncFailure.store(error)
        }
        return (items, excluded)
    }

    /// What the remote holds for an item.
    private enum Theirs {
        /// No record: never synced, or gone from the remote.
        case absent
        /// The record this device last agreed with, unchanged (not read).
        case agreed
        /// A record this device has not agreed with yet.
        case record(SyncRecord, digest: [UInt8])
    }

    /// The items among `keys` as the keychain holds them now (the others
    /// are not there), and the groups of `keys` that do not sync.
    private func localItems(_ keys: Set<ItemKey>) throws(SyncFailure) -> (
        items: [ItemKey: ItemGeneration], excluded: Set<String>
    ) {
        let device = manager.localDevice
        var items: [ItemKey: ItemGeneration] = [:]
        var excluded: Set<String> = []
        do throws(KeychainError) {
            for key in keys {
                if device.hasEntitlementPolicy(key.group) {
                    excluded.insert(key.group)
                    continue
                }
                if let item = try manager.generation(forIdentifier: key.identifier, inGroup: key.group) {
                    items[key] = item
                }
            }
        } catch {
            throw SyncFailure.store(error)
        }
        return (items, excluded)
    }

    /// Merges the items changed here or in the circle (the merge rule:
    /// ``MergeRule``), applies here what the circle changed, and returns
    /// what to push. `changes`: the items changed here since the last round
    /// (`all`: every item is looked at); those that wait for a class key go to `waiting`.
    private func merge(
        _ remote: Remote, _ state: inout SyncState, key: SyncKey, changes: SyncEngine.Changes,
        waiting: inout Set<ItemKey>, report: inout SyncReport
    ) throws(SyncFailure) -> [Push] {
        let device = manager.localDevice
        var keys: Set<ItemKey>
        let local: [ItemKey: ItemGeneration]
        let excluded: Set<String>
        if changes.all {
            (local, excluded) = try localItems()
            keys = Set(local.keys).union(state.base.keys).union(remote.records.keys)
        } else {
            keys = changes.keys.union(remote.records.keys)
            (local, excluded) = try localItems(keys)
        }
        // Items of a group that does not sync here (a policed one, or one this machine did not
        // choose): the circle's records of them are left to the machines that take them, noted as
        // seen so that a round does not read them again (choosing the group, or a policy's end,
        // makes this machine read everything once more).
        for (itemKey, read) in remote.records where excluded.contains(itemKey.group) || !state.syncs(itemKey.group) {
            state.processed[read.name] = read.digest
        }
        keys = keys.filter { !excluded.contains($0.group) && state.syncs($0.group) }
        var pushes: [Push] = []
        var taken = Set(local.keys).union(remote.records.keys).union(state.base.keys)
        let now = clock()
        for itemKey in keys.sorted() {
            let here = local[itemKey]
            // A ThisDeviceOnly item here holds its name: nothing of the circle replaces it.
            if let here, !here.protectionClass.isMigratable { continue }
            let base = state.base[itemKey]
            let theirs: Theirs
            if let read = remote.records[itemKey] {
                theirs = .record(read.record, digest: read.digest)
            } else if remote.listed[key.recordName(itemKey)] != nil {
                theirs = .agreed
            } else {
                theirs = .absent
            }
            if let here, !device.isAvailable(here.protectionClass) {
                report.waiting += 1
                waiting.insert(itemKey)
                continue
            }
            if case .record(let record, _) = theirs, let content = record.content,
                !device.isAvailable(content.protectionClass)
            {
                report.waiting += 1
                waiting.insert(itemKey)
                continue
            }
            let changedHere: Bool
            switch (here, base) {
            case (.some(let here), .some(let base)): changedHere = base.generation != here.generation
            case (.some, nil): changedHere = true
            case (nil, .some(let base)): changedHere = base.generation != 0
            case (nil, nil): changedHere = false
            }
            if !changedHere {
                switch theirs {
                case .agreed:
                    continue
                case .absent:
                    // Synced before, but the remote no longer lists it: publish it again.
                    if let base, let record = try currentRecord(itemKey, here, vector: base.vector, now: now, state) {
                        pushes.append(Push(record, generation: here?.generation ?? 0, key: key))
                    }
                    continue
                case .record(let record, let digest):
                    switch record.vector.compare(base?.vector ?? VersionVector()) {
                    case .equal:
                        state.processed[key.recordName(itemKey)] = digest
                        continue
                    case .after:
                        if let generation = try apply(record, over: here) {
                            state.base[itemKey] = SyncState.Base(vector: record.vector, generation: generation)
                            state.processed[key.recordName(itemKey)] = digest
                            report.received += 1
                        }
                        continue
                    case .before, .concurrent:
                        // Not after what this device agreed on (a fork the remote joined later):
                        // merged below as a change of this device's, so that both sides end with one
                        // version (republishing this one would only be answered by theirs, forever).
                        break
                    }
                }
            }
            state.counter += 1
            let vector = (base?.vector ?? VersionVector()).advanced(by: state.device, to: state.counter)
            guard let mine = try currentRecord(itemKey, here, vector: vector, now: now, state) else { continue }
            var remoteRecord: SyncRecord? = nil
            if case .record(let record, _) = theirs { remoteRecord = record }
            let outcome = MergeRule.merge(local: mine, remote: remoteRecord)
            guard let result = outcome.result else { continue }
            // The version that lost is kept first, under a name of its own: should that fail,
            // nothing has been replaced yet.
            if let loser = outcome.conflictCopy, let content = loser.content {
                let host = state.member(loser.origin)?.name ?? "another device"
                // A name no item has, here or in the circle; one made meanwhile makes it try the next.
                var kept = false
                for _ in 0..<8 where !kept {
                    let name = MergeRule.conflictName(
                        of: itemKey.identifier, host: host, changed: loser.changed,
                        isTaken: {
                            taken.contains(ItemKey(group: itemKey.group, identifier: $0))
                                || (try? manager.generation(forIdentifier: $0, inGroup: itemKey.group)) != nil
                        })
                    let copyKey = ItemKey(group: itemKey.group, identifier: name)
                    taken.insert(copyKey)
                    state.counter += 1
                    let copy = SyncRecord(
                        key: copyKey, vector: VersionVector().advanced(by: state.device, to: state.counter),
                        body: .item(content), changed: loser.changed, origin: state.device)
                    guard let written = try apply(copy, over: nil) else { continue }
                    report.conflicts.append(copyKey.description)
                    pushes.append(Push(copy, generation: written, key: key))
                    kept = true
                }
                // No name could be had: the item is left as it is, for the next round.
                guard kept else { continue }
            }
            var generation = here?.generation ?? 0
            if result.origin != mine.origin || result.changed != mine.changed || result.isTombstone != mine.isTombstone
            {
                // The circle's version won: it becomes the item here.
                guard let written = try apply(result, over: here) else { continue }
                generation = written
                report.received += 1
            }
            pushes.append(Push(result, generation: generation, key: key))
        }
        return pushes
    }

    /// The item as this device holds it now, as a record of `vector`
    /// (a tombstone when it is gone); nil when it changed while read.
    private func currentRecord(
        _ key: ItemKey, _ here: ItemGeneration?, vector: VersionVector, now: UInt64, _ state: SyncState
    ) throws(SyncFailure) -> SyncRecord? {
        guard let here else {
            return SyncRecord(key: key, vector: vector, body: .tombstone, changed: now, origin: state.device)
        }
        let version: ItemVersion?
        do throws(KeychainError) {
            version = try manager.version(forIdentifier: key.identifier, inGroup: key.group)
        } catch {
            throw SyncFailure.store(error)
        }
        guard let version, version.generation == here.generation else { return nil }
        return SyncRecord(
            key: key, vector: vector,
            body: .item(
                SyncedContent(protectionClass: version.protectionClass, value: version.value, details: version.details)),
            changed: now, origin: state.device)
    }

    /// Makes `record` the item here, unless the item changed since it was
    /// listed (a write of the person's never gives way to the circle's in
    /// the same instant: the next round merges it). The generation written
    /// (0 for a removal), or nil when nothing was done.
    private func apply(_ record: SyncRecord, over here: ItemGeneration?) throws(SyncFailure) -> Int64? {
        do throws(KeychainError) {
            guard let content = record.content else {
                guard let here else { return 0 }
                return try manager.deleteKey(
                    forIdentifier: record.key.identifier, inGroup: record.key.group, generation: here.generation)
                    ? 0 : nil
            }
            return try manager.write(
                content.value, identifier: record.key.identifier, group: record.key.group,
                protectionClass: content.protectionClass, details: content.details, replacing: here?.generation)
        } catch {
            throw SyncFailure.store(error)
        }
    }

    /// The files of a commit that writes `records` (name and sealed bytes)
    /// over `indexes`, with the index files of their buckets and the
    /// manifest (next number); the manifest's bytes and the indexes after.
    func writeRecords(
        _ records: [(name: [UInt8], bytes: [UInt8])], indexes: [UInt8: [[UInt8]: [UInt8]]], manifest: inout Manifest,
        key: SyncKey, state: SyncState
    ) -> (
        changes: [GitRepository.Change], manifest: [UInt8],
        indexes: [UInt8: (digest: [UInt8], entries: [[UInt8]: [UInt8]])]
    ) {
        var changes: [GitRepository.Change] = []
        var entries = indexes
        var touched: Set<UInt8> = []
        for (name, bytes) in records {
            changes.append(GitRepository.Change(path: RecordPath.of(name), contents: bytes))
            entries[name[0], default: [:]][name] = Crypto.hash(bytes)
            touched.insert(name[0])
        }
        for bucket in touched.sorted() {
            let bytes = IndexFile.encode(entries[bucket] ?? [:], bucket: bucket, key: key)
            changes.append(GitRepository.Change(path: IndexFile.path(bucket), contents: bytes))
            manifest.indexes[bucket] = Crypto.hash(bytes)
        }
        manifest.sequence = max(manifest.sequence, state.sequence) + 1
        manifest.writer = state.device
        manifest.written = clock()
        let bytes = manifest.encode(key: key)
        changes.append(GitRepository.Change(path: Manifest.path, contents: bytes))
        var after: [UInt8: (digest: [UInt8], entries: [[UInt8]: [UInt8]])] = [:]
        for (bucket, digest) in manifest.indexes { after[bucket] = (digest, entries[bucket] ?? [:]) }
        return (changes, bytes, after)
    }
}
