#if canImport(Glibc)
import Glibc
#endif

/// `fuse_file_info.fh` values: an object kept alive (retained) from the open
/// that hands it to the kernel until the release that takes it back.
enum FileHandle {
    /// Retains `object` and returns the number the kernel will hand back.
    static func make(_ object: AnyObject) -> UInt64 {
        UInt64(UInt(bitPattern: Unmanaged.passRetained(object).toOpaque()))
    }

    /// The object behind a handle, still owned by the handle.
    static func object<T: AnyObject>(_ handle: UInt64, as type: T.Type) -> T? {
        guard let raw = UnsafeRawPointer(bitPattern: UInt(handle)) else { return nil }
        return Unmanaged<T>.fromOpaque(raw).takeUnretainedValue()
    }

    /// Ends the handle: the object is released once the caller drops it.
    @discardableResult
    static func take<T: AnyObject>(_ handle: UInt64, as type: T.Type) -> T? {
        guard let raw = UnsafeRawPointer(bitPattern: UInt(handle)) else { return nil }
        return Unmanaged<T>.fromOpaque(raw).takeRetainedValue()
    }
}

/// Starts a pthread running `body`; the caller joins or detaches it. Used for
/// the libfuse loops and the socket server, which inherit the signal mask of
/// the thread that starts them (no Foundation in the device process).
func startThread(_ body: @escaping @Sendable () -> Void) -> pthread_t? {
    final class Box { let body: @Sendable () -> Void; init(_ body: @escaping @Sendable () -> Void) { self.body = body } }
    let box = Unmanaged.passRetained(Box(body))
    var thread = pthread_t()
    let started = pthread_create(&thread, nil, { raw in
        Unmanaged<Box>.fromOpaque(raw!).takeRetainedValue().body()
        return nil
    }, box.toOpaque())
    guard started == 0 else {
        box.release()
        return nil
    }
    return thread
}
