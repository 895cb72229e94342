import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

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
        // A missing or foreign file is said before any passcode or password is asked for.
        guard access(path, R_OK) == 0 else {
            throw fail("cannot read \(path): \(Errno.current.description); nothing was asked or restored")
        }
        do {
            try BackupFile.checkReadable(path)
        } catch {
            throw fail(backupExplanation(error, file: path), status: ExitStatus.of(error))
        }
        let holder = try KeysHolder.find(options.place)
        defer { holder.finish() }
        guard let password = Passcode.read(prompt: "Backup password: "), password.count > 0 else {
            throw fail("no backup password given")
        }
        let passcode = holder.hasPolicedGroups ? holder.passcode(for: "for policed groups") : nil
        let summary: RestoreSummary
        switch holder {
        case .device(let device):
            // Opened here, by this user: the device reads only what this user
            // can read (O_NONBLOCK: a FIFO must not block the open).
            guard let file = FileDescriptor(open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)) else {
                throw fail("cannot read \(path): \(Errno.current.description)")
            }
            let outcome = try device.outcome(
                .restore(path: path, password: password, policy: policy, passcode: passcode), passing: file.borrowed)
            switch outcome {
            case .success(let applied)?:
                summary = applied
            case .failure(.keychain(.ownerDenied, let message))?:
                throw fail("cannot restore: " + message, status: ExitStatus.denied)
            case .failure(.keychain(.missingEntitlement, _))?:
                throw fail(backupExplanation(.missingEntitlement, file: path), status: ExitStatus.denied)
            case .failure(.keychain(.duplicateItem, let message))?: throw fail(message)
            // Another restore running: the device's sentence says so and what to do.
            case .failure(.keychain(.badRequest, let message))?: throw fail(message)
            case .failure(.keychain(.quotaExceeded, let message))?: throw fail(message)
            case .failure(.keychain(let error, _))?:
                throw fail(backupExplanation(error, file: path), status: ExitStatus.of(error))
            case .failure(.system)?, .failure(.unexpected)?, nil:
                throw DeviceAccess.failure(outcome, about: .action("cannot restore"))
            }
        case .local(let manager, _):
            do {
                summary = try manager.restore(
                    try BackupFile.load(from: path), password: password, policy: policy,
                    passcode: passcode)
            } catch {
                throw fail(backupExplanation(error, file: path), status: ExitStatus.of(error))
            }
            guard summary.applied else { throw fail(RestoreSummary.conflictMessage(summary.conflicts)) }
        }
        print(
            "restored from \(path): \(summary.added) added, \(summary.replaced) replaced, \(summary.unchanged) unchanged, \(summary.kept) kept"
        )
    }
}
