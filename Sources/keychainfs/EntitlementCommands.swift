import ArgumentParser
import KeychainCore
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

/// Sends a policy request to the keychain's running device, or, when none
/// runs, carries it out on the keychain directly (as `passcode` does).
func policyReply(_ request: DeviceRequest, keychain place: KeychainPlace, passing file: Int32? = nil) throws -> [String] {
    try place.requireExisting()
    let reply: DeviceReply
    if let answer = DeviceClient.send(request, to: try place.socketPath(), passing: file) {
        reply = answer
    } else {
        guard case .directory(let keychain) = place else { throw fail("the keychainfs service went away", status: ExitStatus.noDevice) }
        let device = try DeviceAccess.openDirectly(keychain)
        reply = device.answer(policyRequest: request, by: nil)
        // The log's newest line is anchored in the keychain, as a device anchors it when it stops.
        device.shutDown()
    }
    switch reply {
    case .ok(let fields):
        return fields
    case .keychainError(.authFailed, _):
        throw fail("the passcode is wrong (or wrong passcodes have locked changes out for now); nothing was changed",
                   status: ExitStatus.denied)
    case .keychainError(.itemNotFound, let message):
        if case .revoke = request { throw fail("no such rule: nothing was revoked", status: ExitStatus.absent) }
        throw fail(message, status: ExitStatus.absent)
    case .keychainError(_, let message), .systemError(_, let message):
        throw fail(message)
    case .value:
        throw DeviceAccess.unexpectedReply()
    }
}

/// The passcode that authorises a change of policy (an empty line for a keychain without one).
func policyPasscode() throws -> SecureBytes? {
    guard let passcode = Passcode.read(prompt: "Passcode (empty if none): ") else {
        throw fail("no passcode given (an empty line if the keychain has none); nothing was changed")
    }
    return passcode.count > 0 ? passcode : nil
}

/// Who a rule is for, as `grant` and `revoke` take it.
struct ProgramOptions: ParsableArguments {
    @Option(name: .customLong("exe"), help: "The program's executable (symlinks are resolved; its SHA-256 is pinned).")
    var executable: String?

    @Option(name: .long, help: "Only when the program runs in this systemd unit (e.g. backup.service).")
    var unit: String?

    @Option(name: .long, help: "Only when the program runs as this uid.")
    var uid: UInt32?

    var absoluteExecutable: String? { executable.map(absolutePath) }
}

struct GrantCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "grant",
        abstract: "Allow a program to use an access group (entitlement); needs the passcode.",
        discussion: """
            Once a group has a rule, only the programs its rules name may list, read, write, rename \
            or remove its items, through any mount or the device's socket; every other program gets \
            EPERM. A program is its executable: the resolved path, pinned by the SHA-256 of the file \
            now (a binary replaced at that path, e.g. by an upgrade, must be granted again), and \
            optionally its systemd unit and uid. A script is run by its interpreter: grant the \
            interpreter together with the unit the script runs in. The passcode is read from the \
            terminal or one line of standard input (an empty line if the keychain has none).
            """
    )

    @Argument(help: "The access group.")
    var group: String

    @OptionGroup var program: ProgramOptions

    @Flag(name: .customLong("allow-jit"),
          help: "Admit the program while it runs code from anonymous memory (a JavaScript engine, a JVM).")
    var allowJIT = false

    @OptionGroup var options: KeychainOptions

    func validate() throws {
        guard program.executable != nil else { throw ValidationError("--exe is required: the program to allow") }
        guard (try? ItemLimits.validate(name: group)) != nil else { throw ValidationError("not a valid group name: \(group)") }
    }

    func run() throws {
        let passcode = try policyPasscode()
        // Resolved and opened here, as this user: the device (the service's
        // account, perhaps) pins what this user names, wherever it lies.
        let named = program.absoluteExecutable!
        var resolved = named
        if let canonical = realpath(named, nil) {
            resolved = String(cString: canonical)
            free(canonical)
        }
        let file = open(resolved, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)
        defer { if file >= 0 { close(file) } }
        let request = DeviceRequest.grant(group: group, executable: resolved, unit: program.unit, uid: program.uid,
                                          passcode: passcode, allowJIT: allowJIT)
        let passed: Int32? = file >= 0 ? file : nil
        let fields = try policyReply(request, keychain: options.place, passing: passed)
        guard fields.count == 2 else { throw DeviceAccess.unexpectedReply() }
        print("granted \(group) to \(shown(fields[0])) (sha256 \(fields[1]))"
              + (program.unit.map { " in \($0)" } ?? "") + (program.uid.map { " as uid \($0)" } ?? "")
              + (allowJIT ? ", JIT code allowed" : ""))
    }
}

