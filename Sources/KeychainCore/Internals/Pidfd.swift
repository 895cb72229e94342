internal import CLinux
#if canImport(Glibc)
import Glibc
#endif

/// pidfds (pidfd_open(2)): a process named by a descriptor, which no reuse
/// of its pid can make name another.
package enum Pidfd {
    /// Whether the process `pidfd` refers to still runs: its pidfd becomes
    /// readable once it has exited (pidfd_open(2)). Polling needs no
    /// permission over the process, where a signal 0 (pidfd_send_signal)
    /// is refused for another user's (the service's callers).
    package static func isAlive(_ pidfd: BorrowedDescriptor) -> Bool {
        !hasExited(pidfd, waitingUpTo: 0)
    }

    /// A pidfd for `pid`, or nil (ESRCH: it is gone).
    package static func open(_ pid: Int32) -> FileDescriptor? {
        FileDescriptor(CLinux_pidfd_open(pid))
    }

    /// Whether the process ends within `milliseconds` (-1: however long it takes).
    package static func hasExited(_ pidfd: BorrowedDescriptor, waitingUpTo milliseconds: Int32) -> Bool {
        var entry = pollfd(fd: pidfd.raw, events: Int16(POLLIN), revents: 0)
        // Readable, or a pidfd poll cannot watch (an error): gone either way.
        return (try? valueOrErrno { poll(&entry, 1, milliseconds) }) != 0
    }
}
