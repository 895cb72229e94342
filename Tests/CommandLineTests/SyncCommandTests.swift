import Foundation
import KeychainCore
import Testing
import TestSupport

extension SerialTests {
    /// `keychainfs sync` between two devices, through real processes and a bare repository.
    @Suite struct SyncCommandTests {
        /// A mounted keychain (the first machine) and a second keychain
        /// (another machine), mounted, unlocked, that looks for changes every second.
        static func twoMachines() throws -> (MountHarness, first: String, other: String, otherMount: String) {
            let (harness, mnt) = try MountHarness.unlockedMount()
            harness.extraEnvironment["KEYCHAINFS_SYNC_INTERVAL"] = "1"
            let other = harness.root + "/other"
            #expect(harness.sh("\"$K\" init --keychain \"$1\"", arguments: [other], stdin: "5678\n5678\n").succeeded)
            let otherMount = try harness.prepareMountpoint("othermnt")
            #expect(harness.sh("\"$K\" mount \"$1\" --keychain \"$2\"", arguments: [otherMount, other]).succeeded)
            try harness.unlock(otherMount, passcode: "5678")
            // A push may start `gc --auto`: in the foreground, so that nothing outlives the test.
            #expect(
                harness.sh(
                    "git init --bare --quiet \"$R/remote.git\" && git --git-dir=\"$R/remote.git\" config gc.autoDetach false"
                )
                .succeeded)
            return (harness, mnt, other, otherMount)
        }

