#if canImport(Glibc)
import Glibc
#endif

/// pidfds (pidfd_open(2)): a process named by a descriptor, which no reuse
/// of its pid can make name another.
enum Pidfd {
    /// Whether the process `pidfd` refers to still runs: its pidfd becomes
    /// readable once it has exited (pidfd_open(2)). Polling needs no
    /// permission over the process, where a signal 0 (pidfd_send_signal)
    /// is refused for another user's (the service's callers).
    static func isAlive(_ pidfd: Int32) -> Bool {
        var entry = pollfd(fd: pidfd, events: Int16(POLLIN), revents: 0)
        while true {
            let ready = poll(&entry, 1, 0)
            if ready < 0 && errno == EINTR { continue }
            return ready == 0
        }
    }
}
