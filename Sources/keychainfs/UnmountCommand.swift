import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct UnmountCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unmount",
        abstract: "Unmount; returns once done (after the last mount, once the device process has exited)."
    )

    @Argument(help: "The mount point.")
    var mountpoint: String

    func run() throws {
        let mountpoint = canonicalMountPoint(self.mountpoint)
        if MountTable.isDeadMount(mountpoint) {
            // The device was killed: clear what it left (docs/FILESYSTEM.md, "The device process": kill -9).
            guard MountTable.unmount(mountpoint, lazy: true) == 0 else {
                throw fail("cannot clear the dead mount at \(mountpoint)")
            }
            return
        }
        guard MountTable.isMountPoint(mountpoint) else { throw fail("\(mountpoint) is not mounted") }
        func unmountDirectly() throws {
            let result = MountTable.unmount(mountpoint, lazy: false)
            guard result == 0 else { throw fail("cannot unmount \(mountpoint): \(String(cString: strerror(result)))") }
        }
        switch try MountpointArgument(mountpoint: mountpoint).server() {
        case .service:
            // The mount is this user's (the service cannot unmount it).
            try unmountDirectly()
        case .device(let device, let keychain):
            // No device answers: unmount directly.
            guard let outcome = try device.outcome(.unmount(mountpoint: mountpoint)) else {
                return try unmountDirectly()
            }
            if try device.answer(outcome, about: .action("cannot unmount \(mountpoint)")) == .last {
                waitForDeviceExit(keychain)
            }
        }
    }
}

/// The device holds an flock on the keychain's lock file until it exits;
/// taking it ourselves waits exactly that long.
func waitForDeviceExit(_ keychain: KeychainDirectory) {
    guard let fd = FileDescriptor(open(keychain.lockFilePath, O_RDONLY | O_CLOEXEC)) else { return }
    _ = try? nothingOrErrno { flock(fd.raw, LOCK_EX) }
}
