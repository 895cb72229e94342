import ArgumentParser
import KeychainCore
import KeychainTPM
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct PasscodeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "passcode",
        abstract: "Change, add or remove the keychain's passcode.",
        discussion: """
            Reads the current passcode (an empty line if the keychain has none), then the new one \
            twice (4 characters at least), from the terminal or one per line of standard input. A wrong \
            current passcode counts as a failed unlock. Works through the running device, or on the \
            keychain directly when no device holds it.
            """
    )

    @OptionGroup var options: KeychainOptions

    @Flag(name: .long, help: "Remove the passcode: unlocking needs none from then on.")
    var remove = false

    @Flag(
        name: .customLong("tpm"),
        help: "Seal a keychain kept in a file to the TPM (asks for the current passcode only; prints a recovery key).")
    var sealToTPM = false

    func run() throws {
        let place = options.place
        try place.requireExisting()
        if sealToTPM { return try moveToTPM(place) }
        guard let current = Passcode.read(prompt: "Current passcode (empty if none): ") else {
            throw fail("no current passcode given (an empty line if the keychain has none)")
        }
        let old = current.count > 0 ? current : nil
        let new =
            remove
            ? nil
            : try Passcode.readNew(
                prompt: "New passcode: ",
                missing: "no new passcode given; type one, or use --remove to remove the passcode")
        if let refused = try Self.change(at: place, from: old, to: new) {
            throw fail(
                Self.explain(refused.error, retryAfter: refused.retryAfter), status: ExitStatus.of(refused.error))
        }
        print(remove ? "removed the passcode" : "changed the passcode")
    }

    /// Changes the passcode of the keychain at `place` through its running
    /// device, or on the keychain directly when none holds it; the core
    /// error that refused it (nil: changed), and for a keychain opened here
    /// the seconds a lockout has left.
    static func change(
        at place: KeychainPlace, from old: SecureBytes?, to new: SecureBytes?
    ) throws -> (error: KeychainError, retryAfter: Int64?)? {
        let outcome = try RunningDevice(listeningAt: try place.socketPath()).outcome(
            .changePasscode(old: old, new: new))
        switch outcome {
        case .success?:
            return nil
        case .failure(.keychain(let error, _))?:
            return (error, nil)
        case .failure(.system)?, .failure(.unexpected)?:
            throw DeviceAccess.failure(outcome, about: .action("the passcode was not changed"))
        case nil:
            // No device holds the keychain: change it directly.
            guard case .directory(let keychain) = place else {
                throw fail("the keychainfs service went away", status: ExitStatus.noDevice)
            }
            let device = try DeviceAccess.openDirectly(keychain)
            // The log's newest line is anchored in the keychain, as a device anchors it when it stops.
            defer { device.shutDown() }
            do {
                try device.changePasscode(from: old, to: new)
                return nil
            } catch {
                return (error, device.status.retryAfter)
            }
        }
    }

    /// `--tpm`: done on the keychain directly, so that no device holds it.
    private func moveToTPM(_ place: KeychainPlace) throws {
        guard case .directory(let keychain) = place else {
            throw fail(
                "the keychainfs service seals the keychains it creates when its account reaches a TPM; "
                    + "a keychain of the service is moved by recreating it (backup, init, restore)")
        }
        try place.requireExisting()
        guard let current = Passcode.read(prompt: "Current passcode (empty if none): ") else {
            throw fail("no current passcode given (an empty line if the keychain has none)")
        }
        let recovery: RecoveryKey
        do {
            recovery = try Device.moveToTPM(at: keychain, passcode: current.count > 0 ? current : nil)
        } catch .duplicateKeychain {
            throw fail("the keychain's keys are sealed by a TPM already; nothing was changed")
        } catch .tpmUnavailable {
            throw fail("no TPM answers ($TPM2TOOLS_TCTI, else /dev/tpmrm0); nothing was changed")
        } catch .keychainInUse {
            throw fail(KeychainDirectory.heldByADevice)
        } catch {
            throw fail(Self.explain(error, retryAfter: nil), status: ExitStatus.of(error))
        }
        print("sealed the keychain to the TPM, with new keys: a copy of its files from before opens nothing of it")
        RecoveryKeyNotice.show(recovery, of: keychain)
    }

    private static func explain(_ error: KeychainError, retryAfter: Int64?) -> String {
        guard error == .authFailed else { return "the passcode was not changed: \(error)" }
        if let retryAfter, retryAfter > 0 {
            return "the current passcode is wrong, or too many were; try again in \(retryAfter) more seconds"
        }
        return "the current passcode is wrong (or wrong passcodes have locked changes out for now); nothing was changed"
    }
}
