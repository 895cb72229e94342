import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

// The command line's one way to a keychain's device (issue 32): which
// device (KeychainPlace, in KeychainOptions.swift), starting it on demand
// (DeviceLauncher), the request and the map from its reply to a message and
// an exit status (RunningDevice), and the keychain opened in this process
// when no device holds it (DeviceAccess.openDirectly).

/// What every command says when the device's reply is not one it can use.
enum DeviceAccess {
    /// A reply of a kind the request never gets: another build answered.
    static func unexpectedReply() -> ExitCode {
        fail("unexpected reply from the device (a device of another keychainfs build?)")
    }

    /// No reply at all: the device went away, or never answered.
    static func noAnswer() -> ExitCode {
        fail("the device does not answer", status: ExitStatus.noDevice)
    }

    /// The keychain opened in this process, for the commands that carry on
    /// without a device (passcode, policy, backup); a keychain another
    /// process holds, or one that cannot be opened, is the message the user gets.
    static func openDirectly(_ keychain: KeychainDirectory) throws -> Device {
        do {
            return try Device(directory: keychain)
        } catch {
            throw fail(keychain.sentence(for: error))
        }
    }
}

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
            case .interactionNotAllowed:
                throw fail("the keychain is locked for \(item); unlock it first", status: ExitStatus.locked)
            case .authFailed: throw fail(message, status: ExitStatus.denied)
            case .missingEntitlement:
                throw fail(
                    "\(item): the program asking (\(CommandLine.arguments[0])) is not entitled to its access group",
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
            throw DeviceAccess.noAnswer()
        }
        return status.isLocked
    }

    /// Stores a value; returns the core error that refused it (nil: stored)
    /// without a message, for callers that report per item.
    func tryStore(
        _ value: SecureBytes, at item: ItemAddress, condition: PasswordManager.WriteCondition,
        details: ItemDetails? = nil
    ) throws -> KeychainError? {
        switch try deliver(
            .set(group: item.group, identifier: item.identifier, value: value, condition: condition, details: details))
        {
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
        guard case .ok(let fields) = try checked(reply, item: group) else { throw DeviceAccess.unexpectedReply() }
        return try ItemDetails.listed(fromFields: fields)
    }

    /// An item's value; nil when it does not exist (said by no message).
    func valueIfPresent(of item: ItemAddress) throws -> SecureBytes? {
        let reply = try deliver(.get(group: item.group, identifier: item.identifier))
        if case .keychainError(.itemNotFound, _)? = reply { return nil }
        guard case .value(let value, _) = try checked(reply, item: "\(item)") else {
            throw DeviceAccess.unexpectedReply()
        }
        return value
    }

    /// An item's value.
    func value(of item: ItemAddress) throws -> SecureBytes {
        guard
            case .value(let value, _) = try send(.get(group: item.group, identifier: item.identifier), item: "\(item)")
        else {
            throw DeviceAccess.unexpectedReply()
        }
        return value
    }

    /// The groups, or a group's items as (identifier, class, size) (both work while locked).
    func groups() throws -> [String] {
        guard case .ok(let fields) = try send(.list(group: nil), item: "the keychain") else {
            throw DeviceAccess.unexpectedReply()
        }
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
            throw DeviceAccess.unexpectedReply()
        }
        return items
    }

    /// Stores a value as `set` does (the device's accessmode and migrate
    /// setting); `.ifAbsent` refuses to replace one, atomically.
    func store(_ value: SecureBytes, at item: ItemAddress, condition: PasswordManager.WriteCondition = .always) throws {
        _ = try send(
            .set(group: item.group, identifier: item.identifier, value: value, condition: condition), item: "\(item)")
    }
}

/// Starts per-user device processes detached (own session, stdio on
/// /dev/null) and waits for each one's word on a pipe: ready, or why not.
enum DeviceLauncher {
    /// Runs `keychainfs ARGUMENTS --ready-fd 3` detached; nil once it is
    /// ready, else why not.
    static func start(_ arguments: [String]) -> String? {
        var pipeEnds: [Int32] = [0, 0]
        guard pipe(&pipeEnds) == 0 else { return "cannot create a pipe" }
        // Only the child's dup2'd copy (fd 3) may stay open in it.
        for end in pipeEnds { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        var spawnOptions = Spawn.Options()
        spawnOptions.descriptors = [(3, pipeEnds[1])]
        spawnOptions.nullStandardStreams = true
        spawnOptions.newSession = true
        let child = Spawn.start([selfExecutable()] + arguments + ["--ready-fd", "3"], options: spawnOptions)
        close(pipeEnds[1])
        defer { close(pipeEnds[0]) }
        guard child != nil else { return "cannot start the device process" }
        let answer = String(decoding: readLine(pipeEnds[0]), as: UTF8.self)
        if answer.hasPrefix("ok") { return nil }
        return answer.hasPrefix("error ")
            ? String(answer.dropFirst(6)).trimmingNewline
            : "the device process exited before it was ready"
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
        let problem = start(["start", "--foreground", "--keychain", keychain.path])
        // Another client may have started it first: its device serves us too.
        if problem == nil || DeviceClient.isServing(socketPath) { return (socketPath, nil) }
        return (nil, problem)
    }
}
