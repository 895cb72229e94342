import Foundation
import KeychainCore
import KeychainTPM
import Testing
import TestSupport

extension SerialTests {
    /// A keychain sealed by a TPM, a software TPM per test (docs/SECURITY.md,
    /// "Keys sealed by the TPM"). A copy of its files opens on no other TPM;
    /// passcode guesses are bounded by the TPM's lockout, across restarts; an
    /// older copy put back is refused; the recovery key opens it after a TPM
    /// clear; a keychain kept in a file moves to the TPM; and a crash at any
    /// step of a change leaves a keychain that opens.
    @Suite(.serialized) struct KeyProtectionTests {
        static let passcode = "1234"

        static func secure(_ text: String) throws -> SecureBytes { try SecureBytes(text) }

        /// A keychain directory in a fresh temporary directory, removed after.
        final class Scratch: @unchecked Sendable {
            let root: String
            init() throws {
                root = try makeTemporaryDirectory("kcfs-keys")
            }
            deinit { try? FileManager.default.removeItem(atPath: root) }

            func keychain(_ name: String = "keychain") -> KeychainDirectory {
                KeychainDirectory(path: root + "/" + name)
            }

            /// A copy of every file of `keychain`, as a thief or a backup takes it.
            func copy(_ keychain: KeychainDirectory, to name: String) throws -> KeychainDirectory {
                let target = self.keychain(name)
                try? FileManager.default.removeItem(atPath: target.path)
                try FileManager.default.copyItem(atPath: keychain.path, toPath: target.path)
                return target
            }

            /// Puts `copy`'s files back in place of `keychain`'s.
            func restore(_ copy: KeychainDirectory, over keychain: KeychainDirectory) throws {
                try FileManager.default.removeItem(atPath: keychain.path)
                try FileManager.default.copyItem(atPath: copy.path, toPath: keychain.path)
            }
        }

        /// A sealed keychain on `tpm` with one item, its recovery key.
        static func sealedKeychain(
            _ directory: KeychainDirectory, on tpm: SoftwareTPM,
            value: String = "first"
        ) throws -> RecoveryKey {
            let recovery = try Device.createKeychain(
                at: directory, passcode: secure(passcode), kdf: .insecureFastForTests,
                tpm: .required, tcti: tpm.tcti)
            guard let recovery else { throw HarnessError("a keychain sealed by a TPM has a recovery key") }
            let device = try Device(directory: directory, tcti: tpm.tcti)
            try device.unlock(passcode: secure(passcode))
            let manager = PasswordManager(device: device)
            try manager.register(value, forIdentifier: "token")
            try manager.write(secure("always-value"), identifier: "pin", group: "default", protectionClass: .always)
            device.shutDown()
            return recovery
        }

        static func read(_ directory: KeychainDirectory, on tpm: SoftwareTPM, passcode: String = passcode) throws
            -> String
        {
            let device = try Device(directory: directory, tcti: tpm.tcti)
            defer { device.shutDown() }
            try device.unlock(passcode: secure(passcode))
            return try PasswordManager(device: device).string(forIdentifier: "token")
        }

        static func boot(_ directory: KeychainDirectory, on tpm: SoftwareTPM) -> KeychainError? {
            boot(directory, tcti: tpm.tcti)
        }

        static func boot(_ directory: KeychainDirectory, tcti: String) -> KeychainError? {
            do {
                _ = try Device(directory: directory, tcti: tcti)
                return nil
            } catch {
                return error
            }
        }

        @Test func aCopyOfEveryFileOpensOnNoOtherTPMEvenWithThePasscode() throws {
            let scratch = try Scratch(), home = try SoftwareTPM(), elsewhere = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Self.sealedKeychain(keychain, on: home)
            #expect(try keychain.keyProtection() == .tpm2)
            let stolen = try scratch.copy(keychain, to: "stolen")
            // Not the device secret itself: only the TPM's blob of it.
            let file = try Data(contentsOf: URL(fileURLWithPath: stolen.path + "/device-secret"))
            #expect(file.count > 100 && file.prefix(8) == Data("KCFSTPM2".utf8))
            #expect(Self.boot(stolen, on: elsewhere) == .tpmStorageKeyChanged)
            // No TPM at all: said as such, not as damage.
            #expect(throws: KeychainError.tpmUnavailable) {
                try Device(directory: stolen, tcti: "swtpm:host=127.0.0.1,port=1")
            }
            // The copy is intact, and opens on its own TPM with its passcode.
            #expect(try Self.read(stolen, on: home) == "first")
        }

