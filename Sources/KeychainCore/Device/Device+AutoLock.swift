import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Auto-lock after an idle delay, with a `will-lock` grace.
extension Device {
    /// Locks the device after `seconds` without an item read or write (0:
    /// never), as iOS does after its auto-lock delay: observers get
    /// ``DeviceEvent/willLock(grace:)`` first, then `grace` seconds to purge
    /// their copies, then the lock.
    public func setAutoLock(after seconds: Int, grace: Int) {
        precondition(seconds >= 0 && grace >= 0)
        autoLockSettings.withLock { $0 = (seconds, grace) }
        noteAccess()  // the delay counts from now
        startAutoLockThread()
        wakeAutoLock()
    }

    /// The largest auto-lock delay or grace accepted: a week.
    public static let maximumAutoLockSeconds = 7 * 24 * 3600

    /// An auto-lock duration as `.control`, `keychainfs autolock` and
    /// `mount --autolock` take it: canonical decimal seconds (no sign, no
    /// leading zero), or with a unit `s`, `m`, `h` or `d` (`300`, `5m`,
    /// `1h`), at most ``maximumAutoLockSeconds``; nil for anything else.
    public static func autoLockSeconds<Text: Collection<UInt8>>(_ text: Text) -> Int? {
        let unit: Int? =
            switch text.isEmpty ? 0 : text[text.index(text.startIndex, offsetBy: text.count - 1)] {
            case UInt8(ascii: "s"): 1
            case UInt8(ascii: "m"): 60
            case UInt8(ascii: "h"): 3600
            case UInt8(ascii: "d"): 86400
            default: nil
            }
        let digits = text.prefix(text.count - (unit == nil ? 0 : 1))
        guard !digits.isEmpty, digits.count <= 7,
            digits.allSatisfy({ (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }),
            digits.first != UInt8(ascii: "0") || digits.count == 1
        else { return nil }
        let value = digits.reduce(0) { $0 * 10 + Int($1 - UInt8(ascii: "0")) } * (unit ?? 1)
        return value <= maximumAutoLockSeconds ? value : nil
    }

    /// The auto-lock delay and grace, in seconds.
    public var autoLock: (after: Int, grace: Int) { autoLockSettings.withLock { $0 } }

    func noteAccess() { lastAccess.store(MonotonicClock.milliseconds(), ordering: .relaxed) }

    func wakeAutoLock() {
        autoLockThread.withLock { $0 }?.wake()
    }

    /// One thread per device, started with the first setting: it sleeps
    /// until the idle delay could have passed (or a wake-up), and never
    /// holds the device between waits.
    func startAutoLockThread() {
        autoLockThread.withLock { thread in
            guard thread == nil else { return }
            thread = WakeableThread("auto-lock") { [weak self] in
                guard let device = self else { return .stop }
                return device.autoLockStep()
            }
        }
    }

    /// Locks if the device has been idle long enough; returns when to look again.
    func autoLockStep() -> WakeableThread.Next {
        let (after, grace) = autoLock
        guard after > 0, !isLocked else { return .whenWoken }
        let idle = MonotonicClock.milliseconds() - lastAccess.load(ordering: .relaxed)
        let remaining = Int64(after) * 1000 - idle
        guard remaining <= 0 else { return .after(milliseconds: Int32(clamping: remaining)) }
        notify(.willLock(grace: grace))
        if grace > 0 {
            // The grace is not cut short (iOS locks at its end whatever
            // happens meanwhile); this thread only sleeps through it.
            var left = timespec(tv_sec: grace, tv_nsec: 0)
            var rest = timespec()
            while nanosleep(&left, &rest) != 0 && Errno.current.rawValue == EINTR { left = rest }
        }
        guard autoLock.after > 0, !isLocked else { return .whenWoken }
        lockNow(by: nil, detail: "auto-lock after \(after) s idle")
        return .whenWoken
    }
}
