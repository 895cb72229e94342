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
    case local(PasswordManager)

    static func find(_ keychain: KeychainDirectory) throws -> KeysHolder {
        try keychain.requireExisting()
        let socketPath = try keychain.deviceSocketPath()
        if DeviceClient.isServing(socketPath) { return .device(socketPath: socketPath) }
        let manager: PasswordManager
        do {
            manager = PasswordManager(device: try Device(directory: keychain))
        } catch {
            throw fail(keychain.sentence(for: error))
        }
        let passcode = manager.localDevice.status.hasPasscode ? Passcode.read(prompt: "Keychain passcode: ") : nil
        do {
            try manager.localDevice.unlock(passcode: passcode)
        } catch {
            throw fail("the keychain's passcode is wrong, or wrong passcodes have locked unlocking out for now")
        }
        return .local(manager)
    }
}

/// A sentence for a failed backup or restore.
private func explain(_ error: KeychainError, file: String) -> String {
    switch error {
    case .authFailed: return "wrong backup password (or a damaged file header); nothing was restored"
    case .decode: return "\(file) is damaged, cut short or was altered; nothing was restored"
    case .param: return "\(file) is not a keychainfs backup"
    case .interactionNotAllowed: return "the keychain is locked: unlock it first (keychainfs unlock MOUNTPOINT)"
    default: return "\(error)"
    }
}

struct BackupCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backup",
        abstract: "Write an encrypted backup of the migratable items.",
        discussion: """
            Items of a ThisDeviceOnly class are never in it. The backup password is read from the \
            terminal (twice) or one line of standard input; when no device holds the keychain, its \
            passcode is read first. Through a running device, the device must be unlocked.
            """
    )

    @Argument(help: "The backup file to write (mode 0600; replaced whole).")
    var file: String

    @OptionGroup var options: KeychainOptions

    func run() throws {
        let path = absolutePath(file)
        let holder = try KeysHolder.find(options.directory)
        let password = try Passcode.readNew(prompt: "Backup password: ", missing: "no backup password given")
        let count: String
        switch holder {
        case .device(let socketPath):
            switch DeviceClient.send(.backup(path: path, password: password), to: socketPath) {
            case .ok(let fields)?: count = fields.first ?? "?"
            case .keychainError(let error, _)?: throw fail(explain(error, file: path))
            case .value?:
                throw fail("unexpected reply from the device (a device of another keychainfs build?)")
            case .systemError(_, let message)?: throw fail(message)
            case nil: throw fail("the device went away; nothing was written")
            }
        case .local(let manager):
            do {
                let backup = try manager.backup(password: password)
                try BackupFile.save(backup.bytes, to: path)
                count = String(backup.count)
            } catch {
                throw fail(explain(error, file: path))
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
            passcode when no device holds it).
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
        let holder = try KeysHolder.find(options.directory)
        guard let password = Passcode.read(prompt: "Backup password: "), password.count > 0 else {
            throw fail("no backup password given")
        }
        let counts: [String]
        switch holder {
        case .device(let socketPath):
            switch DeviceClient.send(.restore(path: path, password: password, policy: policy), to: socketPath) {
            case .ok(let fields)?: counts = fields
            case .keychainError(.duplicateItem, let message)?: throw fail(message)
            case .keychainError(let error, _)?: throw fail(explain(error, file: path))
            case .value?:
                throw fail("unexpected reply from the device (a device of another keychainfs build?)")
            case .systemError(_, let message)?: throw fail(message)
            case nil: throw fail("the device went away")
            }
        case .local(let manager):
            let summary: RestoreSummary
            do {
                summary = try manager.restore(try BackupFile.load(from: path), password: password, policy: policy)
            } catch {
                throw fail(explain(error, file: path))
            }
            guard summary.applied else { throw fail(RestoreSummary.conflictMessage(summary.conflicts)) }
            counts = [summary.added, summary.replaced, summary.unchanged, summary.kept].map(String.init)
        }
        guard counts.count == 4 else { throw fail("unexpected reply from the device") }
        print("restored from \(path): \(counts[0]) added, \(counts[1]) replaced, \(counts[2]) unchanged, \(counts[3]) kept")
    }
}
