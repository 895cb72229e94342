import ArgumentParser
import KeychainCore
import KeychainProtocol
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

/// The `.control` file of a mount, read as a user would with cat: which
/// device serves the mount (its `keychain` and `mode` lines), and whether
/// one does. Commands go to that device over its socket (one control path:
/// docs/FILESYSTEM.md, "`.control`"); writing `.control` is for shell users.
enum MountControlFile {
    /// The status text as the device wrote it; nil when there is no control file.
    static func text(_ mountpoint: String) -> [UInt8]? {
        guard let fd = FileDescriptor(open(mountpoint + "/.control", O_RDONLY | O_CLOEXEC)) else { return nil }
        return try? fd.borrowed.readAll()
    }

    /// The `key: value` status lines, values unescaped; nil when there is
    /// no control file. A key that appears twice is a forged line: the first wins.
    static func read(_ mountpoint: String) -> [String: String]? {
        guard let text = text(mountpoint) else { return nil }
        var status: [String: String] = [:]
        for line in String(decoding: text, as: UTF8.self).split(separator: "\n") {
            let parts = line.split(separator: ":", maxSplits: 1)
            guard parts.count == 2, status[String(parts[0])] == nil,
                let value = LineEscaping.unescaped(String(parts[1].dropFirst()))
            else { continue }
            status[String(parts[0])] = value
        }
        return status
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

    /// The keychain's device, started by its first request when none runs.
    func device() throws -> RunningDevice {
        let place = options.place
        try place.requireExisting()
        return try RunningDevice(place)
    }

    /// The keychain's device when one runs (none is started for this).
    func runningDevice() throws -> RunningDevice? {
        let place = options.place
        try place.requireExisting()
        return try RunningDevice.running(place)
    }
}

struct MountpointArgument: ParsableArguments {
    @Argument(help: "The mount point.")
    var mountpoint: String

    init() {}
    init(mountpoint: String) { self.mountpoint = mountpoint }

    var path: String { canonicalMountPoint(mountpoint) }

    func requireControl() throws -> [String: String] {
        guard let status = MountControlFile.read(path) else { throw fail(missingControl) }
        return status
    }

    /// Who serves a mount, as its `.control` says.
    enum Server {
        /// The keychainfs service: the mount is its user's, and the service
        /// ends its session when the kernel ends the connection.
        case service
        /// A per-user device of the keychain in `keychain`.
        case device(RunningDevice, keychain: KeychainDirectory)
    }

    /// Who serves the mount: read from its `.control` (which keychain, and
    /// whether the service does), the one place a command reads it.
    func server() throws -> Server {
        let status = try requireControl()
        if status["mode"] == "service" { return .service }
        guard let keychain = status["keychain"] else { throw fail(missingControl) }
        return .device(
            RunningDevice(listeningAt: try keychainSocketPath(keychain)), keychain: KeychainDirectory(path: keychain))
    }

    /// The device serving the mount, reached over its socket as every
    /// command reaches a device (one control path; `.control` is for shell
    /// users: docs/FILESYSTEM.md, "`.control`").
    func device() throws -> RunningDevice {
        switch try server() {
        case .service:
            guard let socket = ServicePaths.socket() else {
                throw fail(
                    "\(path) is served by the keychainfs service, which does not answer", status: ExitStatus.noDevice)
            }
            return RunningDevice(listeningAt: socket)
        case .device(let device, _):
            return device
        }
    }

    /// Why there is no control file to talk to, and what to do.
    var missingControl: String {
        MountTable.isDeadMount(path)
            ? "the device process serving \(path) has died; run `keychainfs unmount \(path.shellWord)`, then mount again"
            : "\(path) is not a keychainfs mount (no .control file)"
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