struct RevokeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "revoke",
        abstract: "Remove a program's entitlement to an access group; needs the passcode.",
        discussion: """
            Removes the group's rules that name the executable (and the unit and uid, when given). \
            A group whose last rule is removed admits no program at all; --all removes the group's \
            policy instead, which opens the group to every program of the user again.
            """
    )

    @Argument(help: "The access group.")
    var group: String

    @OptionGroup var program: ProgramOptions

    @Flag(name: .long, help: "Remove the group's whole policy: every program may use it again.")
    var all = false

    @OptionGroup var options: KeychainOptions

    func validate() throws {
        let named = program.executable != nil || program.unit != nil || program.uid != nil
        guard named != all else { throw ValidationError("name the rule (--exe, --unit, --uid) or give --all, not both") }
    }

    func run() throws {
        let passcode = try policyPasscode()
        let fields = try policyReply(.revoke(group: group, executable: program.absoluteExecutable, unit: program.unit,
                                             uid: program.uid, all: all, passcode: passcode), keychain: options.place)
        let count = fields.first ?? "0"
        print(all ? "removed the policy of \(group) (\(count) rules): every program may use it"
                  : "revoked \(count) rule\(count == "1" ? "" : "s") of \(group)")
    }
}

struct PolicyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "policy",
        abstract: "Show the programs allowed to use each access group that has a policy.",
        discussion: """
            One line per rule: GROUP, the executable, sha256=DIGEST, and unit=, uid= and allow-jit \
            when the rule has them. A group whose policy admits no program is shown as GROUP (no program). \
            Groups without a policy are open to every program of the user and are not shown. With a \
            group, a last line says whether programs own the items they make in it over the bus \
            (apps: own, the default: another program is asked about) or not (apps: open, as \
            gnome-keyring); --apps changes that, with the passcode.
            """
    )

    @Argument(help: "Only this access group.")
    var group: String?

    @Option(name: .long, help: "own: a program owns the items it makes in GROUP over the bus (the default); open: every program may use them.")
    var apps: String?

    @OptionGroup var options: KeychainOptions

    func validate() throws {
        if let apps {
            guard apps == "own" || apps == "open" else { throw ValidationError("--apps takes own or open, not '\(apps)'") }
            guard group != nil else { throw ValidationError("--apps needs the group it is for") }
        }
    }

    func run() throws {
        if let group, let apps {
            let passcode = try policyPasscode()
            let fields = try policyReply(.apps(group: group, open: apps == "open", passcode: passcode), keychain: options.place)
            print("\(LineEscaping.escaped(group)): apps \(fields.first ?? apps)")
            return
        }
        let fields = try policyReply(.policy(group: group), keychain: options.place)
        guard fields.count % 6 == 0 else { throw DeviceAccess.unexpectedReply() }
        for start in stride(from: 0, to: fields.count, by: 6) {
            let rule = fields[start..<start + 6].map { LineEscaping.escaped($0) }
            if rule[1].isEmpty {
                print("\(rule[0]) (no program)")
                continue
            }
            print([rule[0], rule[1], "sha256=" + rule[2]].joined(separator: " ")
                  + (rule[3].isEmpty ? "" : " unit=" + rule[3]) + (rule[4].isEmpty ? "" : " uid=" + rule[4])
                  + (rule[5].isEmpty ? "" : " allow-jit"))
        }
        if let group {
            let mode = try policyReply(.apps(group: group, open: nil, passcode: nil), keychain: options.place)
            print("\(LineEscaping.escaped(group)): apps \(mode.first ?? "own")")
        }
    }
}
