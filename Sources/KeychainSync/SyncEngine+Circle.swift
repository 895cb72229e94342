import KeychainCore

/// How far a join by approval is (docs/SYNC.md, "Joining").
package enum JoinProgress: Sendable, Equatable {
    /// Asked: waiting for a device of the circle to answer (`keychainfs sync approve` there).
    case asked
    /// Both devices can now show the code: waiting for the person to approve it there.
    case code(String)
    /// In the circle, and synced once.
    case joined(SyncReport)
}

/// A device asking to join, as the approving device sees it.
package struct JoinAsker: Sendable, Equatable {
    package let id: UInt64
    package let name: String
    package var idText: String { Hex.string(id) }
}

extension SyncEngine {
    // MARK: Starting a circle

    /// Starts a circle at `remote` (which must hold none) with this
    /// keychain's items; returns the circle's recovery key (shown once) and the first round's report.
    package func create(remote: String, groups: [String] = []) throws(SyncFailure) -> (
        recoveryKey: SecureBytes, report: SyncReport
    ) {
        try operation.withLock { _ throws(SyncFailure) -> (SecureBytes, SyncReport) in
            guard try storedState() == nil else { throw alreadyInCircle() }
            try makeDirectory()
            let git = try GitRepository.prepare(at: repositoryPath, remote: remote)
            if try git.fetch() != nil {
                throw SyncFailure(
                    .badInput,
                    "\(remote) holds a keychainfs circle already: join it with `keychainfs sync join \(remote)`")
            }
            let circle = Crypto.randomBytes(SyncKey.circleSize)
            let key = SyncKey.random(circle: circle, epoch: 1)
            let keys = DeviceKeys.generate()
            let me = Member(id: Self.newDeviceID(), name: hostName, publicKey: keys.publicKey)
            let recovery = RecoveryKey.generate()
            let recoveryPublic = DeviceKeys.recovery(from: recovery.key).publicKey
            var state = SyncState(
                remote: remote, circle: circle, epoch: 1, device: me.id, deviceName: me.name,
                publicKey: me.publicKey,
                sealedSecrets: try sealSecrets(key, deviceSecret: keys.secretKey, circle: circle, device: me.id),
                recoveryPublic: recoveryPublic, members: [me])
            state.groups = try Self.checked(groups)
            let manifest = Manifest(
                circle: circle, epoch: 1, sequence: 1, writer: me.id, written: clock(), recoveryPublic: recoveryPublic,
                members: [me], indexes: [:])
            let manifestBytes = manifest.encode(key: key)
            let commit = try git.commit(
                [
                    GitRepository.Change(path: Manifest.path, contents: manifestBytes),
                    GitRepository.Change(
                        path: KeyGrant.recoveryPath(epoch: 1),
                        contents: KeyGrant.sealForRecovery(key, recoveryPublic: recoveryPublic))
                ], on: nil, message: "keychainfs")
            guard try git.push(commit) == .pushed else {
                throw SyncFailure(.remote, "another device started a circle at \(remote) at the same time: join it")
            }
            state.agree(with: commit, manifest: manifestBytes, sequence: 1)
            try save(state)
            let report = try round(&state)
            state.lastSync = clock()
            try save(state)
            return (recovery.formatted(), report)
        }
    }

    static func newDeviceID() -> UInt64 {
        var id: UInt64 = 0
        while id == 0 { id = Crypto.randomBytes(8).reduce(0) { $0 << 8 | UInt64($1) } }
        return id
    }

    private func alreadyInCircle() -> SyncFailure {
        SyncFailure(.alreadyInCircle, "this keychain is in a circle already (`keychainfs sync status`)")
    }

    // MARK: Joining with the recovery key

    /// Joins the circle at `remote` with its recovery key (typed as shown).
    package func join(remote: String, recoveryKey typed: SecureBytes, groups: [String] = []) throws(SyncFailure)
        -> SyncReport
    {
        try operation.withLock { _ throws(SyncFailure) -> SyncReport in
            guard try storedState() == nil else { throw alreadyInCircle() }
            guard let recovery = RecoveryKey(typed: typed) else {
                throw SyncFailure(
                    .badInput, "that is not a recovery key: 64 letters of cbdefghijklnrtuv, in groups of eight")
            }
            try makeDirectory()
            let git = try GitRepository.prepare(at: repositoryPath, remote: remote)
            let (head, files, header, manifestBytes) = try circleHeader(git, remote: remote)
            let recoveryKeys = DeviceKeys.recovery(from: recovery.key)
            guard let sealedID = files[KeyGrant.recoveryPath(epoch: header.epoch)],
                let sealed = try git.contents(of: sealedID),
                let key = KeyGrant.openWithRecovery(
                    sealed, keys: recoveryKeys, circle: header.circle, epoch: header.epoch),
                var manifest = Manifest.decode(manifestBytes, key: key),
                manifest.recoveryPublic == recoveryKeys.publicKey
            else {
                throw SyncFailure(.badInput, "that recovery key does not open the circle at \(remote)")
            }
            let keys = DeviceKeys.generate()
            let me = Member(id: Self.newDeviceID(), name: hostName, publicKey: keys.publicKey)
            var state = SyncState(
                remote: remote, circle: header.circle, epoch: header.epoch, device: me.id, deviceName: me.name,
                publicKey: me.publicKey,
                sealedSecrets: try sealSecrets(key, deviceSecret: keys.secretKey, circle: header.circle, device: me.id),
                recoveryPublic: manifest.recoveryPublic, members: manifest.members + [me])
            state.sequence = manifest.sequence
            state.manifestDigest = Crypto.hash(manifestBytes)
            state.groups = try Self.checked(groups)
            manifest.members.append(me)
            try announce(manifest, on: head, git: git, key: key, state: &state)
            try save(state)
            let report = try round(&state)
            state.lastSync = clock()
            try save(state)
            return report
        }
    }

