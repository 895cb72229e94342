import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct ExecCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "exec",
        abstract: "Run a command with items in its environment.",
        discussion: """
            keychainfs exec --env TOKEN=default/github.com -- COMMAND ARGS... Every item is read \
            before the command runs: if one is locked or absent, the command does not run. The \
            values reach the command's environment only (never an argument, never a log).
            """)

    @Option(
        name: .customLong("env"), help: "NAME=GROUP/IDENTIFIER: put that item's value in $NAME.",
        completion: NameCompletion.environment)
    var variables: [String] = []

    @OptionGroup var options: KeychainOptions

    @Argument(parsing: .captureForPassthrough, help: "The command and its arguments, after --.")
    var command: [String] = []

    func validate() throws {
        // The passthrough argument takes every word, `--help` too; before
        // `--` it is this command's (after `--`, the program's own).
        if let first = command.first, first == "--help" || first == "-h" { throw CleanExit.helpRequest(self) }
        let words = command.first == "--" ? Array(command.dropFirst()) : command
        guard !words.isEmpty else { throw ValidationError("Give the command to run after --.") }
        for variable in variables {
            let parts = variable.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2, !parts[0].isEmpty, !parts[0].contains("="), ItemAddress(argument: parts[1]) != nil
            else {
                throw ValidationError("--env takes NAME=GROUP/IDENTIFIER, not '\(variable)'.")
            }
        }
    }

    func run() throws {
        let words = command.first == "--" ? Array(command.dropFirst()) : command
        let device = try RunningDevice(options.place)
        var values: [(String, SecureBytes)] = []
        for variable in variables {
            let parts = variable.split(separator: "=", maxSplits: 1).map(String.init)
            let item = ItemAddress(argument: parts[1])!
            let value = try device.value(of: item)
            guard !value.withUnsafeBytes({ $0.contains(0) }) else {
                throw fail("\(item) holds a NUL byte, which an environment variable cannot carry; nothing was run")
            }
            values.append((parts[0], value))
        }
        for (name, value) in values {
            // NUL-terminated in a wiped buffer; setenv copies it into the
            // environment that execvp hands over (and that exec then replaces).
            var text = [CChar](repeating: 0, count: value.count + 1)
            value.withUnsafeBytes { raw in text.withUnsafeMutableBytes { $0.copyMemory(from: raw) } }
            setenv(name, text, 1)
            text.withUnsafeMutableBytes { wipeMemory($0) }
        }
        let arguments = words.map { strdup($0) } + [nil]
        execvp(words[0], arguments)
        throw fail("cannot run \(words[0]): \(Errno.current.description)", status: ExitCode(127))
    }
}
