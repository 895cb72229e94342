import ArgumentParser
import KeychainCore
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

    @Option(name: .long, help: "Lock the device after this many seconds without an item read or write (as `autolock` on .control).")
    var autolock: Int?

    @Option(name: .customLong("ready-fd"), help: .hidden)
    var readyFD: Int32?

    func validate() throws {
        if let autolock, !(0...Device.maximumAutoLockSeconds).contains(autolock) {
            throw ValidationError("--autolock takes 0 to \(Device.maximumAutoLockSeconds) seconds")
        }
        if let group, (try? ItemLimits.validate(name: group)) == nil {
            throw ValidationError("'\(group)' is not a valid access group name.")
        }
    }

    func run() throws {
        let mountpoint = canonicalMountPoint(self.mountpoint)
        // SPEC: a device killed with kill -9 leaves a dead mount that must not block the next one.
        if MountTable.isDeadMount(mountpoint) { _ = MountTable.unmount(mountpoint, lazy: true) }
        if let problem = MountTable.alreadyMountedProblem(mountpoint) { throw report(problem) }
        guard case .directory(let keychain) = options.place else { return try mountForService(mountpoint) }
        guard keychain.exists else {
            throw report("no keychain at \(keychain.path); create one with `keychainfs init`")
        }
        let socketPath: String
        do {
            socketPath = try RuntimePaths.socketPath(for: keychain.path)
        } catch {
            throw report(error.description)
        }
        if DeviceClient.isServing(socketPath) {
            if try join(socketPath, mountpoint: mountpoint) { return }
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
    private func mountForService(_ mountpoint: String) throws {
        guard !foreground else {
            throw report("--foreground runs a per-user device; the keychainfs service runs as its own systemd unit")
        }
        let place = options.place
        try place.requireExisting()
        let connection: Int32
        do {
            connection = try UserMount.mount(at: mountpoint)
        } catch {
            throw report(error.description)
        }
        let reply = DeviceClient.send(.attach(group: group, mountpoint: mountpoint), to: try place.socketPath(),
                                      passing: connection)
        close(connection)
        guard case .ok? = reply else {
            // The service did not take the connection: the mount would hang every user of it.
            _ = MountTable.unmount(mountpoint, lazy: true)
            switch reply {
            case .keychainError(_, let message)?, .systemError(_, let message)?: throw report(message)
            default: throw report("the keychainfs service did not answer; nothing was mounted")
            }
        }
        try finishMount(mountpoint)
    }

    /// Applies the settings of this mount command to the device it joined.
    private func finishMount(_ mountpoint: String) throws {
        if let autolock {
            // The device is shared: its setting changes for every mount, as through .control.
            let command = Array("autolock \(autolock)\n".utf8)
            let result = command.withUnsafeBytes { DeviceStatusFile.send(mountpoint, $0) }
            if result != 0 { throw report("mounted, but could not set auto-lock: \(String(cString: strerror(result)))") }
        }
        report(ok: ())
    }

    /// Asks the running device process to serve one more mount; false if it
    /// went away without answering.
    private func join(_ socketPath: String, mountpoint: String) throws -> Bool {
        switch DeviceClient.send(.mount(group: group, mountpoint: mountpoint), to: socketPath) {
        case nil:
            return false
        case .ok?:
            try finishMount(mountpoint)
            return true
        case .value?:
            throw report("unexpected reply from the device (a device of another keychainfs build?)")
        case .keychainError(_, let message)?, .systemError(_, let message)?:
            throw report(message)
        }
    }

    /// Becomes the device process.
    private func runDevice(_ keychain: KeychainDirectory, mountpoint: String) -> Int32 {
        let device: DeviceProcess
        do {
            device = try DeviceProcess(keychain: keychain)
        } catch {
            _ = report(error.description)
            return 1
        }
        if let autolock {
            device.manager.localDevice.setAutoLock(after: autolock, grace: device.manager.localDevice.autoLock.grace)
        }
        return device.run(mountpoint: mountpoint, group: group) { error in
            if let error { _ = report(error.description) } else { report(ok: ()) }
        }
    }

    /// Starts the device process detached (own session, stdio on /dev/null)
    /// and waits for its word on a pipe: mounted, or why not.
    private func startDetachedDevice(_ keychain: KeychainDirectory, mountpoint: String) throws {
        var pipeEnds: [Int32] = [0, 0]
        guard pipe(&pipeEnds) == 0 else { throw fail("cannot create a pipe") }
        // Only the child's dup2'd copy (fd 3) may stay open in it.
        for end in pipeEnds { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        var arguments = [selfExecutable(), "mount", mountpoint, "--foreground", "--keychain", keychain.path, "--ready-fd", "3"]
        if let group { arguments += ["--group", group] }
        if let autolock { arguments += ["--autolock", String(autolock)] }
        var spawnOptions = Spawn.Options()
        spawnOptions.descriptors = [(3, pipeEnds[1])]
        spawnOptions.nullStandardStreams = true
        spawnOptions.newSession = true
        let child = Spawn.start(arguments, options: spawnOptions)
        close(pipeEnds[1])
        defer { close(pipeEnds[0]) }
        guard child != nil else { throw fail("cannot start the device process") }
        let answer = String(decoding: readLine(pipeEnds[0]), as: UTF8.self)
        if answer.hasPrefix("ok") { return }
        let message = answer.hasPrefix("error ") ? String(answer.dropFirst(6)).trimmingNewline
            : "the device process exited before the mount was ready"
        throw fail(message)
    }

    /// Success: to the parent's pipe when started detached, silence otherwise.
    private func report(ok: ()) {
        SystemdNotify.send("READY=1")
        guard let readyFD else { return }
        _ = writeLine(readyFD, "ok")
        // The parent waits for this line: let it go at once.
        close(readyFD)
    }

    @discardableResult
    private func report(_ message: String) -> ExitCode {
        if let readyFD {
            _ = writeLine(readyFD, "error " + message)
            return ExitStatus.failure
        }
        return fail(message)
    }
}

/// Writes one line to a descriptor (the ready pipe); false on an error.
func writeLine(_ fd: Int32, _ line: String) -> Bool {
    var text = line + "\n"
    return text.withUTF8 { write(fd, $0.baseAddress, $0.count) } == text.utf8.count
}

/// Bytes up to the first newline or the end of input.
func readLine(_ fd: Int32) -> [UInt8] {
    var result: [UInt8] = []
    var byte: UInt8 = 0
    while true {
        let count = try? withUnsafeMutableBytes(of: &byte) { (raw) throws(Errno) in try Descriptor.read(fd, into: raw) }
        if count == nil || count == 0 || byte == UInt8(ascii: "\n") { return result }
        result.append(byte)
    }
}

func selfExecutable() -> String {
    var buffer = [CChar](repeating: 0, count: Int(PATH_MAX))
    let count = readlink("/proc/self/exe", &buffer, buffer.count - 1)
    return count > 0 ? String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) : CommandLine.arguments[0]
}

extension String {
    var trimmingNewline: String { hasSuffix("\n") ? String(dropLast()) : self }
}
