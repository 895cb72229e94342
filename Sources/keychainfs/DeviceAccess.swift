import ArgumentParser
import KeychainCore
import KeychainProtocol
import KeychainTPM
import KeychainDevice
import KeychainFS
import CLinux
#if canImport(Glibc)
import Glibc
#endif

// The command line's one way to a keychain's device (docs/CONTRIBUTING.md,
// "Where a new piece goes"): which keychain (KeychainPlace), starting its
// device on demand (DeviceLauncher), the requests (RunningDevice), the one map
// from a reply to a message and an exit status (DeviceAccess.explanation), and
// the keychain opened in this process when no device holds it
// (DeviceAccess.openDirectly). No other file of the command line talks to a
// device (./scripts/test checks it).

/// Where a command finds the keychain: a directory of this user, served
/// by this user's own device process, or the user's keychain in the
/// keychainfs service (docs/SECURITY.md, "Two modes").
enum KeychainPlace {
    case directory(KeychainDirectory)
    case service(socketPath: String)

    /// The socket of the device that serves it; fails the command when the
    /// runtime directory cannot hold it.
    func socketPath() throws -> String {
        switch self {
        case .directory(let keychain): return try keychain.deviceSocketPath()
        case .service(let socketPath): return socketPath
        }
    }

    /// The socket of a device that answers for this keychain: the service,
    /// or this user's own device, started now (headless, locked as a
    /// device boots) when none runs, as gpg-agent starts on first use.
    /// Nil with why there is none.
    func startedDevice() -> (socketPath: String?, problem: String?) {
        switch self {
        case .directory(let keychain):
            return DeviceLauncher.ensureRunning(keychain)
        case .service(let socketPath):
            return DeviceClient.isServing(socketPath)
                ? (socketPath, nil)
                : (nil, "the keychainfs service does not answer at \(socketPath) (systemctl start keychainfs.socket)")
        }
    }

    /// The keychain in a sentence's words.
    var name: String {
        switch self {
        case .directory(let keychain): return "the keychain at \(keychain.path)"
        case .service: return "your keychain in the keychainfs service"
        }
    }

    /// Fails the command unless the keychain exists (for the service: unless
    /// the service answers; it says itself when the user has no keychain).
    func requireExisting() throws {
        switch self {
        case .directory(let keychain): try keychain.requireExisting()
        case .service(let socketPath):
            guard DeviceClient.isServing(socketPath) else {
                throw fail(
                    "the keychainfs service does not answer at \(socketPath) (systemctl start keychainfs.socket)",
                    status: ExitStatus.noDevice)
            }
        }
    }
}

/// The one map from a device's reply to what the user is told, and the
/// keychain opened in this process when no device holds it.
enum DeviceAccess {
    /// What a failure's sentence names.
    enum Subject {
        /// An item or a group: "pc/x does not exist".
        case item(String)
        /// What the command was doing: "cannot lock: …".
        case action(String)
        /// Nothing: the device's own sentence.
        case device

        func sentence(_ message: String) -> String {
            switch self {
            case .item(let item): return "\(item): \(message)"
            case .action(let action): return "\(action): \(message)"
            case .device: return message
            }
        }
    }

    /// The message and exit status of an answer the command cannot use:
    /// none at all (nil), a refusal, or one the call never gets (another
    /// build answered). Commands match the refusals they expect and give the rest here.
    static func explanation(of refusal: DeviceRefusal?, about subject: Subject) -> (message: String, status: ExitCode) {
        switch refusal {
        case nil:
            return ("the device went away", ExitStatus.noDevice)
        case .unexpected?:
            return (DeviceRefusal.unexpectedSentence, ExitStatus.failure)
        case .system(let code, let message)?:
            return (subject.sentence(message), code == ENOENT ? ExitStatus.absent : ExitStatus.failure)
        case .keychain(.noSuchKeychain, let message)?:
            return (subject.sentence(message) + personalKeychainHint, ExitStatus.absent)
        case .keychain(let error, let message)?:
            guard case .item(let item) = subject else { return (subject.sentence(message), ExitStatus.of(error)) }
            switch error {
            case .itemNotFound: return ("\(item) does not exist", ExitStatus.absent)
            // Only a create-only write (generate without --force) asks for this.
            case .duplicateItem:
                return ("\(item) already exists and was kept (--force replaces it)", ExitStatus.failure)
            case .interactionNotAllowed:
                return ("the keychain is locked for \(item); unlock it first", ExitStatus.locked)
            // The device's sentence names the item, its owner and what to do.
            case .authFailed, .ownerDenied: return (message, ExitStatus.denied)
            case .missingEntitlement:
                return (
                    "\(item): the program asking (\(CommandLine.arguments[0])) is not entitled to its access group",
                    ExitStatus.denied
                )
            default: return (subject.sentence(message), ExitStatus.of(error))
            }
        }
    }

