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
            for item in try device.items(of: group) where patterns.contains(where: { Self.matches($0, group: group, identifier: item.identifier) }) {
                print(group + "/" + item.identifier)
                found = true
            }
        }
        if !found { throw ExitStatus.absent }
    }

    /// fnmatch(3)'s FNM_CASEFOLD, a GNU extension Swift's Glibc module does not import.
    private static let caseFold: Int32 = 1 << 4

    static func matches(_ pattern: String, group: String, identifier: String) -> Bool {
        if pattern.contains(where: { "*?[".contains($0) }) {
            return fnmatch(pattern, group + "/" + identifier, caseFold) == 0 || fnmatch(pattern, identifier, caseFold) == 0
        }
        return (group + "/" + identifier).lowercased().contains(pattern.lowercased())
    }
}
