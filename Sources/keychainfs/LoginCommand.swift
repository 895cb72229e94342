import ArgumentParser
import KeychainCore
import KeychainProtocol
#if canImport(Glibc)
import Glibc
#endif

/// Whether the login password unlocks this user's keychain (docs/DESKTOP.md,
/// "Unlocked at login"): the user's choice, kept in
/// `~/.config/keychainfs/login` (the account's home, not `$HOME` or
/// `$XDG_CONFIG_HOME`: pam_keychainfs runs the hook before the session's
/// environment exists). The first line is `on` or `off`; an `off` the
/// hook chose says why on the lines after it.
///
/// It is off until the user turns it on, because a login password that is
/// not the passcode would otherwise be tried at every login, and each try
/// is a wrong passcode that counts toward the lockout (and the TPM's).
/// Turned on, the first time the login password does not unlock the
/// keychain turns it off again: one wrong try, never one per login.
enum LoginUnlock {
    static var path: String {
        let home = getpwuid(getuid()).map { String(cString: $0.pointee.pw_dir) } ?? "/"
        return home + "/.config/keychainfs/login"
    }

    /// Whether it is on, and why the hook turned it off (nil: the user did, or never turned it on).
    static func read() -> (isOn: Bool, why: String?) {
        guard let text = TextFile.read(path) else { return (false, nil) }
        let lines = text.split(separator: "\n").map(String.init)
        return (lines.first == "on", lines.count > 1 ? lines[1] : nil)
    }

    static func turnOn() throws { try TextFile.write("on\n", to: path) }

    static func turnOff(because why: String? = nil) throws {
        try TextFile.write("off\n" + (why.map { AuditLog.utcTime(time(nil)) + ": " + $0 + "\n" } ?? ""), to: path)
    }
}

/// `keychainfs login enable|disable|status`.
struct LoginCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "login",
        abstract: "Unlock the keychain with the login password, at login and at the screen's unlock (PAM).",
        discussion: """
            With pam_keychainfs in the system's PAM stacks (`pam-auth-update --enable keychainfs`), the \
            password you log in or unlock the screen with unlocks your keychain, and a change of it \
            (passwd) changes the keychain's passcode. It needs the passcode to be the login password: \
            `keychainfs passcode` makes it so. A login password that does not unlock the keychain turns \
            this off again (one wrong try, never one per login): `login status` says when and why.
            """,
        subcommands: [Enable.self, Disable.self, Status.self])

    struct Enable: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Let the login password unlock this keychain; its passcode must be the login password.")

        func run() throws {
            try KeychainOptions.place(named: nil).requireExisting()
            try LoginUnlock.turnOn()
            print(
                "done: the login password unlocks your keychain, whose passcode must be the same "
                    + "(`keychainfs passcode` makes it so)")
            if !LoginCommand.moduleIsInTheStack {
                print(
                    "note: pam_keychainfs is not in /etc/pam.d/common-auth: `sudo pam-auth-update --enable keychainfs`")
            }
        }
    }

    struct Disable: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "The login password unlocks nothing.")

        func run() throws {
            try LoginUnlock.turnOff()
            print("done: the login password does not unlock your keychain")
        }
    }

    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Whether the login password unlocks this keychain, and why not when it stopped.")

        func run() throws {
            let setting = LoginUnlock.read()
            print("login-unlock: " + (setting.isOn ? "on" : "off"))
            if let why = setting.why { print("turned-off: " + why) }
            print("pam-module: " + (LoginCommand.moduleIsInTheStack ? "in common-auth" : "not in common-auth"))
        }
    }

    /// Whether Debian's shared auth stack has the module (what
    /// `pam-auth-update --enable keychainfs` writes there).
    static var moduleIsInTheStack: Bool {
        TextFile.read("/etc/pam.d/common-auth")?.contains("pam_keychainfs.so") ?? false
    }
}

