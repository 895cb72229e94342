import ArgumentParser
import KeychainCore
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

/// The `.control` file of a mount, read and written as a user would with cat and echo.
enum DeviceStatusFile {
    /// The status text as the device wrote it; nil when there is no control file.
    static func text(_ mountpoint: String) -> [UInt8]? {
        let fd = open(mountpoint + "/.control", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        return try? Descriptor.readAll(fd)
    }

    /// The `key: value` status lines, values unescaped; nil when there is
    /// no control file. A key that appears twice is a forged line: the first wins.
    static func read(_ mountpoint: String) -> [String: String]? {
        guard let text = text(mountpoint) else { return nil }
        var status: [String: String] = [:]
        for line in String(decoding: text, as: UTF8.self).split(separator: "\n") {
            let parts = line.split(separator: ":", maxSplits: 1)
            guard parts.count == 2, status[String(parts[0])] == nil,
                  let value = LineEscaping.unescaped(String(parts[1].dropFirst())) else { continue }
            status[String(parts[0])] = value
        }
        return status
    }

    /// Writes one command; returns 0 or the errno of the write.
    static func send(_ mountpoint: String, _ command: UnsafeRawBufferPointer) -> Int32 {
        let fd = open(mountpoint + "/.control", O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return errno }
        defer { close(fd) }
        return write(fd, command.baseAddress, command.count) == command.count ? 0 : errno
    }
}

/// A mount point, or, without one, the keychain itself (`--keychain`,
/// `$KEYCHAINFS_KEYCHAIN`, the service, or the default), reached through
/// its device's socket.
struct MountpointOrKeychain: ParsableArguments {
    @Argument(help: "A mount point of the keychain (without one: the keychain itself, through its device).")
    var mountpoint: String?

    @OptionGroup var options: KeychainOptions

    /// The mount, when one was named.
    var mount: MountpointArgument? { mountpoint.map { MountpointArgument(mountpoint: $0) } }

    /// The socket of the keychain's device; with `starting`, a per-user
    /// device is started when none runs. Nil when none runs (and none was started).
    func deviceSocket(starting: Bool) throws -> String? {
        let place = options.place
        try place.requireExisting()
        guard starting else {
            let socketPath = try place.socketPath()
            return DeviceClient.isServing(socketPath) ? socketPath : nil
        }
        let device = place.startedDevice()
        guard let socketPath = device.socketPath else {
            throw fail("no device for \(place.name): \(device.problem ?? "")", status: ExitStatus.noDevice)
        }
        return socketPath
    }
}

struct MountpointArgument: ParsableArguments {
    @Argument(help: "The mount point.")
    var mountpoint: String

    init() {}
    init(mountpoint: String) { self.mountpoint = mountpoint }

    var path: String { canonicalMountPoint(mountpoint) }

    func requireControl() throws -> [String: String] {
        guard let status = DeviceStatusFile.read(path) else { throw fail(missingControl) }
        return status
    }

    /// Why there is no control file to talk to, and what to do.
    var missingControl: String {
        MountTable.isDeadMount(path)
            ? "the device process serving \(path) has died; run `keychainfs unmount \(path)`, then mount again"
            : "\(path) is not a keychainfs mount (no .control file)"
    }
}

struct LockCommand: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "lock", abstract: "Lock the device (every mount of its keychain).")

    @OptionGroup var target: MountpointOrKeychain

    func run() throws {
        guard let mount = target.mount else {
            // No device runs: the keychain is locked already.
            guard let socketPath = try target.deviceSocket(starting: false) else { return }
            switch DeviceClient.send(.lock, to: socketPath) {
            case .ok?, nil: return
            case .keychainError(let error, let message)?: throw fail("cannot lock: \(message)", status: ExitStatus.of(error))
            case .systemError(_, let message)?: throw fail("cannot lock: \(message)")
            case .value?: throw DeviceAccess.unexpectedReply()
            }
        }
        _ = try mount.requireControl()
        let result = Array("lock\n".utf8).withUnsafeBytes { DeviceStatusFile.send(mount.path, $0) }
        guard result == 0 else { throw fail("cannot lock: \(String(cString: strerror(result)))") }
    }
}

