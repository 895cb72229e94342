internal import CFuse
import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One FUSE session of a ``FileSystem`` at a mount point, served by libfuse's
/// multi-threaded loop on threads of its own. Ends when the mount goes away
/// (``unmount(lazy:)``, `fusermount3 -u`, `umount`).
public final class FuseMount: Sendable {
    /// The absolute mount point.
    public let mountpoint: String
    /// What is mounted.
    public let fileSystem: FileSystem
    private let session: FuseSession<FileSystem>
    private let loopThread = Mutex<pthread_t?>(nil)

    /// Mounts `fileSystem` at `mountpoint` and starts serving it; `onFinish`
    /// runs on the loop's thread once the session has ended and been torn down.
    /// With `connection`, a `/dev/fuse` descriptor that a client already
    /// mounted at `mountpoint` (fusermount3), serves that instead and owns
    /// it: libfuse takes `/dev/fd/N` for "mounted by the caller"
    /// (fuse_session_mount), closes it when the session ends, and never
    /// unmounts it (the mount is its user's, who unmounts it).
    public init(
        fileSystem: FileSystem, mountpoint: String, connection: consuming FileDescriptor? = nil,
        onFinish: @escaping @Sendable (FuseMount) -> Void
    ) throws(MountError) {
        self.fileSystem = fileSystem
        self.mountpoint = mountpoint
        // Ours (closed on a failure) until libfuse takes it with the mount.
        let attached = connection.raw.map { "/dev/fd/\($0)" }
        var ops = FuseOperations.table()
        let options = "fsname=keychainfs,subtype=keychainfs"
        let strings: [String] = ["keychainfs", "-o", options]
        let arguments = strings.map { strdup($0) }
        defer { arguments.forEach { free($0) } }
        var argv = arguments + [nil]
        let userdata = Unmanaged.passRetained(fileSystem)
        let made = argv.withUnsafeMutableBufferPointer { argv in
            var args = fuse_args(argc: 3, argv: argv.baseAddress, allocated: 0)
            let session = fuse_session_new(&args, &ops, MemoryLayout<fuse_lowlevel_ops>.size, userdata.toOpaque())
            fuse_opt_free_args(&args)
            return session
        }
        guard let made else {
            userdata.release()
            throw MountError("could not create a FUSE session")
        }
        guard fuse_session_mount(made, attached ?? mountpoint) == 0 else {
            fuse_session_destroy(made)
            userdata.release()
            throw MountError("could not mount at \(mountpoint) (is /dev/fuse usable and fusermount3 installed?)")
        }
        _ = connection.take()?.release()  // libfuse closes it when the session ends
        session = FuseSession(made, userdata: userdata)
        fileSystem.kernelCache.attach(session)
        fileSystem.nodes.register(fileSystem.kernelCache)
        guard
            let thread = Threads.start({ [self] in
                serve()
                onFinish(self)
            })
        else {
            fileSystem.nodes.unregister(fileSystem.kernelCache)
            session.tearDown()
            throw MountError("could not start the FUSE loop thread")
        }
        loopThread.withLock { $0 = thread }
    }

    private func serve() {
        FuseSessionLoop(session: session.raw).run()
        fileSystem.nodes.unregister(fileSystem.kernelCache)
        session.tearDown()
    }

    /// Waits for the loop thread to end.
    public func join() {
        guard
            let thread = loopThread.withLock({ value -> pthread_t? in
                defer { value = nil }
                return value
            })
        else { return }
        pthread_join(thread, nil)
    }

    /// Detaches the mount; the loop then ends by itself. A busy mount (open
    /// files) refuses a plain unmount with EBUSY; `lazy` detaches it anyway.
    public func unmount(lazy: Bool) -> Int32 {
        MountTable.unmount(mountpoint, lazy: lazy)
    }
}

/// What could not be mounted, in a sentence for the user.
public struct MountError: Error, CustomStringConvertible {
    /// The sentence.
    public let description: String
    /// An error saying `description`.
    public init(_ description: String) { self.description = description }
}

/// What the kernel of one mount may have cached of the device's names and
/// attributes, and the way to make it forget them. Changes through another
/// mount or the socket, and commits through this one, call it.
package final class KernelCache: Sendable {
    package let scope: FileSystem.MountRoot
    private let session = Mutex<FuseSession<FileSystem>?>(nil)
    /// The inodes this kernel holds, with its reference counts.
    private let known = Mutex<[UInt64: UInt64]>([:])

    init(scope: FileSystem.MountRoot) { self.scope = scope }

    func attach(_ box: FuseSession<FileSystem>) { session.withLock { $0 = box } }

    func took(_ inode: UInt64) { known.withLock { $0[inode, default: 0] += 1 } }

    func dropped(_ inode: UInt64, count: UInt64) {
        known.withLock { known in
            guard let held = known[inode] else { return }
            known[inode] = held > count ? held - count : nil
        }
    }

    /// Forgets every reference; returns them.
    func droppedAll() -> [UInt64: UInt64] {
        known.withLock { known in
            defer { known = [:] }
            return known
        }
    }

    /// Whether this kernel holds the inode (its attributes are then kept
    /// exact by ``forgetAttributes(_:)``).
    func knows(_ inode: UInt64) -> Bool { known.withLock { $0[inode] != nil } }

    /// The kernel re-reads the inode's attributes at its next `stat`. Safe
    /// from inside any request: the kernel takes no lock of the inode for it.
    func forgetAttributes(_ inode: UInt64) {
        session.withLock { $0 }?.whileLive { raw in
            // -ENOENT when the kernel does not know the inode: nothing to do.
            _ = fuse_lowlevel_notify_inval_inode(raw, fuse_ino_t(inode), -1, 0)
        }
    }

    /// The kernel looks the name up again at its next use. The kernel takes
    /// the directory's lock for it: never from a request of this mount (it
    /// would wait for itself), and never while another mount's request can
    /// be waiting for the caller (``NodeTable/forgetNames(_:except:)``).
    func forgetName(_ name: String, inDirectory parent: UInt64) {
        session.withLock { $0 }?.whileLive { raw in
            _ = fuse_lowlevel_notify_inval_entry(raw, fuse_ino_t(parent), name, name.utf8.count)
        }
    }

    /// The directory inode and name under which this mount shows `node`,
    /// if it shows it and the kernel may have looked it up.
    func cachedName(of node: Node, in nodes: NodeTable) -> (parent: UInt64, name: String)? {
        // An item in a folder: the folder's inode, and the name's last part.
        if case .item(let group, let identifier) = node, let slash = identifier.lastIndex(of: "/") {
            guard scope == .keychain || scope == .group(group) else { return nil }
            let folder = Node.folder(group: group, path: String(identifier[..<slash]))
            return nodes.existingInode(for: folder).map { ($0, String(identifier[identifier.index(after: slash)...])) }
        }
        switch (node, scope) {
        case (.item(let group, let identifier), .group(let mounted)) where group == mounted:
            return (NodeTable.rootInode, identifier)
        case (.item(let group, let identifier), .keychain):
            return nodes.existingInode(for: .group(group)).map { ($0, identifier) }
        case (.group(let group), .keychain):
            return (NodeTable.rootInode, group)
        default:
            return nil
        }
    }
}
