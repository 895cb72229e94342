import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct UnlockCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unlock",
        abstract: "Unlock the device; the passcode is read from the terminal or one line of standard input."
    )

    @OptionGroup var target: MountpointOrKeychain

    func run() throws {
        try unlock(try target.mount?.device() ?? target.device())
    }

    /// A wrong passcode, through a mount or the socket alike: denied, and
    /// how long unlocking is refused when this one began a lockout.
    private static func wrongPasscode(retryAfter: Int64?) -> ExitCode {
        guard let retryAfter, retryAfter > 0 else {
            return fail("not unlocked: wrong passcode", status: ExitStatus.denied)
        }
        return fail(
            "not unlocked: wrong passcode; after repeated failures unlocking is refused for \(retryAfter) more seconds",
            status: ExitStatus.denied)
    }

    /// Asked during a lockout: the device would refuse any passcode
    /// without trying it, so none is asked for, and none is called wrong.
    private static func lockedOut(_ retryAfter: Int64) -> ExitCode {
        fail(
            "not unlocked: unlocking is locked out for \(retryAfter) more seconds after repeated wrong passcodes; "
                + "no passcode was tried (try again then)", status: ExitStatus.denied)
    }

    /// The device of the mount, or of the keychain (started if need be), over its socket.
    private func unlock(_ device: RunningDevice) throws {
        let status = try device.status()
        if status.retryAfter > 0 { throw Self.lockedOut(status.retryAfter) }
        var passcode: SecureBytes?
        if status.hasPasscode {
            guard let typed = Passcode.read(prompt: "Passcode: "), typed.count > 0 else {
                throw fail("no passcode given: this keychain has one (an empty line is none)")
            }
            passcode = typed
        }
        let outcome = try device.outcome(.unlock(passcode: passcode))
        switch outcome {
        case .success?:
            return
        case .failure(.keychain(.authFailed, _))?:
            throw Self.wrongPasscode(retryAfter: try device.statusIfAnswered()?.retryAfter)
        case .failure?, nil:
            throw DeviceAccess.failure(outcome, about: .action("cannot unlock"))
        }
    }
}
