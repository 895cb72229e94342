import Foundation
import Testing
import TestSupport

extension SerialTests {
    /// The desktop session is the device's lock screen (docs/FILESYSTEM.md,
    /// "`.control`"). logind is python3-dbusmock's logind template on a
    /// private system bus (the test's own `dbus-daemon`), with a session of
    /// the keychain's ordinary user; the device follows it as it would the
    /// real one.
    @Suite struct LoginSessionTests {
        let harness: MountHarness

        init() throws {
            harness = try MountHarness(as: try OrdinaryUser())
        }

        /// Runs `script` with a private system bus and a mock logind on it
        /// (a session `c1` of the user), an unlocked device following it with
        /// a grace of 1 s, mounted at `$R/mnt`, and its events on fd 3.
        /// `mountOptions`: added to the mount's command line (a private
        /// session bus is there for `--secret-service`).
        func withSession(_ script: String, mountOptions: String = "") throws -> ShellResult {
            _ = try harness.prepareMountpoint("mnt")
            return harness.sh(
                """
                PASSCODE=$1
                export KEYCHAINFS_KEYCHAIN="$KC" DBUS_SYSTEM_BUS_ADDRESS="unix:path=$R/system_bus"
                dbus-daemon --session --fork --address="$DBUS_SYSTEM_BUS_ADDRESS" --print-pid > "$R/bus.pid" || exit 96
                export DBUS_SESSION_BUS_ADDRESS="unix:path=$R/session_bus"
                dbus-daemon --session --fork --address="$DBUS_SESSION_BUS_ADDRESS" --print-pid >> "$R/bus.pid" || exit 94
                /usr/bin/python3 -m dbusmock --system --template logind > "$R/logind.log" 2>&1 &
                logind=$!
                trap 'kill $logind $watcher 2> /dev/null; "$K" unmount "$R/mnt" 2> /dev/null; "$K" stop 2> /dev/null; kill $(cat "$R/bus.pid") $monitor 2> /dev/null' EXIT
                gdbus wait --system --timeout 20 org.freedesktop.login1 || exit 95
                mock() { gdbus call --system -d org.freedesktop.login1 "$@" > /dev/null; }
                mock -o /org/freedesktop/login1 -m org.freedesktop.DBus.Mock.AddSession c1 seat0 $(id -u) $(id -un) true
                session() { method=$1; shift; mock -o /org/freedesktop/login1/session/c1 -m org.freedesktop.login1.Session.$method "$@"; }
                emit() { mock -o /org/freedesktop/login1 -m org.freedesktop.DBus.Mock.EmitSignal \\
                    org.freedesktop.login1.Manager "$@"; }
                unlock() { printf '%s\\n' "$PASSCODE" | "$K" unlock > /dev/null; }
                "$K" mount "$R/mnt" \(mountOptions) || exit 97
                # The device follows the sessions from a thread of its own: wait for its word.
                for n in $(seq 100); do "$K" log | grep -q ' session ok ' && break; sleep 0.1; done
                "$K" log | grep ' session ' | cut -d' ' -f2-3
                unlock && printf s3cret > "$R/mnt/default/x" && "$K" autolock 0 --grace 1 > /dev/null
                mkfifo "$R/events"
                "$K" watch "$R/mnt" > "$R/events" & watcher=$!
                exec 3< "$R/events"
                read -r state <&3; echo "$state"
                \(script)
                """, arguments: [MountHarness.passcode])
        }

