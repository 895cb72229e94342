import Foundation
import KeychainCore
import KeychainTPM
import KeychainFS
import Testing
import TestSupport

extension SerialTests {
    /// `keychainfs passcode`, through real processes.
    @Suite struct PasscodeCommandTests {
        @Test func changingThePasscodeOfAStoppedKeychain() throws {
            let harness = try MountHarness()
            let changed = harness.sh(
                "\"$K\" passcode --keychain \"$KC\"", stdin: "\(MountHarness.passcode)\nnew-passcode\nnew-passcode\n")
            #expect(changed.succeeded && changed.stdout == "changed the passcode\n", "\(changed)")
            let mnt = try harness.mount()
            #expect(
                !harness.sh("\"$K\" unlock \"$1\"", arguments: [mnt], stdin: MountHarness.passcode + "\n").succeeded)
            try harness.unlock(mnt, passcode: "new-passcode")
        }

        @Test func changingThePasscodeThroughTheRunningDevice() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(harness.sh("printf kept > \"$1/default/item\"", arguments: [mnt]).succeeded)
            // A wrong current passcode changes nothing and is counted.
            let wrong = harness.sh("\"$K\" passcode --keychain \"$KC\"", stdin: "not-it\nnew-passcode\nnew-passcode\n")
            #expect(!wrong.succeeded && wrong.stderr.contains("current passcode is wrong"), "\(wrong)")
            #expect(harness.status(mnt)["failed-attempts"] == "1")
            let changed = harness.sh(
                "\"$K\" passcode --keychain \"$KC\"", stdin: "\(MountHarness.passcode)\nnew-passcode\nnew-passcode\n")
            #expect(changed.succeeded, "\(changed)")
            #expect(harness.status(mnt)["failed-attempts"] == "0")
            #expect(readFile(mnt + "/default/item") == "kept")  // still unlocked
            #expect(harness.control(mnt, "lock").succeeded)
            #expect(harness.control(mnt, "unlock \(MountHarness.passcode)").stderr.contains("Permission denied"))
            #expect(harness.control(mnt, "unlock new-passcode").succeeded)
            #expect(readFile(mnt + "/default/item") == "kept")
        }

        @Test func aPasscodeCanBeRemovedAndAddedAgain() throws {
            let harness = try MountHarness()
            #expect(
                harness.sh("\"$K\" passcode --remove --keychain \"$KC\"", stdin: "\(MountHarness.passcode)\n").stdout
                    == "removed the passcode\n")
            let mnt = try harness.mount()
            #expect(harness.status(mnt)["passcode"] == "no")
            #expect(harness.control(mnt, "unlock").succeeded)
            #expect(harness.sh("\"$K\" passcode --keychain \"$KC\"", stdin: "\nadded\nadded\n").succeeded)
            #expect(harness.status(mnt)["passcode"] == "yes")
            #expect(
                harness.sh("\"$K\" passcode --keychain \"$KC\"", stdin: "added\n\n").stderr.contains("use --remove"))
        }

        /// The keybag is replaced in one transaction: a crash at any point
        /// leaves the old or the new passcode working, never neither.
        @Test func killingAPasscodeChangeAtRandomMomentsLeavesOnePasscodeWorking() throws {
            let harness = try MountHarness()
            let template = harness.root + "/template"
            #expect(harness.sh("cp -a \"$KC\" \"$1\"", arguments: [template]).succeeded)
            var outcomes: [String: Int] = [:]
            for round in 0..<12 {
                let keychain = harness.root + "/kc-\(round)"
                #expect(harness.sh("cp -a \"$1\" \"$2\"", arguments: [template, keychain]).succeeded)
                let input = harness.root + "/in-\(round)"
                try "\(MountHarness.passcode)\nnew-passcode\n".write(toFile: input, atomically: true, encoding: .utf8)
                let stdin = open(input, O_RDONLY)
                var options = Spawn.Options()
                options.environment = harness.environment()
                options.descriptors = [(0, stdin)]
                options.nullStandardStreams = true
                let pid = try #require(
                    Spawn.start([harness.binary, "passcode", "--keychain", keychain], options: options))
                close(stdin)
                usleep(UInt32.random(in: 0...250_000))  // a random moment of the change: the experiment
                kill(pid, SIGKILL)
                _ = Spawn.wait(pid)
                let device = try Device(directory: KeychainDirectory(path: keychain))
                let oldWorks = (try? device.unlock(passcode: SecureBytes(MountHarness.passcode))) != nil
                device.lock()
                let newWorks = (try? device.unlock(passcode: SecureBytes("new-passcode"))) != nil
                #expect(oldWorks != newWorks, "round \(round): old \(oldWorks), new \(newWorks)")
                outcomes[newWorks ? "new" : "old", default: 0] += 1
            }
            // Both outcomes should occur; not required (timing), but say when they don't.
            if outcomes.count < 2 {
                print("passcode kill test: every round ended with the \(outcomes.keys.first ?? "") passcode")
            }
        }
    }
}
