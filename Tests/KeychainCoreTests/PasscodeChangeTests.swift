import Foundation
import Testing
@testable import KeychainCore
@testable import KeychainProtocol

@Suite struct PasscodeChangeTests {
    @Test func theNewPasscodeUnlocksTheOldOneNoLongerDoesAndItemsStay() throws {
        let keychain = try TemporaryKeychain()
        do {
            let manager = try keychain.manager()
            try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
            try manager.register("kept", forIdentifier: "item")
            try manager.localDevice.changePasscode(from: secure(TemporaryKeychain.passcode), to: secure("new passcode"))
            // The running device keeps its keys; the next unlock needs the new passcode.
            #expect(try manager.string(forIdentifier: "item") == "kept")
            manager.localDevice.lock()
            expectError(.authFailed) { try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode)) }
            try manager.localDevice.unlock(passcode: secure("new passcode"))
        }
        // After a restart too.
        let manager = try keychain.manager()
        expectError(.authFailed) { try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode)) }
        try manager.localDevice.unlock(passcode: secure("new passcode"))
        #expect(try manager.string(forIdentifier: "item") == "kept")
    }

    @Test func aWrongCurrentPasscodeIsAFailedAttemptAndTheLockoutApplies() throws {
        let keychain = try TemporaryKeychain()
        let device = try keychain.device()
        for _ in 0..<5 {
            expectError(.authFailed) { try device.changePasscode(from: secure("wrong"), to: secure("new")) }
        }
        #expect(device.status.failedAttempts == 5 && device.status.retryAfter > 0)
        // Locked out: even the right passcode is refused, and nothing changed.
        expectError(.authFailed) {
            try device.changePasscode(from: secure(TemporaryKeychain.passcode), to: secure("new"))
        }
        keychain.clock.advance(3600)
        try device.unlock(passcode: secure(TemporaryKeychain.passcode))
    }

    @Test func aPasscodeCanBeAddedAndRemoved() throws {
        let keychain = try TemporaryKeychain(passcode: nil)
        let device = try keychain.device()
        try device.changePasscode(from: nil, to: secure("added"))
        #expect(device.status.hasPasscode)
        expectError(.authFailed) { try device.unlock(passcode: nil) }
        try device.unlock(passcode: secure("added"))
        try device.changePasscode(from: secure("added"), to: nil)
        #expect(!device.status.hasPasscode)
        device.lock()
        try device.unlock(passcode: nil)
        expectError(.param) { try device.changePasscode(from: nil, to: secure("")) }
    }

    @Test func requestsAndRepliesRoundTripAndMalformedFramesAreRefused() throws {
        let requests: [DeviceRequest] = [
            .process(.ping), .mount(.mount(group: nil, mountpoint: "/m")),
            .mount(.mount(group: "TEAMID.g", mountpoint: "/m 2")),
            .mount(.unmount(mountpoint: "/m")), .device(.changePasscode(old: nil, new: try secure("n"))),
            .device(.changePasscode(old: try secure("o"), new: nil)),
            .item(.get(group: "default", identifier: "t")),
            .item(.set(group: "g", identifier: "t", value: try secure("v"))),
            .item(
                .set(
                    group: "g", identifier: "t", value: try secure(""), protectionClass: .alwaysThisDeviceOnly,
                    condition: .ifAbsent)),
            .item(.remove(group: "g", identifier: "t")), .item(.list(group: nil)), .item(.list(group: "g")),
            .item(.info(group: "g", identifier: "t")),
            .item(.setClass(group: "g", identifier: "t", protectionClass: .afterFirstUnlock)),
            .item(.rename(group: "g", from: "a", to: "b", replacing: true)),
            .item(.rename(group: "g", from: "a", to: "b", replacing: false)),
            .item(.createGroup("g")), .item(.removeGroup("g")), .device(.lock), .device(.unlock(passcode: nil)),
            .device(.unlock(passcode: try secure("1234"))),
            .device(.status(mountpoint: nil)), .device(.sync)
        ]
        for request in requests {
            let frame = try request.frame()
            let decoded = try frame.withUnsafeBytes {
                try DeviceRequest(body: UnsafeRawBufferPointer(rebasing: $0[4...]))
            }
            #expect(try decoded.frame() == frame)
            #expect(frame.withUnsafeBytes { Int($0.load(as: UInt32.self)) } == frame.count - 4)
        }
        for reply in [
            DeviceReply.ok(["last"]), .keychainError(.authFailed, "wrong passcode"), .systemError(EBUSY, "busy"),
            .value(try secure("v"), .whenUnlockedThisDeviceOnly)
        ] {
            let frame = try reply.frame()
            #expect(
                try frame.withUnsafeBytes { try DeviceReply(body: UnsafeRawBufferPointer(rebasing: $0[4...])) } == reply
            )
        }
        // Every bad frame but the first two speaks this build's version, so
        // that each is refused for its own fault.
        let v = DeviceProtocol.version
        for bad: [UInt8] in [
            [], [v &+ 1, 1, 0, 0, 0, 0], [v, 99, 0, 0, 0, 0], [v, 3, 0, 0, 0, 0, 9, 0, 0, 0, 65],
            [v, 1, 0, 0, 0, 0, 0], [v, 4, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            // A path with a NUL (a C string would end there), and a non-canonical policy.
            [v, 3, 0, 0, 0, 0, 3, 0, 0, 0, 97, 0, 98],
            [v, 6, 0, 0, 0, 0, 2, 0, 0, 0, 47, 102, 1, 1, 0, 0, 0, 112, 2, 0, 0, 0, 48, 50],
            // rename's flag must be exactly "0" or "1"; a class must be a class's name.
            [v, 13, 0, 0, 0, 0, 1, 0, 0, 0, 103, 1, 0, 0, 0, 97, 1, 0, 0, 0, 98, 1, 0, 0, 0, 50],
            [v, 12, 0, 0, 0, 0, 1, 0, 0, 0, 103, 1, 0, 0, 0, 97, 1, 0, 0, 0, 120]
        ] {
            #expect(throws: KeychainError.param) { try bad.withUnsafeBytes { try DeviceRequest(body: $0) } }
        }
    }
}
