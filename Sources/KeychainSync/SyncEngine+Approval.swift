import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// A join by approval in progress, kept in `sync/joining` until it ends.
struct JoiningState {
    static let magic = Array("KCFSJOIN".utf8)

    var remote: String
    var circle: [UInt8]
    var me: Member
    /// The device's secret key, sealed as the sync state's secrets are.
    var sealedSecret: [UInt8]
    /// The nonce committed to in the request, revealed once a device answered.
    var nonce: [UInt8]
    /// The answer this device revealed its nonce to: fixed once taken.
    var response: JoinResponse?
    /// The groups this machine will sync (empty: every group).
    var groups: [String] = []
    /// Whether the person typed here the code the approving machine shows,
    /// and it was this one's: only then is a granted key taken (the answer
    /// and the grant come through the remote, which could make both).
    var confirmed = false

    var encoded: [UInt8] {
        var writer = ByteWriter()
        writer.append(Self.magic)
        writer.appendPrefixed(remote)
        writer.append(circle)
        me.encode(into: &writer)
        writer.append(UInt32(sealedSecret.count))
        writer.append(sealedSecret)
        writer.append(nonce)
        let response = response?.encoded ?? []
        writer.append(UInt32(response.count))
        writer.append(response)
        writer.append(UInt16(groups.count))
        for group in groups { writer.appendPrefixed(group) }
        writer.append(UInt8(confirmed ? 1 : 0))
        return writer.bytes
    }

    init(remote: String, circle: [UInt8], me: Member, sealedSecret: [UInt8], nonce: [UInt8]) {
        self.remote = remote
        self.circle = circle
        self.me = me
        self.sealedSecret = sealedSecret
        self.nonce = nonce
    }

    init(_ bytes: [UInt8]) throws(KeychainError) {
        var reader = ByteReader(bytes)
        guard try reader.read(Self.magic.count) == Self.magic else { throw .decode }
        remote = try reader.readPrefixed()
        circle = try reader.read(SyncKey.circleSize)
        me = try Member(reading: &reader)
        sealedSecret = try reader.read(Int(try reader.readUInt32()))
        nonce = try reader.read(32)
        let response = try reader.read(Int(try reader.readUInt32()))
        self.response = response.isEmpty ? nil : JoinResponse(response)
        for _ in 0..<Int(try reader.readUInt16()) { groups.append(try reader.readPrefixed()) }
        confirmed = try reader.readByte() == 1
        guard reader.isAtEnd else { throw .decode }
    }

    static func context(circle: [UInt8], device: UInt64) -> [UInt8] {
        var writer = ByteWriter()
        writer.appendPrefixed("kcfs-sync-joining")
        writer.append(circle)
        writer.append(device)
        return writer.bytes
    }
}

extension SyncEngine {
    var joiningPath: String { directory + "/joining" }

    private func loadJoining() throws(SyncFailure) -> JoiningState? {
        guard let fd = FileDescriptor(open(joiningPath, O_RDONLY | O_CLOEXEC)) else { return nil }
        do {
            return try JoiningState(try fd.borrowed.readAll())
        } catch {
            throw SyncFailure(.store(.decode), "\(joiningPath) is damaged: remove it and ask to join again")
        }
    }

    // MARK: The new device

    /// Asks to join the circle at `remote` (nil: the one asked already), or
    /// goes on with the request: call again until ``JoinProgress/joined(_:)``.
    package func join(remote: String?, groups: [String] = []) throws(SyncFailure) -> JoinProgress {
        try operation.withLock { _ throws(SyncFailure) -> JoinProgress in
            guard try storedState() == nil else {
                throw SyncFailure(.alreadyInCircle, "this keychain is in a circle already (`keychainfs sync status`)")
            }
            guard var joining = try loadJoining() else {
                guard let remote else {
                    throw SyncFailure(.notInCircle, "this device is not asking to join a circle: name the remote")
                }
                try ask(remote, groups: try Self.checked(groups))
                return .asked
            }
            if let remote, remote != joining.remote {
                throw SyncFailure(
                    .badInput,
                    "this device is asking to join the circle at \(joining.remote) already "
                        + "(`keychainfs sync join --cancel` to ask another)")
            }
            return try proceed(&joining)
        }
    }

    /// Forgets a join request (the remote keeps the request until a device of the circle answers or removes it).
    package func cancelJoin() throws(SyncFailure) {
        operation.withLock { _ in _ = unlink(joiningPath) }
    }

