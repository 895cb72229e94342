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
        guard let mount = target.mount else { return try unlockThroughTheSocket() }
        let status = try mount.requireControl()
        if let retryAfter = status["retry-after"].flatMap({ Int64($0) }), retryAfter > 0 {
            throw Self.lockedOut(retryAfter)
        }
        let command = SecureBuffer()
        do {
            try Array("unlock".utf8).withUnsafeBytes { try command.append($0) }
            if status["passcode"] != "no" {
                guard let passcode = Passcode.read(prompt: "Passcode: "), passcode.count > 0 else {
                    throw fail("no passcode given: this keychain has one (an empty line is none)")
                }
                try Array(" ".utf8).withUnsafeBytes { try command.append($0) }
                try passcode.withUnsafeBytes { try command.append($0) }
            }
            try Array("\n".utf8).withUnsafeBytes { try command.append($0) }
        } catch let error as KeychainError {
            throw fail("the passcode is too long: \(error)")
        }
        let result = command.withBytes(from: 0, length: command.count) { MountControlFile.send(mount.path, $0) }
        command.wipe()
        guard result == 0 else {
            if result == EACCES {
                throw Self.wrongPasscode(
                    retryAfter: MountControlFile.read(mount.path)?["retry-after"].flatMap { Int64($0) })
            }
            throw fail("cannot unlock: \(String(cString: strerror(result)))")
        }
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

    /// Without a mount point: the device of the keychain, started if need be.
    private func unlockThroughTheSocket() throws {
        let device = try target.device()
        let status = try device.status()
        if status.retryAfter > 0 { throw Self.lockedOut(status.retryAfter) }
        var passcode: SecureBytes?
        if status.hasPasscode {
            guard let typed = Passcode.read(prompt: "Passcode: "), typed.count > 0 else {
                throw fail("no passcode given: this keychain has one (an empty line is none)")
            }
            passcode = typed
        }
        let reply = try device.reply(to: .unlock(passcode: passcode))
        switch reply {
        case .ok?:
            return
        case .keychainError(.authFailed, _)?:
            throw Self.wrongPasscode(retryAfter: try device.statusIfAnswered()?.retryAfter)
        case .keychainError?, .systemError?, .value?, nil:
            throw DeviceAccess.failure(reply, about: .action("cannot unlock"))
        }
    }
}
