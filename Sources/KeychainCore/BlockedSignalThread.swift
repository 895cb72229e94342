#if canImport(Glibc)
import Glibc
#endif

/// Starts a thread running `body` with every signal blocked; nil if no
/// thread can be made. The caller joins or detaches it.
///
/// A thread inherits its creator's signal mask: a helper that may be started
/// before the device routes SIGTERM to its signalfd must never be the
/// thread a signal kills the process through.
func startThreadWithSignalsBlocked(_ body: @escaping @Sendable () -> Void) -> pthread_t? {
    final class Box {
        let body: @Sendable () -> Void
        init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }
    var all = sigset_t()
    var previous = sigset_t()
    sigfillset(&all)
    pthread_sigmask(SIG_SETMASK, &all, &previous)
    defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
    let box = Unmanaged.passRetained(Box(body))
    var thread = pthread_t()
    guard pthread_create(&thread, nil, { raw in
        Unmanaged<Box>.fromOpaque(raw!).takeRetainedValue().body()
        return nil
    }, box.toOpaque()) == 0 else {
        box.release()
        return nil
    }
    return thread
}
