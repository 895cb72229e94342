import ArgumentParser
import KeychainCore
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

/// `GROUP/IDENTIFIER`, checked as the keychain checks names.
struct ItemAddress: ExpressibleByArgument, CustomStringConvertible {
    let group: String
    let identifier: String

    init(group: String, identifier: String) {
        self.group = group
        self.identifier = identifier
    }

    init?(argument: String) {
        let parts = argument.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 2, (try? ItemLimits.validate(name: parts[0])) != nil,
              (try? ItemLimits.validate(name: parts[1])) != nil else { return nil }
        group = parts[0]
        identifier = parts[1]
    }

    var description: String { group + "/" + identifier }
}

/// JSON string syntax (RFC 8259) for a text.
func jsonString(_ text: String) -> String {
    var out = "\""
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "\n": out += "\\n"
        case "\t": out += "\\t"
        case "\r": out += "\\r"
        case _ where scalar.value < 0x20: out += "\\u" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count) + String(scalar.value, radix: 16)
        default: out.unicodeScalars.append(scalar)
        }
    }
    return out + "\""
}

struct GetCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "get", abstract: "Print an item's value, byte-exact, from the running device.")

    @Argument(help: "The item, as GROUP/IDENTIFIER.", completion: NameCompletion.items)
    var item: ItemAddress

    @OptionGroup var options: KeychainOptions

    @Flag(help: "Print {\"group\", \"identifier\", \"value\"} (a value that is not UTF-8 as \"base64\").")
    var json = false

    @Flag(help: "Copy the value to the clipboard instead of printing it; cleared after 45 s ($KEYCHAINFS_CLIP_TIME) unless it changed.")
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
        guard arguments.count == 2 || (arguments.count == 4 && arguments[2] == "--keychain" && !arguments[3].hasPrefix("-")),
              arguments[0] == "get", !arguments[1].hasPrefix("-"),
              let item = ItemAddress(argument: arguments[1]) else { return nil }
        do {
            try printValue(of: item, from: KeychainOptions.place(named: arguments.count == 4 ? arguments[3] : nil), json: false, clip: false)
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
            let field = value.string().map { "\"value\": " + jsonString($0) }
                ?? "\"base64\": \"" + base64(value.bytes()) + "\""
            print("{\"group\": \(jsonString(item.group)), \"identifier\": \(jsonString(item.identifier)), \(field)}")
        } else {
            guard value.withUnsafeBytes({ (try? Descriptor.writeAll(1, $0)) != nil }) else { throw fail("cannot write the value to standard output") }
        }
    }
}

struct SetCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set",
        abstract: "Add or replace an item; its value is all of standard input (never an argument).",
        discussion: "The item gets the device's current accessmode and migrate setting, as a write through a mount does.")

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

struct RemoveCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rm", abstract: "Delete an item (works while locked, as on iOS).")

    @Argument(help: "The item, as GROUP/IDENTIFIER.", completion: NameCompletion.items)
    var item: ItemAddress

    @OptionGroup var options: KeychainOptions

    func run() throws {
        _ = try RunningDevice(options.place).send(.remove(group: item.group, identifier: item.identifier), item: "\(item)")
    }
}

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
            print("[" + items.map {
                "{\"identifier\": \(jsonString($0.identifier)), \"class\": \(jsonString($0.info.protectionClass.name)), \"size\": \($0.info.size)}"
            }.joined(separator: ", ") + "]")
        } else if !items.isEmpty {
            print(items.map(\.identifier).joined(separator: "\n"))
        }
    }
}

struct ExecCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "exec",
        abstract: "Run a command with items in its environment.",
        discussion: """
            keychainfs exec --env TOKEN=default/github.com -- COMMAND ARGS... Every item is read \
            before the command runs: if one is locked or absent, the command does not run. The \
            values reach the command's environment only (never an argument, never a log).
            """)

    @Option(name: .customLong("env"), help: "NAME=GROUP/IDENTIFIER: put that item's value in $NAME.", completion: NameCompletion.environment)
    var variables: [String] = []

    @OptionGroup var options: KeychainOptions

    @Argument(parsing: .captureForPassthrough, help: "The command and its arguments, after --.")
    var command: [String] = []

    func validate() throws {
        // The passthrough argument takes every word, `--help` too; before
        // `--` it is this command's (after `--`, the program's own).
        if let first = command.first, first == "--help" || first == "-h" { throw CleanExit.helpRequest(self) }
        let words = command.first == "--" ? Array(command.dropFirst()) : command
        guard !words.isEmpty else { throw ValidationError("Give the command to run after --.") }
        for variable in variables {
            let parts = variable.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2, !parts[0].isEmpty, !parts[0].contains("="), ItemAddress(argument: parts[1]) != nil else {
                throw ValidationError("--env takes NAME=GROUP/IDENTIFIER, not '\(variable)'.")
            }
        }
    }

    func run() throws {
        let words = command.first == "--" ? Array(command.dropFirst()) : command
        let device = try RunningDevice(options.place)
        var values: [(String, SecureBytes)] = []
        for variable in variables {
            let parts = variable.split(separator: "=", maxSplits: 1).map(String.init)
            let item = ItemAddress(argument: parts[1])!
            let value = try device.value(of: item)
            guard !value.withUnsafeBytes({ $0.contains(0) }) else {
                throw fail("\(item) holds a NUL byte, which an environment variable cannot carry; nothing was run")
            }
            values.append((parts[0], value))
        }
        for (name, value) in values {
            // NUL-terminated in a wiped buffer; setenv copies it into the
            // environment that execvp hands over (and that exec then replaces).
            var text = [CChar](repeating: 0, count: value.count + 1)
            value.withUnsafeBytes { raw in text.withUnsafeMutableBytes { $0.copyMemory(from: raw) } }
            setenv(name, text, 1)
            text.withUnsafeMutableBytes { wipeMemory($0) }
        }
        let arguments = words.map { strdup($0) } + [nil]
        execvp(words[0], arguments)
        throw fail("cannot run \(words[0]): \(String(cString: strerror(errno)))", status: ExitCode(127))
    }
}

/// RFC 4648 base64.
func base64(_ bytes: [UInt8]) -> String {
    let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    var out: [UInt8] = []
    for start in stride(from: 0, to: bytes.count, by: 3) {
        let chunk = Array(bytes[start..<min(start + 3, bytes.count)]) + [0, 0]
        let value = UInt32(chunk[0]) << 16 | UInt32(chunk[1]) << 8 | UInt32(chunk[2])
        let count = min(3, bytes.count - start)
        for index in 0..<4 {
            out.append(index <= count ? alphabet[Int(value >> UInt32(18 - 6 * index)) & 63] : UInt8(ascii: "="))
        }
    }
    return String(decoding: out, as: UTF8.self)
}
