#if canImport(Glibc)
import Glibc
#endif
import Foundation
import KeychainCore

/// An X server of the test's own (Xvfb, no TCP), for the clipboard: `--clip`
/// and its clearer talk to it through `xclip` with DISPLAY=``display``.
/// Stopped when the test ends, passed or failed.
package final class VirtualDisplay {
    package let display: String
    private let pid: pid_t

    package init() throws {
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0 else { throw HarnessError("pipe: errno \(errno)") }
        var options = Spawn.Options()
        options.nullStandardStreams = true
        options.descriptors = [(3, ends[1])]
        // -displayfd: Xvfb picks a free display and writes its number once it accepts clients.
        let started = Spawn.start(["/usr/bin/Xvfb", "-displayfd", "3", "-nolisten", "tcp"], options: options)
        close(ends[1])
        defer { close(ends[0]) }
        guard let started else { throw HarnessError("cannot start /usr/bin/Xvfb (./scripts/setup installs xvfb)") }
        pid = started
        var text = ""
        var byte: UInt8 = 0
        while read(ends[0], &byte, 1) == 1, byte != UInt8(ascii: "\n") { text.append(Character(UnicodeScalar(byte))) }
        guard !text.isEmpty, Int(text) != nil else {
            kill(started, SIGKILL)
            _ = Spawn.wait(started)
            throw HarnessError("Xvfb did not start")
        }
        display = ":" + text
    }

    deinit {
        kill(pid, SIGTERM)
        _ = Spawn.wait(pid)
    }
}

/// The processes whose environment holds `entry` (`NAME=value`): how a test
/// finds the detached helpers a command of its own left behind.
package func processes(withEnvironment entry: String) -> [pid_t] {
    let wanted = Array(entry.utf8)
    return ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { name in
        guard let pid = pid_t(name), pid != getpid(),
            let environ = FileManager.default.contents(atPath: "/proc/\(name)/environ")
        else { return nil }
        return environ.split(separator: 0).contains { Array($0) == wanted } ? pid : nil
    }
}

/// Waits (up to `seconds`) for a process that is not our child to end.
package func waitForExit(_ pid: pid_t, seconds: Int32) -> Bool {
    guard let pidfd = Pidfd.open(pid) else { return errno == ESRCH }
    return Pidfd.hasExited(pidfd.borrowed, waitingUpTo: seconds * 1000)
}
