import ArgumentParser
import KeychainCore
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
            or a program not entitled to the access group); 5 no device is running for the \
            keychain (get, set, rm, ls, exec need one); 64 a command line that does not parse; \
            exec: 127 when the command cannot be run, otherwise the command's own status.
            """,
        subcommands: [InitCommand.self, MountCommand.self, UnmountCommand.self,
                      LockCommand.self, UnlockCommand.self, StatusCommand.self, PasscodeCommand.self,
                      BackupCommand.self, RestoreCommand.self, GetCommand.self, SetCommand.self,
                      RemoveCommand.self, ListCommand.self, ExecCommand.self, GitCredentialCommand.self,
                      DockerCredentialCommand.self, GrantCommand.self, RevokeCommand.self, PolicyCommand.self,
                      LogCommand.self, WatchCommand.self, ServiceCommand.self]
    )

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
        default: main(arguments)
        }
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
        case .authFailed, .missingEntitlement: return denied
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
