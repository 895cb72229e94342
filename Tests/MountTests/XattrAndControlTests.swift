import KeychainCore
import KeychainProtocol
import Foundation
import Testing
import TestSupport

extension SerialTests {
    @Suite struct XattrTests {
        @Test func classAttributesReadWhileLockedAndSettingReEncrypts() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let item = mnt + "/default/item"
            #expect(harness.sh("printf v > \"$1\"", arguments: [item]).succeeded)
            #expect(
                harness.sh("getfattr -d \"$1\"", arguments: [item]).stdout.contains(
                    "user.keychain.accessible=\"whenUnlocked\""))
            #expect(harness.sh("setfattr -n user.keychain.migratable -v no \"$1\"", arguments: [item]).succeeded)
            #expect(
                harness.sh("getfattr --only-values -n user.keychain.accessible \"$1\"", arguments: [item]).stdout
                    == "whenUnlockedThisDeviceOnly")
            #expect(
                harness.sh("setfattr -n user.keychain.accessible -v alwaysThisDeviceOnly \"$1\"", arguments: [item])
                    .succeeded)
            #expect(harness.control(mnt, "lock").succeeded)
            #expect(harness.sh("cat \"$1\"", arguments: [item]).stdout == "v")
            #expect(
                harness.sh("getfattr --only-values -n user.keychain.migratable \"$1\"", arguments: [item]).stdout
                    == "no")
            // Moving it back to a locked class needs that class's key.
            let locked = harness.sh("setfattr -n user.keychain.accessible -v whenUnlocked \"$1\"", arguments: [item])
            #expect(locked.stderr.contains("Permission denied"))
            #expect(
                harness.sh("getfattr --only-values -n user.keychain.accessible \"$1\"", arguments: [item]).stdout
                    == "alwaysThisDeviceOnly")
        }

        /// An item's label and content type, which the Secret Service keeps
        /// with it, are attributes on a mount too: an item with none shows
        /// its identifier and `text/plain`; the label is written with
        /// setfattr, keeps the value, needs the item's class key (EACCES
        /// while locked, the old label kept), and one past 4,096 bytes or
        /// holding a NUL is EINVAL; the write is audited; the type changes
        /// with the value only (ENOTSUP).
        @Test func anItemsLabelIsReadAndWrittenAsAnAttribute() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let item = mnt + "/default/item"
            func read(_ name: String) -> String {
                harness.sh("getfattr --only-values -n user.keychain.\(name) \"$1\"", arguments: [item]).stdout
            }
            func write(_ name: String, _ value: String) -> ShellResult {
                harness.sh("setfattr -n user.keychain.\(name) -v \"$2\" \"$1\"", arguments: [item, value])
            }
            #expect(harness.sh("printf v > \"$1\"", arguments: [item]).succeeded)
            #expect(read("label") == "item" && read("type") == "text/plain")
            #expect(write("label", "Work mail").succeeded)
            #expect(read("label") == "Work mail")
            #expect(harness.sh("cat \"$1\"", arguments: [item]).stdout == "v")
            let log = harness.sh("\"$K\" log --keychain \"$KC\"").stdout
            #expect(
                log.contains("set-details ok default/item") && log.contains("user.keychain.label=Work mail"), "\(log)")
            let listed = harness.sh("getfattr -d \"$1\"", arguments: [item]).stdout
            #expect(listed.contains("user.keychain.label=\"Work mail\"") && listed.contains("user.keychain.type="))
            #expect(write("label", String(repeating: "l", count: 4097)).stderr.contains("Invalid argument"))
            // A NUL, which the bus could not show (a D-Bus string holds none): setfattr's hex spelling.
            #expect(write("label", "0x6e756c00696e").stderr.contains("Invalid argument"))
            #expect(write("type", "application/json").stderr.contains("Operation not supported"))
            #expect(
                harness.sh("setfattr -x user.keychain.label \"$1\"", arguments: [item]).stderr.contains(
                    "Operation not permitted"))
            #expect(harness.control(mnt, "lock").succeeded)
            #expect(read("label") == "Work mail")
            #expect(write("label", "While locked").stderr.contains("Permission denied"))
            #expect(read("label") == "Work mail" && read("type") == "text/plain")
        }

        @Test func badAttributeNamesAndValuesChangeNothing() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let item = mnt + "/default/item"
            #expect(harness.sh("printf v > \"$1\"", arguments: [item]).succeeded)
            #expect(
                harness.sh("setfattr -n user.keychain.accessible -v sometimes \"$1\"", arguments: [item]).stderr
                    .contains("Invalid argument"))
            #expect(
                harness.sh("setfattr -n user.keychain.migratable -v maybe \"$1\"", arguments: [item]).stderr.contains(
                    "Invalid argument"))
            #expect(
                harness.sh("setfattr -n user.other -v x \"$1\"", arguments: [item]).stderr.contains(
                    "Operation not supported"))
            #expect(harness.sh("getfattr -n user.other \"$1\"", arguments: [item]).stderr.contains("No such attribute"))
            #expect(
                harness.sh("setfattr -x user.keychain.accessible \"$1\"", arguments: [item]).stderr.contains(
                    "Operation not permitted"))
            #expect(
                harness.sh("getfattr --only-values -n user.keychain.accessible \"$1\"", arguments: [item]).stdout
                    == "whenUnlocked")
            #expect(
                harness.sh("getfattr --only-values -n user.keychain.accessible \"$1/default\"", arguments: [mnt]).stderr
                    .contains("No such attribute"))
        }
    }
}

