import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct LockCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lock", abstract: "Lock the device (every mount of its keychain).")

    @OptionGroup var target: MountpointOrKeychain

    func run() throws {
        // No device runs: the keychain is locked already.
        guard let device = try target.mount?.device() ?? target.runningDevice() else { return }
        // A device that went away unanswered has taken its keys with it.
        guard let outcome = try device.outcome(.lock) else { return }
        try device.answer(outcome, about: .action("cannot lock"))
    }
}
