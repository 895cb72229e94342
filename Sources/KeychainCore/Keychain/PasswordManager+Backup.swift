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

extension RestoreSummary {
    /// An applied restore's counts, as a client reads them from the device's reply.
    package init(counted added: Int, replaced: Int, unchanged: Int, kept: Int) {
        self.init(added: added, replaced: replaced, unchanged: unchanged, kept: kept)
    }
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
    /// device. A group with an entitlement policy is left out unless named
    /// in `policedGroups`, and naming any needs the keychain's `passcode`
    /// (a wrong one counts towards the lockout, as for a grant): a program
    /// the policy keeps out must not get the values through a backup.
    /// Recorded in the audit log, one line per policed group included.
    /// Needs the class keys of the items it holds: while locked,
    /// ``KeychainError/interactionNotAllowed`` and no backup.
    ///
    /// At a door (`consent`: who asked), items that other programs own
    /// (docs/FILESYSTEM.md, "Items another program owns") go into the backup
    /// only when the person allows it, as a read of each would need:
    /// ``KeychainError/ownerDenied`` and no backup otherwise, so that no
    /// program gets another's secret through a file.
    public func backup(
        password: SecureBytes, policedGroups: [String] = [], passcode: SecureBytes? = nil,
        by subject: AuditSubject? = nil,
        kdf: KDFParameters = .moderate
    ) throws(KeychainError) -> (bytes: [UInt8], count: Int) {
        try backup(
            password: password, policedGroups: policedGroups, passcode: passcode, by: subject, kdf: kdf, consent: nil)
    }

    package func backup(
        password: SecureBytes, policedGroups: [String] = [], passcode: SecureBytes? = nil,
        by subject: AuditSubject? = nil,
        kdf: KDFParameters = .moderate, consent: ConsentCaller?
    ) throws(KeychainError) -> (bytes: [UInt8], count: Int) {
        guard password.count > 0 else { throw .param }
        let device = localDevice
        let named = Set(policedGroups)
        do throws(KeychainError) {
            for group in named where !device.hasEntitlementPolicy(group) { throw KeychainError.param }
            if !named.isEmpty { try device.confirmPasscode(passcode) }
        } catch {
            device.audit.record(
                AuditEvent(
                    operation: "backup", result: AuditEvent.result(of: error),
                    group: named.sorted().first, subject: subject, detail: "policed groups"))
            throw error
        }
        if let consent {
            try requireConsentToBackUp(skipping: { device.hasEntitlementPolicy($0) && !named.contains($0) }, consent)
        }
        defer { purge() }  // the values read for it are not a "last access"
        var skipped: [String] = []
        var counts: [String: Int] = [:]
        // One value at a time: each is sealed into the backup and let go
        // before the next is read (BackupFile.encode(password:kdf:_:)).
        let (bytes, count) = try BackupFile.encode(password: password, kdf: kdf) { (write) throws(KeychainError) in
            for group in try groups() {
                if device.hasEntitlementPolicy(group) && !named.contains(group) {
                    skipped.append(group)
                    continue
                }
                for (identifier, info) in try items(inGroup: group) where info.protectionClass.isMigratable {
                    try write(
                        BackupItem(
                            group: group, identifier: identifier, protectionClass: info.protectionClass,
                            value: try key(forIdentifier: identifier, inGroup: group),
                            details: try details(forIdentifier: identifier, inGroup: group)))
                    counts[group, default: 0] += 1
                }
            }
        }
        for group in named.sorted() {
            let count = counts[group, default: 0]
            device.audit.record(
                AuditEvent(
                    operation: "backup", result: "ok", group: group, subject: subject,
                    detail: "\(count) items of a policed group"))
        }
        device.audit.record(
            AuditEvent(
                operation: "backup", result: "ok", subject: subject,
                detail: "\(count) items"
                    + (skipped.isEmpty ? "" : "; policed groups left out: " + skipped.joined(separator: ", "))))
        return (bytes, count)
    }

