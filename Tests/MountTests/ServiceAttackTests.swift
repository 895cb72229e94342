import Foundation
import KeychainCore
import KeychainProtocol
import KeychainDevice
import KeychainFS
import Testing
import TestSupport

extension SerialTests {
    /// The attacks of docs/SECURITY.md, "Service mode under attack", each run
    /// as ordinary users the test creates, against a service the test starts
    /// on its own socket, with attack programs that speak the socket protocol
    /// as any local program can (`Attacks/kcattack.py`).
    @Suite struct ServiceAttackTests {
        /// Puts the attack program where the harness's user can run it; returns its path.
        static func attackProgram(_ harness: MountHarness) throws -> String {
            let source = try #require(Bundle.module.path(forResource: "kcattack", ofType: "py", inDirectory: "Attacks"))
            let copy = harness.root + "/kcattack.py"
            try? FileManager.default.removeItem(atPath: copy)
            // Frames of this build's protocol version.
            let text = try String(contentsOfFile: source, encoding: .utf8)
                .replacingOccurrences(
                    of: "PROTOCOL_VERSION = 0\n", with: "PROTOCOL_VERSION = \(DeviceProtocol.version)\n")
            try text.write(toFile: copy, atomically: true, encoding: .utf8)
            chmod(copy, 0o644)
            return copy
        }

        /// How many threads serve socket connections in the process, and how
        /// many descriptors it has. (A mount's FUSE workers, which a burst of
        /// requests may add to and which stay, are not counted.)
        static func footprint(_ pid: pid_t) -> (connectionThreads: Int, descriptors: Int) {
            let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
            let connections = tasks.filter {
                (try? String(contentsOfFile: "/proc/\(pid)/task/\($0)/comm", encoding: .utf8)) == DeviceProcess
                    .connectionThreadName + "\n"
            }
            let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
            return (connections.count, descriptors)
        }

        /// Waits (at most `seconds`) until `condition` holds; whether it did.
        static func eventually(within seconds: Double = 5, _ condition: () -> Bool) -> Bool {
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline {
                if condition() { return true }
                usleep(10_000)
            }
            return condition()
        }

        /// Over a socket pair of its own, a program could write FUSE requests
        /// naming any uid and pid (a granted program's) and any lengths. The
        /// service serves nothing but a mounted `/dev/fuse` connection, and a
        /// refused descriptor leaves no descriptor and no thread behind.
        @Test func attachServesNothingButAMountedFuseConnection() throws {
            let service = try ServiceHarness()
            let (harness, mnt) = try ServiceModeTests.userOfAService(service)
            let attack = try Self.attackProgram(harness)
            let before = Self.footprint(service.pid)
            let kinds = ["socketpair", "pipe", "file", "devnull", "unmounted-fuse", "directory", "eventfd"]
            let result = harness.sh(
                "/usr/bin/python3 \"$1\" attach \"$2\" " + kinds.joined(separator: " "),
                arguments: [attack, service.socket])
            #expect(result.succeeded, "\(result)")
            let lines = result.stdout.split(separator: "\n")
            #expect(lines.count == kinds.count, "\(result)")
            for (kind, line) in zip(kinds, lines) {
                // A system error (2), EINVAL, with a sentence.
                #expect(line.hasPrefix("\(kind) 2 \(EINVAL) ") && line.contains("/dev/fuse"), "\(line)")
            }
            #expect(
                Self.eventually { Self.footprint(service.pid) == before },
                "left behind: \(Self.footprint(service.pid)) against \(before)")
            // The user's own mount is served as before.
            #expect(harness.sh("cat \"$1/default/token\"", arguments: [mnt]).stdout == "s3cret")
        }

