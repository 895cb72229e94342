#if canImport(Glibc)
import Glibc
#endif

/// What a restore does with an item that the keychain already holds with
/// another value or class.
public enum RestoreConflictPolicy: UInt8, Sendable, CaseIterable {
    /// Restore nothing at all, and report the conflicts.
    case refuse = 0
    /// Keep the keychain's item.
    case keep = 1
    /// Replace it with the backup's.
    case overwrite = 2
}

/// What a restore did.
public struct RestoreSummary: Sendable, Equatable {
    /// Items the keychain did not have.
    public var added = 0
    /// Items replaced by the backup's (``RestoreConflictPolicy/overwrite``).
    public var replaced = 0
    /// Items the keychain already held exactly so.
    public var unchanged = 0
    /// Items kept although the backup's differ (``RestoreConflictPolicy/keep``).
    public var kept = 0
    /// `group/identifier` of every item whose value or class differs from the backup's.
    public var conflicts: [String] = []
    /// False when ``RestoreConflictPolicy/refuse`` met conflicts: nothing was written.
    public var applied = true

    /// What to tell a user whose restore met `conflicts` and wrote nothing.
    public static func conflictMessage(_ conflicts: [String]) -> String {
        let shown = conflicts.prefix(10).joined(separator: ", ") + (conflicts.count > 10 ? ", ..." : "")
        return "\(conflicts.count) items differ from the backup's (\(shown)); nothing was restored. "
            + "Restore with --keep to keep them, or --overwrite to replace them"
    }
}

extension PasswordManager {
    /// Every migratable item as an encrypted backup under `password`
    /// (docs/FORMAT.md, "Backups"); `ThisDeviceOnly` items never leave the
    /// device. Needs the class keys of the items it holds: while locked,
    /// ``KeychainError/interactionNotAllowed`` and no backup.
    public func backup(password: SecureBytes, kdf: KDFParameters = .moderate) throws(KeychainError) -> (bytes: [UInt8], count: Int) {
        guard password.count > 0 else { throw .param }
        defer { purge() }  // the values read for it are not a "last access"
        var migratable: [BackupItem] = []
        for group in try groups() {
            for (identifier, info) in try items(inGroup: group) where info.protectionClass.isMigratable {
                let value = try key(forIdentifier: identifier, inGroup: group)
                migratable.append(BackupItem(group: group, identifier: identifier, protectionClass: info.protectionClass, value: value))
            }
        }
        return (try BackupFile.encode(migratable, password: password, kdf: kdf), migratable.count)
    }

    /// Restores a backup's items with their classes. With
    /// ``RestoreConflictPolicy/refuse`` and any item that differs, writes
    /// nothing (the summary lists the conflicts). A wrong password, or a
    /// file that is cut, altered or not a backup, changes nothing
    /// (``BackupFile/decode(_:password:_:)``). Restoring the same backup
    /// twice changes nothing the second time. Needs the key of every class
    /// it writes (``KeychainError/interactionNotAllowed`` while locked).
    public func restore(_ backup: [UInt8], password: SecureBytes,
                        policy: RestoreConflictPolicy) throws(KeychainError) -> RestoreSummary {
        defer { purge() }
        var summary = RestoreSummary()
        var differing: Set<String> = []
        try BackupFile.decode(backup, password: password) { (item) throws(KeychainError) in
            if try differs(item) == true { differing.insert(item.group + "/" + item.identifier) }
        }
        summary.conflicts = differing.sorted()
        if policy == .refuse && !differing.isEmpty {
            summary.applied = false
            return summary
        }
        try BackupFile.decode(backup, password: password) { (item) throws(KeychainError) in
            switch try differs(item) {
            case nil:
                try write(item.value, identifier: item.identifier, group: item.group,
                          protectionClass: item.protectionClass, condition: .ifAbsent)
                summary.added += 1
            case false?:
                summary.unchanged += 1
            case true? where policy == .overwrite:
                try write(item.value, identifier: item.identifier, group: item.group, protectionClass: item.protectionClass)
                summary.replaced += 1
            case true?:
                summary.kept += 1
            }
        }
        return summary
    }

    /// Whether the keychain's item of that name differs from the backup's
    /// (nil: it has none).
    private func differs(_ item: BackupItem) throws(KeychainError) -> Bool? {
        guard let info = try info(forIdentifier: item.identifier, inGroup: item.group) else { return nil }
        if info.protectionClass != item.protectionClass { return true }
        return try key(forIdentifier: item.identifier, inGroup: item.group) != item.value
    }
}

extension BackupFile {
    /// Writes a backup file at `path`, mode 0600, whole or not at all
    /// (a temporary file, fsynced, renamed into place).
    public static func save(_ bytes: [UInt8], to path: String) throws(KeychainError) {
        let temporary = path + ".partial"
        unlink(temporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw fileFailure("create", temporary) }
        do throws(Errno) {
            try Descriptor.writeAll(fd, bytes)
        } catch {
            close(fd)
            unlink(temporary)
            throw fileFailure("write", temporary, errno: error.rawValue)
        }
        let synced = fsync(fd) == 0 ? 0 : errno
        close(fd)
        guard synced == 0 else {
            unlink(temporary)
            throw fileFailure("write", temporary, errno: synced)
        }
        guard rename(temporary, path) == 0 else {
            let failure = fileFailure("rename into place", path)
            unlink(temporary)
            throw failure
        }
    }

    /// The bytes of a backup file.
    public static func load(from path: String) throws(KeychainError) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw fileFailure("read", path) }
        defer { close(fd) }
        do throws(Errno) {
            return try Descriptor.readAll(fd, limit: .max)
        } catch {
            throw fileFailure("read", path, errno: error.rawValue)
        }
    }
}
