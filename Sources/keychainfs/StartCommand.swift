import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct StartCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "start",
        abstract: "Start the keychain's device without a mount (commands that need it start it themselves).",
        discussion: """
            The device boots locked and keeps running, as gpg-agent does, until `keychainfs stop` or \
            SIGTERM; mounts may join and leave it. get, set, rm, ls, exec, unlock, status, git's and \
            docker's helpers start it when none runs.
            """
    )

    @OptionGroup var options: KeychainOptions

    @Flag(name: .long, help: "Stay in the foreground as the device process (for systemd and tests).")
    var foreground = false

    @Option(name: .customLong("ready-fd"), help: .hidden)
    var readyFD: Int32?

    @OptionGroup var bus: SecretServiceOptions

    func run() throws {
        guard case .directory(let keychain) = options.place else {
            throw fail("the keychainfs service runs your keychain's device already")
        }
        // A device that runs already (a client started it) serves this
        // session's bus from now on: D-Bus activation, too, finds it so.
        if bus.secretService, let running = try RunningDevice.running(options.place) {
            if let problem = bus.joinBus(of: running) { throw fail(problem) }
            return
        }
        guard foreground else {
            guard bus.secretService else {
                if let problem = DeviceLauncher.ensureRunning(keychain).problem { throw fail(problem) }
                return
            }
            if let problem = DeviceLauncher.start(
                ["start", "--foreground", "--keychain", keychain.path] + bus.arguments, keychain: keychain)
            {
                throw fail(problem)
            }
            return
        }
        let device: DeviceProcess
        do {
            device = try DeviceProcess(keychain: keychain)
        } catch {
            throw reportFailure(error.description)
        }
        throw ExitCode(
            device.run(mountpoint: nil, group: nil, secretService: bus.replacing) { error in
                if let error { _ = reportFailure(error.description) } else { reportReady() }
            })
    }

    private func reportReady() { ReadyReport(readyFD).ok() }

    @discardableResult
    private func reportFailure(_ message: String) -> ExitCode { ReadyReport(readyFD).failure(message) }
}
