#if canImport(Glibc)
import Glibc
#endif

/// An `errno` value with a readable name, in the manner of swift-system's
/// `Errno`: what every system call of the project fails with once it went
/// through ``valueOrErrno(retryOnInterrupt:_:)``.
package struct Errno: Error, RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    package let rawValue: Int32

    package init(rawValue: Int32) { self.rawValue = rawValue }
    package init(_ rawValue: Int32) { self.rawValue = rawValue }

    /// The calling thread's `errno` now: read it before any other call.
    /// With ``valueOrErrno(retryOnInterrupt:_:)``, the only reads of
    /// `errno` in the project (./scripts/test refuses any other).
    package static var current: Errno { Errno(errno) }

    /// strerror's sentence ("No such file or directory").
    package var description: String { String(cString: strerror(rawValue)) }

    package static let notPermitted = Errno(EPERM)
    package static let noSuchFile = Errno(ENOENT)
    package static let interrupted = Errno(EINTR)
    package static let ioError = Errno(EIO)
    package static let permissionDenied = Errno(EACCES)
    package static let busy = Errno(EBUSY)
    package static let exists = Errno(EEXIST)
    package static let invalidArgument = Errno(EINVAL)
    package static let fileTooLarge = Errno(EFBIG)
    package static let nameTooLong = Errno(ENAMETOOLONG)
    package static let notEmpty = Errno(ENOTEMPTY)
    package static let stale = Errno(ESTALE)
}

/// Calls a system function that reports failure as -1 and the reason in
/// `errno`: its result, or that reason thrown as an ``Errno``. Interrupted
/// calls (EINTR, signal(7)) are made again unless `retryOnInterrupt` is
/// false. The one place where a return code becomes an error
/// (swift-system's `valueOrErrno`).
@inline(__always)
package func valueOrErrno<I: FixedWidthInteger>(retryOnInterrupt: Bool = true, _ call: () -> I) throws(Errno) -> I {
    while true {
        let result = call()
        if result != -1 { return result }
        let code = errno
        if retryOnInterrupt && code == EINTR { continue }
        throw Errno(code)
    }
}

/// ``valueOrErrno(retryOnInterrupt:_:)`` for calls that return 0 on success.
@inline(__always)
package func nothingOrErrno<I: FixedWidthInteger>(retryOnInterrupt: Bool = true, _ call: () -> I) throws(Errno) {
    _ = try valueOrErrno(retryOnInterrupt: retryOnInterrupt, call)
}

/// mkdir(2) content with a directory there already (EEXIST): every "create
/// it unless it is there" of the project, with the reason when it is not.
package func makeDirectoryUnlessPresent(_ path: String, mode: mode_t) throws(Errno) {
    do {
        try nothingOrErrno { mkdir(path, mode) }
    } catch  where error == .exists {
        return
    }
}
