import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct RemoveCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rm", abstract: "Delete an item (works while locked, as on iOS).")

    @Argument(help: "The item, as GROUP/IDENTIFIER.", completion: NameCompletion.items, transform: ItemAddress.parsed)
    var item: ItemAddress

    @OptionGroup var options: KeychainOptions

    func run() throws {
        try RunningDevice(options.place).call(
            .remove(group: item.group, identifier: item.identifier), about: .item("\(item)"))
    }
}
