import Synchronization
import Foundation
import Glibc
import TestSupport
import Testing
@testable import KeychainCore
@testable import KeychainTPM

@Suite struct DeviceTests {
    @Test func deviceBootsLockedBeforeFirstUnlock() throws {
        let keychain = try TemporaryKeychain()
        let device = try keychain.device()
        #expect(device.status.isLocked)
        #expect(!device.status.hasUnlockedSinceBoot)
        #expect(device.status.hasPasscode)
    }

    @Test func rightPasscodeUnlocksAndLockLocksAgain() throws {
        let keychain = try TemporaryKeychain()
        let device = try keychain.device()
        try device.unlock(passcode: secure(TemporaryKeychain.passcode))
        #expect(!device.status.isLocked)
        device.lock()
        #expect(device.status.isLocked)
        #expect(device.status.hasUnlockedSinceBoot)
    }

    @Test func wrongPasscodeIsRefusedAndLeavesTheDeviceLocked() throws {
        let keychain = try TemporaryKeychain()
        let device = try keychain.device()
        expectError(.authFailed) { try device.unlock(passcode: secure("wrong")) }
        expectError(.authFailed) { try device.unlock(passcode: nil) }
        #expect(device.status.isLocked)
        #expect(device.status.failedAttempts == 2)
    }

    @Test func lockoutsEscalateAndRefuseEvenTheRightPasscodeUntilTheDeadline() throws {
        let keychain = try TemporaryKeychain()
        let device = try keychain.device(policy: LockoutPolicy(delays: [0, 0, 60, 300]))
        let right = try secure(TemporaryKeychain.passcode)
        expectError(.authFailed) { try device.unlock(passcode: secure("a")) }
        expectError(.authFailed) { try device.unlock(passcode: secure("b")) }
        #expect(device.status.retryAfter == 0)
        expectError(.authFailed) { try device.unlock(passcode: secure("c")) }
        #expect(device.status.retryAfter == 60)
        // During the lockout the passcode is not even tried.
        expectError(.authFailed) { try device.unlock(passcode: right) }
        #expect(device.status.failedAttempts == 3)
        keychain.clock.advance(59)
        expectError(.authFailed) { try device.unlock(passcode: right) }
        keychain.clock.advance(1)
        expectError(.authFailed) { try device.unlock(passcode: secure("d")) }
        #expect(device.status.retryAfter == 300)
        keychain.clock.advance(300)
        try device.unlock(passcode: right)
        #expect(!device.status.isLocked)
        #expect(device.status.failedAttempts == 0)
        #expect(device.status.retryAfter == 0)
    }

    /// Nine attempts at once after four failures (as nine mounts' `.control`
    /// writes would be): only the first is tried and counted, its failure
    /// starts the lockout, and the others, the right passcode among them,
    /// are refused without being tried.
    @Test func concurrentUnlockAttemptsCannotOutrunTheLockout() throws {
        // A derivation slow enough (8 MiB) for the attempts to overlap.
        let keychain = try TemporaryKeychain(kdf: KDFParameters(opsLimit: 1, memLimit: 8 << 20))
        let device = try keychain.device()
        for _ in 0..<4 { expectError(.authFailed) { try device.unlock(passcode: secure("wrong")) } }
        // Nine threads of their own (Dispatch's pool would run them nearly
        // one at a time on two cores), released together.
        let attempts = 9
        var barrier = pthread_barrier_t()
        pthread_barrier_init(&barrier, nil, UInt32(attempts))
        defer { pthread_barrier_destroy(&barrier) }
        let finished = DispatchGroup()
        withUnsafeMutablePointer(to: &barrier) { barrier in
            for _ in 0..<attempts {
                let sharedBarrier = UncheckedPointer(barrier)
                finished.enter()
                Thread {
                    pthread_barrier_wait(sharedBarrier.pointer)
                    _ = try? device.unlock(passcode: secure("wrong"))
                    finished.leave()
                }.start()
            }
            finished.wait()
        }
        #expect(device.status.failedAttempts == 5, "\(device.status)")
        #expect(device.status.retryAfter == 60)
        expectError(.authFailed) { try device.unlock(passcode: secure(TemporaryKeychain.passcode)) }
        #expect(device.isLocked)
    }

