import ArgumentParser
import KeychainCore
import KeychainProtocol
#if canImport(Glibc)
import Glibc
#endif

struct AclCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "acl",
        abstract: "Show whose an item is on the Secret Service and which other programs may use it; change that list.",
        discussion: """
            An item a program made over the bus belongs to it: it reads, changes and deletes it there \
            without a question; another program waits while pinentry asks you (Deny, Allow once, \
            Always allow), and Always allow puts it on the item's list shown here. An item made \
            through a mount or the command line belongs to no program. Showing works while locked \
            (the list is sealed with the item's details, not its value). --add and --remove change \
            the list; they need the passcode (read from the terminal or one line of standard input, \
            an empty line if the keychain has none) and the item unlocked.
            """)

    @Argument(help: "The item, as GROUP/IDENTIFIER.", completion: NameCompletion.items, transform: ItemAddress.parsed)
    var item: ItemAddress

    @OptionGroup var options: KeychainOptions

    @Flag(
        help:
            "Print {\"owner\", \"allowed\"}: each program as {\"executable\", \"sha256\", \"package\", \"unit\"} (owner null when none)."
    )
    var json = false

    @Option(
        name: .long,
        help: "Put the program at this executable on the item's list (its SHA-256, and its package, are pinned).")
    var add: String?

    @Option(name: .long, help: "Take every program at this executable off the item's list.")
    var remove: String?

    @Option(
        name: .long,
        help: "Make an item of no program (imported, or made through a mount) this executable's, as if it had made it.")
    var claim: String?

    func validate() throws {
        if [add, remove, claim].compactMap({ $0 }).count > 1 {
            throw ValidationError("one of --add, --remove and --claim")
        }
    }

    func run() throws {
        if let path = add { return try change(path, .add) }
        if let path = remove { return try change(path, .remove) }
        if let path = claim { return try change(path, .claim) }
        let device = try RunningDevice(options.place)
        let details = try device.call(
            .details(group: item.group, identifier: item.identifier), about: .item("\(item)")
        ).entries.first?.details
        if json {
            let allowed = (details?.allowed ?? []).map(Self.json).joined(separator: ", ")
            print("{\"owner\": \(details?.owner.map(Self.json) ?? "null"), \"allowed\": [\(allowed)]}")
            return
        }
        guard let owner = details?.owner else {
            print(
                "owner: none (made through a mount or the command line: any program of yours may use it over the bus)")
            return
        }
        // Escaped: a path is another program's to choose.
        print("owner: " + LineEscaping.escaped(owner.described))
        for program in details?.allowed ?? [] { print("allowed: " + LineEscaping.escaped(program.described)) }
    }

    /// `--add`, `--remove` or `--claim`, as `grant` and `revoke`: the
    /// executable resolved and opened here, as this user, and passed to the device.
    private func change(_ path: String, _ change: AccessChange) throws {
        let removing = change == .remove
        let passcode = try policyPasscode()
        var resolved = absolutePath(path)
        if let canonical = realpath(resolved, nil) {
            resolved = String(cString: canonical)
            free(canonical)
        }
        let file = removing ? nil : FileDescriptor(open(resolved, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY))
        let passed = file.borrowed
        if removing {
            let count = try policyAnswer(
                .disallow(group: item.group, identifier: item.identifier, executable: resolved, passcode: passcode),
                keychain: options.place, passing: passed
            ).count
            print("took \(count) program(s) at \(shown(resolved)) off the list of \(item)")
        } else {
            let pinned = try policyAnswer(
                change == .claim
                    ? .claim(group: item.group, identifier: item.identifier, executable: resolved, passcode: passcode)
                    : .allow(group: item.group, identifier: item.identifier, executable: resolved, passcode: passcode),
                keychain: options.place, passing: passed)
            print(
                change == .claim
                    ? "\(item) belongs to \(shown(pinned.executable)) (sha256 \(pinned.digestHex)) now"
                    : "\(shown(pinned.executable)) (sha256 \(pinned.digestHex)) may use \(item) over the bus")
        }
    }

    private static func json(_ claim: ProgramClaim) -> String {
        "{\"executable\": \(jsonString(claim.program.encoded)), \"sha256\": \(jsonString(claim.digestHex)), "
            + "\"package\": \(claim.package.map(jsonString) ?? "null"), \"unit\": \(claim.unit.map(jsonString) ?? "null")}"
    }
}
