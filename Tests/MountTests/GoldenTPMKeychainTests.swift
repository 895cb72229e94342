import Foundation
import KeychainCore
import KeychainTPM
import Testing
import TestSupport

extension SerialTests {
    /// A keychain of format 5 (its keys sealed by a TPM), committed with the
    /// state of the software TPM that sealed it: every later version must
    /// still open it with its passcode on that TPM, read every item, accept
    /// its rollback counter and know its recovery key (gocryptfs
    /// tests/example_filesystems, for the TPM's part of the format too).
    @Suite(.serialized) struct GoldenTPMKeychainTests {
        static let passcode = "golden-passcode-1234"
        /// Printed when the fixture was written; kept here as a user keeps theirs.
        static let recoveryKey = "irdbdhfh-vgievbku-ejhfrkek-bkhjlvrk-fhfrkfjh-itggunkj-dtbkhjbd-gtbftnni"
        static let items: [(identifier: String, protectionClass: ProtectionClass, value: String)] = [
            ("github.com", .whenUnlocked, "ghp_golden_whenUnlocked"),
            ("afu", .afterFirstUnlock, "afu-value"),
            ("always", .always, "always-value"),
            ("tdo", .whenUnlockedThisDeviceOnly, "tdo-value")
        ]

        static var fixture: String {
            Bundle.module.path(forResource: "golden-v5", ofType: nil, inDirectory: "Fixtures")!
        }

        /// The fixture's keychain, copied with the private modes git does not keep.
        static func copiedKeychain(into root: String) throws -> KeychainDirectory {
            let target = root + "/keychain"
            try FileManager.default.copyItem(atPath: fixture + "/keychain", toPath: target)
            chmod(target, 0o700)
            for file in try FileManager.default.contentsOfDirectory(atPath: target) {
                chmod(target + "/" + file, 0o600)
            }
            return KeychainDirectory(path: target)
        }

        @Test func formatFiveStillOpensOnItsTPMAndReadsEveryItem() throws {
            let scratch = try KeyProtectionTests.Scratch()
            let tpm = try SoftwareTPM(copyingState: Self.fixture + "/tpm-state")
            let keychain = try Self.copiedKeychain(into: scratch.root)
            #expect(try keychain.keyProtection() == .tpm2)
            let legacyCounter = try TPMTools.counterIndexes(on: tpm)
            #expect(legacyCounter.count == 1)
            do {
                let device = try Device(directory: keychain, tcti: tpm.tcti)
                defer { device.shutDown() }
                let manager = PasswordManager(device: device)
                #expect(try manager.string(forIdentifier: "always") == "always-value")
                #expect(throws: KeychainError.authFailed) {
                    try device.unlock(passcode: SecureBytes("not the passcode"))
                }
                try device.unlock(passcode: SecureBytes(Self.passcode))
                for item in Self.items {
                    #expect(try manager.string(forIdentifier: item.identifier) == item.value)
                    #expect(try manager.info(forIdentifier: item.identifier)?.protectionClass == item.protectionClass)
                }
                #expect(device.keyProtection.protection == .tpm2)
            }
            // Its first boot pinned the storage key in the device-secret file, gave
            // it a counter of its own and freed the one made before (docs/SECURITY.md,
            // "Bound to this machine, against whoever holds the files and the TPM");
            // its first unlock bound it to its passcode, with a second counter.
            let file = try Data(contentsOf: URL(fileURLWithPath: keychain.path + "/device-secret"))
            #expect(file.prefix(9) == Data("KCFSTPM2".utf8) + [2])
            let counters = try TPMTools.counterIndexes(on: tpm)
            #expect(
                counters.count == 2 && !counters.contains(legacyCounter[0]), "\(counters) after \(legacyCounter)")
            #expect(KeyProtectionTests.boot(keychain, on: tpm) == nil)
            // The fixture as it was, put back, is behind: its counter is gone.
            try FileManager.default.createDirectory(atPath: scratch.root + "/older", withIntermediateDirectories: false)
            let older = try Self.copiedKeychain(into: scratch.root + "/older")
            #expect(KeyProtectionTests.boot(older, on: tpm) == .rollbackCounterGone)
            // On another TPM it opens nothing; its recovery key opens it there.
            let other = try SoftwareTPM()
            #expect(throws: KeychainError.tpmStorageKeyChanged) { try Device(directory: keychain, tcti: other.tcti) }
            let key = try #require(RecoveryKey(typed: SecureBytes(Self.recoveryKey)))
            _ = try Device.recover(
                at: keychain, recoveryKey: key, newPasscode: SecureBytes("5678"),
                kdf: .insecureFastForTests, tcti: other.tcti)
            let device = try Device(directory: keychain, tcti: other.tcti)
            defer { device.shutDown() }
            try device.unlock(passcode: SecureBytes("5678"))
            #expect(
                try PasswordManager(device: device).string(forIdentifier: "github.com") == "ghp_golden_whenUnlocked")
        }

        /// Writes the fixture: `KEYCHAINFS_WRITE_GOLDEN_TPM=DIR swift test --filter writeGoldenTPMKeychain`
        /// (DIR/keychain, DIR/tpm-state; the recovery key is printed, for ``recoveryKey``).
        /// A tool kept beside the test it feeds: skipped unless asked for.
        @Test(.enabled(if: ProcessInfo.processInfo.environment["KEYCHAINFS_WRITE_GOLDEN_TPM"] != nil))
        func writeGoldenTPMKeychain() throws {
            let root = ProcessInfo.processInfo.environment["KEYCHAINFS_WRITE_GOLDEN_TPM"]!
            let tpm = try SoftwareTPM()
            let keychain = KeychainDirectory(path: root + "/keychain")
            let recovery = try Device.createKeychain(
                at: keychain, passcode: SecureBytes(Self.passcode), kdf: .interactive,
                tpm: .required, tcti: tpm.tcti)
            do {
                let device = try Device(directory: keychain, tcti: tpm.tcti)
                defer { device.shutDown() }
                try device.unlock(passcode: SecureBytes(Self.passcode))
                let manager = PasswordManager(device: device)
                for item in Self.items {
                    try manager.write(
                        SecureBytes(item.value), identifier: item.identifier, group: "default",
                        protectionClass: item.protectionClass)
                }
            }
            tpm.stop()
            try FileManager.default.copyItem(atPath: tpm.stateDirectory, toPath: root + "/tpm-state")
            print("recovery key:", String(decoding: try #require(recovery).formatted().bytes(), as: UTF8.self))
        }
    }
}
