/// How much a keychain may hold: the service's share of one user
/// (docs/SECURITY.md, "Service mode under attack"), so that one user's
/// writes cannot fill the service's disk for everyone.
public struct StoreQuota: Sendable, Equatable {
    /// Items, in every group.
    public var items: Int
    /// Bytes of sealed values and details.
    public var bytes: Int

    public init(items: Int, bytes: Int) {
        self.items = items
        self.bytes = bytes
    }
}
