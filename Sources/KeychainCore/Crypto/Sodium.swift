internal import CSodium

/// libsodium's one-time initialisation.
package enum Sodium {
    private static let initialized: Bool = sodium_init() >= 0

    package static func ensureInitialized() {
        precondition(initialized, "libsodium failed to initialise")
    }
}
