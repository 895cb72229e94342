import Foundation
import KeychainCore
import Testing
import TestSupport

extension SerialTests {
    /// The cheapest ways around the lock, the question and the TPM
    /// (docs/SECURITY.md, "What an ordinary user of the machine can try"),
    /// each run as ordinary users the test makes, each failing on the code
    /// before its fix.
    @Suite(.serialized) struct CheapAttackTests {
        /// Another user's program, sending logind's signals to the victim's
        /// device alone (a unicast signal: Debian's system bus lets anyone
        /// send one, and a match rule's `sender=` filters broadcasts only),
        /// on a system bus run under Debian's own policy with the mock logind
        /// as root. Before: a forged `Unlock` and `LockedHint` false after a
        /// real `Lock` kept the keychain unlocked past the grace, and a forged
        /// `PrepareForSleep` locked another user's keychain at once. Now only
        /// logind's unique name is heard: the real lock comes after its grace,
        /// and the forged sleep and session end change nothing (the next event
        /// is the real Lock's grace, not a lock at once).
        @Test func logindsSignalsForgedByAnotherUserChangeNothing() throws {
            let victim = try OrdinaryUser(), attacker = try OrdinaryUser()
            let bus = try PrivateSystemBus(mockCallers: [victim])
            let harness = try MountHarness(as: victim)
            _ = try harness.prepareMountpoint("mnt")
            // The attacker's program: sends each signal it is told to every connection of the victim's.
            let meeting = try makeTemporaryDirectory("kcfs-forger")
            defer { try? FileManager.default.removeItem(atPath: meeting) }
            chmod(meeting, 0o755)
            for fifo in ["commands", "acks"] {
                #expect(mkfifo(meeting + "/" + fifo, 0o600) == 0)
                try attacker.own(meeting + "/" + fifo)
            }
            try harness.user?.own(meeting + "/commands")
            chmod(meeting + "/commands", 0o666)
            chmod(meeting + "/acks", 0o666)
            let forger = """
                exec 3< "$1/commands" 4> "$1/acks"
                victim=$2
                targets() {
                    busctl --address="$DBUS_SYSTEM_BUS_ADDRESS" list --unique --no-legend | awk -v u="$victim" '$4 == u { print $1 }'
                }
                forge() {
                    path=$1 signal=$2; shift 2
                    for target in $(targets); do gdbus emit --system --dest "$target" -o "$path" -s "$signal" "$@" || return 1; done
                }
                session=/org/freedesktop/login1/session/c1
                while read -r command <&3; do
                    case $command in
                    unlock) forge $session org.freedesktop.login1.Session.Unlock &&
                        forge $session org.freedesktop.DBus.Properties.PropertiesChanged \
                            "'org.freedesktop.login1.Session'" "{'LockedHint': <false>}" "@as []" ;;
                    sleep) forge /org/freedesktop/login1 org.freedesktop.login1.Manager.PrepareForSleep true ;;
                    removed) forge /org/freedesktop/login1 org.freedesktop.login1.Manager.SessionRemoved \
                        "'c1'" "objectpath '$session'" ;;
                    esac
                    echo "$? $(targets | wc -l)" >&4
                done
                """
            try forger.write(toFile: meeting + "/forger.sh", atomically: true, encoding: .utf8)
            chmod(meeting + "/forger.sh", 0o755)
            var options = Spawn.Options()
            options.nullStandardStreams = true
            options.environment = ["PATH=/usr/bin:/bin", "DBUS_SYSTEM_BUS_ADDRESS=\(bus.address)"]
            let forging = Spawn.start(
                [
                    "/usr/sbin/runuser", "-u", attacker.name, "--", "/bin/bash", meeting + "/forger.sh", meeting,
                    victim.name
                ],
                options: options)
            try #require(forging != nil)

            let used = harness.sh(
                """
                PASSCODE=$1
                export KEYCHAINFS_KEYCHAIN="$KC" DBUS_SYSTEM_BUS_ADDRESS="$2"
                trap 'kill $watcher 2> /dev/null; "$K" unmount "$R/mnt" 2> /dev/null; "$K" stop 2> /dev/null' EXIT
                mock() { gdbus call --system -d org.freedesktop.login1 "$@" > /dev/null; }
                mock -o /org/freedesktop/login1 -m org.freedesktop.DBus.Mock.AddSession c1 seat0 $(id -u) $(id -un) true
                session() { method=$1; shift; mock -o /org/freedesktop/login1/session/c1 -m org.freedesktop.login1.Session.$method "$@"; }
                unlock() { printf '%s\n' "$PASSCODE" | "$K" unlock > /dev/null; }
                "$K" mount "$R/mnt" || exit 97
                for n in $(seq 100); do "$K" log | grep -q ' session ok ' && break; sleep 0.1; done
                unlock && printf s3cret > "$R/mnt/default/x" && "$K" autolock 0 --grace 1 > /dev/null
                mkfifo "$R/events"
                "$K" watch "$R/mnt" > "$R/events" & watcher=$!
                exec 3< "$R/events"
                read -r state <&3; echo "$state"
                exec 5> "$3/commands" 6< "$3/acks"
                attack() { echo "$1" >&5; read -r ack <&6; echo "$1: $ack"; }
                next() { timeout 5 sh -c 'read -r line; echo "$line"' <&3 || echo "nothing within 5 s"; }
                session Lock; next
                attack unlock
                next
                cat "$R/mnt/default/x" 2>&1 | sed 's/.*: //'
                unlock; next
                attack sleep
                attack removed
                session Lock; next
                """, arguments: [MountHarness.passcode, bus.address, meeting])
            let tab = "\t"
            #expect(
                used.stdout == """
                    unlocked
                    will-lock\(tab)1
                    unlock: 0 1
                    locked
                    Permission denied
                    unlocked
                    sleep: 0 1
                    removed: 0 1
                    will-lock\(tab)1

                    """, "\(used)")
        }

