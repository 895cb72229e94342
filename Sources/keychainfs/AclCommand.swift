import ArgumentParser
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

struct AclCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "acl",
        abstract: "Show whose an item is on the Secret Service, and which other programs may use it.",
        discussion: """
            An item a program made over the bus belongs to it: it reads, changes and deletes it there \
            without a question; another program waits while pinentry asks you (Deny, Allow once, \
            Always allow), and Always allow puts it on the item's list shown here. An item made \
            through a mount or the command line belongs to no program. Works while locked (the \
            list is sealed with the item's details, not its value).
            """)

    @Argument(help: "The item, as GROUP/IDENTIFIER.", completion: NameCompletion.items)
    var item: ItemAddress

    @OptionGroup var options: KeychainOptions

    @Flag(help: "Print {\"owner\", \"allowed\"}: each program as {\"executable\", \"sha256\", \"package\", \"unit\"} (owner null when none).")
    var json = false

    func run() throws {
        let device = try RunningDevice(options.place)
        guard case .ok(let fields) = try device.send(.details(group: item.group, identifier: item.identifier), item: "\(item)") else {
            throw fail("unexpected reply from the device")
        }
        let details = try PasswordManager.details(fromFields: fields).first?.details
        if json {
            let allowed = (details?.allowed ?? []).map(Self.json).joined(separator: ", ")
            print("{\"owner\": \(details?.owner.map(Self.json) ?? "null"), \"allowed\": [\(allowed)]}")
            return
        }
        guard let owner = details?.owner else {
            print("owner: none (made through a mount or the command line: any program of yours may use it over the bus)")
            return
        }
        // Escaped: a path is another program's to choose.
        print("owner: " + LineEscaping.escaped(owner.described))
        for program in details?.allowed ?? [] { print("allowed: " + LineEscaping.escaped(program.described)) }
    }

    private static func json(_ claim: ProgramClaim) -> String {
        "{\"executable\": \(jsonString(claim.executable)), \"sha256\": \(jsonString(claim.digestHex)), "
            + "\"package\": \(claim.package.map(jsonString) ?? "null"), \"unit\": \(claim.unit.map(jsonString) ?? "null")}"
    }
}
