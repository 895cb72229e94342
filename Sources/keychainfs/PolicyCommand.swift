import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct PolicyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "policy",
        abstract: "Show the programs allowed to use each access group that has a policy.",
        discussion: """
            One line per rule: GROUP, the executable, sha256=DIGEST, and unit=, uid= and allow-jit \
            when the rule has them. A group whose policy admits no program is shown as GROUP (no program). \
            Groups without a policy are open to every program of the user and are not shown. With a \
            group, a last line says whether programs own the items they make in it over the bus \
            (apps: own, the default: another program is asked about) or not (apps: open, as \
            gnome-keyring); --apps changes that, with the passcode.
            """
    )

    @Argument(help: "Only this access group.")
    var group: String?

    @Option(
        name: .long,
        help:
            "own: a program owns the items it makes in GROUP over the bus (the default); open: every program may use them."
    )
    var apps: String?

    @OptionGroup var options: KeychainOptions

    func validate() throws {
        if let apps {
            guard apps == "own" || apps == "open" else {
                throw ValidationError("--apps takes own or open, not '\(apps)'")
            }
            guard group != nil else { throw ValidationError("--apps needs the group it is for") }
        }
    }

    func run() throws {
        if let group, let apps {
            let passcode = try policyPasscode()
            let setting = try policyAnswer(
                .apps(group: group, open: apps == "open", passcode: passcode), keychain: options.place)
            print("\(LineEscaping.escaped(group)): apps \(setting.rawValue)")
            return
        }
        for row in try policyAnswer(.policy(group: group), keychain: options.place).rows {
            let group = LineEscaping.escaped(row.group)
            guard let rule = row.rule else {
                print("\(group) (no program)")
                continue
            }
            print(
                [group, LineEscaping.escaped(rule.executable), "sha256=" + rule.digestHex].joined(separator: " ")
                    + (rule.unit.map { " unit=" + LineEscaping.escaped($0) } ?? "")
                    + (rule.uid.map { " uid=\($0)" } ?? "")
                    + (rule.allowsJIT ? " allow-jit" : ""))
        }
        if let group {
            let mode = try policyAnswer(.apps(group: group, open: nil, passcode: nil), keychain: options.place)
            print("\(LineEscaping.escaped(group)): apps \(mode.rawValue)")
        }
    }
}
