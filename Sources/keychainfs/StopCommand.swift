import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct StopCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stop",
        abstract: "Stop the keychain's device: every mount of it is unmounted, its keys are gone."
    )

    @OptionGroup var options: KeychainOptions

    func run() throws {
        guard case .directory(let keychain) = options.place else {
            throw fail("the keychainfs service is stopped by its administrator (systemctl stop keychainfs)")
        }
        let device = RunningDevice(listeningAt: try keychain.deviceSocketPath())
        // None runs: nothing to stop.
        guard let outcome = try device.outcome(.stop) else { return }
        try device.answer(outcome, about: .action("cannot stop the device"))
        waitForDeviceExit(keychain)
    }
}
