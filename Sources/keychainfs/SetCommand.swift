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
        abstract:
            "Add or replace an item; its value is all of standard input (never an argument), or one line typed twice, unseen, at a terminal.",
        discussion:
            "The item gets the device's current accessmode and migrate setting, as a write through a mount does.")

    @Argument(help: "The item, as GROUP/IDENTIFIER.", completion: NameCompletion.items, transform: ItemAddress.parsed)
    var item: ItemAddress

    @OptionGroup var options: KeychainOptions

    func run() throws {
        let device = try RunningDevice(options.place)
        let value: SecureBytes
        if isatty(0) == 1 {
            // Typed at a terminal: without echo, one line (its newline is
            // the end of the value, not part of it), twice, as `pass
            // insert` asks; a pipe or a file still gives every byte.
            guard let first = Passcode.read(prompt: "Value of \(item): "), first.count > 0 else {
                throw fail("no value was typed; nothing was written")
            }
            guard let again = Passcode.read(prompt: "Repeat the value: "), again == first else {
                throw fail("the two values differ; nothing was written")
            }
            try device.store(first, at: item)
            return
        }
        do {
            value = try readSecret(from: .standardInput)
        } catch .read(let error) {
            throw fail("cannot read standard input: \(error)")
        } catch .tooLarge {
            throw fail("the value is larger than 1 MiB; nothing was written")
        }
        try device.store(value, at: item)
    }
}
