internal import CLinux
#if canImport(Glibc)
import Glibc
#endif

/// Whether the client a question is for still waits for its answer
/// (the device ends its pinentry when the client leaves:
/// docs/SECRET-SERVICE.md, "Whose an item is"). A question open for nobody
/// would only stand on the person's screen for a program that is gone, or that
/// its person stopped (Ctrl-C).
package enum ClientPresence {
    /// A socket client waits while its end is open: it sends nothing
    /// after its request, so a hang-up (POLLRDHUP, POLLHUP) is its leaving.
    package static func socketOpen(_ fd: BorrowedDescriptor) -> Bool {
        var entry = pollfd(fd: fd.raw, events: CLinux_POLLRDHUP, revents: 0)
        guard (try? valueOrErrno({ poll(&entry, 1, 0) })) != nil else { return false }
        return entry.revents & (CLinux_POLLRDHUP | Int16(POLLHUP) | Int16(POLLERR) | Int16(POLLNVAL)) == 0
    }

    /// A process blocked in a FUSE request cannot leave before its answer
    /// (fs/fuse/dev.c waits it out once the daemon has read the request),
    /// but a signal it would take (Ctrl-C, `kill`) stays pending meanwhile
    /// (`/proc/TID/status`: SigPnd for the thread, ShdPnd for its process,
    /// less those it blocks or ignores): it asked to stop waiting.
    package static func uninterrupted(thread: Int32) -> Bool {
        guard let status = ProgramIdentities.readProcFile(thread, "status", limit: 8 << 10) else { return false }
        guard let own = ProcStatus.mask("SigPnd:", in: status), let shared = ProcStatus.mask("ShdPnd:", in: status),
            let blocked = ProcStatus.mask("SigBlk:", in: status), let ignored = ProcStatus.mask("SigIgn:", in: status)
        else { return false }
        // SIGKILL (bit 8) is neither blockable nor ignorable.
        let kill: UInt64 = 1 << 8
        return (own | shared) & (~(blocked | ignored) | kill) == 0
    }
}
