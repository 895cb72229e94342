import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// Which of the release build's two links a command runs in
/// (docs/SECURITY.md, "Two builds of one program"): the one linked
/// statically at fixed addresses starts fast, the position-independent
/// one is placed at a random address. A command stays in the fast one
/// only when all it does is ask its own user's device and print the
/// answer: it serves nobody, reads nothing but its arguments, its standard
/// input and the device's reply, and loads no library (sd-bus, libcrypto
/// and tpm2-tss would bring the system's libc beside the one linked in).
/// Anything else (a device, a mount, the service, the bus, a passcode's
/// prompt, an import's parser, a one-time code) continues in the other.
enum BuildChoice {
    /// The commands that only ask a device (what scripts run in loops), and `help`.
    static let askingCommands: Set<String> = [
        "get", "show", "set", "rm", "ls", "find", "status", "lock", "git-credential", "docker-credential", "help"
    ]

    /// Whether `arguments` (the command line without the program, the
    /// keychain option already after the command) only ask a device. No
    /// command at all is `--version` or `--help`: text, and nothing asked.
    /// `start` without `--foreground` asks a device to serve the bus, or
    /// starts one: the device it starts is the position-independent build
    /// (``servingBuild()``), and `start --foreground` is that device.
    static func onlyAsks(_ arguments: [String]) -> Bool {
        guard let command = arguments.first, !command.hasPrefix("-") else { return true }
        if command == "start" { return !arguments.contains("--foreground") }
        return askingCommands.contains(command)
    }

    /// The program a device started from here runs: this one when it is
    /// position-independent, else the other half.
    static func servingBuild() -> String {
        let own = selfExecutable()
        return ExecutableImage.isPositionIndependent ? own : ExecutableImage.positionIndependentBuild(of: own)
    }

    /// The program a device runs: the device build where it is installed
    /// beside this one (setgid, so that the kernel starts the device
    /// undumpable: docs/SECURITY.md, "A device undumpable from its first
    /// instruction"), else the position-independent build.
    static func deviceBuild() -> String {
        let device = ExecutableImage.deviceBuild(of: selfExecutable())
        return access(device, X_OK) == 0 ? device : servingBuild()
    }

    /// Whether `program` is installed setgid (the device build, as the
    /// package installs it).
    static func isSetgid(_ program: String) -> Bool {
        var info = stat()
        return stat(program, &info) == 0 && info.st_mode & S_ISGID != 0
    }

    /// Whether `arguments` (as ``onlyAsks(_:)`` takes them) run a device:
    /// `start --foreground` and `mount`, which hold the keychain for clients.
    static func runsADevice(_ arguments: [String]) -> Bool {
        guard let command = arguments.first else { return false }
        return command == "mount" || (command == "start" && arguments.contains("--foreground"))
    }

    /// Returns when the command runs in this process; otherwise replaces
    /// the process with the position-independent build (the device build
    /// for a device), given the same
    /// arguments, environment and descriptors (a device's `--ready-fd`),
    /// or exits with why it cannot.
    static func enter(for arguments: [String]) {
        let build: String
        if runsADevice(arguments) {
            build = deviceBuild()
            guard build != selfExecutable() else { return }
        } else {
            guard !ExecutableImage.isPositionIndependent, !onlyAsks(arguments) else { return }
            build = servingBuild()
        }
        let argv = CommandLine.arguments.map { strdup($0) } + [nil]
        execv(build, argv)
        printError("keychainfs: this command runs in " + cannotRun(build))
        Glibc.exit(1)
    }

    /// Why `build`, the position-independent half, did not run (errno
    /// says), and what to do.
    static func cannotRun(_ build: String) -> String {
        "keychainfs's position-independent build, \(build), which cannot be run (\(Errno.current)): "
            + "reinstall keychainfs, or build it with ./scripts/build"
    }
}