    @Test func lockoutDeadlineSurvivesARestartOfTheDeviceProcess() throws {
        let keychain = try TemporaryKeychain()
        let policy = LockoutPolicy(delays: [60])
        do {
            let device = try keychain.device(policy: policy)
            expectError(.authFailed) { try device.unlock(passcode: secure("wrong")) }
        }
        let rebooted = try keychain.device(policy: policy)
        #expect(rebooted.status.retryAfter == 60)
        expectError(.authFailed) { try rebooted.unlock(passcode: secure(TemporaryKeychain.passcode)) }
        keychain.clock.advance(60)
        try rebooted.unlock(passcode: secure(TemporaryKeychain.passcode))
    }

    @Test func iOSLockoutTableIsNoneForFourAttemptsThenOneMinuteFiveFifteenAndAnHour() {
        let delays = (1...10).map { LockoutPolicy.iOS.delay(afterFailures: UInt64($0)) }
        #expect(delays == [0, 0, 0, 0, 60, 300, 900, 3600, 3600, 3600])
    }

    @Test func tamperedLockoutRecordIsReportedAsDecodeNotReset() throws {
        let keychain = try TemporaryKeychain()
        do {
            let device = try keychain.device(policy: LockoutPolicy(delays: [3600]))
            expectError(.authFailed) { try device.unlock(passcode: secure("wrong")) }
        }
        try keychain.withRawDatabase { db in
            // An attacker zeroes the deadline bytes but cannot redo the MAC.
            try db.execute("UPDATE meta SET value = zeroblob(8) || substr(value, 9) WHERE key = 'lockout'")
        }
        expectError(.decode) { try keychain.device() }
    }

    @Test func keychainWithoutPasscodeUnlocksWithoutOneButStillBootsLocked() throws {
        let keychain = try TemporaryKeychain(passcode: nil)
        let manager = try keychain.manager()
        #expect(!manager.localDevice.status.hasPasscode)
        expectError(.interactionNotAllowed) { try manager.register("v", forIdentifier: "item") }
        try manager.localDevice.unlock(passcode: nil)
        try manager.register("v", forIdentifier: "item")
        manager.localDevice.lock()
        expectError(.interactionNotAllowed) { try manager.key(forIdentifier: "item") }
    }

    /// A lock is announced first (will-lock, no grace), as iOS announces
    /// protected data becoming unavailable.
    @Test func observersSeeLockAndUnlock() throws {
        let keychain = try TemporaryKeychain()
        let device = try keychain.device()
        let events = Mutex<[DeviceEvent]>([])
        let token = device.addObserver { event in events.withLock { $0.append(event) } }
        try device.unlock(passcode: secure(TemporaryKeychain.passcode))
        device.lock()
        device.removeObserver(token)
        try device.unlock(passcode: secure(TemporaryKeychain.passcode))
        #expect(events.withLock { $0 } == [.unlocked, .willLock(grace: 0), .locked])
    }