    private func ask(_ remote: String, groups: [String]) throws(SyncFailure) {
        try makeDirectory()
        let git = try GitRepository.prepare(at: repositoryPath, remote: remote)
        let keys = DeviceKeys.generate()
        let me = Member(id: Self.newDeviceID(), name: hostName, publicKey: keys.publicKey)
        let nonce = Crypto.randomBytes(32)
        for _ in 0..<5 {
            guard let head = try git.fetch() else {
                throw SyncFailure(
                    .badInput, "\(remote) holds no keychainfs circle: start one with `keychainfs sync init \(remote)`")
            }
            let files = try git.files(of: head)
            guard let id = files[Manifest.path], let bytes = try git.contents(of: id),
                let header = Manifest.header(bytes)
            else {
                throw SyncFailure(.badInput, "\(remote) holds no keychainfs circle (no manifest on its branch)")
            }
            let sealed: [UInt8]
            do throws(KeychainError) {
                sealed = try manager.localDevice.sealBlob(
                    keys.secretKey, under: SyncState.secretClass,
                    context: JoiningState.context(circle: header.circle, device: me.id))
            } catch {
                throw SyncFailure.store(error)
            }
            let request = JoinRequest(circle: header.circle, device: me, commitment: JoinRequest.commitment(to: nonce))
            let commit = try git.commit(
                [GitRepository.Change(path: JoinRequest.path(me.id), contents: request.encoded)], on: head,
                message: "keychainfs")
            if try git.push(commit) == .pushed {
                var joining = JoiningState(
                    remote: remote, circle: header.circle, me: me, sealedSecret: sealed, nonce: nonce)
                joining.groups = groups
                try AtomicFile.write(joining.encoded, to: joiningPath)
                return
            }
        }
        throw SyncFailure(.remote, "\(remote) kept moving: try again")
    }

    private func proceed(_ joining: inout JoiningState) throws(SyncFailure) -> JoinProgress {
        let git = try GitRepository.prepare(at: repositoryPath, remote: joining.remote)
        guard let head = try git.fetch() else {
            throw SyncFailure.refused("\(joining.remote) holds no circle any more")
        }
        let files = try git.files(of: head)
        guard let manifestID = files[Manifest.path], let manifestBytes = try git.contents(of: manifestID),
            let header = Manifest.header(manifestBytes), header.circle == joining.circle
        else {
            throw SyncFailure.refused(
                "\(joining.remote) now serves another circle than the one this device asked to join")
        }
        let secret: SecureBytes
        do throws(KeychainError) {
            secret = try manager.localDevice.openBlob(
                joining.sealedSecret, under: SyncState.secretClass,
                context: JoiningState.context(circle: joining.circle, device: joining.me.id))
        } catch {
            throw SyncFailure.store(error)
        }
        if let response = joining.response, joining.confirmed,
            let grantID = files[KeyGrant.path(epoch: header.epoch, device: joining.me.id)],
            let grant = try git.contents(of: grantID)
        {
            return .joined(
                try finishJoin(
                    joining, response: response, grant: grant, epoch: header.epoch,
                    manifestBytes: manifestBytes, secret: secret))
        }
        if joining.response == nil, let responseID = files[JoinRequest.responsePath(joining.me.id)],
            let response = try git.contents(of: responseID).flatMap(JoinResponse.init)
        {
            // Fixed from now on: the nonce is revealed to this answer alone.
            joining.response = response
            try AtomicFile.write(joining.encoded, to: joiningPath)
        }
        guard let response = joining.response else { return .asked }
        if files[JoinRequest.revealPath(joining.me.id)] == nil {
            let commit = try git.commit(
                [GitRepository.Change(path: JoinRequest.revealPath(joining.me.id), contents: joining.nonce)], on: head,
                message: "keychainfs")
            // A moved branch: revealed at the next call.
            guard try git.push(commit) == .pushed else { return .asked }
        }
        return .code(
            JoinRequest.code(
                circle: joining.circle, joiner: joining.me, approver: response.approver, approverNonce: response.nonce,
                joinerNonce: joining.nonce))
    }

