import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// Which of the release build's two links a command runs in
/// (docs/SECURITY.md, "Two builds of one program"): the one linked at
/// fixed addresses starts fast, the position-independent one is placed at
/// a random address. A command stays in the fast one only when all it
/// does is ask its own user's device and print the answer: it serves
/// nobody and reads nothing but its arguments, its standard input and the
/// device's reply. Anything else (a device, a mount, the service, the bus,
/// a passcode's prompt, an import's parser) continues in the other.
enum BuildChoice {
    /// The commands that only ask a device (what scripts run in loops), and `help`.
    static let askingCommands: Set<String> = [
        "get", "set", "rm", "ls", "find", "status", "lock", "git-credential", "docker-credential", "help"
    ]

    /// Whether `arguments` (the command line without the program, the
    /// keychain option already after the command) only ask a device. No
    /// command at all is `--version` or `--help`: text, and nothing asked.
    static func onlyAsks(_ arguments: [String]) -> Bool {
        guard let command = arguments.first, !command.hasPrefix("-") else { return true }
        return askingCommands.contains(command)
    }

    /// Returns when the command runs in this process; otherwise replaces
    /// the process with the position-independent build, given the same
    /// arguments, environment and descriptors (a device's `--ready-fd`),
    /// or exits with why it cannot.
    static func enter(for arguments: [String]) {
        guard !ExecutableImage.isPositionIndependent, !onlyAsks(arguments) else { return }
        let build = ExecutableImage.positionIndependentBuild(of: selfExecutable())
        let argv = CommandLine.arguments.map { strdup($0) } + [nil]
        execv(build, argv)
        printError(
            "keychainfs: this command runs in keychainfs's position-independent build, \(build), "
                + "which cannot be run (\(Errno.current)): reinstall keychainfs, or build it with ./scripts/build")
        Glibc.exit(1)
    }
}
