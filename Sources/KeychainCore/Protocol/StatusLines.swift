extension DeviceStatus {
    /// The lock, lockout and auto-lock as `key: value` lines, the first
    /// lines of every view of the status: the `.control` file and
    /// `keychainfs status` both start with these, built here once (issue 40:
    /// they were written twice, and drifted). `afterFirstUnlock` goes right
    /// after `first-unlock` (a mount's `accessmode` and `migrate`).
    public func lines(afterFirstUnlock extra: [String] = []) -> [String] {
        var lines =
            [
                "state: \(isLocked ? "locked" : "unlocked")",
                "first-unlock: \(hasUnlockedSinceBoot ? "yes" : "no")"
            ] + extra + [
                "passcode: \(hasPasscode ? "yes" : "no")",
                "failed-attempts: \(failedAttempts)"
            ]
        if retryAfter > 0 { lines.append("retry-after: \(retryAfter)") }
        lines += ["autolock: \(autoLockAfter)", "autolock-grace: \(autoLockGrace)"]
        return lines
    }
}