    /// One question for every owned item a backup would hold that
    /// `consent`'s program does not own and is not on the list of.
    private func requireConsentToBackUp(
        skipping skipped: (String) -> Bool, _ consent: ConsentCaller
    ) throws(KeychainError) {
        let device = localDevice
        var candidates: [(group: String, identifier: String, details: ItemDetails?)] = []
        for group in try groups() where !skipped(group) && device.appsOwnItems(inGroup: group) {
            for (identifier, details) in try itemsWithDetails(inGroup: group) where details.owner != nil {
                // Only what a backup holds: ThisDeviceOnly items stay on the device.
                guard try info(forIdentifier: identifier, inGroup: group)?.protectionClass.isMigratable == true
                else { continue }
                candidates.append((group, identifier, details))
            }
        }
        guard let question = question(among: candidates, verb: "back up", caller: consent) else { return }
        guard answer(question) != .denied else {
            device.audit.record(
                AuditEvent(
                    operation: "backup", result: "denied", subject: consent.subject(),
                    detail: "\(question.asked.count) items of other programs"))
            throw .ownerDenied
        }
    }

    /// Restores a backup's items with their classes. With
    /// ``RestoreConflictPolicy/refuse`` and any item that differs, writes
    /// nothing (the summary lists the conflicts). A wrong password, or a
    /// file that is cut, altered or not a backup, changes nothing
    /// (``BackupFile/decode(_:password:_:)``). Restoring the same backup
    /// twice changes nothing the second time. Writing into a group with an
    /// entitlement policy needs the keychain's `passcode`
    /// (``KeychainError/missingEntitlement`` without one, counted
    /// ``KeychainError/authFailed`` for a wrong one), and nothing is
    /// written then. Recorded in the audit log. Needs the key of every
    /// class it writes (``KeychainError/interactionNotAllowed`` while locked).
    ///
    /// A restore never carries an owner or an access list
    /// (docs/SECRET-SERVICE.md, "Whose an item is"): a crafted backup must not
    /// plant an item that a program then trusts as its own. Restored items
    /// belong to no program until the person claims them
    /// (`keychainfs acl --claim`, with the passcode). Replacing an item another
    /// program owns needs the person's leave at a door (`consent`).
    public func restore(
        _ backup: some BackupBytes, password: SecureBytes, policy: RestoreConflictPolicy,
        passcode: SecureBytes? = nil, by subject: AuditSubject? = nil
    ) throws(KeychainError) -> RestoreSummary {
        try restore(backup, password: password, policy: policy, passcode: passcode, by: subject, consent: nil)
    }

    package func restore(
        _ backup: some BackupBytes, password: SecureBytes, policy: RestoreConflictPolicy,
        passcode: SecureBytes? = nil, by subject: AuditSubject? = nil, consent: ConsentCaller?
    ) throws(KeychainError) -> RestoreSummary {
        defer { purge() }
        let device = localDevice
        var summary = RestoreSummary()
        var differing: Set<String> = []
        var policedWrites: Set<String> = []
        var replaced: [String: [String]] = [:]
        try BackupFile.decode(backup, password: password) { (item) throws(KeychainError) in
            let difference = try differs(item)
            if difference == true { differing.insert(item.group + "/" + item.identifier) }
            let writes = difference == nil || (difference == true && policy == .overwrite)
            if writes && device.hasEntitlementPolicy(item.group) { policedWrites.insert(item.group) }
            if difference == true && policy == .overwrite { replaced[item.group, default: []].append(item.identifier) }
        }
        summary.conflicts = differing.sorted()
        if policy == .refuse && !differing.isEmpty {
            summary.applied = false
            return summary
        }
        if !policedWrites.isEmpty {
            do throws(KeychainError) {
                try device.confirmPasscode(passcode)
            } catch {
                for group in policedWrites.sorted() {
                    device.audit.record(
                        AuditEvent(
                            operation: "restore", result: AuditEvent.result(of: error), group: group,
                            subject: subject, detail: "into a policed group"))
                }
                throw error
            }
        }
        if let consent {
            for (group, identifiers) in replaced.sorted(by: { $0.key < $1.key }) {
                try requireConsent(
                    group: group, identifiers: identifiers, verb: "replace from a backup", caller: consent)
            }
        }
        try BackupFile.decode(backup, password: password) { (original) throws(KeychainError) in
            var item = original
            item.details = original.details?.ownerless
            switch try differs(item) {
            case nil:
                try write(
                    item.value, identifier: item.identifier, group: item.group,
                    protectionClass: item.protectionClass, condition: .ifAbsent, details: item.details)
                summary.added += 1
            case false?:
                summary.unchanged += 1
            case true? where policy == .overwrite:
                try write(
                    item.value, identifier: item.identifier, group: item.group, protectionClass: item.protectionClass,
                    details: item.details)
                summary.replaced += 1
            case true?:
                summary.kept += 1
            }
        }
        for group in policedWrites.sorted() {
            device.audit.record(
                AuditEvent(
                    operation: "restore", result: "ok", group: group, subject: subject,
                    detail: "into a policed group"))
        }
        device.audit.record(
            AuditEvent(
                operation: "restore", result: "ok", subject: subject,
                detail: "\(summary.added) added, \(summary.replaced) replaced"))
        return summary
    }

