import ArgumentParser
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

struct FindCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "find",
        abstract: "List the items whose names match (works while locked): GROUP/IDENTIFIER, one per line.",
        discussion: """
            A pattern with *, ? or [ is a shell glob matched against GROUP/IDENTIFIER and against \
            IDENTIFIER alone; any other pattern matches names that contain it. Case is ignored, \
            as pass find ignores it. Exit status 2 when nothing matches.
            """)

    @Argument(help: "What to look for; several patterns list the items matching any.")
    var patterns: [String]

    @OptionGroup var options: KeychainOptions

    func run() throws {
        let device = try RunningDevice(options.place)
        var found = false
        for group in try device.groups() {
            // A group whose policy does not admit this program is a note,
            // not a failure: the matches printed are the answer.
            guard let items = try device.itemsIfAdmitted(of: group) else {
                printError(
                    "\(shown(group)): not searched (its policy does not admit \(shown(CommandLine.arguments[0])))")
                continue
            }
            for item in items
            where patterns.contains(where: { Self.matches($0, group: group, identifier: item.identifier) }) {
                print(shown(group + "/" + item.identifier))
                found = true
            }
        }
        if !found { throw ExitStatus.absent }
    }

    /// fnmatch(3)'s FNM_CASEFOLD, a GNU extension Swift's Glibc module does not import.
    private static let caseFold: Int32 = 1 << 4

    static func matches(_ pattern: String, group: String, identifier: String) -> Bool {
        if pattern.contains(where: { "*?[".contains($0) }) {
            return fnmatch(pattern, group + "/" + identifier, caseFold) == 0
                || fnmatch(pattern, identifier, caseFold) == 0
        }
        return (group + "/" + identifier).lowercased().contains(pattern.lowercased())
    }
}
