import Foundation
import Synchronization
import Testing
@testable import KeychainCore
@testable import KeychainSync

/// Three devices on one remote, driven by random sets, removals, renames,
/// class changes, locks and syncs in random orders, with rounds cut short
/// as a killed device's would be and other devices' pushes landing in the
/// middle of a round. After a final round of syncs every device holds the
/// same items, and every write a device acknowledged is there (as the item,
/// under a name it was renamed to, or as a conflict copy) unless a later
/// change made by a device that held it replaced it.
/// `KEYCHAINFS_STRESS_SCALE` (./scripts/stress) runs it longer;
/// `KEYCHAINFS_SYNC_MODEL_SEED` replays one run.
@Suite(.serialized) struct SyncModelTests {
    /// A deterministic generator (SplitMix64), so a failing seed replays.
    struct Random {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
        mutating func chance(_ percent: Int) -> Bool { below(100) < percent }
    }

    static let names = ["mail", "bank", "wifi", "vpn"]
    static let groups = ["default", "work"]
    static let classes: [ProtectionClass] = [.whenUnlocked, .afterFirstUnlock, .always]

    /// What the person did and what stands: values acknowledged, and those a later change replaced.
    final class Ledger: @unchecked Sendable {
        var acknowledged: [String: String] = [:]  // value -> "device step op", for messages
        var replaced: Set<String> = []
    }

    final class Circle: @unchecked Sendable {
        let remote: BareRemote
        let devices: [SyncedDevice]
        /// Each device's engine now (a crash replaces it, as a restarted device makes a new one).
        var engines: [SyncEngine]
        var random: Random
        let lock = NSRecursiveLock()
        /// A round run inside another's interruption is not interrupted itself.
        var nested = false

        init(seed: UInt64) throws {
            random = Random(state: seed)
            remote = try BareRemote()
            devices = try ["laptop", "desktop", "phone"].map { try SyncedDevice($0) }
            engines = devices.map(\.engine)
            let recovery = try engines[0].create(remote: remote.url).recoveryKey
            for engine in engines.dropFirst() { _ = try engine.join(remote: remote.url, recoveryKey: recovery) }
            engines = devices.indices.map { makeEngine($0) }
        }

        /// A fresh engine over device `index`'s keychain, whose rounds this model may interrupt.
        func makeEngine(_ index: Int) -> SyncEngine {
            let device = devices[index]
            return SyncEngine(
                manager: device.manager, keychainPath: device.directory.path, hostName: device.name,
                interruption: { [unowned self] step throws(SyncFailure) in
                    try self.interrupt(index, at: step)
                })
        }

        /// Sometimes another device pushes in the middle of this round (its push then
        /// finds the branch moved); sometimes the device is killed here.
        func interrupt(_ index: Int, at step: SyncEngine.SyncStep) throws(SyncFailure) {
            lock.lock()
            let other = (index + 1 + random.below(2)) % 3
            let pushInBetween = !nested && step == .committed && random.chance(15)
            let crash = !nested && random.chance(6)
            lock.unlock()
            if pushInBetween {
                // The other device's own engine (one per keychain, as in a device), not cut short itself.
                nested = true
                defer { nested = false }
                _ = try? engines[other].sync()
            }
            if crash { throw SyncFailure(.remote, "killed at \(step)") }
        }

        func sync(_ index: Int) {
            do {
                _ = try engines[index].sync()
            } catch  where error.sentence.hasPrefix("killed at") {
                // The device died mid-round: a restarted device makes a new engine from what is on disk.
                engines[index] = makeEngine(index)
            } catch {
                Issue.record("device \(index) failed to sync: \(error)")
            }
        }
    }

    static func holdings(_ device: SyncedDevice) throws -> [String: String] {
        var items: [String: String] = [:]
        for group in try device.manager.groups() {
            for (identifier, _) in try device.manager.items(inGroup: group) {
                if let value = try? device.manager.string(forIdentifier: identifier, inGroup: group) {
                    items[group + "/" + identifier] = value
                }
            }
        }
        return items
    }

    @Test func threeDevicesConvergeAndKeepEveryAcknowledgedWrite() throws {
        let environment = ProcessInfo.processInfo.environment
        let scale = Int(environment["KEYCHAINFS_STRESS_SCALE"] ?? "") ?? 1
        let seed = UInt64(environment["KEYCHAINFS_SYNC_MODEL_SEED"] ?? "") ?? UInt64.random(in: 1...UInt64.max)
        let steps = 120 * scale
        let circle = try Circle(seed: seed)
        let ledger = Ledger()
        for step in 0..<steps {
            let index = circle.random.below(3)
            let device = circle.devices[index]
            let manager = device.manager
            let group = Self.groups[circle.random.below(2)]
            let name = Self.names[circle.random.below(Self.names.count)]
            let held = try? manager.string(forIdentifier: name, inGroup: group)
            switch circle.random.below(100) {
            case 0..<35:
                let value = "v\(step)-\(device.name)"
                let protectionClass = Self.classes[circle.random.below(3)]
                if (try? manager.write(
                    try SecureBytes(value), identifier: name, group: group, protectionClass: protectionClass)) != nil
                {
                    ledger.acknowledged[value] = "\(device.name) step \(step): set \(group)/\(name)"
                    if let held { ledger.replaced.insert(held) }
                }
            case 35..<45:
                // The person removes what they can read (a locked item's value is unknown to them, and to the ledger).
                if let held, (try? manager.deleteKey(forIdentifier: name, inGroup: group)) != nil {
                    ledger.replaced.insert(held)
                }
            case 45..<52:
                let target = Self.names[circle.random.below(Self.names.count)]
                let replacedThere = try? manager.string(forIdentifier: target, inGroup: group)
                let targetUnread =
                    replacedThere == nil && (try? manager.info(forIdentifier: target, inGroup: group)) != nil
                if target != name, held != nil, !targetUnread,
                    (try? manager.renameKey(forIdentifier: name, to: target, inGroup: group, replacing: true)) != nil,
                    let replacedThere
                {
                    ledger.replaced.insert(replacedThere)
                }
            case 52..<58:
                _ = try? manager.setProtectionClass(
                    Self.classes[circle.random.below(3)], forIdentifier: name, inGroup: group)
            case 58..<64:
                if manager.localDevice.isAvailable(.whenUnlocked) {
                    manager.localDevice.lock()
                } else {
                    try manager.localDevice.unlock(passcode: try SecureBytes(SyncedDevice.passcode))
                }
            default:
                circle.sync(index)
            }
        }
        for device in circle.devices where !device.manager.localDevice.isAvailable(.whenUnlocked) {
            try device.manager.localDevice.unlock(passcode: try SecureBytes(SyncedDevice.passcode))
        }
        // Final rounds, none cut short, by engines made afresh from what is on disk.
        circle.engines = circle.devices.map {
            SyncEngine(manager: $0.manager, keychainPath: $0.directory.path, hostName: $0.name)
        }
        for _ in 0..<2 { for engine in circle.engines { _ = try engine.sync() } }
        let final = try circle.devices.map(Self.holdings)
        #expect(final[0] == final[1] && final[1] == final[2], "seed \(seed): the devices differ")
        let present = Set(final[0].values)
        for (value, origin) in ledger.acknowledged where !ledger.replaced.contains(value) {
            let kept = present.contains(value)
            #expect(kept, "seed \(seed): \(value) (\(origin)) was lost")
        }
        withExtendedLifetime(circle) {}
    }
}
