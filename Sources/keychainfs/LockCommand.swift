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
        guard let mount = target.mount else {
            // No device runs: the keychain is locked already.
            guard let device = try target.runningDevice() else { return }
            let reply = try device.reply(to: .lock)
            // A device that went away unanswered has taken its keys with it.
            if reply == nil { return }
            guard case .ok? = reply else { throw DeviceAccess.failure(reply, about: .action("cannot lock")) }
            return
        }
        _ = try mount.requireControl()
        let result = Array("lock\n".utf8).withUnsafeBytes { MountControlFile.send(mount.path, $0) }
        guard result == 0 else { throw fail("cannot lock: \(String(cString: strerror(result)))") }
    }
}
