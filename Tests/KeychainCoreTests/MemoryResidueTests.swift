import Foundation
import Testing
import TestSupport
@testable import KeychainCore
@testable import KeychainTPM

/// After `lock`, nothing derived from the passcode and no key of a locked
/// class may remain anywhere in the process: heap, stacks of live and exited
/// threads, libsodium's buffers. The test scans its own memory for them.
@Suite struct MemoryResidueTests {
    @Test func noPasscodeMaterialOrLockedClassKeyRemainsInMemoryAfterLock() throws {
        let root = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let directory = KeychainDirectory(path: root + "/keychain")
        // Random bytes, never a String: a String would be a copy of our own.
        let passcode = SecureBytes.random(count: 24)
        try Device.createKeychain(at: directory, passcode: passcode, kdf: .insecureFastForTests, tpm: .declined)
        // What an attacker would look for, computed where no copy stays behind.
        let secrets = try SecretThread.run { () throws -> [SecureBytes] in
            let secret = DeviceSecret(secret: try directory.readDeviceSecret())
            let db = try SQLiteConnection(path: directory.databasePath, create: false)
            let query = try db.statement("SELECT value FROM meta WHERE key = 'keybag'")
            #expect(try query.step())
            let bag = try Keybag(decoding: query.blob(0), secret: secret)
            db.finishStatements()
            let stretched = try Crypto.stretch(passcode: passcode, salt: bag.salt, parameters: bag.kdf)
            let passcodeKey = try bag.passcodeKey(secret: secret, passcode: passcode, tpm: nil)
            let classKeys = try [ProtectionClass.whenUnlocked, .whenUnlockedThisDeviceOnly].map {
                try bag.unwrap($0, secret: secret, passcodeKey: passcodeKey)
            }
            return try [stretched]
                + ([passcodeKey] + classKeys).map { key in
                    try key.withKey {
                        try SecureBytes(copying: UnsafeRawBufferPointer(start: $0, count: Crypto.keySize))
                    }
                }
        }

        let device = try Device(directory: directory)
        // As a libfuse worker does: unlock on another thread, which stays
        // alive (its stack below the current frame keeps whatever the calls
        // left there; glibc zeroes most of a stack only when its thread exits).
        let worker = ParkedWorker { try device.unlock(passcode: passcode) }
        defer { worker.finish() }
        try worker.waitForWork()
        #expect(!device.isLocked)
        device.lock()

        let patterns =
            [("passcode", passcode)]
            + zip(
                [
                    "stretched passcode", "passcode key", "whenUnlocked key",
                    "whenUnlockedThisDeviceOnly key"
                ], secrets
            ).map { ($0, $1) }
        // A canary: a plain copy that the scan must find, so that it cannot pass by seeing nothing.
        let canary = SecureBytes.random(count: 32)
        let canaryCopy = canary.bytes()
        let all = patterns + [("canary", canary)]
        let found = scan(all)
        withExtendedLifetime(canaryCopy) {}
        #expect(found.contains { $0.hasPrefix("canary") }, "the scan did not find a planted copy")
        let residue = found.filter { !$0.hasPrefix("canary") }
        #expect(residue.isEmpty, "left in memory after lock: \(residue)")
    }
}

/// A thread that runs one piece of work, then stays parked until `finish`.
private final class ParkedWorker: @unchecked Sendable {
    private let work: () throws -> Void
    private var error: Error?
    private let done = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
    private var thread = pthread_t()

    init(_ work: @escaping () throws -> Void) {
        self.work = work
        let context = Unmanaged.passRetained(self)
        let started = pthread_create(
            &thread, nil,
            { raw in
                let worker = Unmanaged<ParkedWorker>.fromOpaque(raw!).takeRetainedValue()
                do { try worker.work() } catch { worker.error = error }
                worker.done.signal()
                worker.release.wait()
                return nil
            }, context.toOpaque())
        precondition(started == 0)
    }

    /// Waits until the work is done; rethrows its error.
    func waitForWork() throws {
        done.wait()
        if let error { throw error }
    }

    func finish() {
        release.signal()
        pthread_join(thread, nil)
    }
}

/// Scans this process for the patterns, where they live excluded.
/// (SecureBytes do not move: their pointers stay valid while they live.)
private func scan(_ patterns: [(String, SecureBytes)]) -> [String] {
    let views = patterns.map { name, bytes in (name: name, bytes: bytes.withUnsafeBytes { $0 }) }
    return MemoryScan.find(views, excluding: views.map { MemoryScan.range(of: $0.bytes) })
}
