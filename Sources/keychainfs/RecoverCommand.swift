import ArgumentParser
import KeychainCore
import KeychainTPM
#if canImport(Glibc)
import Glibc
#endif

struct RecoverCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "recover",
        abstract: "Open a TPM-sealed keychain with its recovery key, or accept an older copy put back on purpose.",
        discussion: """
            Without options: reads the recovery key that `init` printed (dashes and case do not matter), then \
            a new passcode twice, and seals the keychain to the TPM that answers now (after a TPM clear, a new \
            motherboard, or on another machine), or keeps it in a file with --no-tpm, with new keys: a new \
            recovery key is printed, and the old one (or a copy of the files from before) opens nothing of it. With --accept-rollback: reads the passcode and accepts the keychain's files as they are, \
            after an older copy was put back on purpose (a file-level backup restored); the TPM refuses such a \
            copy otherwise. Both work on the keychain directly: no device may hold it.
            """
    )

    @OptionGroup var options: KeychainOptions

    @Flag(name: .customLong("no-tpm"), help: "Keep the recovered keychain's device secret in a file.")
    var noTPM = false

    @Flag(name: .long, help: "The recovered keychain unlocks without a passcode.")
    var noPasscode = false

    @Flag(
        name: .customLong("accept-rollback"), help: "Accept an older copy of the keychain's files put back on purpose.")
    var acceptRollback = false

    func run() throws {
        guard case .directory(let keychain) = options.place else {
            throw fail("recover works on a keychain directory (--keychain), not on the service's keychains")
        }
        try options.place.requireExisting()
        if acceptRollback { return try accept(keychain) }
        guard let typed = Passcode.read(prompt: "Recovery key: ") else { throw fail("no recovery key given") }
        guard let recoveryKey = RecoveryKey(typed: typed) else {
            throw fail(
                "that is not a recovery key: 64 letters of cbdefghijklnrtuv, in groups of 8; nothing was changed")
        }
        let passcode =
            noPasscode
            ? nil
            : try Passcode.readNew(
                prompt: "New passcode: ", missing: "no new passcode given; type one, or use --no-passcode")
        var recovered: RecoveryKey?
        try directly(
            on: keychain, wrong: "that is not this keychain's recovery key; nothing was changed",
            notApplicable: "the keychain at \(keychain.path) has no recovery key (its keys were never sealed by a TPM)"
        ) {
            () throws(KeychainError) in
            recovered = try Device.recover(
                at: keychain, recoveryKey: recoveryKey, newPasscode: passcode, tpm: noTPM ? .declined : .whenPresent)
        }
        print("recovered the keychain at \(keychain.path), with new keys: the old recovery key opens nothing of it now")
        RecoveryKeyNotice.show(recovered, of: keychain)
    }

    private func accept(_ keychain: KeychainDirectory) throws {
        guard let typed = Passcode.read(prompt: "Passcode (empty if none): ") else { throw fail("no passcode given") }
        try directly(
            on: keychain, wrong: "the passcode is wrong; nothing was changed",
            notApplicable: "the keychain at \(keychain.path) is not behind its TPM counter; nothing was changed"
        ) {
            () throws(KeychainError) in
            try Device.acceptRollback(at: keychain, passcode: typed.count > 0 ? typed : nil)
        }
        print("accepted the keychain at \(keychain.path) as it is now")
    }

    /// A change made on the keychain directly (no device may hold it), its
    /// refusals said: a wrong secret, a keychain it does not apply to, a device that holds it.
    private func directly(
        on keychain: KeychainDirectory, wrong: String, notApplicable: String,
        _ body: () throws(KeychainError) -> Void
    ) throws {
        do {
            try body()
        } catch .authFailed {
            throw fail(wrong, status: ExitStatus.of(.authFailed))
        } catch .badRequest {
            throw fail(notApplicable)
        } catch .keychainInUse {
            throw fail(KeychainDirectory.heldByADevice)
        } catch {
            throw fail(keychain.sentence(for: error))
        }
    }
}
