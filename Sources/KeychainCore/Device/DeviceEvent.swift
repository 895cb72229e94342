/// What the device reports about itself (the `.control` status).
public struct DeviceStatus: Sendable, Equatable {
    /// Whether the `whenUnlocked` class keys are absent.
    public var isLocked: Bool
    /// Whether the device has been unlocked since it booted (`afterFirstUnlock` keys present).
    public var hasUnlockedSinceBoot: Bool
    /// Seconds until the next unlock attempt is allowed; 0 when none is pending.
    public var retryAfter: Int64
    /// Consecutive wrong passcodes.
    public var failedAttempts: UInt64
    /// Whether unlocking needs a passcode.
    public var hasPasscode: Bool
    /// Seconds without an item access before the device locks itself (0: never).
    public var autoLockAfter: Int = 0
    /// Seconds between `will-lock` and an auto-lock.
    public var autoLockGrace: Int = 0
    /// How the keys are kept (docs/SECURITY.md, "Keys sealed by the TPM");
    /// asked of the TPM, so filled in only where a status is shown (the
    /// `status` request, `.control`).
    public var keyProtection: KeyProtectionStatus?
    /// Who decides at the device (docs/SECRET-SERVICE.md, "The device's
    /// judge"): filled in where a status is shown, beside ``keyProtection``.
    public var judge: DeviceJudge?
    /// The process serving the keychain: filled in where a status is shown.
    public var serving: ServingFacts?
}

extension DeviceStatus {
    /// The lock and lockout alone, as the protocol's first fields carry them.
    package init(
        isLocked: Bool, hasUnlockedSinceBoot: Bool, retryAfter: Int64, failedAttempts: UInt64, hasPasscode: Bool,
        autoLockAfter: Int, autoLockGrace: Int
    ) {
        self.isLocked = isLocked
        self.hasUnlockedSinceBoot = hasUnlockedSinceBoot
        self.retryAfter = retryAfter
        self.failedAttempts = failedAttempts
        self.hasPasscode = hasPasscode
        self.autoLockAfter = autoLockAfter
        self.autoLockGrace = autoLockGrace
    }
}

/// A change of the device's lock state or of its items, for observers
/// (cache purge, open files, the kernel caches of the mounts).
public enum DeviceEvent: Sendable, Equatable {
    case locked
    case unlocked
    /// A committed change of the store (never a value).
    case changed(ItemChange)
    /// A group's entitlement policy was granted, changed or removed.
    case entitlementsChanged(group: String)
    /// The device locks in `grace` seconds (iOS
    /// `UIApplicationProtectedDataWillBecomeUnavailable`): purge copies now.
    case willLock(grace: Int)
}

/// What a committed transaction changed in the store: names only.
public enum ItemChange: Sendable, Equatable {
    /// Created, rewritten, reverted or given another class.
    case written(group: String, identifier: String)
    case removed(group: String, identifier: String)
    /// An item at `to` is replaced by it.
    case renamed(group: String, from: String, to: String)
    case groupCreated(String)
    case groupRemoved(String)
}