struct UnlockCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unlock",
        abstract: "Unlock the device; the passcode is read from the terminal or one line of standard input."
    )

    @OptionGroup var target: MountpointOrKeychain

    func run() throws {
        guard let mount = target.mount else { return try unlockThroughTheSocket() }
        let status = try mount.requireControl()
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
        let result = command.withBytes(from: 0, length: command.count) { DeviceStatusFile.send(mount.path, $0) }
        command.wipe()
        guard result == 0 else {
            if result == EACCES {
                throw Self.wrongPasscode(retryAfter: DeviceStatusFile.read(mount.path)?["retry-after"].flatMap { Int64($0) })
            }
            throw fail("cannot unlock: \(String(cString: strerror(result)))")
        }
    }

    /// A wrong passcode, through a mount or the socket alike: denied, and
    /// how long unlocking is refused when a lockout began.
    private static func wrongPasscode(retryAfter: Int64?) -> ExitCode {
        guard let retryAfter, retryAfter > 0 else { return fail("not unlocked: wrong passcode", status: ExitStatus.denied) }
        return fail("not unlocked: wrong passcode; unlocking is refused for \(retryAfter) more seconds after repeated failures",
                    status: ExitStatus.denied)
    }

    /// Without a mount point: the device of the keychain, started if need be.
    private func unlockThroughTheSocket() throws {
        guard let socketPath = try target.deviceSocket(starting: true),
              case .ok(let fields)? = DeviceClient.send(.status, to: socketPath),
              let status = DeviceStatus(fields: fields) else {
            throw DeviceAccess.noAnswer()
        }
        var passcode: SecureBytes?
        if status.hasPasscode {
            guard let typed = Passcode.read(prompt: "Passcode: "), typed.count > 0 else {
                throw fail("no passcode given: this keychain has one (an empty line is none)")
            }
            passcode = typed
        }
        switch DeviceClient.send(.unlock(passcode: passcode), to: socketPath) {
        case .ok?:
            return
        case .keychainError(.authFailed, _)?:
            let after = DeviceClient.send(.status, to: socketPath).flatMap { reply -> DeviceStatus? in
                guard case .ok(let fields) = reply else { return nil }
                return DeviceStatus(fields: fields)
            }
            throw Self.wrongPasscode(retryAfter: after?.retryAfter)
        case .keychainError(let error, let message)?:
            throw fail("cannot unlock: \(message)", status: ExitStatus.of(error))
        case .systemError(_, let message)?:
            throw fail("cannot unlock: \(message)")
        case .value?, nil:
            throw fail("the device went away", status: ExitStatus.noDevice)
        }
    }
}

/// An auto-lock delay or grace as the user writes it (``Device/autoLockSeconds(_:)``).
struct AutoLockDuration: ExpressibleByArgument {
    let seconds: Int

    init?(argument: String) {
        guard let seconds = Device.autoLockSeconds(argument.utf8) else { return nil }
        self.seconds = seconds
    }

    static var defaultValueDescription: String { "seconds, or a number with s, m, h or d (at most 7d)" }
}

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

    @Argument(help: "How long without an item access before the device locks: seconds, or a number with s, m, h or d (300, 5m, 1h; at most 7d; 0: never).")
    var duration: AutoLockDuration

    @OptionGroup var target: MountpointOrKeychain

    @Option(name: .long, help: "Between will-lock and the lock.")
    var grace: AutoLockDuration?

    func run() throws {
        guard let mount = target.mount else {
            guard let socketPath = try target.deviceSocket(starting: true) else { return }
            switch DeviceClient.send(.autoLock(after: duration.seconds, grace: grace?.seconds), to: socketPath) {
            case .ok?: return
            case .keychainError(let error, let message)?: throw fail("cannot set auto-lock: \(message)", status: ExitStatus.of(error))
            case .systemError(_, let message)?: throw fail("cannot set auto-lock: \(message)")
            case .value?: throw DeviceAccess.unexpectedReply()
            case nil: throw DeviceAccess.noAnswer()
            }
        }
        _ = try mount.requireControl()
        // One write: both lines take effect, or neither (.control parses the whole write first).
        var command = "autolock \(duration.seconds)\n"
        if let grace { command += "autolock-grace \(grace.seconds)\n" }
        let result = Array(command.utf8).withUnsafeBytes { DeviceStatusFile.send(mount.path, $0) }
        guard result == 0 else { throw fail("cannot set auto-lock: \(String(cString: strerror(result)))") }
    }
}