        /// A user who passes the service a mount that other users may enter
        /// (`allow_other`, which root made for them here) gives those users
        /// nothing: their requests get EACCES, and the log names their uid and
        /// pid but never what only they could see (their executable's path).
        @Test func requestsOfAnotherUserThroughAPassedMountAreRefused() throws {
            let service = try ServiceHarness()
            let (owner, _) = try ServiceModeTests.userOfAService(service)
            let attack = try Self.attackProgram(owner)
            let user = try #require(owner.user)
            // Where other users can reach it (the harness's own directory is the owner's alone).
            let shared = service.root + "/shared"
            try FileManager.default.createDirectory(
                atPath: shared, withIntermediateDirectories: false,
                attributes: [.posixPermissions: 0o755])
            try user.own(shared)
            // Root made it: root takes it away, whatever happens.
            defer { umount2(shared, Int32(MNT_DETACH)) }
            let root = try MountHarness(service: service)
            let passed = root.sh(
                "/usr/bin/python3 \"$1\" attach-allow-other \"$2\" \"$3\" \"$4\" \"$5\"",
                arguments: [attack, service.socket, shared, String(user.uid), String(user.gid)])
            #expect(passed.stdout == "0 0 \n", "\(passed)")
            #expect(owner.sh("cat \"$1/default/token\"", arguments: [shared]).stdout == "s3cret")
            let other = try MountHarness(passcode: nil, as: try OrdinaryUser(), service: service)
            try FileManager.default.copyItem(atPath: "/usr/bin/cat", toPath: other.root + "/private-reader")
            try other.user!.own(other.root + "/private-reader")
            for script in [
                "\"$R/private-reader\" \"$1/default/token\"", "ls \"$1\"", "cat \"$1/.control\"",
                "printf x > \"$1/default/new\""
            ] {
                let refused = other.sh(script, arguments: [shared])
                #expect(
                    !refused.succeeded && refused.stderr.contains("Permission denied")
                        && !refused.stdout.contains("s3cret"),
                    "\(script): \(refused)")
            }
            #expect(owner.sh("\"$K\" get default/new").status == 2)
            let log = owner.sh("\"$K\" log").stdout
            #expect(
                log.contains("request denied (not the keychain's user)") && log.contains("uid=\(other.user!.uid)"),
                "\(log)")
            #expect(!log.contains("private-reader"), "\(log)")
        }

        /// The victim of a flood is served: their `get` over the socket and
        /// their `cat` through their mount each answer, rightly, within 1 s.
        static func expectServed(
            _ victim: MountHarness, _ mnt: String, while attack: String,
            sourceLocation: SourceLocation = #_sourceLocation
        ) {
            for script in ["\"$K\" get default/token", "cat \"$1/default/token\""] {
                let started = Date()
                let result = victim.sh(script, arguments: [mnt])
                let took = Date().timeIntervalSince(started)
                #expect(
                    result.stdout == "s3cret" && took < 1, "during \(attack): \(script) took \(took) s: \(result)",
                    sourceLocation: sourceLocation)
            }
        }

        /// Runs the attack program's flood (`connections` idle ones held
        /// `holding` seconds, and a slow sender) as `attacker`, and `during`
        /// once the connections are in place; returns the flood's report.
        static func flood(
            _ service: ServiceHarness, from attacker: MountHarness, connections: Int, holding: Int,
            during: () -> Void
        ) throws -> ShellResult {
            let attack = try attackProgram(attacker)
            let ready = attacker.root + "/flood-ready"
            let flood = Thread.detachedResult {
                attacker.sh(
                    "/usr/bin/python3 \"$1\" flood \"$2\" \"$3\" \"$4\" \"$5\"",
                    arguments: [attack, service.socket, String(connections), String(holding), ready])
            }
            #expect(eventually(within: 25) { access(ready, F_OK) == 0 }, "the flood never got its connections")
            during()
            return flood.value()
        }

        /// One user floods the service: 1,100 idle connections, a request sent
        /// a byte every 2.5 s, then 1,000 attach attempts. Another user is
        /// served throughout; the flooder gets at most their share of
        /// connections, each cut 5 s after it was accepted, whatever the pace
        /// of its bytes; and the service is left as it was.
        @Test func oneUsersFloodLeavesAnotherServed() throws {
            let service = try ServiceHarness()
            let (victim, mnt) = try ServiceModeTests.userOfAService(service)
            let attacker = try MountHarness(passcode: nil, as: try OrdinaryUser(), service: service)
            let attack = try Self.attackProgram(attacker)
            // The attacker's keychain is opened (its files stay open) by a first request.
            _ = attacker.sh("\"$K\" ls")
            let before = Self.footprint(service.pid)
            let flooded = try Self.flood(service, from: attacker, connections: 1100, holding: 7) {
                for _ in 0..<3 { Self.expectServed(victim, mnt, while: "1,100 idle connections") }
            }
            // "connected N refused N cut N slow SECONDS"
            let figures = flooded.stdout.split(whereSeparator: \.isWhitespace)
            #expect(figures.count == 8 && figures[1] == "1100", "\(flooded)")
            if figures.count == 8 {
                let refused = Int(figures[3]) ?? 0, cut = Int(figures[5]) ?? 0, slow = Double(figures[7]) ?? 0
                // The slow sender holds one of the 32 places the whole time.
                #expect(cut <= 31 && refused + cut == 1100, "\(flooded)")
                #expect(slow >= 4.5 && slow < 6.5, "the slow sender was held \(slow) s: \(flooded)")
            }
            let attaches = Thread.detachedResult {
                attacker.sh("/usr/bin/python3 \"$1\" attach-many \"$2\" 1000", arguments: [attack, service.socket])
            }
            Self.expectServed(victim, mnt, while: "1,000 attach attempts")
            let attached = attaches.value()
            #expect(attached.stdout == "2 \(EINVAL):1000\n", "\(attached)")
            #expect(
                Self.eventually { Self.footprint(service.pid) == before },
                "left behind: \(Self.footprint(service.pid)) against \(before)")
        }

        /// `victim` stores a value of 1,000,000 bytes and reads it back (a
        /// large request, then a large reply): "stored" when both went through.
        static func storesALargeValue(_ victim: MountHarness) -> ShellResult {
            victim.sh(
                "head -c 1000000 /dev/urandom > \"$R/big\" && \"$K\" set default/big < \"$R/big\" "
                    + "&& \"$K\" get default/big | cmp - \"$R/big\" && echo stored")
        }

        /// One user's connections each announce a large body (1 MiB + 64 KiB,
        /// the most a request may be), send 1,100,000 bytes of it, which takes
        /// a 2 MiB slot of locked memory, and then nothing: where the machine
        /// gave the service 8 MiB (an outsider's, and this one, let not even
        /// root raise it), four of them held it all, and another user's large
        /// `set`s were refused ("no locked memory is left"). A person now
        /// holds an eighth of it at most, one such request here: the second
        /// is refused at its header, saying why, and the other user's `set`
        /// goes through while the first is held.
        @Test func oneUsersLargeRequestsLeaveLockedMemoryForAnother() throws {
            let service = try ServiceHarness(lockedMemoryLimit: 8 << 20)
            let (victim, _) = try ServiceModeTests.userOfAService(service)
            let attacker = try MountHarness(passcode: nil, as: try OrdinaryUser(), service: service)
            let attack = try Self.attackProgram(attacker)
            _ = attacker.sh("\"$K\" ls")
            let ready = attacker.root + "/large-ready"
            let stall = Thread.detachedResult {
                attacker.sh(
                    "/usr/bin/python3 \"$1\" large-stall \"$2\" 8 \(DeviceProtocol.maximumBody) 1100000 3 \"$3\"",
                    arguments: [attack, service.socket, ready])
            }
            #expect(Self.eventually(within: 25) { access(ready, F_OK) == 0 }, "the attack never got its connections")
            let large = Self.storesALargeValue(victim)
            let stalled = stall.value()
            #expect(large.stdout == "stored\n", "\(large)")
            #expect(
                stalled.stdout.hasPrefix("held 1 refused 7: ")
                    && stalled.stdout.contains("you hold your 2 MiB of the service's locked memory already"),
                "\(stalled)")
        }

        /// The same through a mount: one user's descriptors opened for
        /// writing, 1,000,000 bytes written to each and held open, kept
        /// another user's large `set`s out of a service limited to 8 MiB for
        /// as long as they stayed open (an outsider's attack); and, while
        /// only buffers past 64 KiB were counted, a hundred and twenty with
        /// 64 KiB each did too (the next outsider's); and descriptors only
        /// read, of items of their own just past 256 KiB (a 1 MiB slot
        /// each), did too (the one after). Every write buffer and every
        /// reader's value now holds its slot in its person's share (2 MiB
        /// here): the opens or writes past it fail with ENOMEM, the other
        /// user's `set` goes through, and the first descriptor's value is
        /// there.
        @Test(arguments: [(6, 1_000_000, 2, "write"), (120, 65536, 32, "write"), (8, 262_145, 2, "read")])
        func oneUsersOpenWritesLeaveLockedMemoryForAnother(descriptors: Int, size: Int, held: Int, mode: String)
            throws
        {
            let service = try ServiceHarness(lockedMemoryLimit: 8 << 20)
            let (victim, _) = try ServiceModeTests.userOfAService(service)
            let (attacker, mnt) = try ServiceModeTests.userOfAService(service)
            let ready = attacker.root + "/writes-ready", release = attacker.root + "/writes-release"
            try """
            import errno, os, sys, time
            mnt, ready, release, count, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
            reading = sys.argv[6] == "read"
            held, refused = [], 0
            for n in range(count if reading else 0):
                # Items of its own, each just past a slot class, to be read a little and held open.
                with open("%s/default/big%d" % (mnt, n), "wb") as item:
                    item.write(b"x" * size)
            for n in range(count):
                path = "%s/default/big%d" % (mnt, n)
                if reading:
                    try:
                        fd = os.open(path, os.O_RDONLY)
                        os.read(fd, 4096)
                        held.append(fd)
                    except OSError as error:
                        refused += error.errno == errno.ENOMEM
                    continue
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    os.write(fd, b"x" * size)
                    held.append(fd)
                except OSError as error:
                    refused += error.errno == errno.ENOMEM
                    os.close(fd)
            open(ready, "w").close()
            while not os.path.exists(release):
                time.sleep(0.05)
            for fd in held:
                os.close(fd)
            print("held %d refused %d" % (len(held), refused))
            """.write(toFile: attacker.root + "/writes.py", atomically: true, encoding: .utf8)
            let writes = Thread.detachedResult {
                attacker.sh(
                    "/usr/bin/python3 \"$R/writes.py\" \"$1\" \"$2\" \"$3\" \"$4\" \"$5\" \"$6\"",
                    arguments: [mnt, ready, release, String(descriptors), String(size), mode])
            }
            #expect(Self.eventually(within: 25) { access(ready, F_OK) == 0 }, "the writes never got their descriptors")
            let large = Self.storesALargeValue(victim)
            _ = FileManager.default.createFile(atPath: release, contents: nil)
            let written = writes.value()
            #expect(large.stdout == "stored\n", "\(large)")
            #expect(written.stdout == "held \(held) refused \(descriptors - held)\n", "\(written)")
            #expect(attacker.sh("wc -c < \"$1/default/big0\"", arguments: [mnt]).stdout == "\(size)\n")
        }

        /// A backup held every value of the keychain in locked memory at
        /// once: an outsider's backups of seven 1 MB items of their own, in a
        /// loop, took a service limited to 8 MiB from another user's large
        /// values, and each backup failed for want of it. A backup now holds
        /// one value at a time, in a place of its person's share: nine such
        /// items (more than all its locked memory) back up whole, and the
        /// other user's large value is stored.
        @Test func aBackupHoldsOneValueAtATime() throws {
            let service = try ServiceHarness(lockedMemoryLimit: 8 << 20)
            let (victim, _) = try ServiceModeTests.userOfAService(service)
            let (attacker, _) = try ServiceModeTests.userOfAService(service)
            let stored = attacker.sh(
                "for n in 1 2 3 4 5 6 7 8 9; do head -c 1000000 /dev/zero | \"$K\" set default/big$n || exit 1; done")
            #expect(stored.succeeded, "\(stored)")
            let backup = attacker.sh(
                "printf 'pw-1234\\npw-1234\\n' | \"$K\" backup \"$R/big.kcb\" && [ \"$(stat -c %s \"$R/big.kcb\")\" -gt 9000000 ]"
            )
            #expect(backup.succeeded, "\(backup)")
            #expect(Self.storesALargeValue(victim).stdout == "stored\n")
        }

        /// The same through replies: one user's connections each asked for a
        /// large item of their own and never read the reply, asking again as
        /// each deadline ended: another user's large `get`s and `set`s failed
        /// on a service limited to 8 MiB (an outsider's attack). A large reply
        /// now takes a place in its person's share until it is read: the
        /// others are refused at once, saying why, and the other user is served.
        @Test func oneUsersUnreadRepliesLeaveLockedMemoryForAnother() throws {
            let service = try ServiceHarness(lockedMemoryLimit: 8 << 20)
            let (victim, _) = try ServiceModeTests.userOfAService(service)
            let (attacker, _) = try ServiceModeTests.userOfAService(service)
            #expect(attacker.sh("head -c 1000000 /dev/zero | \"$K\" set default/big").succeeded)
            let attack = try Self.attackProgram(attacker)
            let request = attacker.root + "/get-big.frame"
            let frame = try DeviceRequest.item(.get(group: "default", identifier: "big")).frame()
            try frame.withUnsafeBytes { Data($0) }.write(to: URL(fileURLWithPath: request))
            chmod(request, 0o644)
            let ready = attacker.root + "/unread-ready"
            let unread = Thread.detachedResult {
                attacker.sh(
                    "/usr/bin/python3 \"$1\" unread-replies \"$2\" 8 \"$3\" 3 \"$4\"",
                    arguments: [attack, service.socket, request, ready])
            }
            #expect(Self.eventually(within: 25) { access(ready, F_OK) == 0 }, "the attack never got its connections")
            let large = Self.storesALargeValue(victim)
            let refused = unread.value()
            #expect(large.stdout == "stored\n", "\(large)")
            #expect(refused.stdout == "held 1 refused 7\n", "\(refused)")
        }

        /// Out of descriptors (here 64, and no limit per user), the service
        /// sheds idle connections and goes on: it had stopped accepting for
        /// good, and every client hung.
        @Test func aServiceOutOfDescriptorsShedsIdleConnectionsAndGoesOn() throws {
            let service = try ServiceHarness(options: ["--connections-per-user", "100000"], descriptorLimit: 64)
            let (victim, mnt) = try ServiceModeTests.userOfAService(service)
            let attacker = try MountHarness(passcode: nil, as: try OrdinaryUser(), service: service)
            let flooded = try Self.flood(service, from: attacker, connections: 300, holding: 4) {
                for _ in 0..<3 { Self.expectServed(victim, mnt, while: "300 idle connections against 64 descriptors") }
            }
            #expect(flooded.stdout.hasPrefix("connected 300 "), "\(flooded)")
            Self.expectServed(victim, mnt, while: "the end of the flood")
        }

        /// A grant that names a file without passing it: the service hashed
        /// the path with its own rights, and told the SHA-256 of another
        /// user's `device-secret` (and, by its error, whether a file exists).
        /// It opens no path for a client now: every such grant gets the same EINVAL.
        @Test func theServiceOpensNoPathAGrantNames() throws {
            let service = try ServiceHarness()
            let (victim, _) = try ServiceModeTests.userOfAService(service)
            let attacker = try MountHarness(as: try OrdinaryUser(), service: service)
            let attack = try Self.attackProgram(attacker)
            let victimFiles = service.keychain(of: victim.user!)
            for target in [victimFiles + "/device-secret", victimFiles + "/no-such-file"] {
                let granted = attacker.sh(
                    "/usr/bin/python3 \"$1\" grant \"$2\" default \"$3\" \"$4\"",
                    arguments: [attack, service.socket, target, MountHarness.passcode])
                #expect(
                    granted.stdout.hasPrefix("2 \(EINVAL) ") && granted.stdout.contains("opens no path"), "\(granted)")
            }
            #expect(attacker.sh("\"$K\" policy").stdout.isEmpty)
            // A grant of a file the user opens is still made.
            let own = attacker.sh(
                "cp /usr/bin/cat \"$R/mine\" && \"$K\" grant default --exe \"$R/mine\"",
                stdin: MountHarness.passcode + "\n")
            #expect(own.succeeded, "\(own)")
        }

        /// A socket directory that another user owns, or anyone may write, is
        /// refused: its owner could put their own socket in the service's place.
        @Test func theServiceRefusesASocketDirectoryOthersControl() throws {
            let user = try OrdinaryUser()
            let service = try ServiceHarness(started: false)
            let theirs = service.root + "/theirs", open = service.root + "/open"
            try FileManager.default.createDirectory(atPath: theirs, withIntermediateDirectories: false)
            try user.own(theirs)
            try FileManager.default.createDirectory(atPath: open, withIntermediateDirectories: false)
            chmod(open, 0o777)
            let root = try MountHarness()
            for (directory, problem) in [(theirs, "belongs to uid \(user.uid)"), (open, "can be written by others")] {
                let started = root.sh(
                    "\"$K\" service --state-directory \"$1\" --socket \"$2/socket\"",
                    arguments: [service.stateDirectory, directory])
                #expect(started.status == 1 && started.stderr.contains(problem), "\(started)")
                #expect(access(directory + "/socket", F_OK) != 0)
            }
        }

        /// One user's keychain in the service holds at most so many items and
        /// bytes, and restores a backup of at most so many bytes: reaching a
        /// limit says so, keeps every old value, and frees up as items go.
        @Test func eachUsersQuotaSaysSoWhenReached() throws {
            let service = try ServiceHarness(options: [
                "--items-per-user", "3", "--bytes-per-user", "4096",
                "--restore-bytes-per-user", "2000"
            ])
            let (harness, mnt) = try ServiceModeTests.userOfAService(service)  // default/token
            #expect(harness.sh("printf a | \"$K\" set default/a && printf b | \"$K\" set default/b").succeeded)
            let fourth = harness.sh("printf c | \"$K\" set default/c")
            #expect(
                fourth.status == 1 && fourth.stderr.contains("may hold 3 items")
                    && fourth.stderr.contains("it holds 3 items"),
                "\(fourth)")
            let through = harness.sh("printf d > \"$1/default/d\"", arguments: [mnt])
            #expect(!through.succeeded && through.stderr.contains("Disk quota exceeded"), "\(through)")
            // Replacing needs no room; the old values are all there.
            #expect(harness.sh("printf A | \"$K\" set default/a").succeeded)
            #expect(
                harness.sh("cat \"$1/default/a\" \"$1/default/b\" \"$1/default/token\"", arguments: [mnt]).stdout
                    == "Abs3cret")
            #expect(harness.sh("\"$K\" get default/c").status == 2)
            // Bytes: a value that would take the keychain past 4096 bytes.
            #expect(harness.sh("rm \"$1/default/b\"", arguments: [mnt]).succeeded)
            let big = harness.sh("head -c 5000 /dev/zero | \"$K\" set default/big")
            #expect(
                big.status == 1 && big.stderr.contains("4.0 MiB") == false && big.stderr.contains("may hold"), "\(big)")
            #expect(harness.sh("printf c | \"$K\" set default/c").succeeded, "room again once an item went")
            // A restore larger than the limit is refused before it is read (a backup's first bytes, then
            // noise: what is not a backup at all the command line refuses before it asks for the password).
            let restore = harness.sh(
                "{ printf KCFSBAK1; head -c 3000 /dev/urandom; } > \"$R/big.kcbak\" && \"$K\" restore \"$R/big.kcbak\"",
                stdin: "pw\n")
            #expect(restore.status != 0 && restore.stderr.contains("restore a backup of 0.0 MiB at most"), "\(restore)")
        }

        /// A user has at most so many mounts of the service at once (here 2):
        /// the next is refused, saying so, and leaves nothing mounted; one
        /// unmounted makes room.
        @Test func aUsersMountsAreLimited() throws {
            let service = try ServiceHarness(options: ["--mounts-per-user", "2"])
            let (harness, first) = try ServiceModeTests.userOfAService(service)
            let second = try harness.mount("second")
            let third = try harness.prepareMountpoint("third")
            let refused = harness.sh("\"$K\" mount \"$1\"", arguments: [third])
            #expect(
                !refused.succeeded && refused.stderr.contains("you have 2 mounts of this keychain already"),
                "\(refused)")
            #expect(!harness.isMounted(third))
            #expect(
                harness.sh("cat \"$1/default/token\" \"$2/default/token\"", arguments: [first, second]).stdout
                    == "s3crets3cret")
            #expect(harness.sh("\"$K\" unmount \"$1\" && \"$K\" mount \"$2\"", arguments: [second, third]).succeeded)
            #expect(harness.sh("cat \"$1/default/token\"", arguments: [third]).stdout == "s3cret")
        }
    }
}
