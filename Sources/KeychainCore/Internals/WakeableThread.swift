import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A detached thread that runs a step each time it is woken or the delay
/// the last step asked for has passed: the auto-lock and the re-protection
/// of idle keys. It sleeps in `poll` on a pipe, so a wake-up is one write
/// and costs nothing while nobody wakes it.
package final class WakeableThread: Sendable {
    /// What a step asks for next.
    package enum Next {
        /// Run again after this many milliseconds, or sooner if woken.
        case after(milliseconds: Int32)
        /// Run again only when woken.
        case whenWoken
        /// End the thread.
        case stop
    }

    private let wakeEnd: FileDescriptor

    /// Starts the thread; nil (logged) if no pipe or thread can be made.
    package init?(_ purpose: String, step: @escaping @Sendable () -> Next) {
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0 else {
            Diagnostics.log("could not start the \(purpose) thread: no pipe")
            return nil
        }
        for end in ends {
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
            _ = fcntl(end, F_SETFL, O_NONBLOCK)  // a wake-up never blocks its caller
        }
        // The thread owns the reading end from its start; this object the writing end.
        let sleepEnd = ends[0]
        guard let wake = FileDescriptor(ends[1]) else { return nil }  // pipe(2) gave it
        guard
            let thread = Threads.start(
                blockingSignals: true,
                {
                    guard let sleeping = FileDescriptor(sleepEnd) else { return }
                    var timeout: Int32 = -1
                    loop: while true {
                        var sleeper = pollfd(fd: sleeping.raw, events: Int16(POLLIN), revents: 0)
                        if poll(&sleeper, 1, timeout) < 0 && Errno.current.rawValue != EINTR { break }
                        // The owner closed its end: nothing will wake this thread again.
                        if sleeper.revents & Int16(POLLHUP) != 0 { break }
                        var drained = (UInt64(0), UInt64(0), UInt64(0), UInt64(0))
                        while read(sleeping.raw, &drained, MemoryLayout.size(ofValue: drained)) > 0 {}
                        switch step() {
                        case .after(let milliseconds): timeout = max(0, milliseconds)
                        case .whenWoken: timeout = -1
                        case .stop: break loop
                        }
                    }
                })
        else {
            _ = FileDescriptor(sleepEnd)?.close()  // the thread never ran: its end is closed here
            Diagnostics.log("could not start the \(purpose) thread")
            return nil
        }
        pthread_detach(thread)
        // Closed with this object: the thread sees the hang-up and ends.
        wakeEnd = wake
    }

    /// Makes the thread run its step now.
    package func wake() {
        var byte: UInt8 = 1
        _ = write(wakeEnd.raw, &byte, 1)
    }
}
