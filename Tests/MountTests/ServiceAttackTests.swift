import Foundation
import KeychainCore
import Testing
import TestSupport

/// The attacks of issue 29 on service mode, each run as ordinary users the
/// test creates, against a service the test starts on its own socket, with
/// attack programs that speak the socket protocol as any local program can
/// (`Attacks/kcattack.py`).
@Suite struct ServiceAttackTests {
    /// Puts the attack program where the harness's user can run it; returns its path.
    static func attackProgram(_ harness: MountHarness) throws -> String {
        let source = try #require(Bundle.module.path(forResource: "kcattack", ofType: "py", inDirectory: "Attacks"))
        let copy = harness.root + "/kcattack.py"
        try? FileManager.default.removeItem(atPath: copy)
        try FileManager.default.copyItem(atPath: source, toPath: copy)
        chmod(copy, 0o644)
        return copy
    }

    /// How many threads and descriptors the process has.
    static func footprint(_ pid: pid_t) -> (threads: Int, descriptors: Int) {
        let threads = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task").count) ?? -1
        let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
        return (threads, descriptors)
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
        let result = harness.sh("python3 \"$1\" attach \"$2\" " + kinds.joined(separator: " "),
                                arguments: [attack, service.socket])
        #expect(result.succeeded, "\(result)")
        let lines = result.stdout.split(separator: "\n")
        #expect(lines.count == kinds.count, "\(result)")
        for (kind, line) in zip(kinds, lines) {
            // A system error (2), EINVAL, with a sentence.
            #expect(line.hasPrefix("\(kind) 2 \(EINVAL) ") && line.contains("/dev/fuse"), "\(line)")
        }
        #expect(Self.eventually { Self.footprint(service.pid) == before },
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
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: false,
                                                attributes: [.posixPermissions: 0o755])
        try user.own(shared)
        // Root made it: root takes it away, whatever happens.
        defer { umount2(shared, Int32(MNT_DETACH)) }
        let root = try MountHarness(service: service)
        let passed = root.sh("python3 \"$1\" attach-allow-other \"$2\" \"$3\" \"$4\" \"$5\"",
                             arguments: [attack, service.socket, shared, String(user.uid), String(user.gid)])
        #expect(passed.stdout == "0 0 \n", "\(passed)")
        #expect(owner.sh("cat \"$1/default/token\"", arguments: [shared]).stdout == "s3cret")
        let other = try MountHarness(passcode: nil, as: try OrdinaryUser(), service: service)
        try FileManager.default.copyItem(atPath: "/usr/bin/cat", toPath: other.root + "/private-reader")
        try other.user!.own(other.root + "/private-reader")
        for script in ["\"$R/private-reader\" \"$1/default/token\"", "ls \"$1\"", "cat \"$1/.control\"",
                       "printf x > \"$1/default/new\""] {
            let refused = other.sh(script, arguments: [shared])
            #expect(!refused.succeeded && refused.stderr.contains("Permission denied") && !refused.stdout.contains("s3cret"),
                    "\(script): \(refused)")
        }
        #expect(owner.sh("\"$K\" get default/new").status == 2)
        let log = owner.sh("\"$K\" log").stdout
        #expect(log.contains("request denied (not the keychain's user)") && log.contains("uid=\(other.user!.uid)"), "\(log)")
        #expect(!log.contains("private-reader"), "\(log)")
    }
}
