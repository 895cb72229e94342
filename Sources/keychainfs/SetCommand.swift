import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct SetCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set",
        abstract: "Add or replace an item; its value is all of standard input (never an argument).",
        discussion:
            "The item gets the device's current accessmode and migrate setting, as a write through a mount does.")

    @Argument(help: "The item, as GROUP/IDENTIFIER.", completion: NameCompletion.items)
    var item: ItemAddress

    @OptionGroup var options: KeychainOptions

    func run() throws {
        let device = try RunningDevice(options.place)
        let value: SecureBytes
        do {
            value = try readSecret(from: 0)
        } catch .read(let error) {
            throw fail("cannot read standard input: \(error)")
        } catch .tooLarge {
            throw fail("the value is larger than 1 MiB; nothing was written")
        }
        try device.store(value, at: item)
    }
}
