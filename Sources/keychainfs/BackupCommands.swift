import ArgumentParser
import KeychainCore
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

/// Where a command that needs the class keys does its work: through the
/// running device (which must be unlocked), or on the keychain itself when
/// no device holds it (unlocked here with its passcode, read first).
enum KeysHolder {
    case device(socketPath: String)
    /// The keychain opened here, and the passcode that unlocked it.
    case local(PasswordManager, passcode: SecureBytes?)

    static func find(_ place: KeychainPlace) throws -> KeysHolder {
        guard case .directory(let keychain) = place else {
            try place.requireExisting()
            return .device(socketPath: try place.socketPath())
        }
        try keychain.requireExisting()
        let socketPath = try keychain.deviceSocketPath()
        if DeviceClient.isServing(socketPath) { return .device(socketPath: socketPath) }
        let manager = PasswordManager(device: try DeviceAccess.openDirectly(keychain))
        let passcode = manager.localDevice.status.hasPasscode ? Passcode.read(prompt: "Keychain passcode: ") : nil
        do {
            try manager.localDevice.unlock(passcode: passcode)
        } catch {
            throw fail("the keychain's passcode is wrong, or wrong passcodes have locked unlocking out for now",
                       status: ExitStatus.denied)
        }
        return .local(manager, passcode: passcode)
    }

    /// The keychain's passcode where a policed group needs it: the one that
    /// unlocked a keychain opened here, or read now (after the backup password)
    /// for a running device; an empty line is "none".
    func passcode(for purpose: String) -> SecureBytes? {
        switch self {
        case .local(_, let passcode): return passcode
        case .device: return Passcode.read(prompt: "Keychain passcode (\(purpose)): ").flatMap { $0.count > 0 ? $0 : nil }
        }
    }

    /// Done with the keychain: one opened here anchors its audit log's
    /// newest line (what this command recorded) and folds its write-ahead
    /// log in, as a device does when it stops.
    func finish() {
        if case .local(let manager, _) = self { manager.localDevice.shutDown() }
    }

    /// Whether any group of the keychain has an entitlement policy.
    var hasPolicedGroups: Bool {
        switch self {
        case .local(let manager, _): return manager.localDevice.hasEntitlementPolicies
        case .device(let socketPath):
            if case .ok(let fields)? = DeviceClient.send(.policy(group: nil), to: socketPath) { return !fields.isEmpty }
            return false
        }
    }
}

/// A sentence for a failed backup or restore.
private func explain(_ error: KeychainError, file: String) -> String {
    switch error {
    case .authFailed where file.isEmpty: return "the keychain's passcode is wrong, or wrong passcodes have locked it out for now"
    case .authFailed:
        return "wrong backup password or keychain passcode (or a damaged file header); nothing was restored"
    case .decode: return "\(file) is damaged, cut short or was altered; nothing was restored"
    case .param: return "\(file) is not a keychainfs backup"
    case .valueTooLarge: return "\(file) is larger than any backup keychainfs reads (1 GiB); nothing was restored"
    case .interactionNotAllowed: return "the keychain is locked: unlock it first (keychainfs unlock MOUNTPOINT)"
    case .missingEntitlement: return "a policed group needs the keychain's passcode, and none was given; nothing was changed"
    default: return "\(error)"
    }
}