        @Test func aSecondMachineJoinsWhenBothShowTheSameCodeAndThenFollowsByItself() throws {
            let (harness, mnt, other, otherMount) = try Self.twoMachines()
            #expect(
                harness.sh(
                    """
                    printf 'ghp_token' > "$1/default/github.com"
                    printf 'stays' > "$1/default/device-only" && setfattr -n user.keychain.migratable -v no "$1/default/device-only"
                    """, arguments: [mnt]
                ).succeeded)
            let started = harness.sh("\"$K\" sync init \"$R/remote.git\" --keychain \"$KC\"")
            #expect(started.succeeded && started.stdout.contains("synced items: 1"), "\(started)")
            // The round ran on the schedule's thread, which a woken `get` preempts at once
            // (SCHED_IDLE, policy 5 in the 41st field of its stat; nice alone let it keep the core).
            let policy = harness.sh(
                """
                pid=$("$K" status --keychain "$KC" | sed -n 's/^pid: //p')
                for task in /proc/$pid/task/*; do
                    [ "$(cat "$task/comm")" = kcfs-sync ] && cut -d ' ' -f 41 "$task/stat"
                done
                """)
            #expect(policy.stdout == "5\n", "\(policy)")
            // The person starts the join on the new machine, approves on the first, and types there
            // the code the new machine shows.
            let joined = harness.sh(
                """
                mkfifo "$R/typed-new" "$R/typed-first"
                "$K" sync join "$R/remote.git" --keychain "$1" --wait 60 < "$R/typed-new" > "$R/join.out" 2>&1 &
                joiner=$!
                exec 4> "$R/typed-new"
                until grep -q "asked to join" "$R/join.out"; do kill -0 $joiner || exit 7; sleep 0.1; done
                "$K" sync approve --keychain "$KC" < "$R/typed-first" > "$R/approve.out" 2>&1 &
                approver=$!
                exec 3> "$R/typed-first"
                until grep -q "code:" "$R/join.out" && grep -q "code:" "$R/approve.out"; do
                    kill -0 $joiner || exit 8; sleep 0.1
                done
                code() { sed -n 's/.*code: \\([0-9]\\{3\\} [0-9]\\{3\\}\\).*/\\1/p' "$1" | head -n 1; }
                # Each machine gets the code the other shows, as the person reads one and types on the other.
                code "$R/join.out" >&3
                code "$R/approve.out" >&4
                exec 3>&- 4>&-
                wait $approver; approved=$?
                wait $joiner; status=$?
                cat "$R/join.out"; echo ---; cat "$R/approve.out"
                [ $approved -eq 0 ] && [ $status -eq 0 ]
                """, arguments: [other], limit: 90)
            #expect(joined.succeeded, "\(joined)")
            let codes = joined.stdout.split(separator: "\n").compactMap { line -> String? in
                guard let range = line.range(of: "code: ") else { return nil }
                return String(line[range.upperBound...].prefix(7))
            }
            #expect(codes.count == 2 && codes[0] == codes[1], "\(joined.stdout)")
            #expect(readFile(otherMount + "/default/github.com") == "ghp_token")
            #expect(access(otherMount + "/default/device-only", F_OK) == -1)
            // A change on the first machine reaches the second by itself: no `sync` typed.
            #expect(harness.sh("printf 'rotated' > \"$1/default/github.com\"", arguments: [mnt]).succeeded)
            let followed = harness.sh(
                """
                until [ "$(cat "$1/default/github.com")" = rotated ]; do sleep 0.2; done
                """, arguments: [otherMount], limit: 40)
            #expect(followed.succeeded, "\(followed)")
            let status = harness.sh("\"$K\" sync status --keychain \"$1\"", arguments: [other])
            #expect(status.stdout.contains("remote: \(harness.root)/remote.git"), "\(status)")
            #expect(status.stdout.contains("last heard"), "\(status)")
            // The remote holds neither a value nor a name.
            let objects = harness.sh("git --git-dir=\"$R/remote.git\" cat-file --batch-all-objects --batch --unordered")
            for secret in ["ghp_token", "rotated", "stays", "github.com", "device-only"] {
                #expect(!objects.stdout.contains(secret), "\(secret) is in the remote")
            }
        }

        @Test func badRequestsSayWhyAndChangeNothing() throws {
            let (harness, _, other, _) = try Self.twoMachines()
            let notInCircle = harness.sh("\"$K\" sync --keychain \"$KC\"")
            #expect(notInCircle.status == 2 && notInCircle.stderr.contains("sync init"), "\(notInCircle)")
            #expect(harness.sh("\"$K\" sync init \"$R/remote.git\" --keychain \"$KC\"").succeeded)
            #expect(harness.sh("\"$K\" sync groups --keychain \"$KC\"").stdout == "groups: all\n")
            #expect(harness.sh("\"$K\" sync groups work --keychain \"$KC\"").stdout == "groups: work\n")
            #expect(harness.sh("\"$K\" sync groups work --all --keychain \"$KC\"").status == 64)
            let badGroup = harness.sh("\"$K\" sync groups a/b --keychain \"$KC\"")
            #expect(badGroup.status == 1 && badGroup.stderr.contains("a/b is not a group name"), "\(badGroup)")
            #expect(harness.sh("\"$K\" sync status --keychain \"$KC\"").stdout.contains("groups: work\npending: 0\n"))
            let twice = harness.sh("\"$K\" sync init \"$R/remote.git\" --keychain \"$1\"", arguments: [other])
            #expect(twice.status == 1 && twice.stderr.contains("sync join"), "\(twice)")
            let wrongKey = harness.sh(
                "\"$K\" sync join \"$R/remote.git\" --recovery-key --keychain \"$1\"", arguments: [other],
                stdin: String(repeating: "c", count: 64) + "\n")
            #expect(wrongKey.status == 1 && wrongKey.stderr.contains("does not open the circle"), "\(wrongKey)")
            let nobody = harness.sh("\"$K\" sync approve --keychain \"$KC\" --wait 1")
            #expect(nobody.status == 2 && nobody.stderr.contains("no machine asks to join"), "\(nobody)")
            let unknown = harness.sh("\"$K\" sync remove laptop-that-never-was --keychain \"$KC\"")
            #expect(unknown.status == 1 && unknown.stderr.contains("no device of the circle is named"), "\(unknown)")
            let nowhere = harness.sh("\"$K\" sync join \"$R/no-such.git\" --keychain \"$1\"", arguments: [other])
            #expect(nowhere.status == 1 && nowhere.stderr.contains("could not fetch"), "\(nowhere)")
        }
    }
}

