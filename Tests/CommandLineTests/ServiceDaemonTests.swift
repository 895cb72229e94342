import Foundation
import KeychainCore
import Testing
import TestSupport

extension SerialTests {
    /// Where systemd is not the init, the service runs as a daemon
    /// (`keychainfs service --daemon`), as sysvinit's and OpenRC's scripts
    /// drive one with Debian's `start-stop-daemon` (docs/DESKTOP.md,
    /// "Without systemd").
    @Suite struct ServiceDaemonTests {
        /// `--daemon` returns once the service listens, with its pid in the
        /// pid file (the account's process, in a session of its own, with
        /// CAP_SYS_PTRACE alone of root's capabilities) and an
        /// ordinary user served; a second start is refused while it runs;
        /// `start-stop-daemon --stop` ends it and removes the file, and it
        /// starts again on the same socket. A service that cannot start
        /// says why (from its log) and leaves no pid file.
        @Test func theServiceRunsAsADaemon() throws {
            let service = try ServiceHarness(started: false)
            let harness = try MountHarness(as: try OrdinaryUser(), service: service, creating: false)
            defer {
                _ = harness.sh(
                    "start-stop-daemon --stop --quiet --pidfile \"$1\" --retry TERM/10",
                    arguments: [service.root + "/pid"], asRoot: true)
            }
            let used = harness.sh(
                """
                S=$1; daemon() { "$K" service --daemon --pid-file "$S/pid" --log "$S/log" --socket "$S/socket" "$@"; }
                daemon --state-directory "$S/state" | sed "s/pid [0-9]*/pid N/; s|$S|S|"
                pid=$(cat "$S/pid")
                echo "$(stat -c %U /proc/"$pid")" "$(ps -o sid= -p "$pid" | awk -v pid="$pid" '{ print ($1 == pid ? "its own session" : "session " $1) }')"
                # The account keeps one capability, CAP_SYS_PTRACE (bit 19), no group, no new privileges.
                awk '/^(Groups|CapPrm|CapEff|CapBnd|NoNewPrivs):/ { print $1, ($2 == "" ? "none" : $2) }' /proc/"$pid"/status
                as_user() { runuser -u "$USER" -- env KEYCHAINFS_SERVICE="$S/socket" "$K" "$@"; }
                printf '1234\\n1234\\n' | as_user init > /dev/null 2>&1; as_user status | grep '^mode:'
                daemon --state-directory "$S/state"; echo "second start: $?"
                start-stop-daemon --stop --pidfile "$S/pid" --remove-pidfile --retry TERM/10; echo "stop: $?"
                kill -0 "$pid" 2> /dev/null || echo "gone"; test -e "$S/pid" || echo "no pid file"
                daemon --state-directory "$S/state" > /dev/null && echo "started again"
                start-stop-daemon --stop --pidfile "$S/pid" --remove-pidfile --retry TERM/10
                touch "$S/file"; daemon --state-directory "$S/file"; echo "bad state directory: $?"
                test -e "$S/pid" || echo "no pid file"
                """, arguments: [service.root], asRoot: true)
            #expect(
                used.stdout == """
                    keychainfs: the service runs (pid N); its log: S/log
                    keychainfs its own session
                    Groups: none
                    CapPrm: 0000000000080000
                    CapEff: 0000000000080000
                    CapBnd: 0000000000080000
                    NoNewPrivs: 1
                    mode: service
                    second start: 1
                    stop: 0
                    gone
                    no pid file
                    started again
                    bad state directory: 1
                    no pid file

                    """, "\(used)")
            #expect(
                used.stderr.contains("the keychainfs service runs already (pid ")
                    && used.stderr.contains(
                        "the service did not start: \(service.root)/file is not a directory"),
                "\(used)")
        }

        /// A service started without systemd inherited a shell's 8 MiB of
        /// locked memory (the unit's LimitMEMLOCK=128M did not apply), which
        /// one user's flood of large requests filled for everyone. As root it
        /// now raises the limit to 128 MiB, or as far as the machine lets it,
        /// and says so in its log when that is less.
        @Test func aDaemonRaisesItsLockedMemoryOrSaysWhyNot() throws {
            let service = try ServiceHarness(started: false)
            let harness = try MountHarness(service: service, creating: false)
            defer {
                _ = harness.sh(
                    "start-stop-daemon --stop --quiet --pidfile \"$1\" --retry TERM/10",
                    arguments: [service.root + "/pid"], asRoot: true)
            }
            let used = harness.sh(
                """
                S=$1; ulimit -S -l 4096
                "$K" service --daemon --pid-file "$S/pid" --log "$S/log" --socket "$S/socket" \\
                    --state-directory "$S/state" > /dev/null
                awk '/^Max locked memory/ { print $4, $5 }' /proc/"$(cat "$S/pid")"/limits
                grep -c "the service's locked memory is limited to" "$S/log"
                """, arguments: [service.root], asRoot: true)
            var limit = rlimit()
            getrlimit(__rlimit_resource_t(__RLIMIT_MEMLOCK.rawValue), &limit)
            let wanted: UInt64 = 128 << 20
            let expected =
                limit.rlim_max >= wanted
                ? "\(wanted) \(limit.rlim_max == rlim_t.max ? "unlimited" : String(limit.rlim_max))\n0\n"
                : "\(limit.rlim_max) \(limit.rlim_max)\n1\n"
            #expect(used.stdout == expected, "\(used)")
        }
    }
}
