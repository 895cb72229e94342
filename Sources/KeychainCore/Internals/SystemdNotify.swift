internal import CLinux
#if canImport(Glibc)
import Glibc
#endif

/// sd_notify(3) without libsystemd: under a `Type=notify` unit, systemd
/// passes `$NOTIFY_SOCKET` (a path, or `@name` for an abstract socket) and
/// waits for `READY=1`, so that units ordered after the device start only
/// once the keychain is mounted.
package enum SystemdNotify {
    /// Sends `state` (`READY=1`, `WATCHDOG=1`, `STATUS=...`) to systemd, if it asked for notifications.
    package static func send(_ state: String) {
        guard let socketName = getenv("NOTIFY_SOCKET").map({ String(cString: $0) }), !socketName.isEmpty else { return }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        var path = Array(socketName.utf8)
        let abstract = path.first == UInt8(ascii: "@")
        if abstract { path[0] = 0 }
        guard path.count < MemoryLayout.size(ofValue: address.sun_path) else { return }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: path) }
        // An abstract name is exactly its bytes; a path ends at its NUL.
        let length = MemoryLayout<sa_family_t>.size + path.count + (abstract ? 0 : 1)
        guard let fd = FileDescriptor(socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0))
        else { return }
        var message = state
        _ = message.withUTF8 { text in
            withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(fd.raw, text.baseAddress, text.count, Int32(MSG_NOSIGNAL), $0, socklen_t(length))
                }
            }
        }
    }

    /// How often systemd wants `WATCHDOG=1` (half its `WatchdogSec=`, as
    /// sd_watchdog_enabled(3) advises), in milliseconds; nil when the unit
    /// set no watchdog or set it for another process.
    package static func watchdogInterval() -> Int64? {
        guard let usec = getenv("WATCHDOG_USEC").flatMap({ Int64(String(cString: $0)) }), usec > 0 else { return nil }
        if let pid = getenv("WATCHDOG_PID").flatMap({ pid_t(String(cString: $0)) }), pid != getpid() { return nil }
        return max(usec / 2000, 1)
    }
}
