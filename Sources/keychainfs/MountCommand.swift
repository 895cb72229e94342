import ArgumentParser
import KeychainCore
import KeychainProtocol
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct MountCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mount",
        abstract: "Mount the keychain, or one access group of it; returns once the mount is ready.",
        discussion: """
            The first mount of a keychain starts its device process (booted, locked); later mounts \
            join it, so that all of them share one lock.
            """
    )

    @Argument(help: "An empty directory to mount on.")
    var mountpoint: String

    @Option(name: .long, help: "Mount only this access group, its items at the root.")
    var group: String?

    @OptionGroup var options: KeychainOptions

    @Flag(name: .long, help: "Stay in the foreground as the device process (for systemd and tests).")
    var foreground = false

    @Option(
        name: .long,
        help:
            "Lock the device after this long without an item read or write (`300`, `5m`, `1h`; as `keychainfs autolock`)."
    )
    var autolock: AutoLockDuration?

    @Option(name: .customLong("ready-fd"), help: .hidden)
    var readyFD: Int32?

    @OptionGroup var bus: SecretServiceOptions

    func validate() throws { try validateGroupName(group) }

    func run() throws {
        let mountpoint = canonicalMountPoint(self.mountpoint)
        // A device killed with kill -9 leaves a dead mount that must not block
        // the next one (docs/FILESYSTEM.md, "The device process").
        if MountTable.isDeadMount(mountpoint) { _ = MountTable.unmount(mountpoint, lazy: true) }
        if let problem = MountTable.alreadyMountedProblem(mountpoint) { throw reportFailure(problem) }
        let place = options.place
        guard case .directory(let keychain) = place else { return try mountForService(mountpoint, place: place) }
        guard keychain.exists else {
            throw reportFailure("no keychain at \(keychain.path); create one with `keychainfs init`")
        }
        let socketPath: String
        do {
            socketPath = try RuntimePaths.socketPath(for: keychain.path)
        } catch {
            throw reportFailure(error.description)
        }
        if let running = RunningDevice.running(at: socketPath) {
            if let problem = bus.joinBus(of: running) { throw reportFailure(problem) }
            if try join(running, mountpoint: mountpoint) { return }
            // The device was exiting (its last mount had just gone): start the next one.
            waitForDeviceExit(keychain)
        }
        if foreground {
            throw ExitCode(runDevice(keychain, mountpoint: mountpoint))
        }
        try startDetachedDevice(keychain, mountpoint: mountpoint)
    }

    /// Service mode: this user mounts (fusermount3) and the service serves
    /// the connection; the mount stays this user's.
    private func mountForService(_ mountpoint: String, place: KeychainPlace) throws {
        guard !foreground else {
            throw reportFailure(
                "--foreground runs a per-user device; the keychainfs service runs as its own systemd unit")
        }
        guard !bus.secretService else {
            throw reportFailure(
                "the keychainfs service is not on your session bus: --secret-service needs a per-user device (--keychain DIR)"
            )
        }
        try place.requireExisting()
        // Ours until the device has answered (it keeps a copy of its own).
        let connection: FileDescriptor
        do {
            connection = try UserMount.mount(at: mountpoint)
        } catch {
            throw reportFailure(error.description)
        }
        let device = RunningDevice(listeningAt: try place.socketPath())
        let outcome = try device.outcome(.attach(group: group, mountpoint: mountpoint), passing: connection.borrowed)
        _ = connection.close()
        guard case .success? = outcome else {
            // The service did not take the connection: the mount would hang every user of it.
            _ = MountTable.unmount(mountpoint, lazy: true)
            throw reportFailure(DeviceAccess.explanation(of: outcome, about: .action("nothing was mounted")).message)
        }
        try finishMount(device)
    }

    /// Applies the settings of this mount command to the device it joined,
    /// over its socket as every command does.
    private func finishMount(_ device: RunningDevice) throws {
        if let autolock {
            // The device is shared: its setting changes for every mount.
            let outcome = try device.outcome(.autoLock(after: autolock.seconds, grace: nil))
            guard case .success? = outcome else {
                let why = DeviceAccess.explanation(of: outcome, about: .action("could not set auto-lock")).message
                throw reportFailure("mounted, but " + why)
            }
        }
        reportReady()
    }

    /// Asks the running device process to serve one more mount; false if it
    /// went away without answering.
    private func join(_ device: RunningDevice, mountpoint: String) throws -> Bool {
        let outcome = try device.outcome(.mount(group: group, mountpoint: mountpoint))
        switch outcome {
        case nil:
            return false
        case .success?:
            try finishMount(device)
            return true
        case .failure?:
            throw reportFailure(DeviceAccess.explanation(of: outcome, about: .device).message)
        }
    }

    /// Becomes the device process.
    private func runDevice(_ keychain: KeychainDirectory, mountpoint: String) -> Int32 {
        let device: DeviceProcess
        do {
            device = try DeviceProcess(keychain: keychain)
        } catch {
            _ = reportFailure(error.description)
            return 1
        }
        if let autolock {
            device.manager.localDevice.setAutoLock(
                after: autolock.seconds, grace: device.manager.localDevice.autoLock.grace)
        }
        return device.run(mountpoint: mountpoint, group: group, secretService: bus.replacing) { error in
            if let error { _ = reportFailure(error.description) } else { reportReady() }
        }
    }

    /// Starts the device process detached, mounted here.
    private func startDetachedDevice(_ keychain: KeychainDirectory, mountpoint: String) throws {
        var arguments = ["mount", mountpoint, "--foreground", "--keychain", keychain.path]
        if let group { arguments += ["--group", group] }
        if let autolock { arguments += ["--autolock", String(autolock.seconds)] }
        if let problem = DeviceLauncher.start(arguments + bus.arguments, keychain: keychain) { throw fail(problem) }
    }

    private func reportReady() { ReadyReport(readyFD).ok() }

    @discardableResult
    private func reportFailure(_ message: String) -> ExitCode { ReadyReport(readyFD).failure(message) }
}
/// How a device process says it is ready, or why not: to systemd
/// (sd_notify), and to the parent that started it detached (a line on the
/// pipe at `--ready-fd`), else as the command's own message.
struct ReadyReport {
    let fd: Int32?