    /// Whether the keychain's item of that name differs from the backup's
    /// (nil: it has none).
    private func differs(_ item: BackupItem) throws(KeychainError) -> Bool? {
        guard let info = try info(forIdentifier: item.identifier, inGroup: item.group) else { return nil }
        if info.protectionClass != item.protectionClass { return true }
        // An item without details in the backup leaves the keychain's
        // item its own (a write with no details keeps them).
        // Whose the item is never comes from a backup: only the rest is compared.
        if let details = item.details?.ownerless,
            try self.details(forIdentifier: item.identifier, inGroup: item.group)?.ownerless != details
        {
            return true
        }
        return try key(forIdentifier: item.identifier, inGroup: item.group) != item.value
    }
}

extension BackupFile {
    /// Writes a backup file at `path`, mode 0600, whole or not at all
    /// (a temporary file, fsynced, renamed into place).
    public static func save(_ bytes: [UInt8], to path: String) throws(KeychainError) {
        let partial = try createPartial(for: path)
        let temporary = partial.path
        do throws(KeychainError) {
            try write(bytes, to: partial.file.borrowed, name: temporary)
        } catch {
            unlink(temporary)
            throw error
        }
        _ = partial.close()
        try moveIntoPlace(temporary, path)
    }

    /// The temporary file a backup at `path` is written to first (mode
    /// 0600, created here, never an existing one), open for writing.
    public static func createPartial(for path: String) throws(KeychainError) -> PartialBackup {
        let temporary = path + ".partial"
        unlink(temporary)
        guard let file = FileDescriptor(open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)) else {
            throw fileFailure("create", temporary)
        }
        return PartialBackup(file: file, path: temporary)
    }

    /// A backup's temporary file, open for writing, and its path.
    public struct PartialBackup: ~Copyable {
        public let file: FileDescriptor
        public let path: String

        /// Closes the file (written through by whoever it was lent to).
        public consuming func close() -> Bool { file.close() }
    }

    /// Renames a written temporary file onto the backup's path (removing
    /// it when that fails).
    public static func moveIntoPlace(_ temporary: String, _ path: String) throws(KeychainError) {
        guard rename(temporary, path) == 0 else {
            let failure = fileFailure("rename into place", path)
            unlink(temporary)
            throw failure
        }
    }

    /// Writes a whole backup to `fd` and syncs it to disk; `name` names it
    /// in errors. The file may be another user's, passed to the device.
    public static func write(_ bytes: [UInt8], to fd: BorrowedDescriptor, name: String) throws(KeychainError) {
        do throws(Errno) {
            try fd.writeAll(bytes)
        } catch {
            throw fileFailure("write", name, errno: error.rawValue)
        }
        guard fsync(fd.raw) == 0 else { throw fileFailure("write", name) }
    }

    /// The largest backup file `restore` reads: 1 GiB (a thousand items at
    /// the 1 MiB value limit). A larger file is refused before it is read.
    public static let maximumFileSize = 1 << 30

    /// Whether `path` can be read and begins as a backup: what `restore`
    /// checks before it asks for any password, so that a missing or foreign
    /// file is said at once rather than after the person typed one.
    public static func checkReadable(_ path: String) throws(KeychainError) {
        guard let fd = FileDescriptor(open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)) else {
            throw fileFailure("read", path)
        }
        _ = try readHead(of: fd.borrowed, name: path)
    }

    /// The bytes of a backup file. Its header is checked first, so that a
    /// file that is not a backup (``KeychainError/param``) or is larger than
    /// ``maximumFileSize`` (``KeychainError/valueTooLarge``) costs no memory.
    /// A regular file only (a FIFO or device would block or never end).
    public static func load(from path: String) throws(KeychainError) -> [UInt8] {
        guard let fd = FileDescriptor(open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)) else {
            throw fileFailure("read", path)
        }
        return try load(from: fd.borrowed, name: path)
    }

    /// ``load(from:)`` of a file already open (one a client passed to the
    /// device, which may not be able to open its path); `name` names it in
    /// errors.
    public static func load(from fd: BorrowedDescriptor, name path: String) throws(KeychainError) -> [UInt8] {
        let head = try readHead(of: fd, name: path)
        do throws(Errno) {
            let rest = try fd.readAll(limit: maximumFileSize - head.count + 1)
            // It grew past the bound after fstat: refused all the same.
            guard head.count + rest.count <= maximumFileSize else { throw Errno.fileTooLarge }
            return head + rest
        } catch .fileTooLarge {
            throw .valueTooLarge
        } catch {
            throw fileFailure("read", path, errno: error.rawValue)
        }
    }

    /// Checks an open file before anything more is read from it: a regular
    /// file (a FIFO or device would block or never end) of at most
    /// ``maximumFileSize`` bytes (``KeychainError/valueTooLarge``) that
    /// begins with the magic (``KeychainError/param``). Returns the magic it read.
    static func readHead(of fd: BorrowedDescriptor, name path: String) throws(KeychainError) -> [UInt8] {
        var info = stat()
        guard fstat(fd.raw, &info) == 0 else { throw fileFailure("read", path) }
        guard info.st_mode & S_IFMT == S_IFREG else { throw .param }
        guard Int(info.st_size) <= maximumFileSize else { throw .valueTooLarge }
        var head = [UInt8](repeating: 0, count: magic.count)
        let whole: Bool
        do throws(Errno) {
            whole = try head.withMutableBytes { (raw) throws(Errno) in try fd.readExactly(into: raw) }
        } catch {
            throw fileFailure("read", path, errno: error.rawValue)
        }
        guard whole, head == magic else { throw .param }
        return head
    }
}

