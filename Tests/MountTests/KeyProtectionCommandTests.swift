import Foundation
import KeychainCore
import KeychainTPM
import Testing
import TestSupport

extension SerialTests {
    /// Keys sealed by the TPM through the command line and the service, as a
    /// user runs it. A change of several steps (a bump of the TPM rollback
    /// counter, the move of a keychain to the TPM, a recovery) killed with
    /// SIGKILL at each step, through the command line as a user runs it. Every
    /// prefix boots the old or the new state, with every acknowledged write,
    /// or, for a recovery, is opened by running `recover` again: the hardware
    /// never keeps a user from their data (docs/SECURITY.md, "Threats and
    /// their tests").
    @Suite(.serialized) struct KeyProtectionCommandTests {
        static let passcode = MountHarness.passcode

        /// A keychain sealed by `tpm`, with `token` written and the device running.
        static func sealedKeychain(on tpm: SoftwareTPM, crashAt step: String? = nil) throws -> MountHarness {
            var environment = ["TPM2TOOLS_TCTI": tpm.tcti]
            if let step { environment["KEYCHAINFS_CRASH_AT"] = step }
            let harness = try MountHarness(environment: environment)
            #expect(harness.status()["key-protection"] == "tpm2")
            let unlocked = harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: passcode + "\n")
            guard unlocked.succeeded else { throw HarnessError("unlock failed: \(unlocked)") }
            #expect(harness.status()["passcode-binding"]?.hasPrefix("on: ") == true, "init binds it to its passcode")
            let written = harness.sh("printf acknowledged | \"$K\" set --keychain \"$KC\" default/token")
            guard written.succeeded else { throw HarnessError("set failed: \(written)") }
            return harness
        }

