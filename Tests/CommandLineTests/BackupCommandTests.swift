import KeychainCore
import Foundation
import Testing
import TestSupport

/// `keychainfs backup` and `restore`, through real processes.
@Suite struct BackupCommandTests {
    /// A mounted, unlocked keychain holding two migratable items and one
    /// ThisDeviceOnly item, and a second keychain (another device) with passcode 5678.
    static func prepared() throws -> (MountHarness, String, String) {
        let (harness, mnt) = try MountHarness.unlockedMount()
        #expect(harness.sh("""
            printf 'ghp_token' > "$1/default/github.com" && mkdir "$1/TEAMID.shared" && printf 'db' > "$1/TEAMID.shared/db"
            printf 'stays' > "$1/default/device-only" && setfattr -n user.keychain.migratable -v no "$1/default/device-only"
            """, arguments: [mnt]).succeeded)
        let other = harness.root + "/other"
        #expect(harness.sh("\"$K\" init --keychain \"$1\"", arguments: [other], stdin: "5678\n").succeeded)
        return (harness, mnt, other)
    }

    @Test func aBackupFromARunningDeviceRestoresOnAnotherDevice() throws {
        let (harness, _, other) = try Self.prepared()
        let backup = harness.root + "/keychain.kcbak"
        let made = harness.sh("\"$K\" backup \"$1\" --keychain \"$KC\"", arguments: [backup], stdin: "backup-pw\n")
        #expect(made.succeeded && made.stdout.hasPrefix("backed up 2 items"), "\(made)")
        var info = stat()
        #expect(stat(backup, &info) == 0 && info.st_mode & 0o777 == 0o600)
        // The other keychain has no device: the command opens it (its passcode first).
        let restored = harness.sh("\"$K\" restore \"$1\" --keychain \"$2\"", arguments: [backup, other], stdin: "5678\nbackup-pw\n")
        #expect(restored.succeeded && restored.stdout.contains("2 added, 0 replaced, 0 unchanged"), "\(restored)")
        let again = harness.sh("\"$K\" restore \"$1\" --keychain \"$2\"", arguments: [backup, other], stdin: "5678\nbackup-pw\n")
        #expect(again.stdout.contains("0 added, 0 replaced, 2 unchanged"), "\(again)")
        let otherMount = try harness.prepareMountpoint("othermnt")
        #expect(harness.sh("\"$K\" mount \"$1\" --keychain \"$2\"", arguments: [otherMount, other]).succeeded)
        try harness.unlock(otherMount, passcode: "5678")
        #expect(readFile(otherMount + "/default/github.com") == "ghp_token")
        #expect(readFile(otherMount + "/TEAMID.shared/db") == "db")
        #expect(access(otherMount + "/default/device-only", F_OK) == -1)
        #expect(harness.sh("getfattr --only-values -n user.keychain.accessible \"$1\"",
                           arguments: [otherMount + "/default/github.com"]).stdout == "whenUnlocked")
    }

    @Test func conflictsNeedAFlagAndBadBackupsChangeNothing() throws {
        let (harness, mnt, other) = try Self.prepared()
        let backup = harness.root + "/keychain.kcbak"
        #expect(harness.sh("\"$K\" backup \"$1\" --keychain \"$KC\"", arguments: [backup], stdin: "backup-pw\n").succeeded)
        #expect(harness.sh("printf changed > \"$1/default/github.com\"", arguments: [mnt]).succeeded)
        // Into the running device (unlocked): no passcode to give, only the backup password.
        let refused = harness.sh("\"$K\" restore \"$1\" --keychain \"$KC\"", arguments: [backup], stdin: "backup-pw\n")
        #expect(!refused.succeeded && refused.stderr.contains("1 items differ") && refused.stderr.contains("default/github.com"),
                "\(refused)")
        #expect(readFile(mnt + "/default/github.com") == "changed")
        #expect(harness.sh("\"$K\" restore --keep \"$1\" --keychain \"$KC\"", arguments: [backup], stdin: "backup-pw\n")
                .stdout.contains("1 kept"))
        #expect(readFile(mnt + "/default/github.com") == "changed")
        #expect(harness.sh("\"$K\" restore --overwrite \"$1\" --keychain \"$KC\"", arguments: [backup], stdin: "backup-pw\n")
                .stdout.contains("1 replaced"))
        #expect(readFile(mnt + "/default/github.com") == "ghp_token")

        let cut = harness.root + "/cut.kcbak", foreign = harness.root + "/foreign.kcbak"
        #expect(harness.sh("head -c 300 \"$1\" > \"$2\" && printf 'hello' > \"$3\"", arguments: [backup, cut, foreign]).succeeded)
        let cases: [(file: String, password: String, says: String)] = [
            (backup, "wrong-pw", "wrong backup password"), (cut, "backup-pw", "damaged, cut short or was altered"),
            (foreign, "backup-pw", "is not a keychainfs backup"),
        ]
        for bad in cases {
            let result = harness.sh("\"$K\" restore \"$1\" --keychain \"$2\"", arguments: [bad.file, other], stdin: "5678\n\(bad.password)\n")
            #expect(!result.succeeded && result.stderr.contains(bad.says), "\(result)")
        }
        // Locked: no backup.
        #expect(harness.control(mnt, "lock").succeeded)
        let locked = harness.sh("\"$K\" backup \"$1\" --keychain \"$KC\"", arguments: [harness.root + "/locked.kcbak"], stdin: "backup-pw\n")
        #expect(!locked.succeeded && locked.stderr.contains("locked: unlock it first"), "\(locked)")
        #expect(access(harness.root + "/locked.kcbak", F_OK) == -1)
    }
}
