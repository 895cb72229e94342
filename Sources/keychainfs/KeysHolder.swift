import ArgumentParser
import KeychainCore
import KeychainProtocol
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

/// Where a command that needs the class keys does its work: through the
/// running device (which must be unlocked), or on the keychain itself when
/// no device holds it (unlocked here with its passcode, read first).
enum KeysHolder {
    case device(RunningDevice)
    /// The keychain opened here, and the passcode that unlocked it.
    case local(PasswordManager, passcode: SecureBytes?)

    static func find(_ place: KeychainPlace) throws -> KeysHolder {
        guard case .directory(let keychain) = place else {
            try place.requireExisting()
            return .device(RunningDevice(listeningAt: try place.socketPath()))
        }
        try keychain.requireExisting()
        if let device = try RunningDevice.running(place) { return .device(device) }
        let manager = PasswordManager(device: try DeviceAccess.openDirectly(keychain))
        let passcode = manager.localDevice.status.hasPasscode ? Passcode.read(prompt: "Keychain passcode: ") : nil
        do {
            try manager.localDevice.unlock(passcode: passcode)
        } catch {
            throw fail(
                "the keychain's passcode is wrong, or wrong passcodes have locked unlocking out for now",
                status: ExitStatus.denied)
        }
        return .local(manager, passcode: passcode)
    }

    /// The keychain's passcode where a policed group needs it: the one that
    /// unlocked a keychain opened here, or read now (after the backup password)
    /// for a running device; an empty line is "none".
    func passcode(for purpose: String) -> SecureBytes? {
        switch self {
        case .local(_, let passcode): return passcode
        case .device:
            return Passcode.read(prompt: "Keychain passcode (\(purpose)): ").flatMap { $0.count > 0 ? $0 : nil }
        }
    }

    /// Done with the keychain: one opened here anchors its audit log's
    /// newest line (what this command recorded) and folds its write-ahead
    /// log in, as a device does when it stops.
    func finish() {
        if case .local(let manager, _) = self { manager.localDevice.shutDown() }
    }

    /// Whether any group of the keychain has an entitlement policy.
    var hasPolicedGroups: Bool {
        switch self {
        case .local(let manager, _): return manager.localDevice.hasEntitlementPolicies
        case .device(let device):
            guard case .success(let policy)? = try? device.outcome(PolicyCall.policy(group: nil).call) else {
                return false
            }
            return !policy.rows.isEmpty
        }
    }
}

/// A sentence for a failed backup or restore.
func backupExplanation(_ error: KeychainError, file: String) -> String {
    switch error {
    case .authFailed where file.isEmpty:
        return "the keychain's passcode is wrong, or wrong passcodes have locked it out for now"
    case .authFailed:
        return "wrong backup password or keychain passcode (or a damaged file header); nothing was restored"
    case .decode: return "\(file) is damaged, cut short or was altered; nothing was restored"
    case .param: return "\(file) is not a keychainfs backup"
    case .valueTooLarge: return "\(file) is larger than any backup keychainfs reads (1 GiB); nothing was restored"
    case .interactionNotAllowed: return "the keychain is locked: unlock it first (keychainfs unlock MOUNTPOINT)"
    case .missingEntitlement:
        return "a policed group needs the keychain's passcode, and none was given; nothing was changed"
    default: return "\(error)"
    }
}
