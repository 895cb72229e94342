internal import CLinux
import KeychainCore
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

/// A FUSE mount made by its user, for a device of another account (the
/// service) to serve: fusermount3, setuid root, mounts on the user's own
/// directory and hands back the `/dev/fuse` descriptor over the socket
/// named by `_FUSE_COMMFD`, as it does for libfuse (fuse_mount_fusermount).
/// The mount is the user's (`user_id=` is theirs): only they can use and
/// unmount it, wherever the device runs.
public enum UserMount {
    /// Mounts an empty FUSE connection at `mountpoint` (absolute) and
    /// returns its descriptor; the caller passes it to the device.
    public static func mount(at mountpoint: String) throws(MountError) -> FileDescriptor {
        if let problem = MountTable.emptyDirectoryProblem(mountpoint) { throw MountError(problem) }
        var ends: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &ends) == 0,
            let ours = FileDescriptor(ends[0]), let theirs = FileDescriptor(ends[1])
        else { throw MountError("cannot create a socket pair: \(Errno.current.description)") }
        var options = Spawn.Options()
        options.descriptors = [(3, theirs.raw)]
        options.environment = ["_FUSE_COMMFD=3", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
        let child = Spawn.start(
            [MountTable.fusermount, "-o", "fsname=keychainfs,subtype=keychainfs", "--", mountpoint],
            options: options)
        _ = theirs.close()  // fusermount3's copy alone
        guard let child else { throw MountError("cannot run \(MountTable.fusermount) (is fuse3 installed?)") }
        var byte: UInt8 = 0, sender: Int32 = 0, received: Int32 = -1
        _ = try? valueOrErrno { CLinux_receive_with_sender(ours.raw, &byte, 1, &sender, &received) }
        let connection = FileDescriptor(received)
        let status = Spawn.wait(child)
        guard status == 0, let connection else {
            throw MountError("fusermount3 could not mount at \(mountpoint) (exit status \(status))")
        }
        return connection
    }
}