    /// ``explanation(of:about:)`` said on standard error, as the command's failure.
    static func failure(_ refusal: DeviceRefusal?, about subject: Subject) -> ExitCode {
        let explanation = explanation(of: refusal, about: subject)
        return fail(explanation.message, status: explanation.status)
    }

    /// An answer the call never gets: another build answered.
    static func unexpectedReply() -> ExitCode {
        fail(DeviceRefusal.unexpectedSentence)
    }

    /// ``explanation(of:about:)`` of an outcome that is not a success (nil: no answer came).
    static func explanation<Result>(of outcome: DeviceOutcome<Result>?, about subject: Subject) -> (
        message: String, status: ExitCode
    ) {
        explanation(of: outcome?.refusal, about: subject)
    }

    /// ``failure(_:about:)`` of an outcome that is not a success (nil: no answer came).
    static func failure<Result>(_ outcome: DeviceOutcome<Result>?, about subject: Subject) -> ExitCode {
        failure(outcome?.refusal, about: subject)
    }

    /// No reply at all: the device went away, or never answered.
    static func noAnswer() -> ExitCode {
        fail("the device does not answer" + personalKeychainHint, status: ExitStatus.noDevice)
    }

    /// Where the service answers for the user but the user has a keychain
    /// of their own too (service mode once hid it, and nothing said where it
    /// went): how to name it.
    static var personalKeychainHint: String {
        guard getenv("KEYCHAINFS_KEYCHAIN") == nil, ServicePaths.socket() != nil else { return "" }
        let own = KeychainDirectory.defaultLocation()
        guard own.exists else { return "" }
        return "; the keychainfs service answers for you now, and your own keychain at \(own.path) is used only "
            + "when named: --keychain \(own.path), or KEYCHAINFS_KEYCHAIN"
    }

    /// The keychain opened in this process, for the commands that carry on
    /// without a device (passcode, policy, backup) and those that work only
    /// so (`passcode --tpm`, which says `held` when a device holds it); a
    /// keychain another process holds, or one that cannot be opened, is the
    /// message the user gets.
    static func openDirectly(_ keychain: KeychainDirectory, held: String? = nil) throws -> Device {
        do {
            return try Device(directory: keychain)
        } catch {
            if error == .keychainInUse, let held { throw fail(held) }
            throw fail(keychain.sentence(for: error))
        }
    }
}

/// The running device of a keychain, for the commands that are its clients
/// (no mount point needed; the device checks that the peer is its user):
/// started when the first request finds none listening, or, made with
/// ``init(listeningAt:)`` or ``running(_:)``, only the one that listens now.
final class RunningDevice {
    private let socketPath: String
    /// The keychain whose device is started when none listens; nil: none is.
    private let place: KeychainPlace?
    private var startAttempted = false

    /// Exits with ``ExitStatus/absent`` when there is no keychain.
    init(_ place: KeychainPlace) throws {
        if case .directory(let keychain) = place, !keychain.exists {
            throw fail("no keychain at \(keychain.path)", status: ExitStatus.absent)
        }
        self.place = place
        socketPath = try place.socketPath()
    }

    /// The device at `socketPath`, never one started for a request.
    init(listeningAt socketPath: String) {
        self.socketPath = socketPath
        place = nil
    }

    /// The device at `socketPath` when one answers there now.
    static func running(at socketPath: String) -> RunningDevice? {
        DeviceClient.isServing(socketPath) ? RunningDevice(listeningAt: socketPath) : nil
    }

    /// The keychain's device when one answers now (none is started).
    static func running(_ place: KeychainPlace) throws -> RunningDevice? {
        running(at: try place.socketPath())
    }

    /// Starts the keychain's device, once, when this one may
    /// (``ExitStatus/noDevice`` when it cannot be started); whether it did.
    private func startOnce() throws -> Bool {
        guard let place, !startAttempted else { return false }
        startAttempted = true
        let device = place.startedDevice()
        guard device.socketPath != nil else {
            throw fail("no device for \(place.name): \(device.problem ?? "")", status: ExitStatus.noDevice)
        }
        return true
    }

    /// The device's answer to `call`; nil when none came. A call that
    /// passes a descriptor goes to a device that listens now.
    func outcome<Result>(_ call: DeviceCall<Result>, passing descriptor: BorrowedDescriptor? = nil) throws
        -> DeviceOutcome<Result>?
    {
        if let descriptor { return DeviceClient.send(call, to: socketPath, passing: descriptor) }
        switch DeviceClient.deliver(call, to: socketPath) {
        case .answered(let outcome): return outcome
        case .unanswered: return nil
        case .notListening: return try startOnce() ? outcome(call) : nil
        }
    }

