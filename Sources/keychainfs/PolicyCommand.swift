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

    @Option(name: .long, help: "own: a program owns the items it makes in GROUP over the bus (the default); open: every program may use them.")
    var apps: String?

    @OptionGroup var options: KeychainOptions

    func validate() throws {
        if let apps {
            guard apps == "own" || apps == "open" else { throw ValidationError("--apps takes own or open, not '\(apps)'") }
            guard group != nil else { throw ValidationError("--apps needs the group it is for") }
        }
    }

    func run() throws {
        if let group, let apps {
            let passcode = try policyPasscode()
            let fields = try policyReply(.apps(group: group, open: apps == "open", passcode: passcode), keychain: options.place)
            print("\(LineEscaping.escaped(group)): apps \(fields.first ?? apps)")
            return
        }
        let fields = try policyReply(.policy(group: group), keychain: options.place)
        guard fields.count % 6 == 0 else { throw DeviceAccess.unexpectedReply() }
        for start in stride(from: 0, to: fields.count, by: 6) {
            let rule = fields[start..<start + 6].map { LineEscaping.escaped($0) }
            if rule[1].isEmpty {
                print("\(rule[0]) (no program)")
                continue
            }
            print([rule[0], rule[1], "sha256=" + rule[2]].joined(separator: " ")
                  + (rule[3].isEmpty ? "" : " unit=" + rule[3]) + (rule[4].isEmpty ? "" : " uid=" + rule[4])
                  + (rule[5].isEmpty ? "" : " allow-jit"))
        }
        if let group {
            let mode = try policyReply(.apps(group: group, open: nil, passcode: nil), keychain: options.place)
            print("\(LineEscaping.escaped(group)): apps \(mode.first ?? "own")")
        }
    }
}
