import ArgumentParser
import KeychainCore
import KeychainTPM
#if canImport(Glibc)
import Glibc
#endif

struct InitCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract: "Create a keychain.",
        discussion: """
            The passcode (4 characters at least) is read twice, from the terminal or as two lines of standard \
            input. When a TPM 2.0 answers ($TPM2TOOLS_TCTI, else /dev/tpmrm0), the keychain's keys are sealed \
            by it: a copy of its files opens nowhere else, every passcode guess goes through the TPM and its \
            lockout, and an older copy put back is refused. A recovery key is then printed, once: keep it \
            apart from the machine; `keychainfs recover` needs it after a TPM clear or a move to another machine.
            """
    )

    @OptionGroup var options: KeychainOptions

    @Flag(name: .long, help: "Create a keychain that unlocks without a passcode.")
    var noPasscode = false

    @Flag(name: .customLong("no-tpm"), help: "Keep the device secret in a file even when a TPM answers.")
    var noTPM = false

    @Flag(
        name: .customLong("tpm"), help: "Seal the keys to the TPM, and fail when none answers (default: when one does)."
    )
    var requireTPM = false

    func run() throws {
        let place = options.place
        guard case .directory(let directory) = place else { return try createInService(place) }
        if directory.exists {
            throw fail("a keychain already exists at \(directory.path)")
        }
        let passcode = try newPasscode()
        let recovery: RecoveryKey?
        do {
            recovery = try Device.createKeychain(at: directory, passcode: passcode, tpm: tpmChoice)
        } catch .io {
            // The core has just said which path failed, and why.
            throw fail("no keychain was created at \(directory.path)")
        } catch .tpmUnavailable where requireTPM {
            throw fail("no keychain was created: no TPM answers (--tpm); leave it out to keep the keys in a file")
        } catch .tpmUnavailable {
            // Only a TPM that was named ($TPM2TOOLS_TCTI) is missed this way.
            throw fail(
                "no keychain was created: no TPM answers at $TPM2TOOLS_TCTI "
                    + "(\(TrustedPlatformModule.configuredTCTI ?? "")); unset it for the default TPM, or keep the "
                    + "keys in a file with --no-tpm")
        } catch {
            throw fail("cannot create the keychain at \(directory.path): \(error)")
        }
        print("created a keychain at \(directory.path)")
        RecoveryKeyNotice.show(recovery, of: directory, declined: noTPM)
        // At a terminal the person just typed the passcode twice: the new keychain is open, as a
        // new keyring is (gnome-keyring, macOS). From a script (passcodes on a pipe) it stays
        // locked, as before: the script says when it unlocks (docs/FILESYSTEM.md, the command line).
        if isatty(0) == 1 {
            try RunningDevice(place).call(
                .unlock(passcode: passcode), about: .action("the keychain was created, but not unlocked"))
            print("unlocked: its device holds the keys until `keychainfs lock`, `keychainfs stop` or the auto-lock")
        }
    }

    /// The passcode the new keychain gets, typed twice (nil: --no-passcode).
    private func newPasscode() throws -> SecureBytes? {
        guard !noPasscode else { return nil }
        return try Passcode.readNew(
            prompt: "New passcode: ",
            missing: "no passcode given; type one, or use --no-passcode for a keychain without one")
    }

    private var tpmChoice: TPMChoice { noTPM ? .declined : requireTPM ? .required : .whenPresent }

    /// Service mode: the service creates the keychain in its state directory.
    private func createInService(_ place: KeychainPlace) throws {
        try place.requireExisting()
        let passcode = try newPasscode()
        let device = RunningDevice(listeningAt: try place.socketPath())
        let created = try device.call(.create(passcode: passcode), about: .action("no keychain was created"))
        print("created \(place.name)")
        if let key = created.recoveryKey {
            RecoveryKeyNotice.show(formatted: key)
        } else {
            RecoveryKeyNotice.show(formatted: nil)
        }
    }
}

/// What `init`, `passcode --tpm` and `recover` say about how the keys are
/// kept, with the recovery key shown once when a TPM sealed them.
enum RecoveryKeyNotice {
    /// `declined`: the user asked for a file (--no-tpm); otherwise a
    /// keychain without a TPM says why there was none.
    /// `keychain`: the keychain the key is of, which says whether its TPM
    /// is reached directly or through the keychainfs service (docs/FORMAT.md,
    /// "The TPM through the service").
    static func show(_ recovery: RecoveryKey?, of keychain: KeychainDirectory, declined: Bool = true) {
        show(
            formatted: recovery?.formatted(),
            throughService: (try? keychain.keyProtection()) == .tpm2Service)
        if recovery == nil, !declined { print("no TPM: \(KeyProtection.whyNoTPM())") }
    }

    static func show(formatted key: SecureBytes?, throughService: Bool = false) {
        guard let key else {
            print(
                "key protection: file (no TPM sealed the keys: a copy of the keychain's files can be guessed at "
                    + "offline; choose a long passcode)")
            return
        }
        if throughService {
            print(
                "key protection: tpm2-service (the keys are sealed by the TPM the keychainfs service reaches for "
                    + "you, bound to your uid: \(KeyProtection.whyNotYours()))")
        } else {
            print("key protection: tpm2 (the keys are sealed by this machine's TPM)")
        }
        print(
            "recovery key (shown once; keep it apart from this machine, `keychainfs recover` needs it "
                + "after a TPM clear or on another machine):")
        // Straight to standard output: never through a String the heap
        // keeps (after what print buffered).
        fflush(nil)
        key.withUnsafeBytes { _ = try? BorrowedDescriptor.standardOutput.writeAll($0) }
        _ = try? BorrowedDescriptor.standardOutput.writeAll([UInt8(ascii: "\n")])
    }
}
