import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The desktop session as the device's lock screen (docs/FILESYSTEM.md,
/// "`.control`"): when the session locks, the keychain locks after the
/// auto-lock grace, as iOS drops the class keys about 10 seconds after its
/// screen locks; when the session unlocks within the grace, the keys stay (the
/// keychain is never unlocked by it: that takes the passcode).
extension Device {
    /// The longest a session's lock waits: iOS's 10 seconds. The auto-lock
    /// grace is any program of the user's to set (`keychainfs autolock 0
    /// --grace 7d`, no passcode asked), and it kept the keychain unlocked
    /// for days behind a locked screen (docs/SECURITY.md, "The login
    /// password and the session"); it may make the wait shorter, never longer.
    public static let maximumSessionGrace = 10

    /// Locks after `grace` seconds (the auto-lock grace when nil, at most
    /// ``maximumSessionGrace``), unless ``cancelSessionLock()`` comes first;
    /// observers get ``DeviceEvent/willLock(grace:)`` now. `reason` goes to
    /// the audit log.
    public func lockForSession(reason: String, grace: Int? = nil) {
        guard !isLocked else { return }
        let grace = min(grace ?? autoLock.grace, Self.maximumSessionGrace)
        let generation = sessionLockGeneration.add(1, ordering: .acquiringAndReleasing).newValue
        notify(.willLock(grace: grace))
        guard grace > 0 else { return finishSessionLock(generation, reason: reason) }
        let started = Threads.start(blockingSignals: true) { [weak self] in
            var left = timespec(tv_sec: grace, tv_nsec: 0)
            var rest = timespec()
            while nanosleep(&left, &rest) != 0 && Errno.current.rawValue == EINTR { left = rest }
            self?.finishSessionLock(generation, reason: reason)
        }
        if let started {
            pthread_detach(started)
        } else {
            // No thread: lock now rather than not at all.
            finishSessionLock(generation, reason: reason)
        }
    }

    /// The session unlocked within the grace: the pending lock is not made.
    public func cancelSessionLock() {
        sessionLockGeneration.add(1, ordering: .acquiringAndReleasing)
    }

    private func finishSessionLock(_ generation: UInt64, reason: String) {
        guard sessionLockGeneration.load(ordering: .acquiring) == generation, !isLocked else { return }
        lockNow(by: nil, detail: reason)
    }
}