    /// The answer of a device that listens now (none is started), and the
    /// descriptor it passed back with it (nil: none).
    func outcome<Result>(_ call: DeviceCall<Result>, receiving descriptor: inout FileDescriptor?)
        -> DeviceOutcome<Result>?
    {
        DeviceClient.exchange(call, with: socketPath, receiving: &descriptor)
    }

    /// The answer to `call` and the connection that carries what follows
    /// it (`watch`; the caller closes it); nil when no device answered.
    func follow<Result>(_ call: DeviceCall<Result>) throws -> DeviceClient.Followed<Result>? {
        if let followed = DeviceClient.follow(call, at: socketPath) { return followed }
        return try startOnce() ? DeviceClient.follow(call, at: socketPath) : nil
    }

    /// The answer to `call`; a refusal, or no answer, becomes the message
    /// and exit status the user gets, naming `subject`.
    @discardableResult
    func call<Result>(_ call: DeviceCall<Result>, about subject: DeviceAccess.Subject) throws -> Result {
        try answer(try outcome(call), about: subject)
    }

    /// An outcome's answer, as ``call(_:about:)`` gives it.
    @discardableResult
    func answer<Result>(_ outcome: DeviceOutcome<Result>?, about subject: DeviceAccess.Subject) throws -> Result {
        guard case .success(let result)? = outcome else { throw DeviceAccess.failure(outcome, about: subject) }
        return result
    }

    /// The device's status.
    func status() throws -> DeviceStatus {
        guard let status = try statusIfAnswered() else { throw DeviceAccess.noAnswer() }
        return status
    }

    /// The device's status; nil, said by no message, when none came.
    func statusIfAnswered() throws -> DeviceStatus? {
        guard case .success(let status)? = try outcome(.status) else { return nil }
        return status
    }
}

extension RunningDevice {
    /// Whether the keychain is locked (`whenUnlocked` keys absent).
    func isLocked() throws -> Bool {
        try status().isLocked
    }

    /// Stores a value; returns the core error that refused it (nil: stored)
    /// without a message, for callers that report per item.
    func tryStore(
        _ value: SecureBytes, at item: ItemAddress, condition: PasswordManager.WriteCondition,
        details: ItemDetails? = nil
    ) throws -> KeychainError? {
        let outcome = try outcome(
            .set(
                group: item.group, identifier: item.identifier, value: value, condition: condition, details: details))
        switch outcome {
        case .success?: return nil
        case .failure(.keychain(let error, _))?: return error
        case .failure(.system)?, .failure(.unexpected)?, nil:
            throw DeviceAccess.failure(outcome, about: .item("\(item)"))
        }
    }

    /// The items of `group` that have details (none when there is no such group).
    func itemsWithDetails(of group: String) throws -> [(identifier: String, details: ItemDetails)] {
        let outcome = try outcome(.details(group: group, identifier: nil))
        if case .failure(.keychain(.itemNotFound, _))? = outcome { return [] }
        return try answer(outcome, about: .item(group)).entries
    }

    /// An item's value; nil when it does not exist (said by no message).
    func valueIfPresent(of item: ItemAddress) throws -> SecureBytes? {
        let outcome = try outcome(.get(group: item.group, identifier: item.identifier))
        if case .failure(.keychain(.itemNotFound, _))? = outcome { return nil }
        return try answer(outcome, about: .item("\(item)")).value
    }

    /// An item's value.
    func value(of item: ItemAddress) throws -> SecureBytes {
        try call(.get(group: item.group, identifier: item.identifier), about: .item("\(item)")).value
    }

    /// The groups (they are listed while locked too).
    func groups() throws -> [String] {
        try call(.groups, about: .item("the keychain")).groups
    }

    /// A group's items as (identifier, class, size) (listed while locked too).
    func items(of group: String) throws -> [ItemListing] {
        try call(.items(inGroup: group), about: .item(group)).items
    }

    /// ``items(of:)``, or nil when the group's policy does not admit this program.
    func itemsIfAdmitted(of group: String) throws -> [ItemListing]? {
        let outcome = try outcome(.items(inGroup: group))
        if case .failure(.keychain(.missingEntitlement, _))? = outcome { return nil }
        return try answer(outcome, about: .item(group)).items
    }

    /// Stores a value as `set` does (the device's accessmode and migrate
    /// setting); `.ifAbsent` refuses to replace one, atomically.
    func store(_ value: SecureBytes, at item: ItemAddress, condition: PasswordManager.WriteCondition = .always) throws {
        try call(
            .set(group: item.group, identifier: item.identifier, value: value, condition: condition),
            about: .item("\(item)"))
    }
}

/// Starts per-user device processes detached (own session, stdin and
/// stdout on /dev/null, stderr to the journal or to `log`) and waits for
/// each one's word on a pipe: ready, or why not.
enum DeviceLauncher {
    /// A detached device's log when no journald listens: at most this many
    /// bytes are kept (it starts afresh past them).
    static let logLimit = 1 << 20

