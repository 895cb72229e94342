extension KeychainDirectory {
    /// A sentence a user can act on for a core error met while opening this keychain.
    public func sentence(for error: KeychainError) -> String {
        let keychain = self
        switch error {
        case .insecurePermissions:
            return "refusing to use the keychain: " + (keychain.permissionProblem() ?? "its permissions changed; check them")
        case .noSuchKeychain:
            return "no keychain at \(keychain.path); create one with `keychainfs init --keychain \(keychain.path)`"
        case .keychainInUse:
            return "another process holds the keychain at \(keychain.path), but does not answer on its socket "
                + "(was XDG_RUNTIME_DIR different when it started?); unmount its mounts or stop that process"
        case .decode:
            return "the keychain at \(keychain.path) failed its integrity check: it was damaged or altered outside "
                + "keychainfs (a row rolled back, removed or edited), or its device secret does not belong to it; "
                + "restore it from a backup"
        default:
            return "cannot open the keychain at \(keychain.path): \(error)"
        }
    }
}
