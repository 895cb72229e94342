import ArgumentParser
import KeychainCore
import KeychainProtocol
import CLinux
#if canImport(Glibc)
import Glibc
#endif

/// `keychainfs`: the iOS keychain for Linux, as a filesystem.
@main
struct KeychainFSCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keychainfs",
        abstract: "An encrypted password store with iOS keychain semantics, mounted as a filesystem.",
        discussion: """
            Exit status, the same for every command: 0 on success; 1 when the operation failed \
            (the message says why); 2 the item or keychain does not exist; 3 locked (the item's \
            class key is not available); 4 denied (a wrong passcode or backup password, a lockout, \
            or a program not entitled to the access group); 5 no device: none runs for the keychain \
            and none could be started, or the service does not answer; 64 a command line that does not parse; \
            exec: 127 when the command cannot be run, otherwise the command's own status.
            """,
        version: "keychainfs \(KeychainFSCommand.version) (device protocol \(DeviceProtocol.version))",
        subcommands: [
            InitCommand.self, MountCommand.self, UnmountCommand.self,
            LockCommand.self, UnlockCommand.self, StatusCommand.self, AutoLockCommand.self, PasscodeCommand.self,
            RecoverCommand.self,
            BackupCommand.self, RestoreCommand.self, SyncCommand.self, GetCommand.self, SetCommand.self,
            RemoveCommand.self, MoveCommand.self, CopyCommand.self, ListCommand.self, FindCommand.self,
            GenerateCommand.self, OneTimeCodeCommand.self,
            EditCommand.self, ImportCommand.self, ExecCommand.self, GitCredentialCommand.self,
            DockerCredentialCommand.self, GrantCommand.self, RevokeCommand.self, PolicyCommand.self, AclCommand.self,
            LogCommand.self, WatchCommand.self, StartCommand.self, StopCommand.self, ServiceCommand.self,
            DesktopCommand.self, LoginCommand.self, PAMHookCommand.self, TPMCommand.self,
            ClipboardClearCommand.self
        ]
    )

    /// This build's version (docs/PROTOCOL.md says when the protocol changes).
    static let version = "0.4.0"

    /// Run as `git-credential-keychainfs` or `docker-credential-keychainfs`
    /// (links git and docker find on PATH), this binary is their credential
    /// helper; otherwise the keychainfs command.
    static func main() {
        // Every command may hold a secret (a value, a passcode, a credential
        // git or docker sent as text): none may end up in a core file. It
        // stays dumpable: the device reads its /proc/PID/exe and maps to
        // decide a policed group, which a non-dumpable process hides from
        // its own user (the device process itself turns dumpable off).
        _ = disableCoreFiles()
        let arguments = Array(CommandLine.arguments.dropFirst())
        switch CommandLine.arguments.first?.split(separator: "/").last {
        case "git-credential-keychainfs": GitCredentialCommand.main(arguments)
        case "docker-credential-keychainfs": DockerCredentialCommand.main(arguments)
        default:
            let arguments = keychainFirst(arguments)
            _ = GetCommand.runWithoutParser(arguments)
            if let first = arguments.first, !first.hasPrefix("-"), let problem = unknownCommand(first) {
                printError("keychainfs: " + problem)
                Glibc.exit(64)
            }
            // No command is a usage error (it once printed the help and
            // exited 0, so a script's `keychainfs "$cmd"` with an empty
            // variable passed for success). The help goes to standard error.
            if arguments.isEmpty {
                printError(helpMessage())
                Glibc.exit(64)
            }
            BuildChoice.enter(for: arguments)
            // The groups it was started with settled (docs/SECURITY.md, "A
            // device undumpable from its first instruction"): started setgid
            // as the device build, the user's group is the effective one again
            // and the device's stays saved; started by pam_keychainfs's hook,
            // the user's group becomes the real one too. The hook keeps its
            // own, so that a device it starts is undumpable from its first
            // instruction too.
            if arguments.first != PAMHookCommand.configuration.commandName, CLinux_settle_groups() != 0 {
                printError("keychainfs: cannot settle the groups it was started with (\(Errno.current))")
                Glibc.exit(1)
            }
            main(arguments)
        }
    }

    /// `--keychain DIR COMMAND ...` as `COMMAND ... --keychain DIR`: the
    /// keychain named first, as `git -C DIR` and `pass` take it, is every
    /// command's option (`keychainfs --keychain DIR init` was once "Unknown
    /// option"). Only before a known command: anything else is left for the
    /// parser to refuse.
    static func keychainFirst(_ arguments: [String]) -> [String] {
        var arguments = arguments
        let named: [String]
        if arguments.count >= 3, arguments[0] == "--keychain" {
            named = Array(arguments[0...1])
            arguments.removeFirst(2)
        } else if arguments.count >= 2, arguments[0].hasPrefix("--keychain=") {
            named = [arguments[0]]
            arguments.removeFirst()
        } else {
            return arguments
        }
        guard let command = arguments.first, !command.hasPrefix("-"), unknownCommand(command) == nil else {
            return named + arguments
        }
        // Last, where a nested command (`import pass`) takes it too, but
        // before a `--` (what follows is exec's program and its arguments).
        let end = arguments.firstIndex(of: "--") ?? arguments.endIndex
        return Array(arguments[..<end]) + named + arguments[end...]
    }

    /// Commands never offered as a typo's correction: each removes, locks,
    /// stops or replaces something, and a user who typed `show` or `mv`
    /// meant none of them.
    static let neverSuggested: Set<String> = [
        "rm", "stop", "lock", "unmount", "revoke", "restore", "recover", "passcode", "init"
    ]

    /// Why `word` names no subcommand, with the nearest one when a typo
    /// explains it (at most two edits, as git suggests, and never one that
    /// destroys: ``neverSuggested``); nil when it names one.
    static func unknownCommand(_ word: String) -> String? {
        let names = configuration.subcommands.compactMap { $0.configuration.commandName } + ["help"]
        let aliases = configuration.subcommands.flatMap { $0.configuration.aliases }
        guard !names.contains(word), !aliases.contains(word) else { return nil }
        let offered = names.filter { !neverSuggested.contains($0) }
        // A beginning of one command names it (`gen` is `generate`, not `get`, one edit away).
        let begun = offered.filter { $0.hasPrefix(word) }
        let nearest =
            begun.count == 1 && word.count >= 2
            ? (begun[0], 0) : offered.map { ($0, editDistance($0, word)) }.min { $0.1 < $1.1 }
        let hint = nearest.flatMap { $0.1 <= 2 ? "; did you mean '\($0.0)'?" : nil } ?? ""
        return "'\(word)' is not a keychainfs command\(hint) (keychainfs --help lists them)"
    }

    /// Levenshtein distance of two words.
    static func editDistance(_ a: String, _ b: String) -> Int {
        let a = Array(a.utf8), b = Array(b.utf8)
        var previous = Array(0...b.count)
        for (i, x) in a.enumerated() {
            var current = [i + 1]
            for (j, y) in b.enumerated() {
                current.append(min(previous[j + 1] + 1, current[j] + 1, previous[j] + (x == y ? 0 : 1)))
            }
            previous = current
        }
        return previous[b.count]
    }
}

/// Exit statuses, documented once in the command's help.
enum ExitStatus {
    static let failure = ExitCode(1)
    static let absent = ExitCode(2)
    static let locked = ExitCode(3)
    static let denied = ExitCode(4)
    static let noDevice = ExitCode(5)

    /// The status of a core error, the same for every command: a wrong
    /// passcode or password is "denied" wherever it is typed.
    static func of(_ error: KeychainError) -> ExitCode {
        switch error {
        case .itemNotFound, .noSuchKeychain: return absent
        case .interactionNotAllowed: return locked
        case .authFailed, .tpmLockedOut, .missingEntitlement, .ownerDenied: return denied
        case .notAvailable: return noDevice
        default: return failure
        }
    }
}

/// Prints a message to standard error and fails with `status` (1 unless said).
func fail(_ message: String, status: ExitCode = ExitStatus.failure) -> ExitCode {
    printError("keychainfs: " + message)
    return status
}

func printError(_ message: String) {
    var line = message + "\n"
    line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
}
