#if canImport(Glibc)
import Glibc
#endif

/// The process behind a request (FUSE names the calling thread, a socket
/// its peer). The kernel names the calling thread;
/// its process (thread group) is read from `/proc` only when needed.
package struct ProcessIdentity: Sendable, Equatable {
    package let thread: pid_t
    /// The uid the kernel ran the request as.
    package var uid: uid_t

    package init(thread: pid_t, uid: uid_t) {
        self.thread = thread
        self.uid = uid
    }

    /// The process a thread belongs to (itself if /proc cannot tell).
    package var process: pid_t {
        guard
            let fd = FileDescriptor(ProgramIdentities.withProcPath(thread, "status") { open($0, O_RDONLY | O_CLOEXEC) })
        else { return thread }
        // The `Tgid:` line is among the first few (proc(5)); read bytes, not Strings: this runs per audited request.
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 512) { buffer in
            let count = read(fd.raw, buffer.baseAddress, buffer.count)
            guard count > 0,
                let process = ProcStatus.number("Tgid:", in: UnsafeBufferPointer(rebasing: buffer[0..<count])),
                process > 0
            else { return thread }
            return process
        }
    }

    /// The program making the request, for entitlement decisions.
    package var program: ProgramIdentity? { ProgramIdentities.of(thread: thread, uid: uid) }

    /// Who made the request, for the audit log.
    package var auditSubject: AuditSubject { ProgramIdentities.subject(thread: thread, uid: uid) }

    /// The caller as the owner rule asks about it (docs/SECURITY.md, "An
    /// application's secrets on every door").
    package var consentCaller: ConsentCaller {
        ConsentCaller(
            program: { program }, subject: { auditSubject },
            waiting: { [thread] in ClientPresence.uninterrupted(thread: thread) })
    }

    /// Whether two requests came from the same process.
    package func sameProcess(as other: ProcessIdentity) -> Bool {
        thread == other.thread || process == other.process
    }
}
