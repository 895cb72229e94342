import Foundation
import Testing
@testable import KeychainCore
@testable import KeychainSync

/// Devices in this process syncing through a bare repository (docs/SYNC.md).
@Suite(.serialized) struct SyncEngineTests {
    /// A circle of `names.count` devices at a fresh remote: the first
    /// starts it, the others join with its recovery key.
    static func circle(_ names: String..., clock: TestClock? = nil) throws -> (BareRemote, [SyncedDevice]) {
        let remote = try BareRemote()
        let devices = try names.map { name in
            guard let clock else { return try SyncedDevice(name) }
            return try SyncedDevice(name, clock: { clock.now })
        }
        let recovery = try devices[0].engine.create(remote: remote.url).recoveryKey
        for device in devices.dropFirst() {
            _ = try device.engine.join(remote: remote.url, recoveryKey: recovery)
        }
        return (remote, devices)
    }

    /// Two devices in a circle that both hold `mail` with `value`.
    static func twoInSync(mail value: String) throws -> (BareRemote, SyncedDevice, SyncedDevice) {
        let (remote, devices) = try circle("laptop", "desktop")
        try devices[0].set("mail", value)
        _ = try devices[0].engine.sync()
        _ = try devices[1].engine.sync()
        return (remote, devices[0], devices[1])
    }

