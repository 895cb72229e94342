#if canImport(Glibc)
import Glibc
#endif

/// Which processes a client in this process may send a request to (the
/// KeychainProtocol target's admission rule, docs/SECURITY.md, "The login
/// password goes only to the device"); the core knows its processes only.
public enum DevicePeerAdmission {
    /// A process for good: its pid and its start time (`/proc/PID/stat`).
    public struct Process: Hashable, Sendable {
        public var pid: pid_t
        public var start: UInt64

        public init(pid: pid_t, start: UInt64) {
            self.pid = pid
            self.start = start
        }

        /// The process `pid` is now (nil: gone).
        public static func now(_ pid: pid_t) -> Process? {
            ProcessChain.startTime(of: pid).map { Process(pid: pid, start: $0) }
        }
    }
}
