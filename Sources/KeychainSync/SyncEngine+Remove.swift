import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

extension SyncEngine {
    /// Removes a device from the circle (by its name, or its id as
    /// `sync status` shows it) and changes the circle's key, so that the
    /// removed device can open nothing written after (docs/SYNC.md, "Removing
    /// a device"): every record is sealed again under the new key, which is
    /// granted to each remaining device and to a new recovery key, which it
    /// returns (shown once). What the removed device synced before stays in
    /// its own keychain. The recovery key changes too: every member knew the
    /// old one's public half, which is all it takes to seal a circle's key
    /// to it, so the removed device could offer a circle of its own to a
    /// machine joining with the old key.
    package func remove(_ named: String) throws(SyncFailure) -> (removed: Member, recoveryKey: SecureBytes) {
        try operation.withLock { _ throws(SyncFailure) -> (removed: Member, recoveryKey: SecureBytes) in
            var state = try loadState()
            // First agree with the circle, under the key it has now.
            _ = try round(&state)
            try save(state)
            let matches = state.members.filter { $0.name == named || Hex.string($0.id) == named.lowercased() }
            guard matches.count == 1, let removed = matches.first else {
                let known = state.members.map { "\($0.name) (\(Hex.string($0.id)))" }.joined(separator: ", ")
                throw SyncFailure(
                    .badInput,
                    matches.isEmpty
                        ? "no device of the circle is named \(named) (the circle: \(known))"
                        : "\(matches.count) devices are named \(named): name one by its id (the circle: \(known))")
            }
            guard removed.id != state.device else {
                throw SyncFailure(.badInput, "\(named) is this device: remove it from another device of the circle")
            }
            var (key, secret) = try openSecrets(state)
            let git = try GitRepository.prepare(at: repositoryPath, remote: state.remote)
            for _ in 0..<5 {
                let remote = try readRemote(git, &state, &key, secret: secret, everything: true)
                guard let head = remote.head, let manifest = remote.manifest else {
                    throw SyncFailure.refused("the remote holds no circle")
                }
                let newKey = SyncKey.random(circle: state.circle, epoch: key.epoch + 1)
                let recovery = RecoveryKey.generate()
                let recoveryPublic = DeviceKeys.recovery(from: recovery.key).publicKey
                let members = manifest.members.filter { $0.id != removed.id }
                var next = Manifest(
                    circle: state.circle, epoch: newKey.epoch, sequence: manifest.sequence, writer: state.device,
                    written: clock(), recoveryPublic: recoveryPublic, members: members, indexes: [:])
                let records = remote.records.values.map { read -> (name: [UInt8], bytes: [UInt8]) in
                    let name = newKey.recordName(read.record.key)
                    return (name, RecordFile.encode(read.record, name: name, key: newKey))
                }
                var (changes, bytes, indexes) = writeRecords(
                    records, indexes: [:], manifest: &next, key: newKey, state: state)
                changes.insert(GitRepository.Change(path: "records", contents: nil), at: 0)
                changes.insert(GitRepository.Change(path: "index", contents: nil), at: 1)
                for member in members where member.id != state.device {
                    changes.append(
                        GitRepository.Change(
                            path: KeyGrant.path(epoch: newKey.epoch, device: member.id),
                            contents: KeyGrant.grant(newKey, from: state.device, secret: secret, to: member.publicKey)))
                }
                changes.append(
                    GitRepository.Change(
                        path: KeyGrant.recoveryPath(epoch: newKey.epoch),
                        contents: KeyGrant.sealForRecovery(newKey, recoveryPublic: recoveryPublic)))
                let commit = try git.commit(changes, on: head, message: "keychainfs")
                guard try git.push(commit) == .pushed else { continue }
                state.epoch = newKey.epoch
                state.sealedSecrets = try sealSecrets(
                    newKey, deviceSecret: secret, circle: state.circle, device: state.device)
                state.members = members
                state.agree(with: commit, manifest: bytes, sequence: next.sequence, indexes: indexes)
                state.heard[removed.id] = nil
                state.processed = [:]
                for (name, bytes) in records { state.processed[name] = Crypto.hash(bytes) }
                try save(state)
                return (removed, recovery.formatted())
            }
            throw SyncFailure(.remote, "\(state.remote) kept moving: try again")
        }
    }

    /// Takes this keychain out of its circle here: forgets the circle's
    /// keys and state (the items stay; the remote and the other devices
    /// are not told: remove this device from one of them as well).
    package func leave() throws(SyncFailure) {
        try operation.withLock { _ throws(SyncFailure) in
            _ = try loadState()
            try store.withLock { store throws(SyncFailure) in try store?.clear() }
            unlink(joiningPath)
            saved.withLock { $0 = nil }
        }
    }
}