    /// The person typed `typed`, the code the approving machine shows: if it
    /// is this machine's own, a key granted by that machine is taken from now
    /// on; otherwise nothing is, and the answer is not the approver's.
    package func confirmJoin(code typed: String) throws(SyncFailure) {
        try operation.withLock { _ throws(SyncFailure) in
            guard var joining = try loadJoining() else {
                throw SyncFailure(.notInCircle, "this device is not asking to join a circle")
            }
            guard let response = joining.response else {
                throw SyncFailure(.badInput, "no machine of the circle has answered yet: there is no code to confirm")
            }
            let code = JoinRequest.code(
                circle: joining.circle, joiner: joining.me, approver: response.approver, approverNonce: response.nonce,
                joinerNonce: joining.nonce)
            guard Self.isCode(typed, code) else {
                throw SyncFailure(
                    .badInput,
                    "that is not the code this machine shows: the answer did not come unchanged from the machine "
                        + "you approve on. Nothing was joined; start again with `keychainfs sync join --cancel`")
            }
            joining.confirmed = true
            try AtomicFile.write(joining.encoded, to: joiningPath)
        }
    }

    private func finishJoin(
        _ joining: JoiningState, response: JoinResponse, grant: [UInt8], epoch: UInt32, manifestBytes: [UInt8],
        secret: SecureBytes
    ) throws(SyncFailure) -> SyncReport {
        guard KeyGrant.granter(grant) == response.approver.id,
            let key = KeyGrant.open(
                grant, granterPublic: response.approver.publicKey, secret: secret, circle: joining.circle, epoch: epoch),
            let manifest = Manifest.decode(manifestBytes, key: key),
            manifest.members.contains(joining.me), manifest.members.contains(response.approver)
        else {
            throw SyncFailure.refused(
                "the key granted to this device is not from the device whose code was shown: nothing was joined")
        }
        var state = SyncState(
            remote: joining.remote, circle: joining.circle, epoch: epoch, device: joining.me.id,
            deviceName: joining.me.name, publicKey: joining.me.publicKey,
            sealedSecrets: try sealSecrets(key, deviceSecret: secret, circle: joining.circle, device: joining.me.id),
            recoveryPublic: manifest.recoveryPublic, members: manifest.members)
        state.sequence = manifest.sequence
        state.manifestDigest = Crypto.hash(manifestBytes)
        state.groups = joining.groups
        try save(state)
        unlink(joiningPath)
        let report = try round(&state)
        state.lastSync = clock()
        try save(state)
        return report
    }

    // MARK: The approving device

    /// The devices asking to join. The one `device` names, or the only one
    /// when a single one asks, is answered now (a nonce of this device's,
    /// published), so that its code can be shown; with several and none
    /// named, none is: a remote, or anyone who can push to it, that floods
    /// the circle with requests costs one read of them all, never an
    /// answer, a commit or a nonce for each (docs/SYNC.md, "Joining").
    package func joinRequests(answering device: UInt64? = nil) throws(SyncFailure) -> [JoinAsker] {
        try operation.withLock { _ throws(SyncFailure) -> [JoinAsker] in
            let state = try loadState()
            let (key, _) = try openSecrets(state)
            let me = Member(id: state.device, name: state.deviceName, publicKey: state.publicKey)
            let git = try GitRepository.prepare(at: repositoryPath, remote: state.remote)
            for _ in 0..<5 {
                guard let head = try git.fetch() else { throw SyncFailure.refused("the remote holds no circle") }
                let files = try git.files(of: head)
                var askers: [JoinAsker] = []
                var changes: [GitRepository.Change] = []
                let paths = files.keys.filter { $0.hasPrefix("circle/join/") && $0.hasSuffix("/request") }.sorted()
                var requests: [JoinRequest] = []
                // All of them in one `git cat-file`, however many there are.
                for (path, bytes) in zip(paths, try git.contents(paths.compactMap { files[$0] })) {
                    guard let request = bytes.flatMap(JoinRequest.init), request.circle == key.circle,
                        path == JoinRequest.path(request.device.id),
                        !state.members.contains(where: { $0.id == request.device.id })
                    else { continue }
                    requests.append(request)
                }
                let answering = requests.filter { device == nil ? requests.count == 1 : $0.device.id == device }
                for request in requests {
                    askers.append(JoinAsker(id: request.device.id, name: request.device.name))
                    guard answering.contains(where: { $0.device.id == request.device.id }) else { continue }
                    let known = answered.withLock { $0[request.device.id] }
                    if let known, known.request == request, files[JoinRequest.responsePath(request.device.id)] != nil {
                        continue
                    }
                    // A request already answered by another device, or by this one before it restarted:
                    // its nonce is revealed to that answer, so it is answered again only before that.
                    if files[JoinRequest.revealPath(request.device.id)] != nil { continue }
                    let nonce = Crypto.randomBytes(32)
                    answered.withLock { $0[request.device.id] = (request, nonce) }
                    changes.append(
                        GitRepository.Change(
                            path: JoinRequest.responsePath(request.device.id),
                            contents: JoinResponse(approver: me, nonce: nonce).encoded))
                }
                if changes.isEmpty { return askers }
                let commit = try git.commit(changes, on: head, message: "keychainfs")
                if try git.push(commit) == .pushed { return askers }
            }
            throw SyncFailure(.remote, "\(state.remote) kept moving: try again")
        }
    }