/// `keychainfs pam-hook unlock|password|password-set`: what pam_keychainfs
/// runs, as the user, with the password on standard input (never argv):
///
/// - `unlock`: the login password; unlocks the keychain when the user
///   turned `login` on, the keychain is locked and no lockout holds.
/// - `password`: `old NUL new` after a change of the login password; the
///   passcode follows when `old` is the passcode.
/// - `password-set`: the password was set without the old one (root's
///   `passwd USER`): the passcode cannot follow.
///
/// Where it cannot do its part it turns `login` off and says why, so that
/// a passcode that is not the login password costs one wrong try. It
/// prints nothing: PAM's caller shows no output of ours.
struct PAMHookCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pam-hook", abstract: "Run by pam_keychainfs (not by hand).", shouldDisplay: false)

    @Argument var mode: String

    func run() throws {
        // Its standard error is /dev/null (PAM's caller shows nothing of ours): why it refused goes to the journal.
        if let journal = JournalStream.open(identifier: "keychainfs") { dup2(journal.raw, 2) }
        guard LoginUnlock.read().isOn else { return }
        // The password goes to a device pam_keychainfs checked as root (the installed program, not
        // traced, nothing preloaded; only root can read that of a device, which makes itself
        // undumpable), or to one this command starts itself: never to whatever listens on the
        // device's socket (docs/SECURITY.md, "The login password and the session", its row "the login password goes only to the device").
        let checked = getenv("KEYCHAINFS_PAM_DEVICES").map { String(cString: $0) } ?? ""
        // Descriptor 3: pam_keychainfs's end that checks, as root, who accepted a connection.
        let verifier =
            getenv("KEYCHAINFS_PAM_VERIFY").map { String(cString: $0) } == "3" ? BorrowedDescriptor(kept: 3) : nil
        if let verifier { _ = fcntl(verifier.raw, F_SETFD, FD_CLOEXEC) }  // no device it starts keeps it
        DevicePeerAdmission.admitOnly(DevicePeerAdmission.CheckedDevice.list(checked), verifier: verifier)
        let place = KeychainOptions.place(named: nil)
        if case .directory(let keychain) = place, !keychain.exists { return }
        switch mode {
        case "unlock": try unlock(place)
        case "password": try follow(place)
        case "password-set":
            try LoginUnlock.turnOff(
                because: "the login password was set without the old one (by root?): the keychain's passcode is "
                    + "still the old password; `keychainfs passcode`, then `keychainfs login enable`")
        default: throw fail("unknown pam-hook mode \(mode)", status: ExitCode(64))
        }
    }

    private func unlock(_ place: KeychainPlace) throws {
        let device = try RunningDevice(place)
        let status = try device.status()
        guard status.isLocked, status.retryAfter == 0 else { return }
        let password = try Self.input()
        let outcome = try device.outcome(.unlock(passcode: status.hasPasscode ? password : nil))
        switch outcome {
        case .success?: return
        case .failure(.keychain(.authFailed, _))?:
            try LoginUnlock.turnOff(
                because: "the login password did not unlock the keychain (its passcode is another); "
                    + "`keychainfs login enable` once they are the same")
            throw ExitCode(ExitStatus.denied.rawValue)
        case .failure?, nil:
            throw DeviceAccess.failure(outcome, about: .action("cannot unlock"))
        }
    }

    private func follow(_ place: KeychainPlace) throws {
        let both = try Self.input()
        let parts = both.withUnsafeBytes { raw -> (SecureBytes, SecureBytes)? in
            guard let split = raw.firstIndex(of: 0) else { return nil }
            guard let old = try? SecureBytes(copying: UnsafeRawBufferPointer(rebasing: raw[..<split])),
                let new = try? SecureBytes(copying: UnsafeRawBufferPointer(rebasing: raw[(split + 1)...]))
            else { return nil }
            return (old, new)
        }
        guard let (old, new) = parts else { throw fail("pam-hook password: no old and new password") }
        guard new.count >= Passcode.minimumLength else {
            return try LoginUnlock.turnOff(
                because: "the new login password is shorter than a passcode may be (\(Passcode.minimumLength)); "
                    + "the keychain's passcode is still the old password")
        }
        guard let refused = try PasscodeCommand.change(at: place, from: old, to: new) else { return }
        try LoginUnlock.turnOff(
            because: "the login password changed, but the keychain's passcode could not follow ("
                + (refused.error == .authFailed ? "the old login password was not the passcode" : "\(refused.error)")
                + "); `keychainfs passcode`, then `keychainfs login enable`")
        throw ExitCode(ExitStatus.of(refused.error).rawValue)
    }

    /// Standard input whole: what the module wrote.
    private static func input() throws -> SecureBytes {
        do {
            return try readSecret(from: .standardInput)
        } catch {
            throw fail("pam-hook: cannot read the password")
        }
    }
}