    init(_ fd: Int32?) { self.fd = fd }

    func ok() {
        SystemdNotify.send("READY=1")
        // The parent waits for this line: let it go at once (the descriptor
        // it passed is ours, and read no more).
        guard let fd, let ready = FileDescriptor(fd) else { return }
        _ = writeLine(ready.borrowed, "ok")
        _ = ready.close()
    }

    func failure(_ message: String) -> ExitCode {
        guard let fd else { return fail(message) }
        // Kept open until the process ends, which tells the parent too.
        _ = writeLine(BorrowedDescriptor(kept: fd), "error " + message)
        return ExitStatus.failure
    }
}

/// Writes one line to a descriptor (the ready pipe); false on an error.
func writeLine(_ fd: BorrowedDescriptor, _ line: String) -> Bool {
    (try? fd.writeAll(Array((line + "\n").utf8))) != nil
}

/// Bytes up to the first newline or the end of input.
func readLine(_ fd: BorrowedDescriptor) -> [UInt8] {
    var result: [UInt8] = []
    var byte: UInt8 = 0
    while true {
        let count = try? withUnsafeMutableBytes(of: &byte) { (raw) throws(Errno) in try fd.read(into: raw) }
        if count == nil || count == 0 || byte == UInt8(ascii: "\n") { return result }
        result.append(byte)
    }
}

func selfExecutable() -> String {
    var buffer = [CChar](repeating: 0, count: Int(PATH_MAX))
    let count = readlink("/proc/self/exe", &buffer, buffer.count - 1)
    return count > 0
        ? String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) : CommandLine.arguments[0]
}

extension String {
    var trimmingNewline: String { hasSuffix("\n") ? String(dropLast()) : self }
}

/// `--secret-service [--replace]`, shared by `start` and `mount`.
struct SecretServiceOptions: ParsableArguments {
    @Flag(
        name: .customLong("secret-service"),
        help:
            "Also serve the Secret Service (org.freedesktop.secrets) on this session's bus (SECRET-SERVICE.md, in /usr/share/doc/keychainfs)."
    )
    var secretService = false

    @Flag(
        help:
            "With --secret-service: take the name over from the program that has it, where that program allows it (gnome-keyring 42 does not)."
    )
    var replace = false

    /// What `DeviceProcess.run` takes: nil for no bus, else whether to replace.
    var replacing: Bool? { secretService ? replace : nil }

    /// The same options for the device process started detached.
    var arguments: [String] { secretService ? ["--secret-service"] + (replace ? ["--replace"] : []) : [] }

    /// With --secret-service, asks the running `device` to
    /// serve this session's bus ($DBUS_SESSION_BUS_ADDRESS) as well; the
    /// problem, if any, in a sentence. Nothing to do without the flag.
    func joinBus(of device: RunningDevice) -> String? {
        guard secretService else { return nil }
        guard let address = getenv("DBUS_SESSION_BUS_ADDRESS").map({ String(cString: $0) }), !address.isEmpty else {
            return "no session bus: DBUS_SESSION_BUS_ADDRESS is not set"
        }
        let outcome = (try? device.outcome(.serveBus(address: address, replace: replace))) ?? nil
        guard case .success? = outcome else { return DeviceAccess.explanation(of: outcome, about: .device).message }
        return nil
    }
}
