import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

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

    @Flag(
        name: .customLong("weak-password"),
        help: "Accept a backup password that every computer could guess within a thousand years of one core.")
    var weakPassword = false

    @Option(
        name: .customLong("group"),
        help: "Include this group although it has a policy (needs the passcode; repeatable).")
    var policedGroups: [String] = []

    func run() throws {
        let path = absolutePath(file)
        // Where it cannot be written is said before any passcode or password is asked for.
        let directory = path.lastIndex(of: "/").map { String(path[..<$0]) }.flatMap { $0.isEmpty ? "/" : $0 } ?? "."
        guard access(directory, W_OK | X_OK) == 0 else {
            throw fail(
                "cannot write a backup in \(directory): \(Errno.current.description); nothing was asked or written")
        }
        let holder = try KeysHolder.find(options.place)
        defer { holder.finish() }
        let password = try Passcode.readNew(prompt: "Backup password: ", missing: "no backup password given")
        // The file can be attacked offline, away from every lockout: say what a weak password is worth there.
        let years = BackupPasswordStrength.coreYears(password)
        if years < BackupPasswordStrength.minimumCoreYears && !weakPassword {
            throw fail(
                "a backup can be guessed at away from this machine, and every password like this one takes about "
                    + BackupPasswordStrength.said(years) + " of one core (a thousand years at least is asked): "
                    + "choose a longer one (keychainfs generate --print gives one), or --weak-password; "
                    + "nothing was written")
        }
        let passcode = policedGroups.isEmpty ? nil : holder.passcode(for: "to back up a policed group")
        let count: Int
        switch holder {
        case .device(let device):
            // The device writes into a file this user made: it may be
            // another account's (the service), which must not write by path.
            let partial: BackupFile.PartialBackup
            do {
                partial = try BackupFile.createPartial(for: path)
            } catch {
                throw fail("cannot create \(path).partial: \(Errno.current.description)")
            }
            let temporary = partial.path
            // The device writes into it; closed after its answer.
            let outcome = try device.outcome(
                .backup(path: path, password: password, policedGroups: policedGroups, passcode: passcode),
                passing: partial.file.borrowed)
            _ = partial.close()
            if case .success? = outcome {
                do {
                    try BackupFile.moveIntoPlace(temporary, path)
                } catch {
                    throw fail("cannot rename the backup into place at \(path)")
                }
            } else {
                unlink(temporary)
            }
            switch outcome {
            case .failure(.keychain(.missingEntitlement, _))?:
                throw fail(backupExplanation(.missingEntitlement, file: path), status: ExitStatus.denied)
            case .failure(.keychain(.authFailed, _))?:
                throw fail(backupExplanation(.authFailed, file: ""), status: ExitStatus.denied)
            case .failure(.keychain(.ownerDenied, let message))?:
                throw fail("cannot back up: " + message, status: ExitStatus.denied)
            case .failure(.keychain(.param, _))? where !policedGroups.isEmpty:
                throw fail("every --group must name a group with an entitlement policy; nothing was written")
            case .success(let written)?:
                count = written.count
            case .failure(.keychain(let error, _))?:
                throw fail(backupExplanation(error, file: path), status: ExitStatus.of(error))
            case .failure(.system)?, .failure(.unexpected)?, nil:
                throw DeviceAccess.failure(outcome, about: .action("cannot back up"))
            }
        case .local(let manager, _):
            do {
                let backup = try manager.backup(password: password, policedGroups: policedGroups, passcode: passcode)
                try BackupFile.save(backup.bytes, to: path)
                count = backup.count
            } catch KeychainError.param where !policedGroups.isEmpty {
                throw fail("every --group must name a group with an entitlement policy; nothing was written")
            } catch {
                throw fail(backupExplanation(error, file: path), status: ExitStatus.of(error))
            }
        }
        print("backed up \(count) item\(count == 1 ? "" : "s") to \(path) (ThisDeviceOnly items stay on this device)")
    }
}
