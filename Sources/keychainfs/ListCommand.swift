import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct ListCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ls", abstract: "List the groups, or the items of a group (works while locked).")

    @Argument(help: "A group; without one, the groups are listed.", completion: NameCompletion.groups)
    var group: String?

    @OptionGroup var options: KeychainOptions

    @Flag(help: "Print JSON: the groups as strings, items as {\"identifier\", \"class\", \"size\"}.")
    var json = false

    func run() throws {
        let device = try RunningDevice(options.place)
        guard let group else {
            let groups = try device.groups()
            print(json ? "[" + groups.map(jsonString).joined(separator: ", ") + "]" : groups.joined(separator: "\n"))
            return
        }
        let items = try device.items(of: group)
        if json {
            print(
                "["
                    + items.map {
                        "{\"identifier\": \(jsonString($0.identifier)), \"class\": \(jsonString($0.info.protectionClass.name)), \"size\": \($0.info.size)}"
                    }.joined(separator: ", ") + "]")
        } else if !items.isEmpty {
            print(items.map(\.identifier).joined(separator: "\n"))
        }
    }
}
