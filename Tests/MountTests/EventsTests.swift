import KeychainCore
import Foundation
import Testing
import KeychainFS
import TestSupport

extension SerialTests {
    /// The `.events` file, `keychainfs watch` and auto-lock, through real
    /// mounts. Readers block on real reads (the first line, the state at open,
    /// says the descriptor is listening), so no test waits by the clock.
    @Suite struct EventsTests {
        @Test func watchSeesLockUnlockAndItemChangesMadeThroughAnotherMount() throws {
            let (harness, first) = try MountHarness.unlockedMount()
            let second = try harness.mount("second")
            let watched = harness.sh(
                """
                mkfifo "$R/events"
                "$K" watch "$1" > "$R/events" & watcher=$!
                trap 'kill $watcher 2> /dev/null' EXIT
                exec 3< "$R/events"
                read -r state <&3
                printf secret > "$2/default/item"
                mv "$2/default/item" "$2/default/renamed"
                rm "$2/default/renamed"
                printf 'lock\\n' > "$2/.control"
                printf 'unlock %s\\n' "$3" > "$2/.control"
                lines="$state"
                for n in 1 2 3 4 5 6 7; do read -r line <&3; lines="$lines|$line"; done
                kill $watcher; wait $watcher 2> /dev/null
                printf '%s\\n' "$lines"
                """, arguments: [first, second, MountHarness.passcode])
            let tab = "\t"
            // Creating and then writing are two commits.
            #expect(
                watched.stdout == [
                    "unlocked", "written\(tab)default\(tab)item", "written\(tab)default\(tab)item",
                    "renamed\(tab)default\(tab)item\(tab)renamed", "removed\(tab)default\(tab)renamed",
                    "will-lock\(tab)0", "locked", "unlocked"
                ].joined(separator: "|") + "\n", "\(watched)")
            #expect(!watched.stdout.contains("secret"))
        }

