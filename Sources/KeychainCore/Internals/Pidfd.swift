internal import CLinux

/// pidfds (pidfd_open(2)): a process named by a descriptor, which no reuse
/// of its pid can make name another.
enum Pidfd {
    /// Whether the process `pidfd` refers to still runs.
    static func isAlive(_ pidfd: Int32) -> Bool { CLinux_pidfd_alive(pidfd) != 0 }
}