    /// Runs `keychainfs ARGUMENTS --ready-fd 3` detached, the device of
    /// `keychain`; nil once it is ready, else why not. Its diagnostics
    /// (never a secret) go to the journal (`journalctl -t keychainfs`),
    /// else to the file beside its socket (``logPath(_:)``).
    static func start(_ arguments: [String], keychain: KeychainDirectory) -> String? {
        var errors = JournalStream.open(identifier: "keychainfs")
        if errors == nil, let path = logPath(keychain) { errors = FileDescriptor(openLog(path)) }
        return detach(arguments, errors: errors.borrowed).problem
    }

    /// Runs `keychainfs ARGUMENTS --ready-fd 3` in a session of its own,
    /// its standard error on `errors` (nil: /dev/null); its pid once it said
    /// it is ready, else why not.
    static func detach(_ arguments: [String], errors: BorrowedDescriptor?) -> (pid: pid_t?, problem: String?) {
        var pipeEnds: [Int32] = [0, 0]
        guard pipe(&pipeEnds) == 0, let reading = FileDescriptor(pipeEnds[0]),
            let writing = FileDescriptor(pipeEnds[1])
        else { return (nil, "cannot create a pipe") }
        // Only the child's dup2'd copy (fd 3) may stay open in it.
        for end in pipeEnds { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        var spawnOptions = Spawn.Options()
        spawnOptions.descriptors = [(3, writing.raw)]
        if let errors { spawnOptions.descriptors.append((2, errors.raw)) }
        spawnOptions.nullStandardStreams = true
        spawnOptions.newSession = true
        // A device runs position-independent, from the device build where
        // one is installed: from a fixed-address build, it is started
        // directly (BuildChoice).
        let program = BuildChoice.deviceBuild()
        guard access(program, X_OK) == 0 else { return (nil, BuildChoice.cannotRun(program)) }
        // pam_keychainfs's hook runs with a real group that is not the
        // user's; a setgid device build would lose the user's group from its
        // ids at exec, so the hook takes it as its real one first (it stays
        // undumpable: only a change of the effective ids resets that), and
        // the device is undumpable from its first instruction by the setgid
        // exec itself (docs/SECURITY.md, "A device undumpable from its first
        // instruction").
        if getgid() != getegid(), BuildChoice.isSetgid(program), CLinux_take_effective_group() != 0 {
            return (nil, "cannot take the user's group as the real one (\(Errno.current))")
        }
        let child = Spawn.start([program] + arguments + ["--ready-fd", "3"], options: spawnOptions)
        _ = writing.close()  // the child's copy alone: its exit ends our read
        guard let child else { return (nil, "cannot start the device process") }
        let answer = String(decoding: readLine(reading.borrowed), as: UTF8.self)
        if answer.hasPrefix("ok") {
            DevicePeerAdmission.started(child)
            return (child, nil)
        }
        // It exited, or is about to: reaped here, not left a zombie.
        _ = Spawn.wait(child)
        return (
            nil,
            answer.hasPrefix("error ")
                ? String(answer.dropFirst(6)).trimmingNewline : "the device process exited before it was ready"
        )
    }

    /// The file a detached device's diagnostics go to without a journal
    /// (private, appended to; started afresh past ``logLimit``); -1 when it
    /// cannot be opened.
    /// `$XDG_RUNTIME_DIR/keychainfs/….sock.log`: the device's socket's path, with `.log`.
    static func logPath(_ keychain: KeychainDirectory) -> String? {
        (try? RuntimePaths.socketPath(for: keychain.path)).map(DeviceProcess.logPath(socket:))
    }

    private static func openLog(_ path: String) -> Int32 {
        var info = stat()
        let fresh = stat(path, &info) == 0 && Int(info.st_size) > logLimit ? O_TRUNC : 0
        return open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | fresh, 0o600)
    }

    /// The socket of the keychain's device, started now (headless, locked,
    /// as a device boots) when none runs: gpg-agent's way, so that no
    /// command needs a mount first. Nil with why it could not start.
    static func ensureRunning(_ keychain: KeychainDirectory) -> (socketPath: String?, problem: String?) {
        let socketPath: String
        do {
            socketPath = try RuntimePaths.socketPath(for: keychain.path)
        } catch {
            return (nil, error.description)
        }
        if DeviceClient.isServing(socketPath) { return (socketPath, nil) }
        guard keychain.exists else {
            return (nil, "no keychain at \(keychain.path); create one with `keychainfs init`")
        }
        let problem = start(["start", "--foreground", "--keychain", keychain.path], keychain: keychain)
        // Another client may have started it first: its device serves us too.
        if problem == nil || DeviceClient.isServing(socketPath) { return (socketPath, nil) }
        return (nil, problem)
    }
}