        @Test func wrongPasscodesLockTheTPMOutAcrossRestarts() throws {
            let scratch = try Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Self.sealedKeychain(keychain, on: tpm)
            var device: Device? = try Device(directory: keychain, tcti: tpm.tcti)
            let maximum = try #require(device?.keyProtection.tpmMaximumFailures)
            for _ in 0..<maximum {
                #expect(throws: KeychainError.authFailed) { try device?.unlock(passcode: Self.secure("0000")) }
            }
            #expect(device?.keyProtection.tpmFailures == maximum)
            // The right passcode gets nothing now: guesses are bounded by the TPM, which tried nothing.
            #expect(throws: KeychainError.tpmLockedOut) { try device?.unlock(passcode: Self.secure(Self.passcode)) }
            #expect(device?.status.failedAttempts == UInt64(maximum))
            device?.shutDown()
            device = nil
            // Neither a new device nor a reboot of the machine resets it.
            try tpm.restart()
            device = try Device(directory: keychain, tcti: tpm.tcti)
            #expect(throws: KeychainError.tpmLockedOut) { try device?.unlock(passcode: Self.secure(Self.passcode)) }
            // Items of class `always` stay readable: their key needs the TPM, not the passcode.
            #expect(try device.map { try PasswordManager(device: $0).string(forIdentifier: "pin") } == "always-value")
            device?.shutDown()
        }