/// A private copy of a backup file, taken before it is read: the file a
/// client passed may change while the device reads it (each record is
/// checked before any is applied, in a first pass), the copy cannot. It is
/// unlinked from the start (O_TMPFILE) in the keychain's own directory and
/// read a record at a time.
public final class BackupFileCopy: BackupBytes, @unchecked Sendable {
    // Read-only after init; pread does not move a shared offset.
    private let copied: FileDescriptor
    public let count: Int

    /// Copies `file` (named `name` in messages) into `directory`, checking
    /// first, as ``BackupFile/load(from:name:)`` does, that it is a regular
    /// file of at most ``BackupFile/maximumFileSize`` bytes that begins as a
    /// backup; the copy stops at that bound even if the file grows. With
    /// `limit` (the service's restore size per user), a file past it is
    /// ``KeychainError/quotaExceeded``.
    public init(of file: BorrowedDescriptor, name: String, in directory: String, limit: Int? = nil)
        throws(KeychainError)
    {
        var info = stat()
        if let limit, fstat(file.raw, &info) == 0, Int(info.st_size) > limit { throw .quotaExceeded }
        let head = try BackupFile.readHead(of: file, name: name)
        // glibc's O_TMPFILE (__O_TMPFILE | O_DIRECTORY), declared only with _GNU_SOURCE.
        let temporaryFile: Int32 = 0o20_200_000
        guard let copy = FileDescriptor(Glibc.open(directory, O_RDWR | O_CLOEXEC | temporaryFile, 0o600)) else {
            throw fileFailure("create a temporary file in", directory)
        }
        var total = head.count
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        do throws(Errno) {
            try head.withBytes { (raw) throws(Errno) in try copy.borrowed.writeAll(raw) }
            while true {
                let read = try buffer.withMutableBytes { (raw) throws(Errno) in try file.read(into: raw) }
                if read == 0 { break }
                total += read
                // It grew past the bound after fstat: refused all the same.
                guard total <= BackupFile.maximumFileSize else { throw Errno.fileTooLarge }
                guard total <= limit ?? Int.max else { throw Errno(EDQUOT) }
                try buffer.withBytes { (raw) throws(Errno) in
                    try copy.borrowed.writeAll(UnsafeRawBufferPointer(rebasing: raw[..<read]))
                }
            }
        } catch {
            if error == .fileTooLarge { throw .valueTooLarge }
            if error.rawValue == EDQUOT { throw .quotaExceeded }
            throw fileFailure("copy", name, errno: error.rawValue)
        }
        copied = copy
        count = total
    }

    public func bytes(_ range: Range<Int>) throws(KeychainError) -> [UInt8] {
        var result = [UInt8](repeating: 0, count: range.count)
        var done = 0
        while done < range.count {
            let read = try? valueOrErrno {
                result.withUnsafeMutableBytes { raw in
                    pread(copied.raw, raw.baseAddress! + done, range.count - done, off_t(range.lowerBound + done))
                }
            }
            guard let read, read > 0 else { throw .io }
            done += read
        }
        return result
    }
}
