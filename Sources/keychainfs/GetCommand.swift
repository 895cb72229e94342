import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct GetCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "get", abstract: "Print an item's value, byte-exact, from the running device.")

    @Argument(help: "The item, as GROUP/IDENTIFIER.", completion: NameCompletion.items)
    var item: ItemAddress

    @OptionGroup var options: KeychainOptions

    @Flag(help: "Print {\"group\", \"identifier\", \"value\"} (a value that is not UTF-8 as \"base64\").")
    var json = false

    @Flag(
        help:
            "Copy the value to the clipboard instead of printing it; cleared after 45 s ($KEYCHAINFS_CLIP_TIME) unless it changed."
    )
    var clip = false

    func validate() throws {
        if clip && json { throw ValidationError("--clip and --json do not go together.") }
    }

    func run() throws {
        try Self.printValue(of: item, from: options.place, json: json, clip: clip)
    }

    /// `get GROUP/ID`, the form scripts run in loops, without the argument
    /// parser: its type lookups cost more than the rest of the command
    /// (callgrind: 58% of its instructions; docs/BENCHMARKS.md). Any other
    /// form, `--keychain` or an option included, takes the parser's path.
    static func runWithoutParser(_ arguments: [String]) -> Never? {
        // `get GROUP/ID` or `get GROUP/ID --keychain DIR`, nothing else.
        guard
            arguments.count == 2
                || (arguments.count == 4 && arguments[2] == "--keychain" && !arguments[3].hasPrefix("-")),
            arguments[0] == "get", !arguments[1].hasPrefix("-"),
            let item = ItemAddress(argument: arguments[1])
        else { return nil }
        do {
            try printValue(
                of: item, from: KeychainOptions.place(named: arguments.count == 4 ? arguments[3] : nil), json: false,
                clip: false)
            Glibc.exit(0)
        } catch let status as ExitCode {
            Glibc.exit(status.rawValue)
        } catch {
            printError("keychainfs: \(error)")
            Glibc.exit(1)
        }
    }

    static func printValue(of item: ItemAddress, from place: KeychainPlace, json: Bool, clip: Bool) throws {
        let value = try RunningDevice(place).value(of: item)
        if clip {
            try Clipboard.current().copyAndClearLater(value, what: "\(item)")
        } else if json {
            // The edge where a caller asked for text: the value becomes a String here only.
            let field =
                value.string().map { "\"value\": " + jsonString($0) }
                ?? "\"base64\": \"" + base64(value.bytes()) + "\""
            print("{\"group\": \(jsonString(item.group)), \"identifier\": \(jsonString(item.identifier)), \(field)}")
        } else {
            guard value.withUnsafeBytes({ (try? Descriptor.writeAll(1, $0)) != nil }) else {
                throw fail("cannot write the value to standard output")
            }
            // A terminal's prompt starts on a line of its own; a pipe gets the value's bytes alone.
            if isatty(1) == 1, value.withUnsafeBytes({ $0.last }) != UInt8(ascii: "\n") {
                _ = try? Descriptor.writeAll(1, Array("\n".utf8))
            }
        }
    }
}