        @Test func pollWakesForAnEventAndNonBlockingReadsSayEAGAIN() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let fd = open(mnt + "/.events", O_RDONLY | O_NONBLOCK)
            #expect(fd >= 0)
            defer { close(fd) }
            var buffer = [UInt8](repeating: 0, count: 4096)
            #expect(
                read(fd, &buffer, buffer.count) == 9 && String(decoding: buffer[0..<9], as: UTF8.self) == "unlocked\n")
            #expect(read(fd, &buffer, buffer.count) == -1 && errno == EAGAIN)
            var idle = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            #expect(poll(&idle, 1, 0) == 0)
            // Waits in a thread while another process locks; before or after
            // the lock, the poll must end with the descriptor readable.
            let ready = Thread.detachedResult {
                var waiting = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                return poll(&waiting, 1, 10_000) == 1 && waiting.revents & Int16(POLLIN) != 0
            }
            #expect(harness.control(mnt, "lock").succeeded)
            #expect(ready.value())
            let count = read(fd, &buffer, buffer.count)
            #expect(count > 0 && String(decoding: buffer[0..<count], as: UTF8.self) == "will-lock\t0\nlocked\n")
            // Not writable, not a directory, not removable.
            #expect(openErrno(mnt + "/.events", O_WRONLY) == EACCES)
            #expect(unlink(mnt + "/.events") == -1 && errno == EPERM)
            #expect(harness.sh("ls -a \"$1\"", arguments: [mnt]).stdout == ".\n..\n.control\n.events\ndefault\n")
        }

        /// A reader that does not read keeps the first 256 KiB of lines and an
        /// `overflow` line; newer lines are dropped until it has read what it
        /// holds (as inotify's IN_Q_OVERFLOW), so it costs writers nothing.
        @Test func aReaderThatDoesNotReadGetsOverflowAndThenNewLines() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let fd = open(mnt + "/.events", O_RDONLY | O_NONBLOCK)
            #expect(fd >= 0)
            defer { close(fd) }
            // 255-byte names: each `written` line is 271 bytes; 1,100 of them pass 256 KiB.
            let writes = harness.sh(
                """
                i=1000; while [ $i -lt 2100 ]; do printf v > "$1/default/$i$(printf '%0251d' 0)"; i=$((i + 1)); done
                """, arguments: [mnt])
            #expect(writes.succeeded, "\(writes)")
            var held: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 1 << 16)
            while true {
                let count = read(fd, &buffer, buffer.count)
                if count <= 0 { break }
                held += buffer[0..<count]
            }
            let lines = String(decoding: held, as: UTF8.self).split(separator: "\n")
            #expect(held.count <= 256 << 10)
            #expect(lines.first == "unlocked")
            #expect(lines.dropFirst().first?.hasPrefix("written\tdefault\t1000") == true)
            #expect(lines.last == "overflow", "\(lines.suffix(2))")
            #expect(lines.count < 1_000)  // the newest were dropped, not the oldest
            // Read to the end: the next event arrives again.
            #expect(harness.control(mnt, "lock").succeeded)
            let count = read(fd, &buffer, buffer.count)
            #expect(count > 0 && String(decoding: buffer[0..<max(count, 0)], as: UTF8.self) == "will-lock\t0\nlocked\n")
        }

        /// Once the daemon has read a request the kernel waits for its answer:
        /// a read parked for the next event must end when its reader is
        /// signalled, or the reader could not be killed.
        @Test func aReaderWaitingForEventsCanBeInterrupted() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let interrupted = harness.sh("timeout -s INT 1 cat \"$1/.events\"; echo \"status $?\"", arguments: [mnt])
            #expect(interrupted.stdout == "unlocked\nstatus 124\n", "\(interrupted)")
            #expect(harness.control(mnt, "lock").succeeded)
            #expect(harness.status(mnt)["state"] == "locked")
        }

        /// SIGTERM (`systemctl stop`) must not wait for watchers: they get the
        /// end of the file, close it, and the device unmounts and exits.
        @Test func stoppingTheDeviceEndsTheReadersOfEvents() throws {
            let harness = try MountHarness()
            let pid = try harness.mountForeground()
            let watched = harness.sh(
                """
                mkfifo "$R/events"
                "$K" watch "$1" > "$R/events" 2> "$R/watch.err" & watcher=$!
                trap 'kill $watcher 2> /dev/null' EXIT
                exec 3< "$R/events"
                read -r state <&3
                kill -TERM "$2"
                wait $watcher; echo "watch status $?"; cat "$R/watch.err"
                """, arguments: [harness.root + "/mnt", String(pid)])
            #expect(watched.stdout == "watch status 1\nkeychainfs: the mount went away\n", "\(watched)")
            #expect(Spawn.wait(pid) == 0)
            #expect(!harness.isMounted(harness.root + "/mnt"))
        }

        @Test func autoLockSendsWillLockThenLocksAfterTheIdleDelayAndGrace() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(harness.control(mnt, "autolock 0").succeeded)
            #expect(harness.control(mnt, "autolock 99999999").stderr.contains("Invalid argument"))
            #expect(harness.control(mnt, "autolock 07").stderr.contains("Invalid argument"))
            // Durations as people write them; a bad one changes nothing.
            for (duration, seconds) in [("5m", "300"), ("1h", "3600"), ("7d", "604800"), ("45s", "45")] {
                #expect(harness.control(mnt, "autolock " + duration).succeeded, "\(duration)")
                #expect(harness.status(mnt)["autolock"] == seconds, "\(duration)")
            }
            for bad in ["8d", "5x", "m", "05m", "5 m", "-5m"] {
                #expect(harness.control(mnt, "autolock " + bad).stderr.contains("Invalid argument"), "\(bad)")
                #expect(harness.status(mnt)["autolock"] == "45", "\(bad)")
            }
            #expect(harness.control(mnt, "autolock 0").succeeded)
            let locked = harness.sh(
                """
                exec 3< "$1/.events"
                read -r state <&3
                printf 'autolock-grace 1\\nautolock 1\\n' > "$1/.control"
                read -r first <&3
                grep '^state:' "$1/.control"
                read -r second <&3
                printf '%s|%s|%s\\n' "$state" "$first" "$second"
                """, arguments: [mnt])
            #expect(locked.stdout == "state: unlocked\nunlocked|will-lock\t1|locked\n", "\(locked)")
            #expect(harness.status(mnt)["state"] == "locked")
            #expect(harness.status(mnt)["autolock"] == "1" && harness.status(mnt)["autolock-grace"] == "1")
            #expect(harness.sh("\"$K\" log --keychain \"$KC\"").stdout.contains("lock ok (auto-lock after 1 s idle)"))
        }

        @Test func mountAutolockSetsTheDevicesDelay() throws {
            let harness = try MountHarness()
            let mnt = try harness.prepareMountpoint("mnt")
            #expect(harness.sh("\"$K\" mount \"$1\" --keychain \"$KC\" --autolock 600", arguments: [mnt]).succeeded)
            #expect(harness.status(mnt)["autolock"] == "600")
            let second = try harness.prepareMountpoint("second")
            #expect(harness.sh("\"$K\" mount \"$1\" --keychain \"$KC\" --autolock 30", arguments: [second]).succeeded)
            #expect(harness.status(mnt)["autolock"] == "30")  // one device, one setting
            #expect(harness.sh("\"$K\" mount \"$R/x\" --autolock -1").status == 64)
        }

        /// Item changes of a group with an entitlement policy reach only the
        /// programs it admits; lock state reaches everyone.
        @Test func itemChangesOfAPolicedGroupReachOnlyEntitledReaders() throws {
            let (harness, mnt) = try MountHarness.withPolicedGroup()
            #expect(harness.grant("secure", exe: harness.root + "/granted-cat").succeeded)
            #expect(harness.grant("secure", exe: harness.binary).succeeded)
            let seen = harness.sh(
                """
                mkfifo "$R/entitled"
                "$R/granted-cat" "$1/.events" > "$R/entitled" & reader=$!
                trap 'kill $reader 2> /dev/null' EXIT
                exec 4< "$R/entitled"
                exec 3< "$1/.events"
                read -r a <&4; read -r b <&3
                printf new | "$K" set secure/token --keychain "$KC"
                printf new > "$1/default/open"
                read -r entitled1 <&4; read -r entitled2 <&4; read -r other <&3
                kill $reader; wait $reader 2> /dev/null
                printf '%s|%s|%s\\n' "$entitled1" "$entitled2" "$other"
                """, arguments: [mnt])
            #expect(seen.stdout == "written\tsecure\ttoken|written\tdefault\topen|written\tdefault\topen\n", "\(seen)")
        }
    }
}
