import ArgumentParser
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
            Exit status: 0 on success, 1 when the operation failed (the message says why), \
            64 for a command line that does not parse.
            """,
        subcommands: [InitCommand.self, MountCommand.self, UnmountCommand.self,
                      LockCommand.self, UnlockCommand.self, StatusCommand.self, PasscodeCommand.self,
                      BackupCommand.self, RestoreCommand.self]
    )
}

/// Exit statuses, documented once in the command's help.
enum ExitStatus {
    static let failure = ExitCode(1)
}

/// Prints a message to standard error and fails with status 1.
func fail(_ message: String) -> ExitCode {
    printError("keychainfs: " + message)
    return ExitStatus.failure
}

func printError(_ message: String) {
    var line = message + "\n"
    line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
}
