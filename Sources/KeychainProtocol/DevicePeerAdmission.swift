import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Which processes a client in this process may send a request to, when
/// the request carries what must reach the device and nobody else: the
/// login password, which pam_keychainfs hands to `keychainfs pam-hook`
/// (docs/SECURITY.md, "The login password goes only to the device"). A
/// program of the user can listen on the device's socket before the
/// device does, or after stopping it; the runtime directory being the
/// user's own does not tell them apart. By default every peer is admitted
/// (the socket directory is the user's, and the device refuses peers of
/// another uid); once ``admitOnly(_:)`` is called, a connection whose
/// listening process (SO_PEERCRED) is neither listed nor a device this
/// process started is closed before a byte is sent, and why is logged.
extension DevicePeerAdmission {
    /// A device pam_keychainfs checked as root: the process, and the inode
    /// of a listening socket it holds and no other process does. A process
    /// that listened, forked a child to accept, then exec'd the installed
    /// program (which passes every check of the process) holds no such
    /// socket: SO_PEERCRED names the process that called `listen`, not the
    /// one that accepts.
    public struct CheckedDevice: Hashable, Sendable {
        public var process: Process
        public var listener: UInt32

        /// The list pam_keychainfs writes: `PID:START:INODE` separated by commas; malformed entries are left out.
        public static func list(_ text: String) -> Set<CheckedDevice> {
            Set(
                text.split(separator: ",").compactMap { entry in
                    let parts = entry.split(separator: ":")
                    guard parts.count == 3, let pid = pid_t(parts[0]), let start = UInt64(parts[1]),
                        let listener = UInt32(parts[2])
                    else { return nil }
                    return CheckedDevice(process: Process(pid: pid, start: start), listener: listener)
                })
        }
    }

    private struct Rule {
        var admitted: Set<CheckedDevice>
        var started: Set<Process> = []
        /// pam_keychainfs's end that checks, as root, who accepted a
        /// connection to a checked device (nil: nobody checks, and none is admitted).
        var verifier: BorrowedDescriptor?
    }
    private static let rule = Mutex<Rule?>(nil)

    /// From now on, admits only `devices` and the devices this process
    /// starts; a connection to one of `devices` only once `verifier`
    /// (pam_keychainfs's socket, as root) says the device accepted it and
    /// holds it alone.
    public static func admitOnly(_ devices: Set<CheckedDevice>, verifier: BorrowedDescriptor?) {
        rule.withLock { $0 = Rule(admitted: devices, verifier: verifier) }
    }

    /// Whether the process that checks as root says `socket` was accepted
    /// by a checked device that holds it alone: one byte and the
    /// descriptor out, one byte back (1: yes).
    private static func verified(_ socket: BorrowedDescriptor, by verifier: BorrowedDescriptor) -> Bool {
        SocketHolders.askRoot(verifier, about: socket)
    }

    /// A device this process started (``admitOnly(_:)`` admits it): it runs
    /// the program this process chose, with the environment it gave.
    public static func started(_ pid: pid_t) {
        guard let process = Process.now(pid) else { return }
        _ = rule.withLock { $0?.started.insert(process) }
    }

    /// Why nothing may be sent on `socket`, connected to `path` (nil: it may).
    static func refusal(of socket: BorrowedDescriptor, connectedTo path: String) -> String? {
        guard let rule = rule.withLock({ $0 }) else { return nil }
        guard let peer = ProgramIdentities.peerCredentials(socket), let process = Process.now(peer.pid) else {
            return "the device's socket has no peer this process can name: nothing was sent to it"
        }
        if rule.started.contains(process) { return nil }
        if let listener = SocketHolders.listener(boundAt: path),
            rule.admitted.contains(CheckedDevice(process: process, listener: listener))
        {
            // Who listened is not who accepts: a listening descriptor passed
            // around in flight (SCM_RIGHTS, in no process's table) let another
            // process accept. Root checks who holds the accepted end.
            if let verifier = rule.verifier, verified(socket, by: verifier) { return nil }
            return "the device's socket is held by a checked device, but the connection was not accepted by it "
                + "alone (pam_keychainfs checked, as root): nothing was sent to it"
        }
        return "process \(peer.pid) listens on the device's socket, but it is not a device of this keychain that "
            + "pam_keychainfs checked (the installed program, not traced, with no library preloaded, holding "
            + "that listening socket alone) nor one this command started: nothing was sent to it"
    }
}