        @Test func aWholeKeychainPutBackFromAnOlderCopyIsRefused() throws {
            let scratch = try Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Self.sealedKeychain(keychain, on: tpm)
            let older = try scratch.copy(keychain, to: "older")
            do {
                // A credential rotated, then the device locked (a bump of the counter).
                let device = try Device(directory: keychain, tcti: tpm.tcti)
                try device.unlock(passcode: Self.secure(Self.passcode))
                try PasswordManager(device: device).register("rotated", forIdentifier: "token")
                let before = device.keyProtection.rollbackCounter
                device.lock()
                #expect(device.keyProtection.rollbackCounter == before.map { $0 + 1 })
                device.shutDown()
            }
            let newer = try scratch.copy(keychain, to: "newer")
            try scratch.restore(older, over: keychain)
            #expect(Self.boot(keychain, on: tpm) == .rolledBack)
            // The newer copy's rollback record spliced into the older database: its state is still the older one's.
            try Self.splice(RollbackRecordKey.name, from: newer, into: keychain)
            #expect(Self.boot(keychain, on: tpm) == .decode)
            try scratch.restore(newer, over: keychain)
            #expect(try Self.read(keychain, on: tpm) == "rotated")
            // Put back on purpose: accepted with the passcode, and then it opens.
            try scratch.restore(older, over: keychain)
            #expect(throws: KeychainError.authFailed) {
                try Device.acceptRollback(at: keychain, passcode: Self.secure("9999"), tcti: tpm.tcti)
            }
            #expect(Self.boot(keychain, on: tpm) == .rolledBack)
            try Device.acceptRollback(at: keychain, passcode: Self.secure(Self.passcode), tcti: tpm.tcti)
            #expect(try Self.read(keychain, on: tpm) == "first")
            let log = try String(contentsOfFile: keychain.path + "/audit.log", encoding: .utf8)
            #expect(log.contains("accept-rollback"), "the acceptance is in the audit log")
        }

        enum RollbackRecordKey { static let name = "rollback" }

        /// Copies one metadata row of `source`'s database into `target`'s, as an attacker with both copies can.
        static func splice(_ key: String, from source: KeychainDirectory, into target: KeychainDirectory) throws {
            let script = """
                import sqlite3, sys
                db = sqlite3.connect(sys.argv[1])
                db.execute("ATTACH DATABASE ? AS newer", (sys.argv[2],))
                db.execute("UPDATE main.meta SET value = (SELECT value FROM newer.meta WHERE key = ?) WHERE key = ?",
                           (sys.argv[3], sys.argv[3]))
                db.commit()
                """
            let result = Spawn.run([
                "/usr/bin/python3", "-c", script, target.path + "/keychain.db",
                source.path + "/keychain.db", key
            ])
            guard result == 0 else { throw HarnessError("python3's sqlite3 failed (\(result))") }
        }

        @Test func theRecoveryKeyOpensTheKeychainAfterATPMClear() throws {
            let scratch = try Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            let recovery = try Self.sealedKeychain(keychain, on: tpm)
            try TrustedPlatformModule(tcti: tpm.tcti).clear()
            #expect(Self.boot(keychain, on: tpm) == .tpmStorageKeyChanged)
            let untouched = try scratch.copy(keychain, to: "untouched")
            // Another keychain's recovery key opens nothing and changes nothing.
            let other = try Self.sealedKeychain(scratch.keychain("other"), on: tpm)
            #expect(throws: KeychainError.authFailed) {
                _ = try Device.recover(
                    at: keychain, recoveryKey: other, newPasscode: Self.secure("5678"),
                    kdf: .insecureFastForTests, tcti: tpm.tcti)
            }
            #expect(
                try Data(contentsOf: URL(fileURLWithPath: keychain.path + "/keychain.db"))
                    == Data(contentsOf: URL(fileURLWithPath: untouched.path + "/keychain.db")))
            // The key as the user typed it back: upper case, other dashes.
            let typed = String(decoding: recovery.formatted().bytes(), as: UTF8.self).uppercased()
                .replacingOccurrences(of: "-", with: " ")
            let parsed = try #require(RecoveryKey(typed: Self.secure(typed)))
            _ = try Device.recover(
                at: keychain, recoveryKey: parsed, newPasscode: Self.secure("5678"),
                kdf: .insecureFastForTests, tcti: tpm.tcti)
            #expect(try keychain.keyProtection() == .tpm2)
            #expect(try Self.read(keychain, on: tpm, passcode: "5678") == "first")
            #expect(throws: KeychainError.authFailed) { try Self.read(keychain, on: tpm, passcode: Self.passcode) }
            #expect(RecoveryKey(typed: try Self.secure("not-a-recovery-key")) == nil)
            // The recovery is in the log of the keychain it opened, kept beside the new one's (new keys).
            let before = try String(contentsOfFile: keychain.path + "/audit.log.before-rekey", encoding: .utf8)
            #expect(before.contains("op=recover"), "the recovery is in the audit log")
            let log = try String(contentsOfFile: keychain.path + "/audit.log", encoding: .utf8)
            #expect(log.contains("op=rekey"), "\(log)")
        }

        @Test func aPasscodeChangeSealsTheNewPasscodeToTheTPM() throws {
            let scratch = try Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Self.sealedKeychain(keychain, on: tpm)
            do {
                let device = try Device(directory: keychain, tcti: tpm.tcti)
                defer { device.shutDown() }
                #expect(throws: KeychainError.authFailed) {
                    try device.changePasscode(from: Self.secure("0000"), to: Self.secure("5678"))
                }
                try device.changePasscode(from: Self.secure(Self.passcode), to: Self.secure("5678"))
            }
            #expect(throws: KeychainError.authFailed) { try Self.read(keychain, on: tpm, passcode: Self.passcode) }
            #expect(try Self.read(keychain, on: tpm, passcode: "5678") == "first")
        }

        @Test func aKeychainKeptInAFileMovesToTheTPM() throws {
            let scratch = try Scratch(), tpm = try SoftwareTPM(), elsewhere = try SoftwareTPM()
            let keychain = scratch.keychain()
            let none = try Device.createKeychain(
                at: keychain, passcode: Self.secure(Self.passcode), kdf: .insecureFastForTests,
                tpm: .declined, tcti: tpm.tcti)
            #expect(none == nil)
            #expect(try keychain.keyProtection() == .file)
            do {
                let device = try Device(directory: keychain, tcti: tpm.tcti)
                defer { device.shutDown() }
                #expect(device.keyProtection == KeyProtectionStatus(protection: .file))
                try device.unlock(passcode: Self.secure(Self.passcode))
                try PasswordManager(device: device).register("kept", forIdentifier: "token")
                // A device holds it: the move is refused, and changes nothing.
                #expect(throws: KeychainError.keychainInUse) {
                    try Device.moveToTPM(at: keychain, passcode: Self.secure(Self.passcode), tcti: tpm.tcti)
                }
            }
            #expect(throws: KeychainError.authFailed) {
                try Device.moveToTPM(at: keychain, passcode: Self.secure("0000"), tcti: tpm.tcti)
            }
            #expect(try keychain.keyProtection() == .file)
            let recovery = try Device.moveToTPM(at: keychain, passcode: Self.secure(Self.passcode), tcti: tpm.tcti)
            #expect(throws: KeychainError.duplicateKeychain) {
                try Device.moveToTPM(at: keychain, passcode: Self.secure(Self.passcode), tcti: tpm.tcti)
            }
            #expect(!FileManager.default.fileExists(atPath: keychain.path + ".rekey"), "the old keychain is gone")
            let log = try String(contentsOfFile: keychain.path + "/audit.log.before-rekey", encoding: .utf8)
            #expect(log.contains("op=unlock"), "the log from before is kept beside: \(log)")
            #expect(try keychain.keyProtection() == .tpm2)
            #expect(try Self.read(keychain, on: tpm) == "kept")
            let stolen = try scratch.copy(keychain, to: "stolen")
            #expect(Self.boot(stolen, on: elsewhere) == .tpmStorageKeyChanged)
            // And its recovery key works like one made at init.
            _ = try Device.recover(
                at: stolen, recoveryKey: recovery, newPasscode: Self.secure("5678"),
                kdf: .insecureFastForTests, tcti: elsewhere.tcti)
            #expect(try Self.read(stolen, on: elsewhere, passcode: "5678") == "kept")
        }

        @Test func aDamagedSealedBlobIsSaidAndChangesNothing() throws {
            let scratch = try Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Self.sealedKeychain(keychain, on: tpm)
            let path = keychain.path + "/device-secret"
            let whole = try Data(contentsOf: URL(fileURLWithPath: path))
            try whole.prefix(whole.count - 20).write(to: URL(fileURLWithPath: path))
            #expect(Self.boot(keychain, on: tpm) == .tpmMismatch)
            try whole.write(to: URL(fileURLWithPath: path))
            #expect(try Self.read(keychain, on: tpm) == "first")
        }

        @Test func aTakenCounterIndexIsPassedOverAndAllTakenIsSaid() throws {
            let scratch = try Scratch(), tpm = try SoftwareTPM()
            let taken: UInt32 = 0x0181_4B43, free: UInt32 = 0x0181_4B44
            _ = try TrustedPlatformModule(tcti: tpm.tcti).defineCounter(at: taken, auth: Self.secure("another's"))
            let keychain = scratch.keychain()
            #expect(throws: KeychainError.io) {
                try Device.createKeychain(
                    at: keychain, passcode: Self.secure(Self.passcode), kdf: .insecureFastForTests,
                    tpm: .required, tcti: tpm.tcti, counterIndexes: [taken])
            }
            #expect(!keychain.exists, "no half keychain is left")
            let recovery = try Device.createKeychain(
                at: keychain, passcode: Self.secure(Self.passcode), kdf: .insecureFastForTests,
                tpm: .required, tcti: tpm.tcti, counterIndexes: [taken, free])
            #expect(recovery != nil)
            let device = try Device(directory: keychain, tcti: tpm.tcti)
            defer { device.shutDown() }
            // Its counter is the free index's, which the lock then moves (its
            // passcode binding's counter is the third).
            let counter = try #require(device.keyProtection.rollbackCounter)
            let indexes = try TPMTools.counterIndexes(on: tpm)
            #expect(indexes.count == 3 && indexes.contains(taken) && indexes.contains(free), "\(indexes)")
            device.lock()
            #expect(device.keyProtection.rollbackCounter == counter + 1)
        }

        @Test func aBusyTPMIsSaidAndChangesNothing() throws {
            let scratch = try Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Self.sealedKeychain(keychain, on: tpm)
            // The same TPM through a proxy that answers TPM2_Unseal (0x15e) with TPM_RC_RETRY.
            let proxy = try #require(
                Bundle.module.path(forResource: "tpm-proxy.py", ofType: nil, inDirectory: "Fixtures"))
            let busy = "cmd:/usr/bin/python3 \(proxy) busy \(tpm.port) 15e"
            #expect(Self.boot(keychain, tcti: busy) == .tpmUnavailable)
            #expect(try Self.read(keychain, on: tpm) == "first")
        }
    }
}
