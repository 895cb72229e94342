import Foundation
import KeychainCore
import KeychainTPM
import Testing
import TestSupport

extension SerialTests {
    /// `PasswordManager` and `TypedKeychain` while a device process holds the
    /// keychain: they reach it over its socket with the same API and errors,
    /// and open the keychain directly only when no device holds it.
    @Suite struct LibraryClientTests {
        /// This process finds the device's socket through XDG_RUNTIME_DIR, as a
        /// program of the user would; the filesystem tests run one at a time.
        private static func withRuntime<T>(of harness: MountHarness, _ body: () throws -> T) rethrows -> T {
            let previous = getenv("XDG_RUNTIME_DIR").map { String(cString: $0) }
            setenv("XDG_RUNTIME_DIR", harness.runtime, 1)
            defer {
                if let previous { setenv("XDG_RUNTIME_DIR", previous, 1) } else { unsetenv("XDG_RUNTIME_DIR") }
            }
            return try body()
        }

        private func expectError(
            _ expected: KeychainError, sourceLocation: SourceLocation = #_sourceLocation,
            _ body: () throws -> Void
        ) {
            do {
                try body()
                Issue.record("expected \(expected), got success", sourceLocation: sourceLocation)
            } catch {
                #expect(error as? KeychainError == expected, sourceLocation: sourceLocation)
            }
        }

        @Test func theManagerIsAClientOfTheRunningDeviceWithTheSameErrors() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            try Self.withRuntime(of: harness) {
                let manager = try PasswordManager.open(KeychainDirectory(path: harness.keychain))
                #expect(manager.isClientOfRunningDevice)
                expectError(.keychainInUse) { _ = try manager.device }  // the keys are in the device process

                // Writes land in the device: the mount sees them at once, and back.
                try manager.register("s3cret", forIdentifier: "github.com")
                #expect(readFile(mnt + "/default/github.com") == "s3cret")
                #expect(harness.sh("printf 'from the mount' > \"$1/default/other\"", arguments: [mnt]).succeeded)
                #expect(try manager.string(forIdentifier: "other") == "from the mount")
                #expect(try manager.validKey("s3cret", forIdentifier: "github.com"))
                #expect(try !manager.validKey("wrong", forIdentifier: "github.com"))
                #expect(
                    try manager.info(forIdentifier: "github.com") == ItemInfo(protectionClass: .whenUnlocked, size: 6))
                #expect(try manager.info(forIdentifier: "missing") == nil)

                // The manager's own settings choose the class, as a local manager's do.
                manager.accessMode = .always
                manager.migrate = false
                try manager.register("kept", forIdentifier: "device-only")
                #expect(
                    harness.sh(
                        "getfattr --only-values -n user.keychain.accessible \"$1/default/device-only\"",
                        arguments: [mnt]
                    )
                    .stdout == "alwaysThisDeviceOnly")
                try manager.setProtectionClass(.afterFirstUnlock, forIdentifier: "device-only")
                #expect(try manager.item(forIdentifier: "device-only").protectionClass == .afterFirstUnlock)

                // Groups, renames and listings.
                try manager.createGroup("TEAMID.shared")
                expectError(.duplicateItem) { try manager.createGroup("TEAMID.shared") }
                #expect(try manager.groups() == ["TEAMID.shared", "default"])
                let typed = try TypedKeychain(manager: manager, group: "TEAMID.shared")
                struct Login: Codable, Equatable { var user: String; var token: String }
                try typed.set(Login(user: "ada", token: "t"), forKey: "login")
                #expect(try typed["login", as: Login.self] == Login(user: "ada", token: "t"))
                #expect((readFile(mnt + "/TEAMID.shared/login") ?? "").contains(#""user":"ada""#))
                expectError(.badRequest) { try manager.removeGroup("TEAMID.shared") }  // not empty
                try manager.renameKey(forIdentifier: "other", to: "renamed")
                expectError(.duplicateItem) { try manager.renameKey(forIdentifier: "renamed", to: "github.com") }
                #expect(try manager.identifiers() == ["device-only", "github.com", "renamed"])
                #expect(access(mnt + "/default/other", F_OK) == -1 && errno == ENOENT)

                // Bad input: refused with the core's errors, nothing changed.
                expectError(.param) { try manager.register("x", forIdentifier: "a\nb") }
                expectError(.valueTooLarge) {
                    try manager.register(
                        try SecureBytes([UInt8](repeating: 1, count: ItemLimits.maximumValueSize + 1)),
                        forIdentifier: "github.com")
                }
                #expect(try manager.string(forIdentifier: "github.com") == "s3cret")

                // Locked is never absent; removal works while locked, as on iOS.
                try manager.lock()
                #expect(try manager.status.isLocked)
                #expect(harness.status(mnt)["state"] == "locked")
                expectError(.interactionNotAllowed) { _ = try manager.key(forIdentifier: "github.com") }
                expectError(.itemNotFound) { _ = try manager.key(forIdentifier: "missing") }
                expectError(.interactionNotAllowed) { try manager.register("new", forIdentifier: "github.com") }
                try manager.deleteKey(forIdentifier: "renamed")
                expectError(.itemNotFound) { try manager.deleteKey(forIdentifier: "renamed") }
                expectError(.authFailed) { try manager.unlock(passcode: try SecureBytes("0000")) }
                #expect(try manager.status.failedAttempts == 1)
                try manager.unlock(passcode: try SecureBytes(MountHarness.passcode))
                #expect(try manager.string(forIdentifier: "github.com") == "s3cret")  // the old value stayed
                try manager.sync()
            }
        }

        @Test func withoutADeviceTheManagerOpensTheKeychainItself() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            try Self.withRuntime(of: harness) {
                let client = try PasswordManager.open(KeychainDirectory(path: harness.keychain))
                try client.register("written through the device", forIdentifier: "token")
                #expect(harness.sh("\"$K\" unmount \"$1\"", arguments: [mnt]).succeeded)
                // The device went away: the client says so rather than guessing.
                expectError(.io) { _ = try client.key(forIdentifier: "token") }

                let local = try PasswordManager.open(KeychainDirectory(path: harness.keychain))
                #expect(!local.isClientOfRunningDevice)
                #expect(try local.status.isLocked)  // a device of its own boots locked
                try local.unlock(passcode: try SecureBytes(MountHarness.passcode))
                #expect(try local.string(forIdentifier: "token") == "written through the device")
                // While this process holds the keychain, a mount cannot take it.
                #expect(!harness.sh("\"$K\" mount \"$1\" --keychain \"$KC\"", arguments: [mnt]).succeeded)
            }
        }
    }
}
