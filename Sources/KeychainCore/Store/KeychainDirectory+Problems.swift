#if canImport(Glibc)
import Glibc
#endif

extension KeychainDirectory {
    /// What a change made on a keychain directly says when a device holds it.
    public static let heldByADevice =
        "a device holds the keychain: unmount it (or `keychainfs stop`) first; nothing was changed"

    /// A sentence a user can act on for a core error met while opening this keychain.
    public func sentence(for error: KeychainError) -> String {
        let keychain = self
        if error == .io || error == .decode, let missing = missingPart() { return missing }
        switch error {
        case .insecurePermissions:
            return "refusing to use the keychain: "
                + (keychain.permissionProblem() ?? "its permissions changed; check them")
        case .noSuchKeychain:
            return
                "no keychain at \(keychain.path); create one with `keychainfs init --keychain \(keychain.path.shellWord)`"
        case .keychainInUse:
            return "another process holds the keychain at \(keychain.path), but does not answer on its socket "
                + "(was XDG_RUNTIME_DIR different when it started?); unmount its mounts or stop that process"
        case .decode:
            return "the keychain at \(keychain.path) failed its integrity check: it was damaged or altered outside "
                + "keychainfs (a row rolled back, removed or edited), or its device secret does not belong to it; "
                + "restore it from a backup"
        case .tpmUnavailable:
            return
                "the keychain at \(keychain.path) is sealed by a TPM, and none answers now (absent or busy; $TPM2TOOLS_TCTI, else "
                + "/dev/tpmrm0; the service's account needs the tss group): start it, or open the keychain on its "
                + "machine; `keychainfs recover` opens it elsewhere with its recovery key"
        case .tpmMismatch:
            return "the keychain at \(keychain.path) is sealed by another TPM, by this one before it was cleared, "
                + "or for another user through the keychainfs service: "
                + "`keychainfs recover --keychain \(keychain.path.shellWord)` opens it with its recovery key and seals "
                + "it to this TPM"
        case .rolledBack:
            return
                "the keychain at \(keychain.path) is older than its TPM rollback counter: an older copy of its files "
                + "was put back. If you put it back yourself, `keychainfs recover --accept-rollback --keychain "
                + "\(keychain.path.shellWord)` accepts it with the passcode; otherwise it was tampered with"
        default:
            return "cannot open the keychain at \(keychain.path): \(error)"
        }
    }

    /// A part of the keychain that is gone, said as such: an emptied
    /// database or a missing device secret was reported as a store that
    /// "could not be read or written" or that "failed its integrity check".
    func missingPart() -> String? {
        var info = stat()
        if stat(databasePath, &info) == 0, info.st_size == 0 {
            return "the keychain's database \(databasePath) is empty (0 bytes): it was emptied outside keychainfs; "
                + "restore the keychain from a backup, or put the file back from a copy"
        }
        if access(deviceSecretPath, F_OK) != 0, Errno.current.rawValue == ENOENT {
            return "the keychain's device secret \(deviceSecretPath) is missing: without it nothing in the keychain "
                + "opens; put it back from the copy it came with, or restore the keychain from a backup"
        }
        return nil
    }
}