extension SerialTests {
    @Suite struct ControlFileTests {
        /// `.control`'s lines are the device's requests: the settings that
        /// only `.control` could change (purge, background, accessmode,
        /// migrate) are answered on the socket too, and a mount shows the
        /// change as it shows one written to `.control`.
        @Test func theSocketChangesWhatTheControlFileChanges() throws {
            let harness = try MountHarness()
            let mnt = try harness.mount()
            try harness.unlock(mnt)
            let sockets = try FileManager.default.contentsOfDirectory(atPath: harness.runtime + "/keychainfs")
            let socket = harness.runtime + "/keychainfs/" + (try #require(sockets.first { $0.hasSuffix(".sock") }))
            let calls: [DeviceCall<Done>] = [.accessMode(.always), .migrate(false), .purge, .background]
            for call in calls {
                let outcome = DeviceClient.send(call, to: socket)
                #expect(outcome != nil && outcome?.refusal == nil, "\(call.request): \(String(describing: outcome))")
            }
            let status = harness.status(mnt)
            #expect(status["accessmode"] == "always" && status["migrate"] == "no", "\(status)")
            #expect(
                harness.sh(
                    "printf v > \"$1/default/item\" && getfattr --only-values -n user.keychain.accessible \"$1/default/item\"",
                    arguments: [mnt]
                ).stdout == "alwaysThisDeviceOnly")
        }

        @Test func statusReportsTheDevice() throws {
            let harness = try MountHarness()
            let mnt = try harness.mount()
            var status = harness.status(mnt)
            #expect(status["state"] == "locked")
            #expect(status["first-unlock"] == "no")
            #expect(status["accessmode"] == "whenUnlocked")
            #expect(status["migrate"] == "yes")
            // The mode says what it cannot protect against.
            #expect(status["mode"] == "per-user")
            #expect(status["mode-limits"]?.contains("any program of this user can read them") == true)
            // And how the keys are kept: a file, open to offline guessing
            // (docs/SECURITY.md, "Who, and what they get").
            #expect(status["key-protection"] == "file")
            #expect(status["key-protection-limits"]?.contains("guessed offline") == true)
            try harness.unlock(mnt)
            #expect(harness.control(mnt, "accessmode afterFirstUnlock").succeeded)
            #expect(harness.control(mnt, "migrate no").succeeded)
            status = harness.status(mnt)
            #expect(status["state"] == "unlocked")
            #expect(status["first-unlock"] == "yes")
            #expect(status["accessmode"] == "afterFirstUnlock")
            #expect(status["migrate"] == "no")
            #expect(
                harness.sh(
                    "printf v > \"$1/default/item\" && getfattr --only-values -n user.keychain.accessible \"$1/default/item\"",
                    arguments: [mnt]
                ).stdout == "afterFirstUnlockThisDeviceOnly")
            #expect(harness.control(mnt, "purge").succeeded)
            #expect(harness.control(mnt, "background").succeeded)
            // Shells that truncate before writing (no atomic O_TRUNC) still reach the commands.
            #expect(
                harness.sh("truncate -s 0 \"$1/.control\" && echo lock > \"$1/.control\"", arguments: [mnt]).succeeded)
            #expect(harness.status(mnt)["state"] == "locked")
        }

        @Test(arguments: [
            "bogus", "lock now", "accessmode sometimes", "accessmode", "migrate maybe",
            "accessmode always\nbogus", "\n", "unlock"
        ])
        func badCommandsFailWithEINVALAndChangeNothing(_ command: String) throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let before = harness.status(mnt)
            // "unlock" alone is malformed only for a keychain with a passcode: a wrong passcode, EACCES.
            #expect(writeErrno(mnt + "/.control", command) == (command == "unlock" ? EACCES : EINVAL))
            #expect(
                harness.status(mnt).filter { $0.key != "failed-attempts" }
                    == before.filter { $0.key != "failed-attempts" })
            let shell = harness.sh("echo \"$2\" > \"$1/.control\"", arguments: [mnt, "bogus"])
            #expect(shell.stderr.contains("Invalid argument") || shell.stderr.contains("I/O error"))
        }

        @Test func wrongPasscodesAreEACCESAndEscalateToALockout() throws {
            let harness = try MountHarness()
            let mnt = try harness.mount()
            for attempt in 1...5 {
                let result = harness.control(mnt, "unlock wrong\(attempt)")
                #expect(result.stderr.contains("Permission denied"))
            }
            let status = harness.status(mnt)
            #expect(status["state"] == "locked")
            #expect(status["failed-attempts"] == "5")
            #expect(Int(status["retry-after"] ?? "") ?? 0 > 0)
            // During the lockout even the right passcode is refused, and the CLI says why, never
            // calling it wrong (it was never tried), through the mount and the socket alike.
            for target in [mnt, "--keychain " + harness.keychain] {
                let refused = harness.sh("\"$K\" unlock \(target)", stdin: MountHarness.passcode + "\n")
                #expect(refused.status == 4, "\(refused)")
                #expect(
                    refused.stderr.contains("unlocking is locked out for ")
                        && refused.stderr.contains("no passcode was tried")
                        && !refused.stderr.contains("wrong passcode;"),
                    "\(refused)")
            }
            #expect(harness.status(mnt)["state"] == "locked")
            #expect(harness.status(mnt)["failed-attempts"] == "5")
        }

        @Test func keychainWithoutPasscodeUnlocksWithABareUnlock() throws {
            let harness = try MountHarness(passcode: nil)
            let mnt = try harness.mount()
            #expect(harness.status(mnt)["passcode"] == "no")
            #expect(harness.control(mnt, "unlock").succeeded)
            #expect(harness.status(mnt)["state"] == "unlocked")
        }
    }
}