    /// The code device `id` shows, once it has revealed its nonce; nil before.
    package func joinCode(for id: UInt64) throws(SyncFailure) -> String? {
        try operation.withLock { _ throws(SyncFailure) -> String? in
            let state = try loadState()
            let git = try GitRepository.prepare(at: repositoryPath, remote: state.remote)
            guard let head = try git.fetch() else { throw SyncFailure.refused("the remote holds no circle") }
            return try code(for: id, state: state, files: try git.files(of: head), git: git)
        }
    }

    private func code(for id: UInt64, state: SyncState, files: [String: String], git: GitRepository)
        throws(SyncFailure) -> String?
    {
        guard let (request, nonce) = answered.withLock({ $0[id] }) else {
            throw SyncFailure(.badInput, "no device with id \(Hex.string(id)) asks this device to join the circle")
        }
        guard let revealID = files[JoinRequest.revealPath(id)] else { return nil }
        guard let reveal = try git.contents(of: revealID), JoinRequest.commitment(to: reveal) == request.commitment
        else {
            throw SyncFailure.refused(
                "\(request.device.name)'s request was altered on the way (its nonce does not match its commitment); "
                    + "nothing was granted")
        }
        let me = Member(id: state.device, name: state.deviceName, publicKey: state.publicKey)
        return JoinRequest.code(
            circle: state.circle, joiner: request.device, approver: me, approverNonce: nonce, joinerNonce: reveal)
    }

    /// Grants the circle's key to device `id`, if `code` is the code both
    /// devices show; a wrong code grants nothing.
    package func approve(_ id: UInt64, code typed: String) throws(SyncFailure) {
        try operation.withLock { _ throws(SyncFailure) in
            var state = try loadState()
            var (key, secret) = try openSecrets(state)
            let git = try GitRepository.prepare(at: repositoryPath, remote: state.remote)
            for _ in 0..<5 {
                let remote = try readRemote(git, &state, &key, secret: secret)
                guard let head = remote.head, var manifest = remote.manifest else {
                    throw SyncFailure.refused("the remote holds no circle")
                }
                guard let code = try code(for: id, state: state, files: try git.files(of: head), git: git) else {
                    throw SyncFailure(.badInput, "that device has not shown its code yet")
                }
                guard Self.isCode(typed, code) else {
                    throw SyncFailure(
                        .badInput,
                        "that is not the code: the devices show different codes, so the request was not the new "
                            + "device's own. Nothing was granted")
                }
                guard let request = answered.withLock({ $0[id]?.request }) else { continue }
                manifest.members.removeAll { $0.id == id }
                manifest.members.append(request.device)
                var next = manifest
                next.sequence = max(manifest.sequence, state.sequence) + 1
                next.writer = state.device
                next.written = clock()
                let bytes = next.encode(key: key)
                let changes = [
                    GitRepository.Change(path: Manifest.path, contents: bytes),
                    GitRepository.Change(
                        path: KeyGrant.path(epoch: key.epoch, device: id),
                        contents: KeyGrant.grant(
                            key, from: state.device, secret: secret, to: request.device.publicKey)),
                    GitRepository.Change(path: "circle/join/" + Hex.string(id), contents: nil)
                ]
                let commit = try git.commit(changes, on: head, message: "keychainfs")
                guard try git.push(commit) == .pushed else { continue }
                state.agree(with: commit, manifest: bytes, sequence: next.sequence)
                state.members = next.members
                try save(state)
                answered.withLock { _ = $0.removeValue(forKey: id) }
                return
            }
            throw SyncFailure(.remote, "\(state.remote) kept moving: try again")
        }
    }

    /// Whether the person typed `code`'s six digits (spaces and the like aside).
    static func isCode(_ typed: String, _ code: String) -> Bool {
        func digits(_ text: String) -> String { String(text.filter(\.isASCII).filter(\.isNumber)) }
        return digits(typed).count == 6 && digits(typed) == digits(code)
    }
}