    @Test func migratableItemsReachTheOtherDeviceWithTheirClassAndDetails() throws {
        let laptop = try SyncedDevice("laptop")
        try laptop.set("github.com", "ghp_token")
        try laptop.set("wifi", "hunter2", group: "home", .afterFirstUnlock)
        try laptop.set("always", "a", .always)
        try laptop.set("device-only", "stays here", .whenUnlockedThisDeviceOnly)
        var details = ItemDetails(label: "GitHub", contentType: "text/plain", attributes: ["service": "github"])
        details.created = 1_700_000_000
        details.modified = 1_700_000_001
        try laptop.manager.setDetails(details, forIdentifier: "github.com", inGroup: "default")
        let remote = try BareRemote()
        let started = try laptop.engine.create(remote: remote.url)
        #expect(started.report.sent == 3)
        let desktop = try SyncedDevice("desktop")
        let joined = try desktop.engine.join(remote: remote.url, recoveryKey: started.recoveryKey)
        #expect(joined.received == 3)
        #expect(
            try desktop.contents() == [
                "default/always=a (always)", "default/github.com=ghp_token (whenUnlocked)",
                "home/wifi=hunter2 (afterFirstUnlock)"
            ])
        let copied = try desktop.manager.details(forIdentifier: "github.com", inGroup: "default")
        #expect(copied?.label == "GitHub")
        #expect(copied?.attributes == ["service": "github"])
        #expect(copied?.modified == 1_700_000_001)
    }

    @Test func changesAndRemovalsTravelBothWays() throws {
        let (remote, devices) = try Self.circle("laptop", "desktop")
        defer { withExtendedLifetime(remote) {} }
        let (laptop, desktop) = (devices[0], devices[1])
        try desktop.set("mail", "one")
        _ = try desktop.engine.sync()
        _ = try laptop.engine.sync()
        #expect(try laptop.get("mail") == "one")
        try laptop.set("mail", "two")
        _ = try laptop.engine.sync()
        #expect(try desktop.engine.sync().received == 1)
        #expect(try desktop.get("mail") == "two")
        try desktop.manager.deleteKey(forIdentifier: "mail")
        _ = try desktop.engine.sync()
        _ = try laptop.engine.sync()
        #expect(try laptop.get("mail") == nil)
        // Nothing more to do: a round with no change pushes nothing.
        #expect(try laptop.engine.sync() == SyncReport())
    }

    @Test func concurrentChangesKeepBothWritesOnEveryDevice() throws {
        let clock = TestClock()
        let (remote, devices) = try Self.circle("laptop", "desktop", clock: clock)
        defer { withExtendedLifetime(remote) {} }
        let (laptop, desktop) = (devices[0], devices[1])
        try laptop.set("mail", "base")
        _ = try laptop.engine.sync()
        _ = try desktop.engine.sync()
        try laptop.set("mail", "from laptop")
        _ = try laptop.engine.sync()
        clock.advance(1000)
        try desktop.set("mail", "from desktop")
        let report = try desktop.engine.sync()
        #expect(report.conflicts.count == 1)
        _ = try laptop.engine.sync()
        #expect(try laptop.contents() == desktop.contents())
        let values = try laptop.contents()
        // The newer (the desktop's, synced later) is the item; the laptop's is beside it.
        #expect(values.contains("default/mail=from desktop (whenUnlocked)"))
        #expect(
            values.contains {
                $0.hasPrefix("default/mail (conflict from laptop, ") && $0.hasSuffix("=from laptop (whenUnlocked)")
            })
    }

    @Test func aChangeSurvivesARemovalThatDidNotSeeIt() throws {
        let (remote, laptop, desktop) = try Self.twoInSync(mail: "base")
        defer { withExtendedLifetime(remote) {} }
        try laptop.manager.deleteKey(forIdentifier: "mail")
        _ = try laptop.engine.sync()
        try desktop.set("mail", "changed")
        _ = try desktop.engine.sync()
        _ = try laptop.engine.sync()
        #expect(try laptop.get("mail") == "changed")
        #expect(try desktop.get("mail") == "changed")
    }

    @Test func aValueWhoseClassIsLockedWaitsForTheUnlock() throws {
        let (remote, devices) = try Self.circle("laptop", "desktop")
        defer { withExtendedLifetime(remote) {} }
        let (laptop, desktop) = (devices[0], devices[1])
        try laptop.set("mail", "one")
        try laptop.set("bg", "one", .afterFirstUnlock)
        _ = try laptop.engine.sync()
        _ = try desktop.engine.sync()
        try laptop.set("mail", "two")
        try laptop.set("bg", "two", .afterFirstUnlock)
        _ = try laptop.engine.sync()
        desktop.manager.localDevice.lock()
        let locked = try desktop.engine.sync()
        #expect(locked.waiting == 1)
        #expect(locked.received == 1)
        try desktop.manager.localDevice.unlock(passcode: try SecureBytes(SyncedDevice.passcode))
        #expect(try desktop.get("mail") == "one")
        #expect(try desktop.get("bg") == "two")
        #expect(try desktop.engine.sync().received == 1)
        #expect(try desktop.get("mail") == "two")
    }

    @Test func aThisDeviceOnlyItemNeverReachesTheRemoteAndNoNameDoes() throws {
        let laptop = try SyncedDevice("laptop")
        try laptop.set("secret-device-only-name", "device-only-value-7f3a", .whenUnlockedThisDeviceOnly)
        try laptop.set("visible-name-github", "migratable-value-91c2")
        try laptop.set("wifi-name", "after-first-unlock-value-5d1e", group: "group-name-home", .afterFirstUnlock)
        let remote = try BareRemote()
        _ = try laptop.engine.create(remote: remote.url)
        try laptop.set("visible-name-github", "second-version-value-44ab")
        _ = try laptop.engine.sync()
        let everything = try remote.everyObject()
        for secret in [
            "device-only-value-7f3a", "secret-device-only-name", "migratable-value-91c2", "visible-name-github",
            "after-first-unlock-value-5d1e", "wifi-name", "group-name-home", "second-version-value-44ab", "laptop"
        ] {
            #expect(everything.range(of: Data(secret.utf8)) == nil, "\(secret) is in the remote")
        }
        // Records are padded: every one is the same size for short values.
        let sizes = Set(try remote.files().filter { $0.key.hasPrefix("records/") }.map(\.value.count))
        #expect(sizes.count == 1)
    }

    /// A circle of one (the laptop, holding `mail`) and a phone that asked to join it.
    static func phoneAsking() throws -> (BareRemote, SyncedDevice, SyncedDevice) {
        let (remote, devices) = try circle("laptop")
        try devices[0].set("mail", "secret")
        _ = try devices[0].engine.sync()
        let phone = try SyncedDevice("phone")
        #expect(try phone.engine.join(remote: remote.url) == .asked)
        return (remote, devices[0], phone)
    }

    @Test func aNewDeviceJoinsWhenBothShowTheSameCode() throws {
        let (remote, laptop, phone) = try Self.phoneAsking()
        defer { withExtendedLifetime(remote) {} }
        #expect(try phone.engine.join(remote: nil) == .asked)
        let askers = try laptop.engine.joinRequests()
        #expect(askers.map(\.name) == ["phone"])
        #expect(try laptop.engine.joinCode(for: askers[0].id) == nil)
        guard case .code(let shown) = try phone.engine.join(remote: nil) else {
            Issue.record("the new device shows no code")
            return
        }
        #expect(try laptop.engine.joinCode(for: askers[0].id) == shown)
        // Another code grants nothing.
        let wrong = shown == "000 000" ? "111 111" : "000 000"
        expectFailure(.badInput) { try laptop.engine.approve(askers[0].id, code: wrong) }
        #expect(try phone.engine.join(remote: nil) == .code(shown))
        try laptop.engine.approve(askers[0].id, code: shown)
        // Granted, but the phone takes the key only once the person typed there the laptop's code.
        #expect(try phone.engine.join(remote: nil) == .code(shown))
        expectFailure(.badInput) { try phone.engine.confirmJoin(code: wrong) }
        #expect(try phone.engine.join(remote: nil) == .code(shown))
        try phone.engine.confirmJoin(code: shown)
        guard case .joined(let report) = try phone.engine.join(remote: nil) else {
            Issue.record("the new device did not join")
            return
        }
        #expect(report.received == 1)
        #expect(try phone.get("mail") == "secret")
        #expect(laptop.engine.status().contains { $0.0 == "member" && $0.1.hasPrefix("phone ") })
    }

    /// Many machines asking at once (a flood, from anyone who can push to
    /// the remote) are listed, and none is answered until the person names
    /// one: each answer was a nonce kept, a file and a commit. The one
    /// named is answered, and shows its code.
    @Test func amongManyAskersOnlyTheOneNamedIsAnswered() throws {
        let (remote, laptop, phone) = try Self.phoneAsking()
        let others = try ["tablet", "tv", "car"].map { name in
            let device = try SyncedDevice(name)
            #expect(try device.engine.join(remote: remote.url) == .asked)
            return device
        }
        let askers = try laptop.engine.joinRequests()
        #expect(askers.map(\.name).sorted() == ["car", "phone", "tablet", "tv"])
        #expect(try remote.files().keys.filter { $0.hasSuffix("/response") }.isEmpty)
        let chosen = try #require(askers.first { $0.name == "phone" })
        _ = try laptop.engine.joinRequests(answering: chosen.id)
        #expect(try remote.files().keys.filter { $0.hasSuffix("/response") }.count == 1)
        guard case .code(let shown) = try phone.engine.join(remote: nil) else {
            Issue.record("the phone shows no code")
            return
        }
        #expect(try laptop.engine.joinCode(for: chosen.id) == shown)
        for device in others { #expect(try device.engine.join(remote: nil) == .asked) }
    }

    @Test func aRemovedDeviceOpensNothingWrittenAfter() throws {
        let (remote, devices) = try Self.circle("laptop", "desktop", "old-phone")
        let (laptop, desktop, phone) = (devices[0], devices[1], devices[2])
        try laptop.set("before", "known to all")
        _ = try laptop.engine.sync()
        _ = try phone.engine.sync()
        let oldState = try phone.engine.loadState()
        let (oldKey, _) = try phone.engine.openSecrets(oldState)
        _ = try laptop.engine.remove("old-phone")
        try laptop.set("after", "not for the phone")
        _ = try laptop.engine.sync()
        _ = try desktop.engine.sync()
        #expect(try desktop.get("after") == "not for the phone")
        let sentence = expectFailure(.removed) { _ = try phone.engine.sync() }
        #expect(sentence.contains("removed"))
        #expect(try phone.get("after") == nil)
        #expect(try phone.get("before") == "known to all")
        // The old key opens no record and no manifest of the remote now.
        for (path, bytes) in try remote.files() {
            if path.hasPrefix("records/"), let name = RecordPath.name(path) {
                #expect(RecordFile.decode(Array(bytes), name: name, key: oldKey) == nil)
            }
            if path == Manifest.path { #expect(Manifest.decode(Array(bytes), key: oldKey) == nil) }
        }
    }

    /// Every member knows the recovery key's public half, all it takes to
    /// seal a circle's key to it: a removed machine could offer a circle of
    /// its own to a machine joining with that key. A removal now gives the
    /// circle a new recovery key: the old one opens nothing written after,
    /// the new one joins and reads it.
    @Test func aRemovalGivesTheCircleANewRecoveryKey() throws {
        let remote = try BareRemote()
        let laptop = try SyncedDevice("laptop"), phone = try SyncedDevice("old-phone")
        let oldRecovery = try laptop.engine.create(remote: remote.url).recoveryKey
        _ = try phone.engine.join(remote: remote.url, recoveryKey: oldRecovery)
        let newRecovery = try laptop.engine.remove("old-phone").recoveryKey
        #expect(newRecovery != oldRecovery)
        try laptop.set("after", "written after the removal")
        _ = try laptop.engine.sync()
        let stranger = try SyncedDevice("stranger")
        let sentence = expectFailure(.badInput) {
            _ = try stranger.engine.join(remote: remote.url, recoveryKey: oldRecovery)
        }
        #expect(sentence.contains("does not open the circle"), "\(sentence)")
        #expect(try stranger.get("after") == nil)
        let desktop = try SyncedDevice("desktop")
        _ = try desktop.engine.join(remote: remote.url, recoveryKey: newRecovery)
        #expect(try desktop.get("after") == "written after the removal")
    }

    // MARK: What a remote can try

    @Test func aRemoteThatReplaysAnOlderManifestIsRefused() throws {
        let (remote, devices) = try Self.circle("laptop", "desktop")
        let (laptop, desktop) = (devices[0], devices[1])
        try laptop.set("mail", "one")
        _ = try laptop.engine.sync()
        let old = try remote.head()
        try laptop.set("mail", "two")
        _ = try laptop.engine.sync()
        _ = try desktop.engine.sync()
        try remote.force(old)
        let sentence = expectFailure(.refused) { _ = try desktop.engine.sync() }
        #expect(sentence.contains("older manifest"))
        #expect(try desktop.get("mail") == "two")
    }

    @Test func aRemoteThatDropsARecordIsRefused() throws {
        let (remote, devices) = try Self.circle("laptop", "desktop")
        let (laptop, desktop) = (devices[0], devices[1])
        try laptop.set("mail", "one")
        try laptop.set("bank", "two")
        _ = try laptop.engine.sync()
        let record = try #require(try remote.files().keys.first { $0.hasPrefix("records/") })
        try remote.tamper([record: nil])
        let sentence = expectFailure(.refused) { _ = try desktop.engine.sync() }
        #expect(sentence.contains("dropped"))
        #expect(try desktop.contents() == [])
    }

    /// A remote that serves an object larger than any file of a circle
    /// (here 5 MiB in a record's place) is refused before the device reads
    /// it into memory: no remote makes the device hold what it chooses.
    @Test func aRemoteThatServesAnOversizeObjectIsRefusedUnread() throws {
        let (remote, devices) = try Self.circle("laptop", "desktop")
        let (laptop, desktop) = (devices[0], devices[1])
        try laptop.set("mail", "one")
        _ = try laptop.engine.sync()
        let record = try #require(try remote.files().keys.first { $0.hasPrefix("records/") })
        try remote.tamper([record: Data(repeating: 0x41, count: 5 << 20)])
        let sentence = expectFailure(.refused) { _ = try desktop.engine.sync() }
        #expect(sentence.contains("holds an object of 5242880 bytes"), "\(sentence)")
        #expect(sentence.contains("larger than any file of a circle (4 MiB at most)"), "\(sentence)")
        #expect(try desktop.contents() == [])
    }

    @Test func aRemoteThatSwapsTwoRecordsIsRefused() throws {
        let (remote, devices) = try Self.circle("laptop", "desktop")
        let (laptop, desktop) = (devices[0], devices[1])
        try laptop.set("mail", "one")
        try laptop.set("bank", "two")
        _ = try laptop.engine.sync()
        _ = try desktop.engine.sync()
        try laptop.set("mail", "three")
        _ = try laptop.engine.sync()
        let records = try remote.files().filter { $0.key.hasPrefix("records/") }.sorted { $0.key < $1.key }
        #expect(records.count == 2)
        try remote.tamper([records[0].key: records[1].value, records[1].key: records[0].value])
        let sentence = expectFailure(.refused) { _ = try desktop.engine.sync() }
        #expect(sentence.contains("not the one the manifest lists"))
        #expect(try desktop.get("mail") == "one")
    }

    @Test func aRemoteThatServesAnotherCirclesRepositoryIsRefused() throws {
        let (remote, devices) = try Self.circle("laptop", "desktop")
        try devices[0].set("mail", "mine")
        _ = try devices[0].engine.sync()
        _ = try devices[1].engine.sync()
        let (other, strangers) = try Self.circle("stranger")
        try strangers[0].set("mail", "theirs")
        _ = try strangers[0].engine.sync()
        try runGit(
            ["--git-dir=" + other.url, "push", "--quiet", "--force", remote.url, "keychainfs:keychainfs"],
            in: other.root)
        let sentence = expectFailure(.refused) { _ = try devices[1].engine.sync() }
        #expect(sentence.contains("another circle's repository"))
        #expect(try devices[1].get("mail") == "mine")
    }
}

extension SyncEngineTests {
    /// The remote swaps in its own key and nonce during a join: the two
    /// machines' codes differ, the person's code is refused, and no key is granted.
    @Test func aRemoteInTheMiddleOfAJoinGetsNoKey() throws {
        let (remote, laptop, phone) = try Self.phoneAsking()
        let path = try #require(try remote.files().keys.first { $0.hasSuffix("/request") })
        let genuine = try #require(JoinRequest(Array(try remote.files()[path]!)))
        // The attacker's own key and nonce, under the phone's id and name.
        let attacker = DeviceKeys.generate()
        let attackerNonce = Crypto.randomBytes(32)
        let forged = JoinRequest(
            circle: genuine.circle,
            device: Member(id: genuine.device.id, name: genuine.device.name, publicKey: attacker.publicKey),
            commitment: JoinRequest.commitment(to: attackerNonce))
        try remote.tamper([path: Data(forged.encoded)])
        let askers = try laptop.engine.joinRequests()
        #expect(askers.map(\.name) == ["phone"])
        guard case .code(let phoneCode) = try phone.engine.join(remote: nil) else {
            Issue.record("the phone shows no code")
            return
        }
        // The phone's nonce does not open the attacker's commitment: the attacker reveals its own.
        try remote.tamper([JoinRequest.revealPath(genuine.device.id): Data(attackerNonce)])
        let laptopCode = try #require(try laptop.engine.joinCode(for: askers[0].id))
        #expect(laptopCode != phoneCode)
        // Typed on the phone, the laptop's code does not match the answer the remote forged either.
        expectFailure(.badInput) { try phone.engine.confirmJoin(code: laptopCode) }
        let sentence = expectFailure(.badInput) { try laptop.engine.approve(askers[0].id, code: phoneCode) }
        #expect(sentence.contains("Nothing was granted"))
        #expect(try remote.files().keys.contains { $0.hasPrefix("circle/grants/") } == false)
        #expect(laptop.engine.status().contains { $0.0 == "member" } == false)
        #expect(try phone.engine.join(remote: nil) == .code(phoneCode))
    }
}

extension SyncEngineTests {
    /// A record that waited for its class key is merged, not overwritten, when this
    /// device changes the same item and pushes onto the commit it checked last.
    @Test func aChangeThatWaitedForTheUnlockIsMergedWithOneMadeHere() throws {
        let (remote, laptop, desktop) = try Self.twoInSync(mail: "base")
        defer { withExtendedLifetime(remote) {} }
        desktop.manager.localDevice.lock()
        try laptop.set("mail", "from laptop")
        _ = try laptop.engine.sync()
        #expect(try desktop.engine.sync().waiting == 1)
        try desktop.manager.localDevice.unlock(passcode: try SecureBytes(SyncedDevice.passcode))
        try desktop.set("mail", "from desktop")
        _ = try desktop.engine.sync()
        _ = try laptop.engine.sync()
        for device in [laptop, desktop] {
            let contents = try device.contents()
            let values = Set(contents.map { $0.split(separator: "=").last.map(String.init) ?? "" })
            #expect(values.contains("from laptop (whenUnlocked)"), "\(device.name): \(contents)")
            #expect(values.contains("from desktop (whenUnlocked)"), "\(device.name): \(contents)")
        }
        #expect(try laptop.contents() == desktop.contents())
    }
}

extension SyncEngineTests {
    @Test func aMachineSyncsOnlyTheGroupsItChose() throws {
        let remote = try BareRemote()
        let laptop = try SyncedDevice("laptop")
        try laptop.set("mail", "m")
        try laptop.set("vpn", "v", group: "work")
        let recovery = try laptop.engine.create(remote: remote.url).recoveryKey
        let desktop = try SyncedDevice("desktop")
        try desktop.set("private", "p")
        _ = try desktop.engine.join(remote: remote.url, recoveryKey: recovery, groups: ["work"])
        #expect(try desktop.contents() == ["default/private=p (whenUnlocked)", "work/vpn=v (whenUnlocked)"])
        _ = try laptop.engine.sync()
        #expect(try laptop.get("private") == nil)
        #expect(desktop.engine.status().contains { $0.0 == "groups" && $0.1 == "work" })
        // A change of a group the desktop does not take stays in the circle for the others.
        try laptop.set("mail", "m2")
        _ = try laptop.engine.sync()
        _ = try desktop.engine.sync()
        #expect(try desktop.get("mail") == nil)
        // Every group from now on: what was left out arrives, what stayed here leaves.
        #expect(try desktop.engine.setGroups([]) == [])
        _ = try desktop.engine.sync()
        _ = try laptop.engine.sync()
        #expect(try desktop.get("mail") == "m2")
        #expect(try laptop.get("private") == "p")
        expectFailure(.badInput) { _ = try desktop.engine.setGroups(["bad/name"]) }
    }
}

extension SyncEngineTests {
    /// A removed machine that can still push offers a machine that has not synced since its
    /// removal (so still counts it a member) a key of its own, a later epoch than the real one: refused.
    @Test func aKeyOfferedByARemovedMachineIsRefused() throws {
        let (remote, devices) = try Self.circle("laptop", "desktop", "old-phone")
        let (laptop, desktop, phone) = (devices[0], devices[1], devices[2])
        try laptop.set("mail", "secret")
        _ = try laptop.engine.sync()
        _ = try desktop.engine.sync()
        let phoneState = try phone.engine.loadState()
        let (_, phoneSecret) = try phone.engine.openSecrets(phoneState)
        _ = try laptop.engine.remove("old-phone")
        // The desktop has not synced since: in its list the phone is still a member.
        let desktopState = try desktop.engine.loadState()
        #expect(desktopState.epoch == 1 && desktopState.members.contains { $0.id == phoneState.device })
        // The phone's own key, as epoch 3, granted to the desktop from the phone's key pair.
        let forged = SyncKey.random(circle: phoneState.circle, epoch: 3)
        let members = phoneState.members
        let manifest = Manifest(
            circle: phoneState.circle, epoch: 3, sequence: desktopState.sequence + 10, writer: phoneState.device,
            written: 1, recoveryPublic: phoneState.recoveryPublic, members: members, indexes: [:])
        let grant = KeyGrant.grant(
            forged, from: phoneState.device, secret: phoneSecret, to: desktopState.publicKey)
        try remote.tamper([
            Manifest.path: Data(manifest.encode(key: forged)),
            KeyGrant.path(epoch: 3, device: desktopState.device): Data(grant)
        ])
        let sentence = expectFailure(.refused) { _ = try desktop.engine.sync() }
        #expect(sentence.contains("more than one after this device's 1"))
        #expect(try desktop.engine.loadState().epoch == 1)
        #expect(try desktop.get("mail") == "secret")
    }
}
