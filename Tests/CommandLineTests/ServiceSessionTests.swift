import Foundation
import KeychainCore
import Testing
import TestSupport

extension SerialTests {
    /// In service mode, each user's login sessions are that user's lock
    /// screen, as a per-user device's are (docs/FILESYSTEM.md, "`.control`").
    /// logind is python3-dbusmock's template on a private system bus that
    /// every account may use (the service runs as its own account), with a
    /// session for each of two ordinary users of the service.
    @Suite struct ServiceSessionTests {
        @Test func eachUsersSessionLocksTheirOwnKeychainInTheService() throws {
            // Root's, mode 0711: every account reaches the bus's socket, none lists it.
            let scratch = try makeTemporaryDirectory("kcfs-bus")
            chmod(scratch, 0o711)
            defer { try? FileManager.default.removeItem(atPath: scratch) }
            let address = "unix:path=\(scratch)/system_bus"
            let started = Spawn.run(
                [
                    "/bin/sh", "-c",
                    """
                    # The session bus's configuration, on our socket, with every account let in.
                    sed -e "s|<listen>.*</listen>|<listen>$2</listen>|" \
                        -e 's|<policy context="default">|&<allow user="*"/>|' /usr/share/dbus-1/session.conf > "$1/bus.conf"
                    dbus-daemon --config-file="$1/bus.conf" --fork --print-pid > "$1/bus.pid" || exit 1
                    DBUS_SYSTEM_BUS_ADDRESS="$2" /usr/bin/python3 -m dbusmock --system --template logind \
                        > /dev/null 2>&1 < /dev/null &
                    echo $! >> "$1/bus.pid"
                    DBUS_SYSTEM_BUS_ADDRESS="$2" gdbus wait --system --timeout 20 org.freedesktop.login1
                    """, "sh", scratch, address
                ])
            defer { _ = Spawn.run(["/bin/sh", "-c", "kill $(cat \"$1/bus.pid\")", "sh", scratch]) }
            try #require(started == 0, "no private system bus with logind")
            let service = try ServiceHarness(environment: ["DBUS_SYSTEM_BUS_ADDRESS": address])
            let first = try MountHarness(as: try OrdinaryUser(), service: service)
            let second = try MountHarness(as: try OrdinaryUser(), service: service)
            let used = first.sh(
                """
                export DBUS_SYSTEM_BUS_ADDRESS=\(address)
                A=$1 B=$2 KB=$3
                # Each user runs their own copy of the command (the other's is in a directory of theirs).
                K_() { user=$1; shift; k=$K; [ "$user" = "$A" ] || k=$KB; runuser -u "$user" -- "$k" "$@"; }
                state() { K_ "$1" status | head -1; }
                mock() { gdbus call --system -d org.freedesktop.login1 "$@" > /dev/null; }
                emit() { mock -o /org/freedesktop/login1 -m org.freedesktop.DBus.Mock.EmitSignal \\
                    org.freedesktop.login1.Manager "$@"; }
                unlock() { printf '1234\\n' | K_ "$1" unlock; }
                mock -o /org/freedesktop/login1 -m org.freedesktop.DBus.Mock.AddSession c1 seat0 $(id -u $A) $A true
                mock -o /org/freedesktop/login1 -m org.freedesktop.DBus.Mock.AddSession c2 seat1 $(id -u $B) $B true
                for user in $A $B; do unlock $user; K_ $user autolock 0 --grace 1 > /dev/null; done
                mkfifo "$R/events" && chmod 666 "$R/events"
                K_ $A watch > "$R/events" & watcher=$!
                trap 'kill $watcher 2> /dev/null' EXIT
                exec 3< "$R/events"
                read -r line <&3; echo "A: $line"
                # A's session locks: A's keychain after the grace; B's stays unlocked.
                mock -o /org/freedesktop/login1/session/c1 -m org.freedesktop.login1.Session.Lock
                read -r line <&3; echo "A: $line"; read -r line <&3; echo "A: $line"
                echo "B: $(state $B)"
                unlock $A; read -r line <&3
                # The machine sleeps: every keychain at once.
                emit PrepareForSleep b "[<true>]"
                read -r line <&3; echo "A: $line"; read -r line <&3; echo "A: $line"
                echo "B: $(state $B)"
                unlock $A; unlock $B; read -r line <&3; emit PrepareForSleep b "[<false>]"
                # B's session ends: B's keychain at once; A's stays.
                emit SessionRemoved so "[<'c2'>, <objectpath '/org/freedesktop/login1/session/c2'>]"
                for n in $(seq 100); do [ "$(state $B)" = "state: locked" ] && break; sleep 0.1; done
                echo "B: $(state $B)"; echo "A: $(state $A)"
                K_ $B log | grep ' lock ok ' | sed 's/.*lock ok (\\([^)]*\\)).*/B: \\1/'
                """, arguments: [first.user!.name, second.user!.name, second.binary], asRoot: true)
            let tab = "\t"
            #expect(
                used.stdout == """
                    A: unlocked
                    A: will-lock\(tab)1
                    A: locked
                    B: state: unlocked
                    A: will-lock\(tab)0
                    A: locked
                    B: state: locked
                    B: state: locked
                    A: state: unlocked
                    B: the machine goes to sleep
                    B: the session ended

                    """, "\(used)")
        }
    }
}
