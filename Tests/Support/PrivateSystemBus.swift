#if canImport(Glibc)
import Glibc
#endif
import Foundation
import KeychainCore

/// A system bus of the test's own, run by root under Debian's policy
/// (`/usr/share/dbus-1/system.conf` and its `system.d`, as the machine's
/// bus has it: any user may send a signal to any connection; only root
/// may own `org.freedesktop.login1`), with python3-dbusmock's logind
/// template owning that name, as root. `mockCallers` may drive the mock
/// (its `org.freedesktop.DBus.Mock` interface, which the real logind does
/// not have); nothing else is added to the policy. Stopped when the test
/// ends, passed or failed.
package final class PrivateSystemBus {
    package let directory: String
    /// The bus's address, as `DBUS_SYSTEM_BUS_ADDRESS` takes it.
    package let address: String
    private var pids: [pid_t] = []

    package init(mockCallers: [OrdinaryUser]) throws {
        directory = try makeTemporaryDirectory("kcfs-system-bus")
        chmod(directory, 0o755)  // the users' programs reach the socket in it
        address = "unix:path=\(directory)/system_bus"
        var config = try String(contentsOfFile: "/usr/share/dbus-1/system.conf", encoding: .utf8)
        // What only the machine's own bus does: its user, pid file, forking,
        // syslog, activation, and its address. Its policy stays as it is.
        for pattern in [
            "<user>[^<]*</user>", "<fork/>", "<pidfile>[^<]*</pidfile>", "<syslog/>",
            "<servicehelper>[^<]*</servicehelper>", "<standard_system_servicedirs/>"
        ] {
            config = config.replacingOccurrences(of: pattern, with: "", options: .regularExpression)
        }
        config = config.replacingOccurrences(
            of: "<listen>unix:path=/run/dbus/system_bus_socket</listen>", with: "<listen>\(address)</listen>")
        config = config.replacingOccurrences(
            of: "<includedir>system.d</includedir>", with: "<includedir>/usr/share/dbus-1/system.d</includedir>")
        let mockPolicy = mockCallers.map {
            """
            <policy user="\($0.name)"><allow send_destination="org.freedesktop.login1" \
            send_interface="org.freedesktop.DBus.Mock"/></policy>
            """
        }.joined(separator: "\n")
        config = config.replacingOccurrences(of: "</busconfig>", with: mockPolicy + "\n</busconfig>")
        try config.write(toFile: directory + "/system.conf", atomically: true, encoding: .utf8)

        var quiet = Spawn.Options()
        quiet.nullStandardStreams = true
        // --print-address: the daemon writes its address once it listens.
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0 else { throw HarnessError("pipe: errno \(errno)") }
        var printing = quiet
        printing.descriptors = [(3, ends[1])]
        let daemon = Spawn.start(
            [
                "/usr/bin/dbus-daemon", "--config-file=\(directory)/system.conf", "--nofork", "--nopidfile",
                "--print-address=3"
            ], options: printing)
        close(ends[1])
        defer { close(ends[0]) }
        guard let daemon else { throw HarnessError("cannot run dbus-daemon") }
        pids.append(daemon)
        var byte: UInt8 = 0
        var printed = 0
        while read(ends[0], &byte, 1) == 1, byte != UInt8(ascii: "\n") { printed += 1 }
        guard printed > 0 else { throw HarnessError("the system bus did not start") }
        var withBus = quiet
        withBus.environment =
            ProcessInfo.processInfo.environment.map { "\($0.key)=\($0.value)" } + [
                "DBUS_SYSTEM_BUS_ADDRESS=\(address)"
            ]
        guard
            let logind = Spawn.start(
                ["/usr/bin/python3", "-m", "dbusmock", "--system", "--template", "logind"], options: withBus)
        else { throw HarnessError("cannot run python3-dbusmock") }
        pids.append(logind)
        // gdbus wait: until the mock owns its name (it connects once the daemon listens).
        guard
            Spawn.run(
                ["/usr/bin/gdbus", "wait", "--system", "--timeout", "20", "org.freedesktop.login1"], options: withBus)
                == 0
        else { throw HarnessError("the mock logind did not come on the bus") }
    }

    deinit {
        for pid in pids.reversed() {
            kill(pid, SIGTERM)
            _ = Spawn.wait(pid)
        }
        try? FileManager.default.removeItem(atPath: directory)
    }
}
