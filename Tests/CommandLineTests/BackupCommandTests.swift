import KeychainCore
import Foundation
import Testing
import TestSupport

extension SerialTests {
    /// `keychainfs backup` and `restore`, through real processes.
    @Suite struct BackupCommandTests {
        /// A mounted, unlocked keychain holding two migratable items and one
        /// ThisDeviceOnly item, and a second keychain (another device) with passcode 5678.
        static func prepared() throws -> (MountHarness, String, String) {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(
                harness.sh(
                    """
                    printf 'ghp_token' > "$1/default/github.com" && mkdir "$1/TEAMID.shared" && printf 'db' > "$1/TEAMID.shared/db"
                    printf 'stays' > "$1/default/device-only" && setfattr -n user.keychain.migratable -v no "$1/default/device-only"
                    """, arguments: [mnt]
                ).succeeded)
            let other = harness.root + "/other"
            #expect(harness.sh("\"$K\" init --keychain \"$1\"", arguments: [other], stdin: "5678\n5678\n").succeeded)
            return (harness, mnt, other)
        }

        @Test func aBackupFromARunningDeviceRestoresOnAnotherDevice() throws {
            let (harness, _, other) = try Self.prepared()
            let backup = harness.root + "/keychain.kcbak"
            let made = harness.sh(
                "\"$K\" backup \"$1\" --keychain \"$KC\"", arguments: [backup], stdin: "backup-pw\nbackup-pw\n")
            #expect(made.succeeded && made.stdout.hasPrefix("backed up 2 items"), "\(made)")
            var info = stat()
            #expect(stat(backup, &info) == 0 && info.st_mode & 0o777 == 0o600)
            // The other keychain has no device: the command opens it (its passcode first).
            let restored = harness.sh(
                "\"$K\" restore \"$1\" --keychain \"$2\"", arguments: [backup, other], stdin: "5678\nbackup-pw\n")
            #expect(restored.succeeded && restored.stdout.contains("2 added, 0 replaced, 0 unchanged"), "\(restored)")
            let again = harness.sh(
                "\"$K\" restore \"$1\" --keychain \"$2\"", arguments: [backup, other], stdin: "5678\nbackup-pw\n")
            #expect(again.stdout.contains("0 added, 0 replaced, 2 unchanged"), "\(again)")
            let otherMount = try harness.prepareMountpoint("othermnt")
            #expect(harness.sh("\"$K\" mount \"$1\" --keychain \"$2\"", arguments: [otherMount, other]).succeeded)
            try harness.unlock(otherMount, passcode: "5678")
            #expect(readFile(otherMount + "/default/github.com") == "ghp_token")
            #expect(readFile(otherMount + "/TEAMID.shared/db") == "db")
            #expect(access(otherMount + "/default/device-only", F_OK) == -1)
            #expect(
                harness.sh(
                    "getfattr --only-values -n user.keychain.accessible \"$1\"",
                    arguments: [otherMount + "/default/github.com"]
                ).stdout == "whenUnlocked")
        }