        /// The session's Lock signal: `will-lock 1`, then the lock after the
        /// grace; a read through the mount is EACCES (locked, not absent).
        /// An Unlock within the grace keeps the keys; LockedHint (what screen
        /// lockers set) does as Lock does; the machine going to sleep and the
        /// session ending lock at once. Nothing of the session unlocks. A
        /// grace a program of the user set to a week kept the keychain
        /// unlocked behind the locked screen: the session's lock waits 10 s
        /// at most, as iOS's does.
        @Test func theSessionLocksTheKeychain() throws {
            let used = try withSession(
                """
                session Lock
                read -r line <&3; echo "$line"; read -r line <&3; echo "$line"
                cat "$R/mnt/default/x" 2>&1 | sed 's/.*: //'
                session Unlock
                "$K" status | head -1
                unlock; read -r line <&3; echo "$line"
                session Lock; read -r line <&3; echo "$line"; session Unlock
                # Past the grace, nothing more came: the lock was called off.
                timeout 2 head -n 1 <&3; echo "after the grace: $?"
                cat "$R/mnt/default/x"; echo
                # A program of the user sets a grace of a week (no passcode asked): the session's lock waits 10 s at most.
                "$K" autolock 0 --grace 604800 > /dev/null
                session Lock; read -r line <&3; echo "$line"; session Unlock
                "$K" autolock 0 --grace 1 > /dev/null
                session SetLockedHint true
                read -r line <&3; echo "$line"; read -r line <&3; echo "$line"
                unlock; read -r line <&3
                gdbus call --system -d org.freedesktop.login1 -o /org/freedesktop/login1 \\
                    -m org.freedesktop.login1.Manager.ListInhibitors | grep -o "'sleep', 'KeychainFS', [^,]*, 'delay'"
                emit PrepareForSleep b "[<true>]"
                read -r line <&3; echo "$line"; read -r line <&3; echo "$line"
                unlock; read -r line <&3; emit PrepareForSleep b "[<false>]"
                emit SessionRemoved so "[<'c1'>, <objectpath '/org/freedesktop/login1/session/c1'>]"
                read -r line <&3; echo "$line"; read -r line <&3; echo "$line"
                "$K" log | grep ' lock ok ' | sed 's/.*lock ok (\\([^)]*\\)).*/\\1/'
                """)
            let tab = "\t"
            #expect(
                used.stdout == """
                    session ok
                    unlocked
                    will-lock\(tab)1
                    locked
                    Permission denied
                    state: locked
                    unlocked
                    will-lock\(tab)1
                    after the grace: 124
                    s3cret
                    will-lock\(tab)10
                    will-lock\(tab)1
                    locked
                    'sleep', 'KeychainFS', 'Lock the keychain before the machine sleeps', 'delay'
                    will-lock\(tab)0
                    locked
                    will-lock\(tab)0
                    locked
                    the session locked
                    the session set LockedHint
                    the machine goes to sleep
                    the session ended

                    """, "\(used)")
        }

        /// The Secret Service says the session's lock as gnome-keyring does:
        /// once the keychain locks after the session's Lock, the default
        /// collection's `Locked` property is true, and the service emitted
        /// `PropertiesChanged` (Locked) and `CollectionChanged` for it; the
        /// unlock says false the same way.
        @Test func theSecretServiceSaysTheSessionsLock() throws {
            let used = try withSession(
                """
                dbus-monitor --session "type='signal',sender='org.freedesktop.secrets'" > "$R/signals" 2> /dev/null &
                monitor=$!
                # The monitor is listening once its own connection is on the bus.
                for n in $(seq 100); do grep -q NameAcquired "$R/signals" && break; sleep 0.1; done
                locked() {
                    gdbus call --session -d org.freedesktop.secrets -o /org/freedesktop/secrets/collection/default \\
                        -m org.freedesktop.DBus.Properties.Get org.freedesktop.Secret.Collection Locked
                }
                locked
                session Lock; read -r line <&3; read -r line <&3; echo "$line"
                locked
                unlock; read -r line <&3; echo "$line"
                locked
                # The monitor writes what it saw as it sees it: wait (bounded) for both changes' signals.
                for n in $(seq 100); do
                    [ "$(grep -c member=CollectionChanged "$R/signals")" -ge 2 ] && break; sleep 0.1
                done
                kill $monitor
                grep -A 8 'member=PropertiesChanged' "$R/signals" | grep -E 'boolean|string "Locked"' | tr -s ' '
                grep -c 'member=CollectionChanged' "$R/signals"
                """, mountOptions: "--secret-service")
            #expect(
                used.stdout == """
                    session ok
                    unlocked
                    (<false>,)
                    locked
                    (<true>,)
                    unlocked
                    (<false>,)
                     string "Locked"
                     variant boolean true
                     string "Locked"
                     variant boolean false
                    2

                    """, "\(used)")
        }
    }
}
