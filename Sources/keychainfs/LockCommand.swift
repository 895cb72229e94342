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
            guard let socketPath = try target.deviceSocket(starting: false) else { return }
            switch DeviceClient.send(.lock, to: socketPath) {
            case .ok?, nil: return
            case .keychainError(let error, let message)?:
                throw fail("cannot lock: \(message)", status: ExitStatus.of(error))
            case .systemError(_, let message)?: throw fail("cannot lock: \(message)")
            case .value?: throw DeviceAccess.unexpectedReply()
            }
        }
        _ = try mount.requireControl()
        let result = Array("lock\n".utf8).withUnsafeBytes { DeviceStatusFile.send(mount.path, $0) }
        guard result == 0 else { throw fail("cannot lock: \(String(cString: strerror(result)))") }
    }
}
