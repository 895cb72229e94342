import KeychainCore

extension SyncEngine {
    /// One round (docs/SYNC.md, "A round"): read and check the remote,
    /// merge each item's version here with the remote's, apply what the
    /// circle changed, push what this device changed on top of the commit
    /// read. A branch that moved meanwhile is read again; git never merges.
    func round(_ state: inout SyncState) throws(SyncFailure) -> SyncReport {
        var (key, secret) = try openSecrets(state)
        let git = try GitRepository.prepare(at: repositoryPath, remote: state.remote)
        for _ in 0..<8 {
            let remote = try readRemote(git, &state, &key, secret: secret)
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
            let pushes = try merge(remote, &state, key: key, report: &report)
            try interruption?(.applied)
            guard !pushes.isEmpty else {
                state.sequence = manifest.sequence
                state.manifestDigest = remote.manifestDigest
                try save(state)
                return report
            }
            // What this round applied here is agreed on even if the push must wait.
            try save(state)
            var next = manifest
            let (changes, newManifest) = writeRecords(
                pushes.map { ($0.record, key.recordName($0.record.key)) }, remote: remote, manifest: &next, key: key,
                state: state)
            let commit = try git.commit(changes, on: head, message: "keychainfs")
            try interruption?(.committed)
            switch try git.push(commit) {
            case .moved:
                continue
            case .pushed:
                try interruption?(.pushed)
                for push in pushes {
                    state.base[push.record.key] = SyncState.Base(
                        vector: push.record.vector, generation: push.generation)
                }
                report.sent = pushes.count
                state.sequence = next.sequence
                state.manifestDigest = Crypto.hash(newManifest)
                state.heard[state.device] = next.written
                try save(state)
                return report
            }
        }
        throw SyncFailure(.remote, "\(state.remote) kept moving while this device synced: try again")
    }

    /// A record this round pushes, and the item's generation here once it is pushed (0: none here).
    struct Push {
        let record: SyncRecord
        let generation: Int64
    }

    /// The items of the keychain that sync: every group without an
    /// entitlement policy (a policy is this device's; elsewhere nothing
    /// would keep its programs out).
    private func localItems() throws(SyncFailure) -> (items: [ItemKey: ItemGeneration], excluded: Set<String>) {
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

    /// Merges every item (the merge rule: ``MergeRule``), applies here what
    /// the circle changed, and returns what to push.
    private func merge(_ remote: Remote, _ state: inout SyncState, key: SyncKey, report: inout SyncReport)
        throws(SyncFailure) -> [Push]
    {
        let device = manager.localDevice
        let (local, excluded) = try localItems()
        var keys = Set(local.keys).union(state.base.keys).union(remote.records.keys)
        keys = keys.filter { !excluded.contains($0.group) }
        var pushes: [Push] = []
        var taken = Set(local.keys).union(remote.records.keys)
        let now = clock()
        for itemKey in keys.sorted() {
            let here = local[itemKey]
            // A ThisDeviceOnly item here holds its name: nothing of the circle replaces it.
            if let here, !here.protectionClass.isMigratable { continue }
            let base = state.base[itemKey]
            let theirs = remote.records[itemKey]?.record
            if let here, !device.isAvailable(here.protectionClass) {
                report.waiting += 1
                continue
            }
            if let content = theirs?.content, !device.isAvailable(content.protectionClass) {
                report.waiting += 1
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
                let seen = base?.vector ?? VersionVector()
                guard let theirs else {
                    // Synced before, but the remote no longer lists it: publish it again.
                    if let base, let record = try currentRecord(itemKey, here, vector: base.vector, now: now, state) {
                        pushes.append(Push(record: record, generation: here?.generation ?? 0))
                    }
                    continue
                }
                switch theirs.vector.compare(seen) {
                case .equal:
                    continue
                case .after:
                    if let generation = try apply(theirs, over: here) {
                        state.base[itemKey] = SyncState.Base(vector: theirs.vector, generation: generation)
                        report.received += 1
                    }
                case .before, .concurrent:
                    // Older than what this device agreed on: publish what it holds.
                    if let record = try currentRecord(itemKey, here, vector: seen, now: now, state) {
                        pushes.append(Push(record: record, generation: here?.generation ?? 0))
                    }
                }
                continue
            }
            state.counter += 1
            let vector = (base?.vector ?? VersionVector()).advanced(by: state.device, to: state.counter)
            guard let mine = try currentRecord(itemKey, here, vector: vector, now: now, state) else { continue }
            let outcome = MergeRule.merge(local: mine, remote: theirs)
            guard let result = outcome.result else { continue }
            var generation = here?.generation ?? 0
            if result.origin != mine.origin || result.changed != mine.changed || result.isTombstone != mine.isTombstone
            {
                // The circle's version won: it becomes the item here.
                guard let written = try apply(result, over: here) else { continue }
                generation = written
                report.received += 1
            }
            pushes.append(Push(record: result, generation: generation))
            if let loser = outcome.conflictCopy, let content = loser.content {
                let host = state.member(loser.origin)?.name ?? "another device"
                let name = MergeRule.conflictName(
                    of: itemKey.identifier, host: host, changed: loser.changed,
                    isTaken: { taken.contains(ItemKey(group: itemKey.group, identifier: $0)) })
                let copyKey = ItemKey(group: itemKey.group, identifier: name)
                taken.insert(copyKey)
                state.counter += 1
                let copy = SyncRecord(
                    key: copyKey, vector: VersionVector().advanced(by: state.device, to: state.counter),
                    body: .item(content), changed: loser.changed, origin: state.device)
                guard let written = try apply(copy, over: nil) else { continue }
                report.conflicts.append(copyKey.description)
                pushes.append(Push(record: copy, generation: written))
            }
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

    /// The files of a commit that writes `records` over the remote's, with
    /// the index files of their buckets and the manifest (next number).
    func writeRecords(
        _ records: [(record: SyncRecord, name: [UInt8])], remote: Remote, manifest: inout Manifest, key: SyncKey,
        state: SyncState
    ) -> (changes: [GitRepository.Change], manifest: [UInt8]) {
        var changes: [GitRepository.Change] = []
        var indexes = remote.indexes
        var touched: Set<UInt8> = []
        for (record, name) in records {
            let bytes = RecordFile.encode(record, name: name, key: key)
            changes.append(GitRepository.Change(path: RecordPath.of(name), contents: bytes))
            indexes[name[0], default: [:]][name] = Crypto.hash(bytes)
            touched.insert(name[0])
        }
        for bucket in touched.sorted() {
            let bytes = IndexFile.encode(indexes[bucket] ?? [:], bucket: bucket, key: key)
            changes.append(GitRepository.Change(path: IndexFile.path(bucket), contents: bytes))
            manifest.indexes[bucket] = Crypto.hash(bytes)
        }
        manifest.sequence = max(manifest.sequence, state.sequence) + 1
        manifest.writer = state.device
        manifest.written = clock()
        let bytes = manifest.encode(key: key)
        changes.append(GitRepository.Change(path: Manifest.path, contents: bytes))
        return (changes, bytes)
    }
}