    @Test func observersSeeEveryCommittedChangeByNameWithoutItsValue() throws {
        let keychain = try TemporaryKeychain()
        let manager = try keychain.manager()
        let events = Mutex<[DeviceEvent]>([])
        let token = manager.localDevice.addObserver { event in events.withLock { $0.append(event) } }
        defer { manager.localDevice.removeObserver(token) }
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        try manager.register("v1", forIdentifier: "a", inGroup: "g")
        try manager.renameKey(forIdentifier: "a", to: "b", inGroup: "g")
        try manager.deleteKey(forIdentifier: "b", inGroup: "g")
        expectError(.itemNotFound) { try manager.deleteKey(forIdentifier: "b", inGroup: "g") }
        try manager.removeGroup("g")
        try manager.createGroup("h")
        // The first write into "g" made the group: its creation comes first.
        #expect(
            events.withLock { $0 } == [
                .unlocked, .changed(.groupCreated("g")), .changed(.written(group: "g", identifier: "a")),
                .changed(.renamed(group: "g", from: "a", to: "b")),
                .changed(.removed(group: "g", identifier: "b")), .changed(.groupRemoved("g")),
                .changed(.groupCreated("h"))
            ])
    }

    @Test func onlyOneDeviceHoldsAKeychainAtATime() throws {
        let keychain = try TemporaryKeychain()
        var first: Device? = try keychain.device()
        expectError(.keychainInUse) { try keychain.device() }
        _ = first
        first = nil
        _ = try keychain.device()
    }

    @Test func creatingOverAnExistingKeychainIsRefusedAndOpeningAMissingOneSaysSo() throws {
        let keychain = try TemporaryKeychain()
        expectError(.duplicateKeychain) {
            try Device.createKeychain(at: keychain.directory, passcode: secure("x"), kdf: .insecureFastForTests)
        }
        expectError(.noSuchKeychain) { try Device(directory: KeychainDirectory(path: keychain.root + "/missing")) }
        expectError(.param) {
            try Device.createKeychain(at: KeychainDirectory(path: keychain.root + "/empty"), passcode: secure(""))
        }
    }

    @Test func keychainDirectoryIsPrivateToItsOwner() throws {
        let keychain = try TemporaryKeychain()
        var info = stat()
        #expect(stat(keychain.directory.path, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o700)
        #expect(stat(keychain.directory.deviceSecretPath, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o600)
    }

    @Test func aWrongDeviceSecretOpensNothing() throws {
        let keychain = try TemporaryKeychain()
        let other = try TemporaryKeychain()
        unlink(keychain.directory.deviceSecretPath)
        #expect(link(other.directory.deviceSecretPath, keychain.directory.deviceSecretPath) == 0)
        expectError(.decode) { try keychain.device() }
    }
}

extension DeviceTests {
    @Test(arguments: ["", "/device-secret", "/keychain.db"])
    func aKeychainOthersCanReadOrWriteIsRefused(_ file: String) throws {
        let keychain = try TemporaryKeychain()
        let path = keychain.directory.path + file
        #expect(chmod(path, file.isEmpty ? 0o750 : 0o640) == 0)
        expectError(.insecurePermissions) { try keychain.device() }
        #expect(keychain.directory.permissionProblem()?.contains(file.isEmpty ? "chmod 700" : "chmod 600") == true)
        #expect(chmod(path, file.isEmpty ? 0o700 : 0o600) == 0)
        #expect(keychain.directory.permissionProblem() == nil)
        _ = try keychain.device()
    }

    @Test func databaseFileIsPrivateToItsOwner() throws {
        let keychain = try TemporaryKeychain()
        var info = stat()
        #expect(stat(keychain.directory.databasePath, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o600)
    }
}

extension DeviceTests {
    /// A secret left by an init that died before writing the database does not block the next init.
    @Test func anInterruptedInitLeavesNothingThatBlocksTheNext() throws {
        let root = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let directory = KeychainDirectory(path: root + "/keychain")
        #expect(mkdir(directory.path, 0o700) == 0)
        #expect(
            FileManager.default.createFile(atPath: directory.deviceSecretPath, contents: Data(repeating: 7, count: 32)))
        try Device.createKeychain(at: directory, passcode: secure("p"), kdf: .insecureFastForTests, tpm: .declined)
        let device = try Device(directory: directory)
        try device.unlock(passcode: secure("p"))
    }
}

/// A pointer handed to threads that all use it under their own synchronisation.
struct UncheckedPointer<T>: @unchecked Sendable {
    let pointer: UnsafeMutablePointer<T>
    init(_ pointer: UnsafeMutablePointer<T>) { self.pointer = pointer }
}