        /// `binding-committed`: the passcode binding's half of the bump (the
        /// write moved it; docs/FORMAT.md, "The passcode binding (format 6)"),
        /// committed but not counted; the next unlock completes it.
        @Test(arguments: ["bump-begun", "bump-committed", "bump-counted", "binding-committed"])
        func aDeviceKilledAtAnyStepOfACounterBumpBootsWithEveryWrite(step: String) throws {
            let tpm = try SoftwareTPM()
            let harness = try Self.sealedKeychain(on: tpm, crashAt: step)
            let before = try #require(harness.status()["rollback-counter"].flatMap { UInt64($0) })
            // The lock bumps the counter; the device dies at `step` of it (the
            // command still says locked, which a device that is gone is).
            _ = harness.sh("\"$K\" lock --keychain \"$KC\"")
            #expect(harness.status()["state"] == "stopped", "the device died at \(step)")
            harness.extraEnvironment["KEYCHAINFS_CRASH_AT"] = nil
            // A new device boots: the old epoch or the new one, and the write is there.
            let unlocked = harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: Self.passcode + "\n")
            #expect(unlocked.succeeded, "\(unlocked)")
            #expect(harness.sh("\"$K\" get --keychain \"$KC\" default/token").stdout == "acknowledged")
            let after = try #require(harness.status()["rollback-counter"].flatMap { UInt64($0) })
            #expect(after == (step == "bump-begun" ? before : before + 1))
            // And the next bump works on from there.
            #expect(harness.sh("\"$K\" lock --keychain \"$KC\"").succeeded)
            #expect(harness.status()["rollback-counter"].flatMap { UInt64($0) } == after + 1)
        }

        /// The move makes a new keychain beside the old one and swaps them in
        /// one rename (docs/FORMAT.md, "Keys sealed by a TPM (format 5)"). Killed
        /// before the swap, the old keychain is whole (kept in a file); killed
        /// after it, the new one is (sealed); either way the next boot destroys
        /// what is left beside it.
        @Test(arguments: ["rekey-copied", "rekey-exchanged"])
        func aMoveToTheTPMKilledAtAnyStepLeavesOneWholeKeychain(step: String) throws {
            let tpm = try SoftwareTPM()
            let harness = try MountHarness(environment: ["TPM2TOOLS_TCTI": tpm.tcti], creating: false)
            let created = harness.sh("\"$K\" init --no-tpm --keychain \"$KC\"", stdin: "1234\n1234\n")
            #expect(created.succeeded && created.stdout.contains("key protection: file"), "\(created)")
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "1234\n").succeeded)
            #expect(harness.sh("printf kept | \"$K\" set --keychain \"$KC\" default/token").succeeded)
            #expect(harness.sh("\"$K\" stop --keychain \"$KC\"").succeeded)
            harness.extraEnvironment["KEYCHAINFS_CRASH_AT"] = step
            let killed = harness.sh("\"$K\" passcode --tpm --keychain \"$KC\"", stdin: "1234\n")
            #expect(killed.status == 128 + SIGKILL, "\(killed)")
            #expect(FileManager.default.fileExists(atPath: harness.keychain + ".rekey"))
            harness.extraEnvironment["KEYCHAINFS_CRASH_AT"] = nil
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "1234\n").succeeded)
            #expect(harness.sh("\"$K\" get --keychain \"$KC\" default/token").stdout == "kept")
            #expect(harness.status()["key-protection"] == (step == "rekey-copied" ? "file" : "tpm2"))
            #expect(!FileManager.default.fileExists(atPath: harness.keychain + ".rekey"), "what was left is gone")
            // Run again from a whole file keychain, the move finishes.
            if step == "rekey-copied" {
                #expect(harness.sh("\"$K\" stop --keychain \"$KC\"").succeeded)
                let moved = harness.sh("\"$K\" passcode --tpm --keychain \"$KC\"", stdin: "1234\n")
                #expect(moved.succeeded && moved.stdout.contains("with new keys"), "\(moved)")
                #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "1234\n").succeeded)
                #expect(harness.status()["key-protection"] == "tpm2")
            }
        }

        /// `passcode --tpm` works on the keychain itself: while a device
        /// holds it, the command says to stop that device, and nothing changes.
        @Test func aMoveToTheTPMWhileADeviceRunsIsRefusedAndChangesNothing() throws {
            let tpm = try SoftwareTPM()
            let harness = try MountHarness(environment: ["TPM2TOOLS_TCTI": tpm.tcti], creating: false)
            #expect(harness.sh("\"$K\" init --no-tpm --keychain \"$KC\"", stdin: "1234\n1234\n").succeeded)
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "1234\n").succeeded)
            let refused = harness.sh("\"$K\" passcode --tpm --keychain \"$KC\"", stdin: "1234\n")
            #expect(refused.status == 1, "\(refused)")
            #expect(
                refused.stderr == "keychainfs: a device holds the keychain: unmount it (or `keychainfs stop`) first; "
                    + "nothing was changed\n", "\(refused)")
            #expect(harness.status()["key-protection"] == "file")
            #expect(harness.status()["state"] == "unlocked")
        }

        @Test func aRecoveryKilledAfterItsCommitIsDoneAgainWithTheSameKey() throws {
            let tpm = try SoftwareTPM()
            let harness = try MountHarness(environment: ["TPM2TOOLS_TCTI": tpm.tcti], creating: false)
            let created = harness.sh("\"$K\" init --tpm --keychain \"$KC\"", stdin: "1234\n1234\n")
            #expect(created.succeeded, "\(created)")
            let recoveryKey = try #require(created.stdout.split(separator: "\n").last.map(String.init))
            #expect(recoveryKey.count == 71)
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "1234\n").succeeded)
            #expect(harness.sh("printf sealed | \"$K\" set --keychain \"$KC\" default/token").succeeded)
            #expect(harness.sh("\"$K\" stop --keychain \"$KC\"").succeeded)
            try TrustedPlatformModule(tcti: tpm.tcti).clear()
            let refused = harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "1234\n")
            #expect(!refused.succeeded && refused.stderr.contains("keychainfs recover"), "\(refused)")
            harness.extraEnvironment["KEYCHAINFS_CRASH_AT"] = "recover-committed"
            let killed = harness.sh("\"$K\" recover --keychain \"$KC\"", stdin: recoveryKey + "\n5678\n5678\n")
            #expect(killed.status == 128 + SIGKILL, "\(killed)")
            harness.extraEnvironment["KEYCHAINFS_CRASH_AT"] = nil
            let again = harness.sh("\"$K\" recover --keychain \"$KC\"", stdin: recoveryKey + "\n5678\n5678\n")
            #expect(again.succeeded && again.stdout.contains("key protection: tpm2"), "\(again)")
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "5678\n").succeeded)
            #expect(harness.sh("\"$K\" get --keychain \"$KC\" default/token").stdout == "sealed")
            // A wrong recovery key is said, and changes nothing.
            #expect(harness.sh("\"$K\" stop --keychain \"$KC\"").succeeded)
            let wrong = harness.sh(
                "\"$K\" recover --keychain \"$KC\"",
                stdin: String(repeating: "cccccccc-", count: 7) + "cccccccc\n9999\n9999\n")
            #expect(wrong.status != 0 && wrong.stderr.contains("not this keychain's recovery key"), "\(wrong)")
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "5678\n").succeeded)
        }

        @Test func initSaysHowTheKeysAreKeptAndStatusShowsItAsJSONToo() throws {
            let tpm = try SoftwareTPM()
            let harness = try MountHarness(environment: ["TPM2TOOLS_TCTI": tpm.tcti], creating: false)
            // --tpm where none answers: nothing is created.
            harness.extraEnvironment["TPM2TOOLS_TCTI"] = "swtpm:host=127.0.0.1,port=1"
            let refused = harness.sh("\"$K\" init --tpm --keychain \"$KC\"", stdin: "1234\n1234\n")
            #expect(refused.status == 1 && refused.stderr.contains("no TPM answers"), "\(refused)")
            #expect(!FileManager.default.fileExists(atPath: harness.keychain + "/keychain.db"))
            // Without --tpm too: the TPM named in $TPM2TOOLS_TCTI is never replaced by a file
            // (docs/SECURITY.md, "The TPM is the machine's, or none").
            let named = harness.sh("\"$K\" init --keychain \"$KC\"", stdin: "1234\n1234\n")
            #expect(named.status == 1 && named.stderr.contains("no TPM answers at $TPM2TOOLS_TCTI"), "\(named)")
            #expect(!FileManager.default.fileExists(atPath: harness.keychain + "/keychain.db"))
            // Asked for a file, it is made, and says how its keys are kept.
            let inFile = harness.sh("\"$K\" init --no-tpm --keychain \"$KC\"", stdin: "1234\n1234\n")
            #expect(inFile.succeeded && inFile.stdout.contains("key protection: file"), "\(inFile)")
            #expect(!inFile.stdout.contains("no TPM:"), "asked for: nothing to explain: \(inFile)")
            try FileManager.default.removeItem(atPath: harness.keychain)
            harness.extraEnvironment["TPM2TOOLS_TCTI"] = tpm.tcti
            let sealed = harness.sh("\"$K\" init --keychain \"$KC\"", stdin: "1234\n1234\n")
            #expect(sealed.succeeded && sealed.stdout.contains("key protection: tpm2"), "\(sealed)")
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "1234\n").succeeded)
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "0000\n").status == 4)
            let json = harness.sh("\"$K\" status --json --keychain \"$KC\"").stdout
            let object = try #require(
                try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any], "\(json)")
            #expect(object["key-protection"] as? String == "tpm2")
            #expect(object["tpm-lockout"] as? String == "1 of 3", "\(json)")
            #expect(object["rollback-counter"] as? Int != nil, "\(json)")
            // Which TPM: the one named, said as named, never the machine's by mistake.
            #expect(
                object["tpm"] as? String
                    == "\(tpm.tcti) (named by $TPM2TOOLS_TCTI where the device started, not this machine's /dev/tpmrm0)",
                "\(json)")
            // A mount's .control says the same.
            let mountpoint = try harness.mount()
            #expect(harness.status(mountpoint)["key-protection"] == "tpm2")
            #expect(harness.status(mountpoint)["tpm-lockout"] == "1 of 3")
        }

        /// A device started in the background sent its diagnostics to
        /// /dev/null, so a bump of the counter that failed went unseen. They go
        /// to the journal now (`journalctl -t keychainfs`), or, where no
        /// journald listens, to a file beside the device's socket.
        @Test func aBackgroundDevicesFailedBumpIsInItsLog() throws {
            let tpm = try SoftwareTPM()
            let harness = try Self.sealedKeychain(on: tpm)
            tpm.stop()
            #expect(harness.sh("\"$K\" lock --keychain \"$KC\"").succeeded)
            let journal = FileManager.default.fileExists(atPath: "/run/systemd/journal/stdout")
            let log = harness.sh(
                journal
                    ? "journalctl -t keychainfs --since=-60s -o cat" : "cat \"$XDG_RUNTIME_DIR\"/keychainfs/*.sock.log")
            #expect(
                log.stdout.contains("could not advance the TPM rollback counter (lock)"), "\(log)")
            #expect(!log.stdout.contains("acknowledged"), "never a secret")
        }

        /// Root takes the TPM's lockout hierarchy, and `status` says so (docs/SECURITY.md,
        /// "Bound to this machine, against whoever holds the files and the TPM").
        @Test func theLockoutHierarchyIsTakenResetAndGivenBackFromTheCommandLine() throws {
            let tpm = try SoftwareTPM()
            let harness = try MountHarness(environment: ["TPM2TOOLS_TCTI": tpm.tcti])
            #expect(harness.sh("\"$K\" start --keychain \"$KC\"").succeeded)
            #expect(harness.status()["tpm-lockout-auth"] == "empty")
            let took = harness.sh("\"$K\" tpm take-lockout --state-directory \"$R\"")
            #expect(took.succeeded && took.stdout.contains("took the TPM's lockout hierarchy: 3 tries"), "\(took)")
            #expect(harness.status()["tpm-lockout-auth"] == "set")
            let again = harness.sh("\"$K\" tpm take-lockout --state-directory \"$R\"")
            #expect(again.status == 1 && again.stderr.contains("set already"), "\(again)")
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "0000\n").status == 4)
            #expect(harness.status()["tpm-lockout"] == "1 of 3")
            let reset = harness.sh("\"$K\" tpm reset-lockout --state-directory \"$R\"")
            #expect(reset.succeeded, "\(reset)")
            #expect(harness.status()["tpm-lockout"] == "0 of 3")
            #expect(harness.sh("\"$K\" tpm release-lockout --state-directory \"$R\"").succeeded)
            #expect(harness.status()["tpm-lockout-auth"] == "empty")
            let none = harness.sh("\"$K\" tpm release-lockout --state-directory \"$R\"")
            #expect(none.status == 1 && none.stderr.contains("take-lockout` was not run there"), "\(none)")
        }

        /// An ordinary user's `init` where the machine's TPM is Debian's
        /// (`/dev/tpmrm0`, root and group tss only): it says that a TPM is
        /// there which this user cannot reach, and what to do, never "this
        /// machine has none". The TPM is a file of root's in a /dev of the
        /// test's own (a private mount namespace): what init judges is who may
        /// open it.
        @Test func anOrdinaryUsersInitSaysTheTPMIsThereButNotTheirs() throws {
            let harness = try MountHarness(as: try OrdinaryUser(), creating: false)
            let user = try #require(harness.user)
            let machineHasOne = access("/dev/tpmrm0", F_OK) == 0
            let inner = #"""
                set -e
                real=$(mktemp -d)
                mount --bind /dev "$real"
                mount -t tmpfs -o mode=755 tmpfs /dev
                for name in null zero random urandom; do : > "/dev/$name"; mount --bind "$real/$name" "/dev/$name"; done
                umount -l "$real" && rmdir "$real"
                : > /dev/tpmrm0 && chmod 660 /dev/tpmrm0
                exec runuser -u "$1" -- env -u TPM2TOOLS_TCTI -u KEYCHAINFS_TPM "$K" init --keychain "$KC"
                """#
            let made = harness.sh(
                "exec /usr/bin/unshare --mount --propagation private /bin/sh -c \"$2\" sh \"$1\"",
                arguments: [user.name, inner], stdin: "1234\n1234\n", asRoot: true)
            #expect(made.succeeded, "\(made)")
            #expect(
                made.stdout.contains(
                    "no TPM: this machine has one (/dev/tpmrm0), but you cannot reach it (only root and group tss can)"),
                "\(made)")
            #expect(made.stdout.contains("keychainfs.socket"), "\(made)")
            #expect(try KeychainDirectory(path: harness.keychain).keyProtection() == .file)
            // The namespace's /dev went with it: the machine's is as it was.
            #expect((access("/dev/tpmrm0", F_OK) == 0) == machineHasOne)
        }

        /// The TPM for every user: an ordinary user who cannot reach the TPM
        /// runs their own device, and gets the TPM through the service, bound
        /// to their uid (docs/FORMAT.md, "The TPM through the service").
        /// Another user with a copy of every file, and the passcode, opens
        /// nothing through the same service; and one user's wrong passcodes
        /// leave the TPM open to the others.
        @Test func anOrdinaryUserGetsTheTPMThroughTheServiceForTheirUidAlone() throws {
            let tpm = try SoftwareTPM()
            let service = try ServiceHarness(environment: ["TPM2TOOLS_TCTI": tpm.tcti])
            // No TCTI of their own: the user reaches no TPM (here there is none at /dev/tpmrm0).
            let throughService = ["TPM2TOOLS_TCTI": "", "KEYCHAINFS_SERVICE": service.socket]
            let alice = try MountHarness(as: try OrdinaryUser(), environment: throughService, creating: false)
            let created = alice.sh("\"$K\" init --keychain \"$KC\"", stdin: "1234\n1234\n")
            #expect(created.succeeded, "\(created)")
            #expect(created.stdout.contains("key protection: tpm2-service"), "\(created)")
            #expect(created.stdout.contains("bound to your uid"), "\(created)")
            let file = try Data(contentsOf: URL(fileURLWithPath: alice.keychain + "/device-secret"))
            #expect(file.prefix(9) == Data("KCFSTPM2".utf8) + [3], "sealed through the service")
            #expect(alice.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "1234\n").succeeded)
            #expect(alice.sh("printf sealed | \"$K\" set --keychain \"$KC\" default/token").succeeded)
            let status = alice.status()
            #expect(status["key-protection"] == "tpm2-service", "\(status)")
            #expect(status["passcode-binding"]?.hasPrefix("on: ") == true, "\(status)")
            #expect(status["key-protection-limits"]?.contains("binds to your uid") == true, "\(status)")
            #expect(
                status["tpm"]?.hasPrefix("the keychainfs service's, which reaches this machine's TPM for you (you ")
                    == true, "\(status)")
            #expect(alice.sh("\"$K\" stop --keychain \"$KC\"").succeeded)

            // Bob copies every file of Alice's keychain and knows her passcode.
            let bob = try MountHarness(as: try OrdinaryUser(), environment: throughService, creating: false)
            let bobUser = try #require(bob.user)
            let copied = bob.sh(
                "cp -a \"$1\" \"$KC\" && chown -R \"$2\" \"$KC\"", arguments: [alice.keychain, bobUser.name],
                asRoot: true)
            #expect(copied.succeeded, "\(copied)")
            let stolen = bob.sh("\"$K\" get --keychain \"$KC\" default/token", stdin: "1234\n")
            #expect(!stolen.succeeded && !stolen.stdout.contains("sealed"), "\(stolen)")
            #expect(stolen.stderr.contains("for another user through the keychainfs service"), "\(stolen)")
            let unlocked = bob.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "1234\n")
            #expect(!unlocked.succeeded, "\(unlocked)")

            // Alice's wrong passcode uses her share (1 of swtpm's 3 tries); her
            // next try waits, the TPM counted one, and Carol unlocks hers.
            #expect(alice.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "0000\n").status == 4)
            let waits = alice.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "1234\n")
            #expect(waits.status == 4 && waits.stderr.contains("your user's share of it"), "\(waits)")
            #expect(alice.status()["tpm-lockout"] == "1 of 3")
            let carol = try MountHarness(as: try OrdinaryUser(), environment: throughService, creating: false)
            #expect(carol.sh("\"$K\" init --keychain \"$KC\"", stdin: "5678\n5678\n").succeeded)
            let carols = carol.sh("\"$K\" unlock --keychain \"$KC\"", stdin: "5678\n")
            #expect(carols.succeeded, "the TPM is open to another user: \(carols)")
        }

        /// A service told to use no TPM (`KEYCHAINFS_TPM=none`) seals
        /// nothing for anyone, though its account reaches one: a user's
        /// `init` keeps the keys in a file and says so.
        @Test func aServiceToldToUseNoTPMSealsNothingForUsers() throws {
            let tpm = try SoftwareTPM()
            let service = try ServiceHarness(environment: ["TPM2TOOLS_TCTI": tpm.tcti, "KEYCHAINFS_TPM": "none"])
            let user = try MountHarness(
                as: try OrdinaryUser(), environment: ["TPM2TOOLS_TCTI": "", "KEYCHAINFS_SERVICE": service.socket],
                creating: false)
            let created = user.sh("\"$K\" init --keychain \"$KC\"", stdin: "1234\n1234\n")
            #expect(created.succeeded && created.stdout.contains("key protection: file"), "\(created)")
            #expect(try KeychainDirectory(path: user.keychain).keyProtection() == .file)
        }

        /// The keychains the service holds unsealed their passcode objects
        /// outside any share of the TPM's lockout: three wrong passcodes on
        /// one user's keychain locked the TPM (swtpm allows 3) for every user,
        /// and another user's right passcode was refused. Now each try uses
        /// its person's share, as the broker's do: past it the service passes
        /// none of that user's, and the TPM stays open for the others.
        @Test func oneUsersWrongPasscodesInTheServiceLeaveTheTPMOpenToOthers() throws {
            let tpm = try SoftwareTPM()
            let service = try ServiceHarness(environment: ["TPM2TOOLS_TCTI": tpm.tcti])
            let guesser = try MountHarness(as: try OrdinaryUser(), service: service)
            let other = try MountHarness(as: try OrdinaryUser(), service: service)
            for _ in 0..<3 {
                let wrong = guesser.sh("\"$K\" unlock", stdin: "0000\n")
                #expect(wrong.status == 4, "\(wrong)")
            }
            let counted = try TPMTools.run("tpm2_getcap properties-variable", on: tpm).output
            #expect(
                counted.contains("TPM2_PT_LOCKOUT_COUNTER: 0x1\n"), "one wrong passcode reached the TPM: \(counted)")
            let unlocked = other.sh("\"$K\" unlock", stdin: MountHarness.passcode + "\n")
            #expect(unlocked.succeeded, "\(unlocked)")
            #expect(other.sh("\"$K\" status").stdout.contains("state: unlocked"))
        }

        @Test func theServiceSealsTheKeychainsItCreatesAndTheUserGetsTheRecoveryKey() throws {
            let tpm = try SoftwareTPM()
            let service = try ServiceHarness(environment: ["TPM2TOOLS_TCTI": tpm.tcti])
            let harness = try MountHarness(as: try OrdinaryUser(), service: service, creating: false)
            let created = harness.sh("\"$K\" init", stdin: "1234\n1234\n")
            #expect(created.succeeded && created.stdout.contains("key protection: tpm2"), "\(created)")
            let recoveryKey = try #require(created.stdout.split(separator: "\n").last.map(String.init))
            #expect(recoveryKey.count == 71 && recoveryKey.split(separator: "-").count == 8)
            #expect(harness.sh("\"$K\" unlock", stdin: "1234\n").succeeded)
            let status = harness.sh("\"$K\" status").stdout
            #expect(status.contains("key-protection: tpm2") && status.contains("rollback-counter: "), "\(status)")
            // The service took the TPM's lockout hierarchy at its start.
            #expect(status.contains("tpm-lockout-auth: set"), "\(status)")
            #expect(FileManager.default.fileExists(atPath: service.stateDirectory + "/tpm-lockout-auth"))
            let file = try Data(
                contentsOf: URL(fileURLWithPath: service.keychain(of: harness.user!) + "/device-secret"))
            #expect(file.prefix(8) == Data("KCFSTPM2".utf8))
        }
    }
}

extension MountHarness {
    /// `keychainfs status` of the keychain's device, as key: value pairs.
    func status() -> [String: String] {
        var pairs: [String: String] = [:]
        for line in sh("\"$K\" status --keychain \"$KC\"").stdout.split(separator: "\n") {
            let parts = line.split(separator: ":", maxSplits: 1)
            if parts.count == 2 { pairs[String(parts[0])] = String(parts[1].dropFirst()) }
        }
        return pairs
    }
}