    /// The remote's head, files and manifest header, for a device not in its circle yet.
    private func circleHeader(_ git: GitRepository, remote: String) throws(SyncFailure) -> (
        String, [String: String], (circle: [UInt8], epoch: UInt32), [UInt8]
    ) {
        guard let head = try git.fetch() else {
            throw SyncFailure(
                .badInput, "\(remote) holds no keychainfs circle: start one with `keychainfs sync init \(remote)`")
        }
        let files = try git.files(of: head)
        guard let id = files[Manifest.path], let bytes = try git.contents(of: id), let header = Manifest.header(bytes)
        else {
            throw SyncFailure(.badInput, "\(remote) holds no keychainfs circle (no manifest on its keychainfs branch)")
        }
        return (head, files, header, bytes)
    }

    /// Pushes `manifest` (a changed membership) on `head`, with `extra` files.
    private func announce(
        _ manifest: Manifest, on head: String, git: GitRepository, key: SyncKey, state: inout SyncState,
        extra: [GitRepository.Change] = []
    ) throws(SyncFailure) {
        var next = manifest
        next.sequence = max(manifest.sequence, state.sequence) + 1
        next.writer = state.device
        next.written = clock()
        let bytes = next.encode(key: key)
        let commit = try git.commit(
            [GitRepository.Change(path: Manifest.path, contents: bytes)] + extra, on: head, message: "keychainfs")
        guard try git.push(commit) == .pushed else {
            throw SyncFailure(.remote, "\(state.remote) moved meanwhile: try again")
        }
        state.agree(with: commit, manifest: bytes, sequence: next.sequence)
        state.members = next.members
    }

    // MARK: Groups

    /// The groups as a person names them: each a valid group name, once; empty: every group.
    static func checked(_ groups: [String]) throws(SyncFailure) -> [String] {
        for group in groups {
            do throws(KeychainError) {
                try ItemLimits.validate(name: group)
            } catch {
                throw SyncFailure(.badInput, "\(group) is not a group name")
            }
        }
        return Array(Set(groups)).sorted()
    }

    /// Syncs only `groups` on this machine from now on (empty: every group).
    /// Items of a group left out stay here and in the circle; a group taken
    /// in is read from the circle at the next round.
    package func setGroups(_ groups: [String]) throws(SyncFailure) -> [String] {
        try operation.withLock { _ throws(SyncFailure) -> [String] in
            var state = try loadState()
            state.groups = try Self.checked(groups)
            state.forgetWhatWasRead()
            try save(state)
            changedHere.withLock { $0.all = true }
            return state.groups
        }
    }

    // MARK: Status

    /// The groups this machine syncs, as `sync status` and `sync groups` say them: `all`, or the list.
    package var groupsText: String { Self.text(ofGroups: saved.withLock { $0?.groups ?? [] }) }

    static func text(ofGroups groups: [String]) -> String {
        groups.isEmpty ? "all" : groups.joined(separator: ", ")
    }

    /// How many items changed here since they were last synced (new,
    /// changed, removed), or why that is not known now.
    private func pendingText(_ state: SyncState) -> String {
        let local: [ItemKey: ItemGeneration]
        do throws(SyncFailure) {
            local = try localItems().items.filter { $0.value.protectionClass.isMigratable && state.syncs($0.key.group) }
        } catch {
            return "unknown (\(error.sentence))"
        }
        let changed = local.count { state.base[$0.key]?.generation != $0.value.generation }
        let removed = state.base.count { $0.value.generation != 0 && local[$0.key] == nil && state.syncs($0.key.group) }
        return String(changed + removed)
    }

    /// What `keychainfs sync status` shows, as `name: value` lines.
    package func status() -> [(String, String)] {
        guard let state = saved.withLock({ $0 }) else { return [("circle", "none")] }
        let now = clock()
        func ago(_ time: UInt64) -> String {
            guard time > 0 else { return "never" }
            let seconds = now > time ? (now - time) / 1000 : 0
            if seconds < 120 { return "\(seconds) s ago" }
            if seconds < 7200 { return "\(seconds / 60) min ago" }
            if seconds < 172_800 { return "\(seconds / 3600) h ago" }
            return "\(seconds / 86_400) days ago"
        }
        var lines: [(String, String)] = [
            ("remote", state.remote), ("circle", Hex.string(state.circle)), ("key", String(state.epoch)),
            ("device", "\(state.deviceName) (\(Hex.string(state.device)))"), ("last-sync", ago(state.lastSync)),
            ("synced-items", String(state.base.values.count { $0.generation != 0 })),
            ("groups", Self.text(ofGroups: state.groups)),
            ("pending", pendingText(state))
        ]
        if !state.lastProblem.isEmpty { lines.append(("problem", state.lastProblem)) }
        for member in state.members where member.id != state.device {
            lines.append(
                ("member", "\(member.name) (\(Hex.string(member.id))), last heard \(ago(state.heard[member.id] ?? 0))"))
        }
        return lines
    }
}

extension SyncEngine {
    /// A device id as `sync status` and `sync approve` show it (16 hexadecimal digits).
    package static func deviceID(_ text: String) -> UInt64? { Hex.device(text.lowercased()) }
}
