#if canImport(Glibc)
import Glibc
#endif

/// `fuse_file_info.fh` values: an object kept alive (retained) from the open
/// that hands it to the kernel until the release that takes it back.
enum FuseHandle {
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
