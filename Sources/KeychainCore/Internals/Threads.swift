#if canImport(Glibc)
import Glibc
#endif

/// The one place the project starts a thread (pthreads: the device process
/// links no Foundation).
package enum Threads {
    /// Starts a thread running `body`; the caller joins or detaches it. Nil
    /// if none can be made.
    ///
    /// `blockingSignals`: the thread starts with every signal blocked. A
    /// thread inherits its creator's mask, and a helper that may be started
    /// before the device routes SIGTERM to its signalfd must never be the
    /// thread a signal kills the process through. Without it the thread
    /// inherits the caller's mask (the libfuse loops, the socket server).
    ///
    /// `stack`: run on this memory instead of a stack of pthread's (see
    /// ``SecretThread``).
    package static func start(
        blockingSignals: Bool = false, stack: UnsafeMutableRawBufferPointer? = nil,
        _ body: @escaping @Sendable () -> Void
    ) -> pthread_t? {
        var previous = sigset_t()
        if blockingSignals {
            var all = sigset_t()
            sigfillset(&all)
            pthread_sigmask(SIG_SETMASK, &all, &previous)
        }
        defer { if blockingSignals { pthread_sigmask(SIG_SETMASK, &previous, nil) } }
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        defer { pthread_attr_destroy(&attributes) }
        if let stack, pthread_attr_setstack(&attributes, stack.baseAddress, stack.count) != 0 { return nil }
        let box = Unmanaged.passRetained(Body(body))
        var thread = pthread_t()
        guard
            pthread_create(
                &thread, &attributes,
                { raw in
                    Unmanaged<Body>.fromOpaque(raw!).takeRetainedValue().run()
                    return nil
                }, box.toOpaque()) == 0
        else {
            box.release()
            return nil
        }
        return thread
    }

    private final class Body {
        let run: @Sendable () -> Void
        init(_ run: @escaping @Sendable () -> Void) { self.run = run }
    }
}

/// CLOCK_MONOTONIC: intervals that no change of the wall clock disturbs
/// (auto-lock, idle keys, caches kept for a while).
package enum MonotonicClock {
    /// Milliseconds since an arbitrary point (boot).
    package static func milliseconds() -> Int64 {
        let now = timespec.monotonic()
        return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
    }

    /// Seconds since an arbitrary point (boot), with the fraction.
    package static func seconds() -> Double {
        let now = timespec.monotonic()
        return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
    }
}

private extension timespec {
    static func monotonic() -> timespec {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return now
    }
}