struct BackupCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backup",
        abstract: "Write an encrypted backup of the migratable items.",
        discussion: """
            Items of a ThisDeviceOnly class are never in it, nor the items of a group with an \
            entitlement policy unless named with --group, which needs the keychain's passcode. The \
            backup password is read twice, from the terminal or two lines of standard input; when no \
            device holds the keychain, its passcode is read first; through a running device, which \
            must be unlocked, the passcode for --group is read after the backup password.
            """
    )

    @Argument(help: "The backup file to write (mode 0600; replaced whole).")
    var file: String

    @OptionGroup var options: KeychainOptions

    @Option(name: .customLong("group"), help: "Include this group although it has a policy (needs the passcode; repeatable).")
    var policedGroups: [String] = []

    func run() throws {
        let path = absolutePath(file)
        let holder = try KeysHolder.find(options.place)
        defer { holder.finish() }
        let password = try Passcode.readNew(prompt: "Backup password: ", missing: "no backup password given")
        let passcode = policedGroups.isEmpty ? nil : holder.passcode(for: "to back up a policed group")
        let count: String
        switch holder {
        case .device(let socketPath):
            // The device writes into a file this user made: it may be
            // another account's (the service), which must not write by path.
            let partial: (fd: Int32, path: String)
            do {
                partial = try BackupFile.createPartial(for: path)
            } catch {
                throw fail("cannot create \(path).partial: \(String(cString: strerror(errno)))")
            }
            let reply = DeviceClient.send(.backup(path: path, password: password, policedGroups: policedGroups,
                                                  passcode: passcode), to: socketPath, passing: partial.fd)
            close(partial.fd)
            if case .ok? = reply {
                do {
                    try BackupFile.moveIntoPlace(partial.path, path)
                } catch {
                    throw fail("cannot rename the backup into place at \(path)")
                }
            } else {
                unlink(partial.path)
            }
            switch reply {
            case .keychainError(.missingEntitlement, _)?:
                throw fail(explain(.missingEntitlement, file: path), status: ExitStatus.denied)
            case .keychainError(.authFailed, _)?: throw fail(explain(.authFailed, file: ""), status: ExitStatus.denied)
            case .keychainError(.param, _)? where !policedGroups.isEmpty:
                throw fail("every --group must name a group with an entitlement policy; nothing was written")
            case .ok(let fields)?: count = fields.first ?? "?"
            case .keychainError(let error, _)?: throw fail(explain(error, file: path), status: ExitStatus.of(error))
            case .value?:
                throw DeviceAccess.unexpectedReply()
            case .systemError(_, let message)?: throw fail(message)
            case nil: throw fail("the device went away; nothing was written")
            }
        case .local(let manager, _):
            do {
                let backup = try manager.backup(password: password, policedGroups: policedGroups, passcode: passcode)
                try BackupFile.save(backup.bytes, to: path)
                count = String(backup.count)
            } catch KeychainError.param where !policedGroups.isEmpty {
                throw fail("every --group must name a group with an entitlement policy; nothing was written")
            } catch {
                throw fail(explain(error, file: path), status: ExitStatus.of(error))
            }
        }
        print("backed up \(count) items to \(path) (ThisDeviceOnly items stay on this device)")
    }
}

struct RestoreCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "restore",
        abstract: "Restore the items of an encrypted backup.",
        discussion: """
            Items come back with their classes. An item the keychain already holds with another \
            value or class is a conflict: without --keep or --overwrite nothing is restored and the \
            conflicts are listed. Restoring the same backup again changes nothing. The backup \
            password is read from the terminal or one line of standard input (after the keychain's \
            passcode when no device holds it). Writing into a group with an entitlement policy needs \
            the keychain's passcode: through a running device it is read after the backup password \
            when the keychain has a policed group.
            """
    )

    @Argument(help: "The backup file.")
    var file: String

    @OptionGroup var options: KeychainOptions

    @Flag(help: "Keep the keychain's item where the backup's differs.")
    var keep = false

    @Flag(help: "Replace the keychain's item where the backup's differs.")
    var overwrite = false

    func validate() throws {
        if keep && overwrite { throw ValidationError("Give --keep or --overwrite, not both.") }
    }

    func run() throws {
        let path = absolutePath(file)
        let policy: RestoreConflictPolicy = keep ? .keep : overwrite ? .overwrite : .refuse
        let holder = try KeysHolder.find(options.place)
        defer { holder.finish() }
        guard let password = Passcode.read(prompt: "Backup password: "), password.count > 0 else {
            throw fail("no backup password given")
        }
        let passcode = holder.hasPolicedGroups ? holder.passcode(for: "for policed groups") : nil
        let counts: [String]
        switch holder {
        case .device(let socketPath):
            // Opened here, by this user: the device reads only what this user
            // can read (O_NONBLOCK: a FIFO must not block the open).
            let file = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)
            guard file >= 0 else { throw fail("cannot read \(path): \(String(cString: strerror(errno)))") }
            defer { close(file) }
            switch DeviceClient.send(.restore(path: path, password: password, policy: policy, passcode: passcode),
                                     to: socketPath, passing: file) {
            case .ok(let fields)?: counts = fields
            case .keychainError(.missingEntitlement, _)?:
                throw fail(explain(.missingEntitlement, file: path), status: ExitStatus.denied)
            case .keychainError(.duplicateItem, let message)?: throw fail(message)
            case .keychainError(.quotaExceeded, let message)?: throw fail(message)
            case .keychainError(let error, _)?: throw fail(explain(error, file: path), status: ExitStatus.of(error))
            case .value?:
                throw DeviceAccess.unexpectedReply()
            case .systemError(_, let message)?: throw fail(message)
            case nil: throw fail("the device went away")
            }
        case .local(let manager, _):
            let summary: RestoreSummary
            do {
                summary = try manager.restore(try BackupFile.load(from: path), password: password, policy: policy,
                                              passcode: passcode)
            } catch {
                throw fail(explain(error, file: path), status: ExitStatus.of(error))
            }
            guard summary.applied else { throw fail(RestoreSummary.conflictMessage(summary.conflicts)) }
            counts = [summary.added, summary.replaced, summary.unchanged, summary.kept].map(String.init)
        }
        guard counts.count == 4 else { throw DeviceAccess.unexpectedReply() }
        print("restored from \(path): \(counts[0]) added, \(counts[1]) replaced, \(counts[2]) unchanged, \(counts[3]) kept")
    }
}
