import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// `fuse_file_info.fh` values: an object kept alive (retained) from the open
/// that hands it to the kernel until the release that takes it back. Every
/// handle handed out is remembered with its type, and a number that is not
/// one of them, or names an object of another type, gives nil: a request
/// is never trusted to bring back a pointer (FuseRequestCheck).
enum FuseHandle {
    private static let live = Mutex<[UInt64: ObjectIdentifier]>([:])

    /// Retains `object` and returns the number the kernel will hand back.
    static func make(_ object: AnyObject) -> UInt64 {
        let handle = UInt64(UInt(bitPattern: Unmanaged.passRetained(object).toOpaque()))
        live.withLock { $0[handle] = ObjectIdentifier(type(of: object)) }
        return handle
    }

    /// The object behind a handle, still owned by the handle.
    static func object<T: AnyObject>(_ handle: UInt64, as type: T.Type) -> T? {
        guard live.withLock({ $0[handle] == ObjectIdentifier(type) }),
            let raw = UnsafeRawPointer(bitPattern: UInt(handle))
        else { return nil }
        return Unmanaged<T>.fromOpaque(raw).takeUnretainedValue()
    }

    /// Ends the handle: the object is released once the caller drops it.
    @discardableResult
    static func take<T: AnyObject>(_ handle: UInt64, as type: T.Type) -> T? {
        guard live.withLock({ $0[handle] == ObjectIdentifier(type) ? $0.removeValue(forKey: handle) : nil }) != nil,
            let raw = UnsafeRawPointer(bitPattern: UInt(handle))
        else { return nil }
        return Unmanaged<T>.fromOpaque(raw).takeRetainedValue()
    }
}
