import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct GrantCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "grant",
        abstract: "Allow a program to use an access group (entitlement); needs the passcode.",
        discussion: """
            Once a group has a rule, only the programs its rules name may list, read, write, rename \
            or remove its items, through any mount or the device's socket; every other program gets \
            EPERM. A program is its executable: the resolved path, pinned by the SHA-256 of the file \
            now (a binary replaced at that path, e.g. by an upgrade, must be granted again), and \
            optionally its systemd unit and uid. A script is run by its interpreter: grant the \
            interpreter together with the unit the script runs in. The passcode is read from the \
            terminal or one line of standard input (an empty line if the keychain has none).
            """
    )

    @Argument(help: "The access group.")
    var group: String

    @OptionGroup var program: ProgramOptions

    @Flag(
        name: .customLong("allow-jit"),
        help: "Admit the program while it runs code from anonymous memory (a JavaScript engine, a JVM).")
    var allowJIT = false

    @OptionGroup var options: KeychainOptions

    func validate() throws {
        guard program.executable != nil else { throw ValidationError("--exe is required: the program to allow") }
        guard (try? ItemLimits.validate(name: group)) != nil else {
            throw ValidationError("not a valid group name: \(group)")
        }
    }

    func run() throws {
        let passcode = try policyPasscode()
        // Resolved and opened here, as this user: the device (the service's
        // account, perhaps) pins what this user names, wherever it lies.
        let named = program.absoluteExecutable!
        var resolved = named
        if let canonical = realpath(named, nil) {
            resolved = String(cString: canonical)
            free(canonical)
        }
        let file = FileDescriptor(open(resolved, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY))
        let pinned = try policyAnswer(
            .grant(
                group: group, executable: resolved, unit: program.unit, uid: program.uid,
                passcode: passcode, allowJIT: allowJIT),
            keychain: options.place, passing: file.borrowed)
        print(
            "granted \(group) to \(shown(pinned.executable)) (sha256 \(pinned.digestHex))"
                + (program.unit.map { " in \($0)" } ?? "") + (program.uid.map { " as uid \($0)" } ?? "")
                + (allowJIT ? ", JIT code allowed" : ""))
    }
}
