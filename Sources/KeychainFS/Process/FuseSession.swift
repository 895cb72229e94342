internal import CFuse
import Synchronization

/// A libfuse session pointer and the retained object its callbacks reach
/// through the userdata (a mount's ``FileSystem``, an edit's scratch
/// files): torn down once, by whoever gets there first.
final class FuseSession<Userdata: AnyObject>: @unchecked Sendable {
    // Used only by the loop thread after init, and torn down once.
    let raw: OpaquePointer
    private let userdata: Unmanaged<Userdata>
    private let tornDown = Mutex(false)

    init(_ raw: OpaquePointer, userdata: Unmanaged<Userdata>) {
        self.raw = raw
        self.userdata = userdata
    }

    /// Runs `body` with the session unless it was torn down (and keeps it from being torn down meanwhile).
    func whileLive(_ body: (OpaquePointer) -> Void) {
        tornDown.withLock { done in
            if !done { body(raw) }
        }
    }

    func tearDown() {
        let first = tornDown.withLock { done in
            defer { done = true }
            return !done
        }
        guard first else { return }
        // After the kernel ended the connection this only closes /dev/fuse
        // (fuse_kern_unmount sees POLLERR and returns).
        fuse_session_unmount(raw)
        fuse_session_destroy(raw)
        userdata.release()
    }
}