extension SerialTests.SyncCommandTests {
    @Test func twoMachinesSyncOverSSHWithTheKeyOnlyTheAgentHolds() throws {
        let harness = try MountHarness(creating: true)
        let server = try LocalSSHServer(in: harness.root)
        let remote = try server.bareRepository("circle.git")
        harness.extraEnvironment.merge(server.environment) { _, new in new }
        let mnt = try harness.mount()
        try harness.unlock(mnt)
        let other = harness.root + "/other"
        #expect(harness.sh("\"$K\" init --keychain \"$1\"", arguments: [other], stdin: "5678\n5678\n").succeeded)
        let otherMount = try harness.prepareMountpoint("othermnt")
        #expect(harness.sh("\"$K\" mount \"$1\" --keychain \"$2\"", arguments: [otherMount, other]).succeeded)
        try harness.unlock(otherMount, passcode: "5678")
        #expect(harness.sh("printf 'over-ssh' > \"$1/default/token\"", arguments: [mnt]).succeeded)
        let started = harness.sh("\"$K\" sync init \"$1\" --keychain \"$KC\"", arguments: [remote])
        #expect(started.succeeded, "\(started)")
        let lines = started.stdout.split(separator: "\n").map(String.init)
        let key = lines.firstIndex { $0.contains("recovery key") }.map { lines[$0 + 1] } ?? ""
        let joined = harness.sh(
            "\"$K\" sync join \"$1\" --recovery-key --keychain \"$2\"", arguments: [remote, other], stdin: key + "\n")
        #expect(joined.succeeded && joined.stdout.contains("1 received"), "\(joined)")
        #expect(readFile(otherMount + "/default/token") == "over-ssh")
        // The records are in the host account's repository, reached through sshd.
        let objects = harness.sh(
            "runuser -u \"$1\" -- git --git-dir=\"$2\" rev-parse --verify --quiet keychainfs",
            arguments: [server.host.name, server.host.home + "/circle.git"], asRoot: true)
        #expect(objects.succeeded, "\(objects)")
        // The person's key exists only in the agent: git authenticated through it.
        #expect(access(server.directory + "/person", F_OK) == -1)
    }
}

extension SerialTests.SyncCommandTests {
    @Test func aDeviceKilledMidSyncLosesNoAcknowledgedWrite() throws {
        let (harness, mnt, other, otherMount) = try Self.twoMachines()
        let started = harness.sh("\"$K\" sync init \"$R/remote.git\" --keychain \"$KC\"")
        let lines = started.stdout.split(separator: "\n").map(String.init)
        let key = lines.firstIndex { $0.contains("recovery key") }.map { lines[$0 + 1] } ?? ""
        #expect(
            harness.sh(
                "\"$K\" sync join \"$R/remote.git\" --recovery-key --keychain \"$1\"", arguments: [other],
                stdin: key + "\n"
            ).succeeded)
        // 300 writes, each acknowledged (printf's close returned 0), then the device is killed
        // while its round runs git.
        let killed = harness.sh(
            """
            i=0; while [ $i -lt 300 ]; do printf "v$i" > "$1/default/item-$i" || exit 3; i=$((i + 1)); done
            device=$(sed -n 's/^pid: //p' "$1/.control")
            "$K" sync --keychain "$KC" > /dev/null 2>&1 &
            syncer=$!
            until pgrep -P "$device" git > /dev/null; do kill -0 $syncer 2> /dev/null || break; done
            kill -9 "$device"
            wait $syncer
            fusermount3 -u -z "$1"
            """, arguments: [mnt])
        #expect(killed.succeeded, "\(killed)")
        #expect(harness.sh("\"$K\" mount \"$1\" --keychain \"$KC\"", arguments: [mnt]).succeeded)
        try harness.unlock(mnt)
        #expect(harness.sh("\"$K\" sync --keychain \"$KC\"").succeeded)
        #expect(harness.sh("\"$K\" sync --keychain \"$1\"", arguments: [other]).succeeded)
        let compared = harness.sh(
            """
            i=0; while [ $i -lt 300 ]; do
                [ "$(cat "$1/default/item-$i")" = "v$i" ] || { echo "first machine: item-$i"; exit 1; }
                [ "$(cat "$2/default/item-$i")" = "v$i" ] || { echo "second machine: item-$i"; exit 1; }
                i=$((i + 1))
            done
            """, arguments: [mnt, otherMount])
        #expect(compared.succeeded, "\(compared)")
    }
}
