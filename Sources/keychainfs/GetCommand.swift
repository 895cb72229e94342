import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct GetCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "get", abstract: "Print an item's value, byte-exact, from the running device.",
        // pass users type `show`.
        aliases: ["show"])

    @Argument(help: "The item, as GROUP/IDENTIFIER.", completion: NameCompletion.items, transform: ItemAddress.parsed)
    var item: ItemAddress

    @OptionGroup var options: KeychainOptions

    @Flag(help: "Print {\"group\", \"identifier\", \"value\"} (a value that is not UTF-8 as \"base64\").")
    var json = false

    @Flag(
        name: [.customShort("c"), .long],
        help:
            "Copy the value's first line (the password, as pass -c does) to the clipboard instead of printing it; cleared after 45 s ($KEYCHAINFS_CLIP_TIME) unless it changed."
    )
    var clip = false

    func validate() throws {
        if clip && json { throw ValidationError("--clip and --json do not go together.") }
    }

    func run() throws {
        try Self.printValue(of: item, from: options.place, json: json, clip: clip)
    }

    /// `get GROUP/ID`, the form scripts run in loops, with `--keychain DIR`
    /// (or `--keychain=DIR`) before or after it or not at all, without the
    /// argument parser: its first use of the command tree (protocol
    /// conformance lookups) costs more than the rest of the command
    /// (docs/BENCHMARKS.md). Any other form, an option included, takes the
    /// parser's path.
    static func runWithoutParser(_ arguments: [String]) -> Never? {
        guard arguments.first == "get", let (itemArgument, keychain) = Self.fastArguments(arguments.dropFirst()),
            let item = ItemAddress(argument: itemArgument)
        else { return nil }
        do {
            try printValue(
                of: item, from: KeychainOptions.place(named: keychain), json: false,
                clip: false)
            Glibc.exit(0)
        } catch let status as ExitCode {
            Glibc.exit(status.rawValue)
        } catch {
            printError("keychainfs: \(error)")
            Glibc.exit(1)
        }
    }

    /// The item and the keychain named of `get`'s arguments when they are
    /// `ITEM`, `ITEM --keychain DIR`, `--keychain DIR ITEM` or either with
    /// `--keychain=DIR`; nil for anything else (the parser's to judge).
    static func fastArguments(_ arguments: ArraySlice<String>) -> (item: String, keychain: String?)? {
        var rest = Array(arguments)
        var keychain: String?
        if let index = rest.firstIndex(of: "--keychain"), index + 1 < rest.count, !rest[index + 1].hasPrefix("-") {
            keychain = rest[index + 1]
            rest.removeSubrange(index...(index + 1))
        } else if let index = rest.firstIndex(where: { $0.hasPrefix("--keychain=") }) {
            keychain = String(rest[index].dropFirst("--keychain=".count))
            rest.remove(at: index)
        }
        guard rest.count == 1, !rest[0].hasPrefix("-"), keychain.map({ !$0.isEmpty }) ?? true else { return nil }
        return (rest[0], keychain)
    }

    static func printValue(of item: ItemAddress, from place: KeychainPlace, json: Bool, clip: Bool) throws {
        let value = try RunningDevice(place).value(of: item)
        if clip {
            // pass's entries hold the password on the first line and notes after it: `-c` copies the password.
            let firstLine = try value.withUnsafeBytes { (bytes) throws(KeychainError) in
                try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: bytes.prefix { $0 != UInt8(ascii: "\n") }))
            }
            try Clipboard.current().copyAndClearLater(firstLine, what: "the first line of \(item)")
        } else if json {
            // The edge where a caller asked for text: the value becomes a String here only.
            let field =
                value.string().map { "\"value\": " + jsonString($0) }
                ?? "\"base64\": \"" + base64(value.bytes()) + "\""
            print("{\"group\": \(jsonString(item.group)), \"identifier\": \(jsonString(item.identifier)), \(field)}")
        } else {
            guard value.withUnsafeBytes({ (try? BorrowedDescriptor.standardOutput.writeAll($0)) != nil }) else {
                throw fail("cannot write the value to standard output")
            }
            // A terminal's prompt starts on a line of its own; a pipe gets the value's bytes alone.
            if isatty(1) == 1, value.withUnsafeBytes({ $0.last }) != UInt8(ascii: "\n") {
                _ = try? BorrowedDescriptor.standardOutput.writeAll(Array("\n".utf8))
            }
        }
    }
}
