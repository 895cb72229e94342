import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct RevokeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "revoke",
        abstract: "Remove a program's entitlement to an access group; needs the passcode.",
        discussion: """
            Removes the group's rules that name the executable (and the unit and uid, when given). \
            A group whose last rule is removed admits no program at all; --all removes the group's \
            policy instead, which opens the group to every program of the user again.
            """
    )

    @Argument(help: "The access group.")
    var group: String

    @OptionGroup var program: ProgramOptions

    @Flag(name: .long, help: "Remove the group's whole policy: every program may use it again.")
    var all = false

    @OptionGroup var options: KeychainOptions

    func validate() throws {
        let named = program.executable != nil || program.unit != nil || program.uid != nil
        guard named != all else {
            throw ValidationError("name the rule (--exe, --unit, --uid) or give --all, not both")
        }
    }

    func run() throws {
        let passcode = try policyPasscode()
        let count = try policyAnswer(
            .revoke(
                group: group, executable: program.absoluteExecutable, unit: program.unit,
                uid: program.uid, all: all, passcode: passcode), keychain: options.place
        ).count
        print(
            all
                ? "removed the policy of \(group) (\(count) rules): every program may use it"
                : "revoked \(count) rule\(count == 1 ? "" : "s") of \(group)")
    }
}
