internal import CLinux
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// What a descriptor passed with `attach` must be before the device serves
/// it: a `/dev/fuse` file bound to a live, mounted connection, opened in
/// the device's own user namespace. Anything else (a socket pair, a pipe, a
/// regular file, an unmounted `/dev/fuse`) would let its sender write FUSE
/// requests of their own making, naming any uid and pid as the caller, and
/// requests with lengths and counts that libfuse 3.14 trusts (docs/SECURITY.md,
/// "Service mode under attack"). Only the kernel writes to a mounted
/// connection's descriptor.
package enum FuseConnection {
    /// `/dev/fuse`'s device number: character device 10, 229 (the kernel's
    /// Documentation/admin-guide/devices.txt; FUSE_MINOR in fs/fuse/dev.c).
    static let major: UInt64 = 10
    static let minor: UInt64 = 229

    /// Why `descriptor` is not a connection to serve, in a sentence; nil when it is.
    package static func problem(with descriptor: BorrowedDescriptor) -> String? {
        var info = stat()
        guard (try? nothingOrErrno { fstat(descriptor.raw, &info) }) != nil else {
            return "the descriptor passed cannot be examined"
        }
        // glibc's major() and minor() are macros (sys/sysmacros.h).
        let device = UInt64(info.st_rdev)
        let major = ((device >> 8) & 0xfff) | ((device >> 32) & ~0xfff)
        let minor = (device & 0xff) | ((device >> 12) & ~0xff)
        guard info.st_mode & S_IFMT == S_IFCHR, major == Self.major, minor == Self.minor else {
            return "the descriptor passed is not /dev/fuse"
        }
        // Bound to a connection, in our user namespace: a request's uid and
        // pid are then numbers of ours (the kernel maps them into the
        // connection's namespaces, which a mount by another user namespace
        // would have made its own).
        guard let clone = FileDescriptor(open("/dev/fuse", O_RDWR | O_CLOEXEC)) else {
            return "/dev/fuse cannot be opened to check the connection passed"
        }
        let bound = (try? nothingOrErrno { CLinux_fuse_clone(clone.raw, descriptor.raw) }) != nil
        // The clone ends with no request of its own; the connection lives on
        // in the descriptor passed (fuse_dev_release aborts only the last).
        _ = clone.close()
        guard bound else { return "the /dev/fuse descriptor passed is not a mounted FUSE connection of this system" }
        // Still mounted: a connection whose mount went away polls as an error.
        var state = pollfd(fd: descriptor.raw, events: Int16(POLLIN | POLLOUT), revents: 0)
        guard (try? valueOrErrno { Glibc.poll(&state, 1, 0) }) != nil,
            state.revents & Int16(POLLERR | POLLHUP | POLLNVAL) == 0
        else {
            return "the FUSE connection passed has ended (its mount is gone)"
        }
        return nil
    }
}
