import KeychainCore
import KeychainFS

/// What one user may hold of the service at once, so that one user's flood
/// leaves the others served (docs/SECURITY.md, "Service mode under attack").
/// Each limit, when reached, is said in a sentence to the user who reached it;
/// docs/SECURITY.md gives the defaults and why.
public struct ServiceLimits: Sendable {
    /// Socket connections open at once (a request each, or a `watch`).
    public var connectionsPerUser: Int
    /// Mounts (`attach`ed FUSE connections) at once.
    public var mountsPerUser: Int
    /// What one user's keychain may hold: items, and bytes of sealed
    /// values and details.
    public var quota: StoreQuota
    /// The largest backup file one user may restore.
    public var restoreBytes: Int

    public init(
        connectionsPerUser: Int = 32, mountsPerUser: Int = 16,
        quota: StoreQuota = StoreQuota(items: 10_000, bytes: 64 << 20), restoreBytes: Int = 64 << 20
    ) {
        self.connectionsPerUser = connectionsPerUser
        self.mountsPerUser = mountsPerUser
        self.quota = quota
        self.restoreBytes = restoreBytes
    }
}
