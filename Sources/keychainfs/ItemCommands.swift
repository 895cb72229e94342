import ArgumentParser
import KeychainCore
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

/// The running device of a keychain, for the commands that are its clients
/// (no mount point needed; the device checks that the peer is its user),
/// started when the first request finds none listening.
final class RunningDevice {
    private let place: KeychainPlace
    private let socketPath: String
    private var startAttempted = false

    /// Exits with ``ExitStatus/absent`` when there is no keychain.
    init(_ place: KeychainPlace) throws {
        if case .directory(let keychain) = place, !keychain.exists {
            throw fail("no keychain at \(keychain.path)", status: ExitStatus.absent)
        }
        self.place = place
        socketPath = try place.socketPath()
    }

    /// The reply to `request`: sent to the device that listens, or to one
    /// started for it when none does (``ExitStatus/noDevice`` when it cannot be started).
    fileprivate func deliver(_ request: DeviceRequest) throws -> DeviceReply? {
        switch DeviceClient.deliver(request, to: socketPath) {
        case .answered(let reply): return reply
        case .unanswered: return nil
        case .notListening:
            guard !startAttempted else { return nil }
            startAttempted = true
            let device = place.startedDevice()
            guard device.socketPath != nil else {
                throw fail("no device for \(place.name): \(device.problem ?? "")", status: ExitStatus.noDevice)
            }
            return try deliver(request)
        }
    }

    /// Sends a request; a failure becomes the message and exit status the user gets.
    func send(_ request: DeviceRequest, item: String) throws -> DeviceReply {
        try checked(try deliver(request), item: item)
    }

    /// A reply as ``send(_:item:)`` gives it: a failure becomes the message and exit status.
    func checked(_ reply: DeviceReply?, item: String) throws -> DeviceReply {
        switch reply {
        case nil:
            throw fail("the device went away", status: ExitStatus.noDevice)
        case .keychainError(let error, let message)?:
            switch error {
            case .itemNotFound: throw fail("\(item) does not exist", status: ExitStatus.absent)
            // Only a create-only write (generate without --force) asks for this.
            case .duplicateItem: throw fail("\(item) already exists and was kept (--force replaces it)")
            case .interactionNotAllowed: throw fail("the keychain is locked for \(item); unlock it first", status: ExitStatus.locked)
            case .authFailed: throw fail(message, status: ExitStatus.denied)
            case .missingEntitlement:
                throw fail("\(item): the program asking (\(CommandLine.arguments[0])) is not entitled to its access group",
                           status: ExitStatus.denied)
            default: throw fail("\(item): \(message)")
            }
        case .systemError(let code, let message)?:
            throw fail("\(item): \(message)", status: code == ENOENT ? ExitStatus.absent : ExitStatus.failure)
        case let reply?:
            return reply
        }
    }
}

extension RunningDevice {
    /// Whether the keychain is locked (`whenUnlocked` keys absent).
    func isLocked() throws -> Bool {
        guard case .ok(let fields)? = try deliver(.status), let status = DeviceStatus(fields: fields) else {
            throw fail("the device does not answer", status: ExitStatus.noDevice)
        }
        return status.isLocked
    }

    /// Stores a value; returns the core error that refused it (nil: stored)
    /// without a message, for callers that report per item.
    func tryStore(_ value: SecureBytes, at item: ItemAddress, condition: PasswordManager.WriteCondition,
                  details: ItemDetails? = nil) throws -> KeychainError? {
        switch try deliver(.set(group: item.group, identifier: item.identifier, value: value, condition: condition, details: details)) {
        case .ok?: return nil
        case .keychainError(let error, _)?: return error
        case .systemError(_, let message)?: throw fail("\(item): \(message)")
        case .value?, nil: throw fail("the device went away", status: ExitStatus.noDevice)
        }
    }

    /// The items of `group` that have details (none when there is no such group).
    func itemsWithDetails(of group: String) throws -> [(identifier: String, details: ItemDetails)] {
        let reply = try deliver(.details(group: group, identifier: nil))
        if case .keychainError(.itemNotFound, _)? = reply { return [] }
        guard case .ok(let fields) = try checked(reply, item: group) else { throw fail("unexpected reply from the device") }
        return try PasswordManager.details(fromFields: fields)
    }

    /// An item's value; nil when it does not exist (said by no message).
    func valueIfPresent(of item: ItemAddress) throws -> SecureBytes? {
        let reply = try deliver(.get(group: item.group, identifier: item.identifier))
        if case .keychainError(.itemNotFound, _)? = reply { return nil }
        guard case .value(let value, _) = try checked(reply, item: "\(item)") else { throw fail("unexpected reply from the device") }
        return value
    }

    /// An item's value.
    func value(of item: ItemAddress) throws -> SecureBytes {
        guard case .value(let value, _) = try send(.get(group: item.group, identifier: item.identifier), item: "\(item)") else {
            throw fail("unexpected reply from the device")
        }
        return value
    }

    /// The groups, or a group's items as (identifier, class, size) (both work while locked).
    func groups() throws -> [String] {
        guard case .ok(let fields) = try send(.list(group: nil), item: "the keychain") else { throw fail("unexpected reply from the device") }
        return fields
    }

    func items(of group: String) throws -> [ItemListing] {
        try itemRows(send(.list(group: group), item: group))
    }

    /// ``items(of:)``, or nil when the group's policy does not admit this program.
    func itemsIfAdmitted(of group: String) throws -> [ItemListing]? {
        let reply = try deliver(.list(group: group))
        if case .keychainError(.missingEntitlement, _)? = reply { return nil }
        return try itemRows(checked(reply, item: group))
    }

    /// A group listing's items.
    private func itemRows(_ reply: DeviceReply) throws -> [ItemListing] {
        guard case .ok(let fields) = reply, let items = try? ItemListing.items(fromFields: fields) else {
            throw fail("unexpected reply from the device")
        }
        return items
    }

    /// Stores a value as `set` does (the device's accessmode and migrate
    /// setting); `.ifAbsent` refuses to replace one, atomically.
    func store(_ value: SecureBytes, at item: ItemAddress, condition: PasswordManager.WriteCondition = .always) throws {
        _ = try send(.set(group: item.group, identifier: item.identifier, value: value, condition: condition), item: "\(item)")
    }
}

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
