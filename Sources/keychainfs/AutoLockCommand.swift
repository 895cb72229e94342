import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct AutoLockCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "autolock",
        abstract: "Lock the device after a time without an item read or write (0: never).",
        discussion: """
            DURATION is seconds (300) or a number with a unit: s, m, h or d (5m, 1h, 7d), at most \
            7d; 0 turns auto-lock off. The device says will-lock (keychainfs watch) and locks after \
            the grace (default 10s). The setting is the running device's, for every mount and \
            client of it; without a mount point the keychain's device is started if none runs. \
            `keychainfs status` shows it.
            """)

    @Argument(
        help:
            "How long without an item access before the device locks: seconds, or a number with s, m, h or d (300, 5m, 1h; at most 7d; 0: never)."
    )
    var duration: AutoLockDuration

    @OptionGroup var target: MountpointOrKeychain

    @Option(name: .long, help: "Between will-lock and the lock.")
    var grace: AutoLockDuration?

    func run() throws {
        // One request: the delay and the grace both take effect, or neither.
        let device = try target.mount?.device() ?? target.device()
        let setting = try device.call(
            .autoLock(after: duration.seconds, grace: grace?.seconds), about: .action("cannot set auto-lock"))
        // The device's setting as it now stands: what was asked for, or the reply is not this build's.
        guard setting.after == duration.seconds, grace.map({ $0.seconds == setting.grace }) ?? true else {
            throw DeviceAccess.unexpectedReply()
        }
    }
}