        /// Without `XDG_RUNTIME_DIR` (cron, `su -`, ssh without pam_systemd)
        /// the device's socket was in `/tmp/keychainfs-UID`, a name another
        /// user could make first: the victim could then not unlock, get, set
        /// or mount until root removed it. Now it is in the account's home
        /// (no `/run/user/UID` here), which no other user can write, and
        /// `status` says where and why.
        @Test func aRuntimeDirectoryMadeFirstByAnotherUserKeepsNoOneOut() throws {
            let victim = try OrdinaryUser()
            let squatter = try MountHarness(as: try OrdinaryUser(), creating: false)
            let squatted = "/tmp/keychainfs-\(victim.uid)"
            defer { _ = Spawn.run(["/bin/rm", "-rf", squatted]) }
            #expect(squatter.sh("mkdir -m 700 \"$1\"", arguments: [squatted]).succeeded)
            let harness = try MountHarness(as: victim)
            let used = harness.sh(
                """
                unset XDG_RUNTIME_DIR
                printf '%s\\n' "$1" | "$K" unlock --keychain "$KC" && echo unlocked
                printf value | "$K" set --keychain "$KC" default/x && "$K" get --keychain "$KC" default/x; echo
                "$K" status --keychain "$KC" | grep '^runtime-directory: '
                "$K" stop --keychain "$KC" > /dev/null
                """, arguments: [MountHarness.passcode])
            #expect(
                used.stdout == """
                    unlocked
                    value
                    runtime-directory: \(victim.home)/.local/state/keychainfs/run (no XDG_RUNTIME_DIR and no /run/user/\(victim.uid): in your home, where no other user can make it first)

                    """, "\(used)")
        }

        /// Another user's software TPM on `localhost:2321`, where tpm2-tss's
        /// default TCTI list looks after `/dev/tpmrm0`: before, a user who
        /// could not open the device (every ordinary Debian user, everyone on
        /// a machine without a TPM) had the keychain sealed by it, its
        /// counters kept there, and a copy of the files opened with the
        /// attacker's TPM. Now, with no TCTI named, only the machine's TPM is
        /// asked: none answers here, so the keys are kept in a file.
        @Test func anotherUsersSoftwareTPMOnTheDefaultPortIsNeverUsed() throws {
            let attacker = try MountHarness(as: try OrdinaryUser(), creating: false)
            let listening = attacker.sh(
                """
                mkdir -p "$R/tpm"
                setsid /usr/bin/swtpm socket --tpm2 --server type=tcp,port=2321,bindaddr=127.0.0.1 \\
                    --ctrl type=tcp,port=2322,bindaddr=127.0.0.1 --tpmstate dir="$R/tpm" \\
                    --flags not-need-init,startup-clear > /dev/null 2>&1 < /dev/null &
                for n in $(seq 100); do
                    TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=2321 tpm2_getcap properties-fixed > /dev/null 2>&1 && exit 0
                    sleep 0.05
                done
                exit 1
                """)
            try #require(listening.succeeded, "the attacker's swtpm listens on 2321: \(listening)")

            // No TCTI named, no KEYCHAINFS_TPM: what a user who runs `init` has.
            let victim = try MountHarness(
                as: try OrdinaryUser(), environment: ["TPM2TOOLS_TCTI": "", "KEYCHAINFS_TPM": ""], creating: false)
            let created = victim.sh("\"$K\" init --keychain \"$KC\"", stdin: "2580\n2580\n")
            #expect(created.succeeded, "\(created)")
            let machineTPMOpens = victim.sh("test -r /dev/tpmrm0 && test -w /dev/tpmrm0").succeeded
            if !machineTPMOpens {
                #expect(created.stdout.contains("key protection: file"), "\(created)")
            }
            let indexes = attacker.sh(
                "TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=2321 TSS2_LOG=all+NONE tpm2_getcap handles-nv-index")
            #expect(indexes.succeeded && indexes.stdout.isEmpty, "the attacker's TPM holds: \(indexes)")
        }
    }
}