struct StatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status", abstract: "Print the device status of a mount, or of the keychain's device.",
        discussion: """
            With a mount point: its .control file. Without: the keychain's device, through its \
            socket (state: stopped when none runs: the keychain is locked). Either way key: value \
            lines, among them key-protection (tpm2 or file) and, sealed by a TPM, tpm-lockout and \
            rollback-counter; with --json one object of the same keys (numbers as numbers).
            """)

    @OptionGroup var target: MountpointOrKeychain

    @Flag(help: "Print one JSON object of the same keys and values.")
    var json = false

    func run() throws {
        let lines: [String]
        if let mount = target.mount {
            guard let text = DeviceStatusFile.text(mount.path) else { throw fail(mount.missingControl) }
            lines = String(decoding: text, as: UTF8.self).split(separator: "\n").map(String.init)
        } else {
            lines = try deviceLines()
        }
        guard json else {
            print(lines.joined(separator: "\n"))
            return
        }
        let members = lines.compactMap { line -> String? in
            let parts = line.split(separator: ":", maxSplits: 1)
            guard parts.count == 2 else { return nil }
            let value = String(parts[1].dropFirst())
            return jsonString(String(parts[0])) + ": " + (Int64(value).map(String.init) ?? jsonString(value))
        }
        print("{" + members.joined(separator: ", ") + "}")
    }

    private func deviceLines() throws -> [String] {
        let mode = if case .service = target.options.place { "service" } else { "per-user" }
        guard let socketPath = try target.deviceSocket(starting: false) else {
            var lines = ["state: stopped", "mode: \(mode)"]
            // How the keys are kept is in the device-secret file (no TPM asked).
            if case .directory(let keychain) = target.options.place, let protection = try? keychain.keyProtection() {
                lines.append("key-protection: \(protection.rawValue)")
            }
            return lines
        }
        guard case .ok(let fields)? = DeviceClient.send(.status, to: socketPath),
              let status = DeviceStatus(fields: fields) else {
            throw DeviceAccess.noAnswer()
        }
        var lines = ["state: \(status.isLocked ? "locked" : "unlocked")",
                     "first-unlock: \(status.hasUnlockedSinceBoot ? "yes" : "no")",
                     "passcode: \(status.hasPasscode ? "yes" : "no")",
                     "failed-attempts: \(status.failedAttempts)"]
        if status.retryAfter > 0 { lines.append("retry-after: \(status.retryAfter)") }
        lines += ["autolock: \(status.autoLockAfter)", "autolock-grace: \(status.autoLockGrace)", "mode: \(mode)"]
        return lines + (status.keyProtection?.lines ?? [])
    }
}

struct WatchCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Print the device's events as they happen (a mount's .events file, or the keychain's device).",
        discussion: """
            One line per event, fields separated by tabs (names escaped as in status lines): \
            the state first (locked or unlocked), then will-lock SECONDS, locked, unlocked, written \
            GROUP ID, removed GROUP ID, renamed GROUP FROM TO, group-created GROUP, group-removed \
            GROUP, policy GROUP; overflow when a slow reader missed some. Never a value. Events of \
            every client of the device are seen (mounts, the command line, the library); item \
            changes of a group with an entitlement policy only by programs it admits. Without a \
            mount point the keychain's device is followed (started if none runs). Runs until \
            interrupted; exits 1 when the mount or the device goes away.
            """
    )

    @OptionGroup var target: MountpointOrKeychain

    func run() throws {
        guard let mount = target.mount else {
            guard let socketPath = try target.deviceSocket(starting: true) else { return }
            guard let (reply, connection) = DeviceClient.follow(.watch, at: socketPath) else {
                throw DeviceAccess.noAnswer()
            }
            defer { close(connection) }
            switch reply {
            case .ok: break
            case .keychainError(let error, let message): throw fail("cannot watch: \(message)", status: ExitStatus.of(error))
            case .systemError(_, let message): throw fail("cannot watch: \(message)")
            case .value: throw DeviceAccess.unexpectedReply()
            }
            try copyToOutput(connection, ended: "the device went away")
            return
        }
        let fd = open(mount.path + "/.events", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            let reason = errno
            if DeviceStatusFile.text(mount.path) == nil { throw fail(mount.missingControl) }
            throw fail("cannot read the events of \(mount.path): \(String(cString: strerror(reason)))")
        }
        defer { close(fd) }
        try copyToOutput(fd, ended: "the mount went away")
    }

    /// Copies event lines to standard output until `fd` ends (an error
    /// saying `ended`) or the reader of our output goes away (done).
    private func copyToOutput(_ fd: Int32, ended: String) throws {
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let count: Int
            do throws(Errno) {
                count = try buffer.withMutableBytes { (raw) throws(Errno) in try Descriptor.read(fd, into: raw) }
            } catch {
                throw fail(error.description)
            }
            guard count > 0 else { throw fail(ended) }
            guard buffer.withUnsafeBytes({ (try? Descriptor.writeAll(1, UnsafeRawBufferPointer(rebasing: $0[0..<count]))) != nil }) else {
                return
            }
        }
    }
}