        @Test func conflictsNeedAFlagAndBadBackupsChangeNothing() throws {
            let (harness, mnt, other) = try Self.prepared()
            let backup = harness.root + "/keychain.kcbak"
            #expect(
                harness.sh(
                    "\"$K\" backup \"$1\" --keychain \"$KC\"", arguments: [backup], stdin: "backup-pw\nbackup-pw\n"
                ).succeeded)
            #expect(harness.sh("printf changed > \"$1/default/github.com\"", arguments: [mnt]).succeeded)
            // Into the running device (unlocked): no passcode to give, only the backup password.
            let refused = harness.sh(
                "\"$K\" restore \"$1\" --keychain \"$KC\"", arguments: [backup], stdin: "backup-pw\n")
            #expect(
                !refused.succeeded && refused.stderr.contains("1 items differ")
                    && refused.stderr.contains("default/github.com"),
                "\(refused)")
            #expect(readFile(mnt + "/default/github.com") == "changed")
            #expect(
                harness.sh("\"$K\" restore --keep \"$1\" --keychain \"$KC\"", arguments: [backup], stdin: "backup-pw\n")
                    .stdout.contains("1 kept"))
            #expect(readFile(mnt + "/default/github.com") == "changed")
            #expect(
                harness.sh(
                    "\"$K\" restore --overwrite \"$1\" --keychain \"$KC\"", arguments: [backup], stdin: "backup-pw\n"
                )
                .stdout.contains("1 replaced"))
            #expect(readFile(mnt + "/default/github.com") == "ghp_token")

            let cut = harness.root + "/cut.kcbak", foreign = harness.root + "/foreign.kcbak"
            #expect(
                harness.sh("head -c 300 \"$1\" > \"$2\" && printf 'hello' > \"$3\"", arguments: [backup, cut, foreign])
                    .succeeded)
            // A wrong password is "denied" (4), as a wrong passcode is everywhere.
            let cases: [(file: String, password: String, says: String, status: Int32)] = [
                (backup, "wrong-pw", "wrong backup password", 4),
                (cut, "backup-pw", "damaged, cut short or was altered", 1),
                (foreign, "backup-pw", "is not a keychainfs backup", 1)
            ]
            for bad in cases {
                let result = harness.sh(
                    "\"$K\" restore \"$1\" --keychain \"$2\"", arguments: [bad.file, other],
                    stdin: "5678\n\(bad.password)\n")
                #expect(result.status == bad.status && result.stderr.contains(bad.says), "\(result)")
            }
            // Locked: no backup.
            #expect(harness.control(mnt, "lock").succeeded)
            let locked = harness.sh(
                "\"$K\" backup \"$1\" --keychain \"$KC\"", arguments: [harness.root + "/locked.kcbak"],
                stdin: "backup-pw\nbackup-pw\n")
            #expect(!locked.succeeded && locked.stderr.contains("locked: unlock it first"), "\(locked)")
            #expect(access(harness.root + "/locked.kcbak", F_OK) == -1)
        }

        /// A policed group's values leave in a backup only when named, with the
        /// passcode, and a restore writes into one only with the passcode: a
        /// program the policy keeps out exported `secure/*` and replaced a
        /// policed value this way. Both are audited (docs/SECURITY.md,
        /// "Callers the device trusts").
        @Test func policedGroupsLeaveAndComeBackOnlyWithThePasscode() throws {
            let (harness, mnt) = try MountHarness.withPolicedGroup()
            #expect(harness.grant("secure", exe: harness.root + "/granted-cat").succeeded)
            func backup(_ name: String, _ options: String = "", stdin: String) -> ShellResult {
                harness.sh("\"$K\" backup \"$R/\(name)\" --keychain \"$KC\" \(options)", stdin: stdin)
            }
            let plain = backup("plain.kcbak", stdin: "pw-12-backup\npw-12-backup\n")
            #expect(plain.succeeded && plain.stdout.hasPrefix("backed up 1 item to "), "\(plain)")
            let wrong = backup("wrong.kcbak", "--group secure", stdin: "pw-12-backup\npw-12-backup\nnot-it\n")
            #expect(!wrong.succeeded && wrong.stderr.contains("passcode is wrong"), "\(wrong)")
            #expect(harness.status(mnt)["failed-attempts"] == "1")
            let none = backup("none.kcbak", "--group secure", stdin: "pw-12-backup\npw-12-backup\n")
            #expect(!none.succeeded && none.stderr.contains("needs the keychain's passcode"), "\(none)")
            let open = backup("open.kcbak", "--group default", stdin: "pw-12-backup\npw-12-backup\n1234\n")
            #expect(!open.succeeded && open.stderr.contains("must name a group with an entitlement policy"), "\(open)")
            for refused in ["wrong.kcbak", "none.kcbak", "open.kcbak"] {
                #expect(access(harness.root + "/" + refused, F_OK) == -1, "\(refused)")
            }
            let named = backup("named.kcbak", "--group secure", stdin: "pw-12-backup\npw-12-backup\n1234\n")
            #expect(named.succeeded && named.stdout.hasPrefix("backed up 2 items"), "\(named)")

            // Another keychain (another device) holding secure/token = ATTACKER, backed up.
            let other = harness.root + "/other", otherMount = try harness.prepareMountpoint("othermnt")
            #expect(
                harness.sh(
                    "\"$K\" init --keychain \"$1\" && \"$K\" mount \"$2\" --keychain \"$1\"",
                    arguments: [other, otherMount], stdin: "5678\n5678\n"
                ).succeeded)
            try harness.unlock(otherMount, passcode: "5678")
            #expect(
                harness.sh(
                    "mkdir \"$1/secure\" && printf ATTACKER > \"$1/secure/token\" && \"$K\" backup \"$R/crafted.kcbak\" --keychain \"$2\"",
                    arguments: [otherMount, other], stdin: "pw-12-backup\npw-12-backup\n"
                ).succeeded)
            func restore(stdin: String) -> ShellResult {
                harness.sh("\"$K\" restore --overwrite \"$R/crafted.kcbak\" --keychain \"$KC\"", stdin: stdin)
            }
            let noPasscode = restore(stdin: "pw-12-backup\n")
            #expect(
                !noPasscode.succeeded && noPasscode.stderr.contains("needs the keychain's passcode"), "\(noPasscode)")
            let wrongPasscode = restore(stdin: "pw-12-backup\nnot-it\n")
            #expect(!wrongPasscode.succeeded && wrongPasscode.stderr.contains("keychain passcode"), "\(wrongPasscode)")
            // Counted (the right passcode of the backup above reset the count).
            #expect(harness.status(mnt)["failed-attempts"] == "1")
            #expect(harness.run("granted-cat", mnt + "/secure/token").stdout == "s3cret")
            let restored = restore(stdin: "pw-12-backup\n1234\n")
            #expect(restored.succeeded && restored.stdout.contains("1 replaced"), "\(restored)")
            #expect(harness.run("granted-cat", mnt + "/secure/token").stdout == "ATTACKER")

            let log = harness.sh("\"$K\" log --keychain \"$KC\"").stdout
            for line in [
                " backup ok (1 items; policed groups left out: secure)", " backup refused secure (policed groups)",
                " backup denied secure (policed groups)", " backup ok secure (1 items of a policed group)",
                " restore denied secure (into a policed group)", " restore refused secure (into a policed group)",
                " restore ok secure (into a policed group)"
            ] {
                #expect(log.contains(line), "\(line) not in \(log)")
            }
        }

        /// A file that is not a backup is refused from its first bytes, and one
        /// larger than any backup before it is read: a 512 MiB file used to
        /// grow the device by as much. Nothing changes either way
        /// (docs/SECURITY.md, "Bad input and what it gets").
        @Test func aForeignOrHugeFileIsRefusedBeforeItIsRead() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(
                harness.sh(
                    "printf v > \"$1/default/kept\" && truncate -s 512M \"$R/foreign\" && truncate -s 1100M \"$R/huge\" && mkfifo \"$R/fifo\"",
                    arguments: [mnt]
                ).succeeded)
            let device = try #require(MountHarness.devicePid(mnt))
            func peakKiB() -> Int? {
                let status = (try? String(contentsOfFile: "/proc/\(device)/status", encoding: .utf8)) ?? ""
                return status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") }
                    .flatMap { Int($0.split(separator: " ", omittingEmptySubsequences: true)[1]) }
            }
            let before = try #require(peakKiB())
            for (file, says) in [
                ("foreign", "is not a keychainfs backup"), ("huge", "larger than any backup"),
                ("fifo", "is not a keychainfs backup")
            ] {
                let result = harness.sh("timeout 20 \"$K\" restore \"$R/\(file)\" --keychain \"$KC\"", stdin: "pw\n")
                #expect(!result.succeeded && result.stderr.contains(says), "\(file): \(result)")
            }
            let after = try #require(peakKiB())
            #expect(after - before < 64 << 10, "the device's peak memory grew from \(before) to \(after) KiB")
            #expect(readFile(mnt + "/default/kept") == "v")

            // What is wrong with the file or the place is said before any password is asked
            // for (no standard input given here): before, the password came first, and a backup
            // into a missing directory asked for it twice and then printed its error twice.
            let missing = harness.sh("\"$K\" restore \"$R/no-such-backup\" --keychain \"$KC\" < /dev/null")
            #expect(
                missing.status == 1
                    && missing.stderr == "keychainfs: cannot read \(harness.root)/no-such-backup: No such file or "
                        + "directory; nothing was asked or restored\n",
                "\(missing)")
            let foreign = harness.sh("\"$K\" restore \"$R/foreign\" --keychain \"$KC\" < /dev/null")
            #expect(foreign.stderr.contains("is not a keychainfs backup") && !foreign.stderr.contains("password"))
            // A file that can be attacked offline gets no password worth hours: said, and nothing written.
            let weak = harness.sh("\"$K\" backup \"$R/weak.kcbak\" --keychain \"$KC\"", stdin: "1234\n1234\n")
            #expect(
                weak.status == 1
                    && weak.stderr.contains("every password like this one takes about 108 minutes of one core")
                    && !FileManager.default.fileExists(atPath: harness.root + "/weak.kcbak"), "\(weak)")
            let chosen = harness.sh(
                "\"$K\" backup \"$R/weak.kcbak\" --weak-password --keychain \"$KC\"", stdin: "1234\n1234\n")
            #expect(chosen.succeeded, "\(chosen)")
            let nowhere = harness.sh("\"$K\" backup \"$R/no-such-directory/b.kcbak\" --keychain \"$KC\" < /dev/null")
            #expect(
                nowhere.status == 1
                    && nowhere.stderr == "keychainfs: cannot write a backup in \(harness.root)/no-such-directory: No "
                        + "such file or directory; nothing was asked or written\n",
                "\(nowhere)")
        }
    }
}
