import Synchronization

/// One encrypted row of the items table. Everything here may be seen by a
/// thief of the disk; the value is only in `sealed`.
struct SealedItem: Sendable {
    var group: String
    var identifier: String
    var protectionClass: ProtectionClass
    var generation: Int64
    var nonce: [UInt8]
    var sealed: [UInt8]
    /// The sealed ``ItemDetails`` (`nonce | ciphertext`), if it has any.
    var details: [UInt8]? = nil
}

/// What listing and `stat` learn without any key.
public struct ItemInfo: Sendable, Equatable {
    /// The item's class.
    public var protectionClass: ProtectionClass
    /// The exact length of the value in bytes.
    public var size: Int

    public init(protectionClass: ProtectionClass, size: Int) {
        self.protectionClass = protectionClass
        self.size = size
    }
}

/// A row's name, as ``ItemStore``'s tables know it: SipHash-2-4 with 128
/// bits of output, keyed afresh at each start, of the group and
/// identifier bytes. Not the two strings: building and hashing 100,000
/// of them was a third of the boot check (docs/BENCHMARKS.md, "2026-11-23
/// (day): 100,000 items in less memory and a faster mount"), and they were 40
/// bytes and up a row against 16. A collision between two names is a
/// 2^-128-per-pair event, and could not hand out the wrong secret: the
/// item's seal binds its group and identifier, so a wrong row fails to
/// open (EIO), as would a row changed outside keychainfs.
struct RowIdentity: Hashable {
    let low: UInt64
    let high: UInt64

    /// The bits are already uniform: one word is enough for the table.
    func hash(into hasher: inout Hasher) { hasher.combine(low) }
}

/// The SQLite file of one keychain: the items, the groups, and a few metadata
/// records (keybag, lockout). WAL mode with synchronous=NORMAL: a committed
/// transaction survives the death of the process; ``sync()`` makes it survive
/// power loss too.
final class ItemStore: Sendable {
    static let schemaVersion: Int64 = 1

    private let connection: Mutex<SQLiteConnection>
    private let state: ItemSetState
    /// What this device knows of its rows (``KnownRows``).
    private let known = Mutex(KnownRows())
    /// The quota and what the items use of it (nil: no quota, nothing counted).
    private let quota = Mutex<QuotaState?>(nil)

    private struct QuotaState {
        let limit: StoreQuota
        var items: Int
        var bytes: Int
        /// The use a transaction under way proposes; made current once it commits.
        var pending: (items: Int, bytes: Int)?
    }

    /// The generation of every row as this device last wrote it (or found it
    /// at boot, verified): a row replaced behind the running device's back
    /// (an older copy put back, a removed row restored) no longer matches.
    /// And the rows most recently read or written, as this device committed
    /// them, so that reading them again touches no SQLite page (the point read
    /// was a third of a read's work: docs/BENCHMARKS.md, the read path measured
    /// on 2026-11-23). Only sealed rows are kept (ciphertext and names, what
    /// the database file holds anyway), written through on every commit; a row
    /// changed behind the device's back is then not read again until it leaves
    /// this cache, and the device keeps serving what it committed, never the
    /// changed row.
    private struct KnownRows {
        var generations: [RowIdentity: Int64] = [:]
        var recent: [RowIdentity: SealedItem] = [:]

        /// Enough for every secret a session's programs use, small next to
        /// the generations of a large keychain (a row is ~200 bytes).
        static let recentLimit = 4096

        mutating func remember(_ key: RowIdentity, _ row: SealedItem) {
            if recent[key] == nil, recent.count >= Self.recentLimit {
                recent.remove(at: recent.startIndex)  // an arbitrary one: no bookkeeping per read
            }
            recent[key] = row
        }
    }

    /// Told of every committed change, after its transaction (``Device`` forwards it to its observers).
    private let changeHandler = Mutex<ChangeHandler?>(nil)

    /// The keychain's passcode binding as item writes keep it
    /// (ItemStore+PasscodeBinding.swift), and whether it changed since
    /// its counter last moved.
    let binding = Mutex<(state: StoreBinding, changed: Bool)>((.none, false))

    /// A struct around the closure: a closure read out of a `Mutex` by
    /// `withLock { $0 }` came back wrapped in one more reabstraction thunk at
    /// every read (Swift 6.3), and 26,000 writes overflowed the stack.
    private struct ChangeHandler {
        let call: @Sendable (ItemChange) -> Void
    }

    func onChange(_ handler: @escaping @Sendable (ItemChange) -> Void) {
        changeHandler.withLock { $0 = ChangeHandler(call: handler) }
    }

    private func announce(_ change: ItemChange) {
        changeHandler.withLock { $0 }?.call(change)
    }

    /// Told of every change as it commits, inside the store's write section:
    /// no other change can commit before it returns. For what in memory must
    /// agree with the store at every commit, whoever made the change (which
    /// inode a name holds: ``Device/addCommitObserver(_:)``).
    private let commitHandler = Mutex<ChangeHandler?>(nil)

    func onCommit(_ handler: @escaping @Sendable (ItemChange) -> Void) {
        commitHandler.withLock { $0 = ChangeHandler(call: handler) }
    }

    /// Call with the connection's lock held, once the transaction committed.
    private func committed(_ change: ItemChange) {
        commitHandler.withLock { $0 }?.call(change)
    }

    /// The key of ``RowIdentity``: no secret of the keychain, only what
    /// keeps names that collide unforeseeable.
    private let identityKey = Crypto.randomBytes(Crypto.shortHashKeySize)

    private func identity(group: UnsafeRawBufferPointer, identifier: UnsafeRawBufferPointer) -> RowIdentity {
        precondition(group.count <= Int(UInt16.max))
        // u16 length of the group | group | identifier: one name, one message.
        let length = 2 + group.count + identifier.count
        return withUnsafeTemporaryAllocation(byteCount: length, alignment: 8) { message in
            let base = message.baseAddress!
            base.storeBytes(of: UInt16(group.count).littleEndian, as: UInt16.self)
            if group.count > 0 { (base + 2).copyMemory(from: group.baseAddress!, byteCount: group.count) }
            if identifier.count > 0 {
                (base + 2 + group.count).copyMemory(from: identifier.baseAddress!, byteCount: identifier.count)
            }
            let words = Crypto.shortHash128(UnsafeRawBufferPointer(message), key: identityKey)
            return RowIdentity(low: words.0, high: words.1)
        }
    }

    private func identity(group: String, identifier: String) -> RowIdentity {
        var group = group, identifier = identifier
        return group.withUTF8 { group in
            identifier.withUTF8 { identifier in
                identity(group: UnsafeRawBufferPointer(group), identifier: UnsafeRawBufferPointer(identifier))
            }
        }
    }

    /// Opened read-only: every change fails with ``KeychainError/readOnly``.
    let isReadOnly: Bool

    init(path: String, create: Bool, state: ItemSetState, readOnly: Bool = false) throws(KeychainError) {
        self.state = state
        isReadOnly = readOnly && !create
        let db = try SQLiteConnection(path: path, create: create, readOnly: isReadOnly)
        // An existing keychain enters WAL mode only once it passed its checks
        // (``startWriteAheadLog()``): switching modes rewrites the file's
        // header, and a keychain refused at boot must be left as it was.
        if create { try db.execute("PRAGMA journal_mode=WAL") }
        try db.execute("PRAGMA synchronous=NORMAL")
        try db.execute("PRAGMA secure_delete=ON")
        if create {
            try db.transaction { () throws(KeychainError) in
                try db.execute(
                    """
                    CREATE TABLE meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;
                    CREATE TABLE groups(name TEXT PRIMARY KEY) WITHOUT ROWID;
                    CREATE TABLE items(
                        grp TEXT NOT NULL REFERENCES groups(name),
                        ident TEXT NOT NULL,
                        class INTEGER NOT NULL,
                        generation INTEGER NOT NULL,
                        nonce BLOB NOT NULL,
                        sealed BLOB NOT NULL,
                        details BLOB,
                        PRIMARY KEY (grp, ident)) WITHOUT ROWID;
                    INSERT INTO groups(name) VALUES ('\(ItemLimits.defaultGroup)');
                    INSERT INTO meta(key, value) VALUES ('schema', \(ItemStore.schemaVersion));
                    """)
                try db.statement("INSERT INTO meta(key, value) VALUES (?, ?)")
                    .bind(1, ItemSetState.recordKey)
                    .bind(2, state.sealed(ItemSetState.Record(digest: ItemSetState.emptyDigest, generation: 0))).run()
            }
        }
        let schema = try db.statement("SELECT value FROM meta WHERE key = 'schema'")
        let known = try schema.step() && schema.int64(0) == ItemStore.schemaVersion
        db.finishStatements()
        guard known else {
            Diagnostics.log("store: unknown schema version")
            throw .decode
        }
        connection = Mutex(db)
    }

    func withConnection<R: Sendable>(_ body: (SQLiteConnection) throws(KeychainError) -> R)
        throws(KeychainError) -> R
    {
        try connection.withLock { (db: inout SQLiteConnection) throws(KeychainError) -> R in
            defer { db.finishStatements() }
            do throws(KeychainError) {
                let result = try body(db)
                settleQuota(committed: true)
                return result
            } catch {
                settleQuota(committed: false)
                throw error
            }
        }
    }

    // MARK: Quota

    /// Holds the items to `limit` from now on (the service's share of one
    /// user): a change that would take them past it is refused with
    /// ``KeychainError/quotaExceeded``; one that frees room always passes.
    func setQuota(_ limit: StoreQuota) throws(KeychainError) {
        try withConnection { db throws(KeychainError) in
            let use = try db.statement(
                "SELECT count(*), COALESCE(SUM(LENGTH(sealed) + COALESCE(LENGTH(details), 0)), 0) FROM items")
            guard try use.step() else { throw .io }
            quota.withLock { $0 = QuotaState(limit: limit, items: Int(use.int64(0)), bytes: Int(use.int64(1))) }
        }
    }

    /// What the items use of their quota (nil: none is set).
    var quotaUse: (items: Int, bytes: Int, limit: StoreQuota)? {
        quota.withLock { $0.map { ($0.items, $0.bytes, $0.limit) } }
    }

    /// Checks a change of rows against the quota, inside its transaction.
    private func proposeUse(removing old: [SealedItem], adding new: [SealedItem]) throws(KeychainError) {
        func bytes(_ rows: [SealedItem]) -> Int { rows.reduce(0) { $0 + $1.sealed.count + ($1.details?.count ?? 0) } }
        try quota.withLock { (state) throws(KeychainError) in
            guard var current = state else { return }
            let base = current.pending ?? (current.items, current.bytes)
            let items = base.items - old.count + new.count, size = base.bytes - bytes(old) + bytes(new)
            if (items > current.limit.items && items > base.items) || (size > current.limit.bytes && size > base.bytes)
            {
                throw .quotaExceeded
            }
            current.pending = (items, size)
            state = current
        }
    }

    private func settleQuota(committed: Bool) {
        quota.withLock { state in
            guard var current = state, let pending = current.pending else { return }
            if committed { (current.items, current.bytes) = pending }
            current.pending = nil
            state = current
        }
    }

    // MARK: Metadata

    func metadata(_ key: String) throws(KeychainError) -> [UInt8]? {
        try withConnection { db throws(KeychainError) in try readMetadata(db, key) }
    }

    /// One metadata record (nil: none), inside the caller's connection.
    func readMetadata(_ db: SQLiteConnection, _ key: String) throws(KeychainError) -> [UInt8]? {
        let query = try db.statement("SELECT value FROM meta WHERE key = ?").bind(1, key)
        return try query.step() ? query.blob(0) : nil
    }

    /// Removes one metadata record, inside the caller's connection.
    func removeMetadata(_ db: SQLiteConnection, _ key: String) throws(KeychainError) {
        try db.statement("DELETE FROM meta WHERE key = ?").bind(1, key).run()
    }

    func setMetadata(_ key: String, _ value: [UInt8]) throws(KeychainError) {
        try withConnection { db throws(KeychainError) in try putMetadata(db, key, value) }
    }

    /// Writes one metadata record, inside the caller's connection.
    func putMetadata(_ db: SQLiteConnection, _ key: String, _ value: [UInt8]) throws(KeychainError) {
        try db.statement(
            "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
        )
        .bind(1, key).bind(2, value).run()
    }

    /// Moves the records bound to the rollback counter from epoch `old` to
    /// `new` (nil: unbound) in one transaction, with `records` written
    /// first (encoded for `old`: a new keybag, recovery record; the
    /// rollback record itself is not bound): each bound record is
    /// authenticated under `old` and MACed again under `new`. In a
    /// version-1 keychain (``RollbackEpoch/bindsAll`` false) the keybag,
    /// lockout and recovery records are authenticated as they were before
    /// they were bound, and bound from now on. The store's connection stays
    /// held until `secret`'s epoch says `new`, so that no item write seals
    /// its state record for the old epoch after the commit. A key mapped to
    /// nil in `records` is removed.
    func rebind(
        secret: DeviceSecret, from old: UInt64?, to new: UInt64?,
        writing records: [(key: String, value: [UInt8]?)]
    ) throws(KeychainError) {
        try withConnection { db throws(KeychainError) in
            try db.transaction { () throws(KeychainError) in
                for (key, value) in records {
                    if let value {
                        try putMetadata(db, key, value)
                    } else {
                        try removeMetadata(db, key)
                    }
                }
                for (key, domain) in RollbackRecord.boundRecords {
                    // No audit anchor, no recovery record: nothing to move.
                    guard let record = try readMetadata(db, key) else { continue }
                    let body =
                        !secret.epoch.bindsAll && RollbackRecord.isLateBound(domain)
                        ? try RollbackRecord.unboundBody(key, domain, record, secret: secret)
                        : try secret.authenticatedBody(DeviceSecret.boundDomain(domain, epoch: old), record)
                    try db.statement("UPDATE meta SET value = ? WHERE key = ?")
                        .bind(1, secret.authenticatedRecord(DeviceSecret.boundDomain(domain, epoch: new), body)).bind(
                            2, key
                        ).run()
                }
            }
            secret.epoch.state = (new, true)
        }
    }

    // MARK: Items

    /// The row as this device committed it, if it is among the recent ones
    /// and still the current one (a commit may have replaced it meanwhile).
    private func recentRow(_ key: RowIdentity) -> SealedItem? {
        known.withLock { rows in rows.recent[key].flatMap { rows.generations[key] == $0.generation ? $0 : nil } }
    }

    func item(group: String, identifier: String) throws(KeychainError) -> SealedItem? {
        let key = identity(group: group, identifier: identifier)
        if let row = recentRow(key) { return row }
        let row = try withConnection { db throws(KeychainError) in
            try checkedRow(db, group: group, identifier: identifier)
        }
        if let row {
            // Unless a commit replaced it meanwhile.
            known.withLock { rows in if rows.generations[key] == row.generation { rows.remember(key, row) } }
        }
        return row
    }

    func info(group: String, identifier: String) throws(KeychainError) -> ItemInfo? {
        // A recent row answers without SQLite: the kernel asks on every
        // LOOKUP once a name has expired from its cache (10 s), and a point
        // read costs a read transaction's locks and a B-tree descent.
        if let row = recentRow(identity(group: group, identifier: identifier)) {
            return try Self.info(class: row.protectionClass.rawValue, sealedLength: Int64(row.sealed.count))
        }
        return try withConnection { db throws(KeychainError) in
            let query = try db.statement("SELECT class, length(sealed) FROM items WHERE grp = ? AND ident = ?")
                .bind(1, group).bind(2, identifier)
            guard try query.step() else { return nil }
            return try Self.info(class: query.int64(0), sealedLength: query.int64(1))
        }
    }

    /// A row cut shorter than its tag is listed at size 0, not refused: one
    /// damaged row must not hide its group (`ls` as a filesystem lists an
    /// entry it cannot read); reading it says it is damaged, and it can be
    /// removed. (A changed class is caught at boot, by the item-set state.)
    private static func info(class raw: Int64, sealedLength: Int64) throws(KeychainError) -> ItemInfo {
        guard let protectionClass = ProtectionClass(rawValue: raw) else { throw .decode }
        return ItemInfo(protectionClass: protectionClass, size: max(0, Int(sealedLength) - Crypto.tagSize))
    }

    /// Writes one item in one transaction: `seal` gets the current row (nil
    /// if none) and the new generation, and returns the encrypted row, or
    /// throws to abandon the write with nothing changed. The old row is
    /// replaced in place (INSERT ... ON CONFLICT DO UPDATE), never deleted
    /// first, so no failure can leave the item missing.
    /// Returns the row replaced (nil if none) and the generation written.
    @discardableResult
    func write(
        group: String, identifier: String,
        seal: (_ existing: SealedItem?, _ generation: Int64) throws(KeychainError) -> SealedItem
    )
        throws(KeychainError) -> (replaced: SealedItem?, generation: Int64)
    {
        let written = try withConnection { db throws(KeychainError) in
            let written = try db.transaction { () throws(KeychainError) in
                let existing = try checkedRow(db, group: group, identifier: identifier)
                if existing == nil { try requireFreeName(db, group: group, identifier: identifier) }
                var record = try loadState(db)
                let row = try seal(existing, try advance(&record))
                try saveState(db, &record, removing: [existing].compactMap { $0 }, adding: [row])
                try db.statement("INSERT OR IGNORE INTO groups(name) VALUES (?)").bind(1, group).run()
                let groupCreated = db.changes > 0
                try upsert(db, row)
                return (replaced: existing, row: row, groupCreated: groupCreated)
            }
            expect(group, identifier, written.row)
            if written.groupCreated { committed(.groupCreated(group)) }
            committed(.written(group: group, identifier: identifier))
            return (replaced: written.replaced, generation: written.row.generation, groupCreated: written.groupCreated)
        }
        // A write into a group that did not exist made it: observers (.events,
        // the Secret Service's CollectionCreated) hear of the group first.
        if written.groupCreated { announce(.groupCreated(group)) }
        announce(.written(group: group, identifier: identifier))
        return (written.replaced, written.generation)
    }

    /// ``KeychainError/nameConflict`` when a new item `identifier` would
    /// share its name with a folder of items (`a` beside `a/b`), or one of
    /// its folders with an item (`a/b` beside `a`). Index seeks only: the
    /// items below a name sort between `NAME/` and `NAME0` ('0' follows '/').
    private func requireFreeName(_ db: SQLiteConnection, group: String, identifier: String) throws(KeychainError) {
        if try itemsBelow(db, folder: identifier, inGroup: group) { throw .nameConflict }
        for folder in ItemLimits.folders(of: identifier) {
            let item = try db.statement("SELECT 1 FROM items WHERE grp = ? AND ident = ?").bind(1, group).bind(
                2, folder)
            if try item.step() { throw .nameConflict }
        }
    }

    /// Whether `group` holds items below the folder `folder` (`folder/...`).
    func holdsItems(below folder: String, inGroup group: String) throws(KeychainError) -> Bool {
        try withConnection { db throws(KeychainError) in try itemsBelow(db, folder: folder, inGroup: group) }
    }

    /// ``holdsItems(below:inGroup:)`` inside the caller's connection: one
    /// index seek, the names below `folder` sorting between `folder/` and
    /// `folder0` ('0' follows '/').
    private func itemsBelow(_ db: SQLiteConnection, folder: String, inGroup group: String) throws(KeychainError)
        -> Bool
    {
        try db.statement("SELECT 1 FROM items WHERE grp = ? AND ident >= ? AND ident < ? LIMIT 1")
            .bind(1, group).bind(2, folder + "/").bind(3, folder + "0").step()
    }

    private func upsert(_ db: SQLiteConnection, _ row: SealedItem) throws(KeychainError) {
        try db.statement(
            """
            INSERT INTO items(grp, ident, class, generation, nonce, sealed, details) VALUES (?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT(grp, ident) DO UPDATE SET class = excluded.class,
                generation = excluded.generation, nonce = excluded.nonce, sealed = excluded.sealed, details = excluded.details
            """
        )
        .bind(1, row.group).bind(2, row.identifier).bind(3, row.protectionClass.rawValue)
        .bind(4, row.generation).bind(5, row.nonce).bind(6, row.sealed).bind(7, row.details).run()
    }

    /// Puts `previous` back in place of the row of generation `written`,
    /// exactly as it was (no key needed: the row is not re-sealed). Does
    /// nothing and returns false when the item changed since (another write,
    /// a rename or a removal): a revert never undoes someone else's write.
    func revert(group: String, identifier: String, written: Int64, previous: SealedItem) throws(KeychainError) -> Bool {
        let reverted = try withConnection { db throws(KeychainError) in
            let reverted = try db.transaction { () throws(KeychainError) -> Bool in
                guard let current = try checkedRow(db, group: group, identifier: identifier),
                    current.generation == written
                else { return false }
                var record = try loadState(db)
                try saveState(db, &record, removing: [current], adding: [previous])
                try upsert(db, previous)
                return true
            }
            if reverted {
                expect(group, identifier, previous)
                committed(.written(group: group, identifier: identifier))
            }
            return reverted
        }
        if reverted { announce(.written(group: group, identifier: identifier)) }
        return reverted
    }

    private func currentRow(_ db: SQLiteConnection, group: String, identifier: String) throws(KeychainError)
        -> SealedItem?
    {
        let query = try db.statement(
            "SELECT class, generation, nonce, sealed, details FROM items WHERE grp = ? AND ident = ?"
        )
        .bind(1, group).bind(2, identifier)
        guard try query.step() else { return nil }
        guard let protectionClass = ProtectionClass(rawValue: query.int64(0)) else { throw .decode }
        return SealedItem(
            group: group, identifier: identifier, protectionClass: protectionClass,
            generation: query.int64(1), nonce: query.blob(2), sealed: query.blob(3),
            details: query.isNull(4) ? nil : query.blob(4))
    }

    /// The row as stored, checked against the generation this device
    /// expects there: ``KeychainError/decode`` for a row replaced, removed or
    /// added outside keychainfs while the device runs.
    private func checkedRow(_ db: SQLiteConnection, group: String, identifier: String) throws(KeychainError)
        -> SealedItem?
    {
        let row = try currentRow(db, group: group, identifier: identifier)
        try requireExpected(row?.generation, group: group, identifier: identifier)
        return row
    }

    /// ``KeychainError/decode`` unless `generation` (nil: no row) is the
    /// one this device last wrote or verified for the row.
    private func requireExpected(_ generation: Int64?, group: String, identifier: String) throws(KeychainError) {
        let key = identity(group: group, identifier: identifier)
        guard generation == known.withLock({ $0.generations[key] }) else {
            Diagnostics.log(
                "an item's row was changed outside keychainfs while the device ran (rolled back, removed or added)")
            throw .decode
        }
    }

    /// Records the row a committed change left (nil: the row is gone).
    private func expect(_ group: String, _ identifier: String, _ row: SealedItem?) {
        let key = identity(group: group, identifier: identifier)
        known.withLock { rows in
            rows.generations[key] = row?.generation
            if let row { rows.remember(key, row) } else { rows.recent[key] = nil }
        }
    }

    /// Hands out the next generation from the authenticated record.
    private func advance(_ record: inout ItemSetState.Record) throws(KeychainError) -> Int64 {
        guard let last = record.generation, last < Int64.max else {
            Diagnostics.log("the keychain's generation counter is exhausted; no more writes are possible")
            throw .io
        }
        record.generation = last + 1
        return last + 1
    }

    /// Moves an item to a new identifier in one transaction, re-sealed by
    /// `reseal` (the identifier is part of the associated data). Replaces an
    /// existing target only when `replacing` is true.
    func rename(
        group: String, from source: String, to target: String, replacing: Bool,
        reseal: (SealedItem, Int64) throws(KeychainError) -> SealedItem
    ) throws(KeychainError) {
        let renamed = try withConnection { db throws(KeychainError) -> Bool in
            let moved = try db.transaction { () throws(KeychainError) -> SealedItem? in
                guard let old = try checkedRow(db, group: group, identifier: source) else { throw .itemNotFound }
                if source == target { return nil }
                let replaced = try checkedRow(db, group: group, identifier: target)
                if !replacing, replaced != nil { throw .duplicateItem }
                if replaced == nil { try requireFreeName(db, group: group, identifier: target) }
                var record = try loadState(db)
                let row = try reseal(old, try advance(&record))
                try saveState(db, &record, removing: [old] + [replaced].compactMap { $0 }, adding: [row])
                try db.statement("DELETE FROM items WHERE grp = ? AND ident = ?").bind(1, group).bind(2, target).run()
                try db.statement(
                    """
                    UPDATE items SET ident = ?, class = ?, generation = ?, nonce = ?, sealed = ?, details = ?
                    WHERE grp = ? AND ident = ?
                    """
                )
                .bind(1, row.identifier).bind(2, row.protectionClass.rawValue).bind(3, row.generation)
                .bind(4, row.nonce).bind(5, row.sealed).bind(6, row.details).bind(7, group).bind(8, source).run()
                return row
            }
            if let moved {
                expect(group, source, nil)
                expect(group, target, moved)
                committed(.renamed(group: group, from: source, to: target))
            }
            return moved != nil
        }
        if renamed { announce(.renamed(group: group, from: source, to: target)) }
    }

    /// Deletes an item; false if there was none, or (given `generation`)
    /// if the item is not at that generation any more.
    func delete(group: String, identifier: String, generation: Int64? = nil) throws(KeychainError) -> Bool {
        let deleted = try withConnection { db throws(KeychainError) in
            let deleted = try db.transaction { () throws(KeychainError) -> Bool in
                guard let existing = try checkedRow(db, group: group, identifier: identifier),
                    generation == nil || existing.generation == generation
                else { return false }
                var record = try loadState(db)
                try saveState(db, &record, removing: [existing], adding: [])
                try db.statement("DELETE FROM items WHERE grp = ? AND ident = ?").bind(1, group).bind(2, identifier)
                    .run()
                return true
            }
            if deleted {
                expect(group, identifier, nil)
                committed(.removed(group: group, identifier: identifier))
            }
            return deleted
        }
        if deleted { announce(.removed(group: group, identifier: identifier)) }
        return deleted
    }

    // MARK: Item-set state (rollback detection)

    /// The authenticated state record, inside the caller's transaction.
    private func loadState(_ db: SQLiteConnection) throws(KeychainError) -> ItemSetState.Record {
        guard let raw = try readMetadata(db, ItemSetState.recordKey) else { throw .decode }
        let record = try state.record(from: raw)
        // Version 1 records are upgraded at boot, before any write.
        guard record.generation != nil else { throw .decode }
        return record
    }

    /// XORs rows out of and into the state and stores it, inside the caller's transaction.
    private func saveState(
        _ db: SQLiteConnection, _ record: inout ItemSetState.Record,
        removing old: [SealedItem], adding new: [SealedItem]
    ) throws(KeychainError) {
        try proposeUse(removing: old, adding: new)
        for row in old + new { ItemSetState.xor(&record.digest, state.rowDigest(row)) }
        try db.statement("UPDATE meta SET value = ? WHERE key = ?")
            .bind(1, state.sealed(record)).bind(2, ItemSetState.recordKey).run()
        guard db.changes == 1 else { throw .decode }
        try updateBinding(db, removing: old, adding: new)
    }

    /// Checks every row against the authenticated state and remembers each
    /// row's generation: ``KeychainError/decode`` when a row was rolled back,
    /// removed or added outside keychainfs, a row claims a generation never
    /// handed out, or the record is missing. Only a `legacy` keychain (one
    /// whose keybag predates the record, format 1) may lack the record or
    /// hold its version 1: it is upgraded here.
    func verifyItemSet(legacy: Bool) throws(KeychainError) {
        try withConnection { db throws(KeychainError) in
            var newest: Int64 = 0
            let count = try db.statement("SELECT count(*) FROM items")
            let expectedRows = try count.step() ? Int(count.int64(0)) : 0
            let rows = try db.statement("SELECT grp, ident, class, generation FROM items")
            let (digest, generations) = try state.digestingConcurrently(expectedRows: expectedRows) {
                (pipeline) throws(KeychainError) in
                while try rows.step() {
                    guard rows.isInteger(2), rows.isInteger(3) else {
                        return try refuse("an item's row holds a non-integer class or generation")
                    }
                    let group = rows.textBytes(0), identifier = rows.textBytes(1)
                    guard group.count <= ItemLimits.maximumNameLength, identifier.count <= ItemLimits.maximumNameLength
                    else {
                        return try refuse(
                            "an item's row holds a name longer than \(ItemLimits.maximumNameLength) bytes")
                    }
                    let generation = rows.int64(3)
                    pipeline.add(
                        identity(group: group, identifier: identifier), group: group, identifier: identifier,
                        protectionClass: rows.int64(2), generation: generation)
                    newest = max(newest, generation)
                }
            }
            let stored = try readMetadata(db, ItemSetState.recordKey).map { (raw) throws(KeychainError) in
                try state.record(from: raw)
            }
            if let stored, !Crypto.constantTimeEqual(stored.digest, digest) {
                return try refuse(
                    "the keychain's items do not match their authenticated state: a row was rolled back, removed or added outside keychainfs"
                )
            }
            if let last = stored?.generation {
                guard newest <= last else {
                    return try refuse("an item's row claims a generation that was never handed out")
                }
            } else {
                guard legacy else {
                    return try refuse("the keychain's authenticated state record is missing or outdated")
                }
                // Format 1 kept the counter in the clear: the upgrade trusts it once.
                let counter = try db.statement("SELECT value FROM meta WHERE key = 'generation'")
                let last = max(newest, try counter.step() ? counter.int64(0) : 0)
                try db.statement(
                    "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
                )
                .bind(1, ItemSetState.recordKey)
                .bind(2, state.sealed(ItemSetState.Record(digest: digest, generation: last))).run()
            }
            known.withLock { $0 = KnownRows(generations: generations) }
        }
    }

    private func refuse(_ reason: String) throws(KeychainError) {
        Diagnostics.log(reason)
        throw .decode
    }

    /// The identifiers of a group with their class and size, sorted by name.
    func list(group: String) throws(KeychainError) -> [(identifier: String, info: ItemInfo)] {
        try withConnection { db throws(KeychainError) in
            guard try groupExists(db, group) else { throw .itemNotFound }
            let query = try db.statement("SELECT ident, class, length(sealed) FROM items WHERE grp = ? ORDER BY ident")
                .bind(1, group)
            var rows: [(String, ItemInfo)] = []
            while try query.step() {
                rows.append((query.text(0), try Self.info(class: query.int64(1), sealedLength: query.int64(2))))
            }
            return rows
        }
    }

    /// The identifiers of `group` with their class and generation (the
    /// generation names one version of an item: every write gives a new one).
    func generations(group: String) throws(KeychainError) -> [(
        identifier: String, protectionClass: ProtectionClass, generation: Int64
    )] {
        try withConnection { db throws(KeychainError) in
            guard try groupExists(db, group) else { throw .itemNotFound }
            let query = try db.statement("SELECT ident, class, generation FROM items WHERE grp = ? ORDER BY ident")
                .bind(1, group)
            var rows: [(String, ProtectionClass, Int64)] = []
            while try query.step() {
                guard let protectionClass = ProtectionClass(rawValue: query.int64(1)) else { throw .decode }
                rows.append((query.text(0), protectionClass, query.int64(2)))
            }
            return rows
        }
    }

    /// The rows of `group` that carry details, as stored (their values are
    /// not opened): what a Secret Service search reads. Each is checked
    /// against the generation this device expects, as every read is.
    func rowsWithDetails(group: String) throws(KeychainError) -> [SealedItem] {
        try withConnection { db throws(KeychainError) in
            let query = try db.statement(
                """
                SELECT ident, class, generation, details FROM items WHERE grp = ? AND details IS NOT NULL ORDER BY ident
                """
            ).bind(1, group)
            var rows: [SealedItem] = []
            while try query.step() {
                let identifier = query.text(0)
                guard let protectionClass = ProtectionClass(rawValue: query.int64(1)) else { throw .decode }
                let row = SealedItem(
                    group: group, identifier: identifier, protectionClass: protectionClass,
                    generation: query.int64(2), nonce: [], sealed: [], details: query.blob(3))
                try requireExpected(row.generation, group: group, identifier: identifier)
                rows.append(row)
            }
            return rows
        }
    }

    /// Format 4: the items table gets its `details` column (every row
    /// without details, as before). Run at boot, once the rows passed
    /// their checks; nothing to do where the column is there.
    func addDetailsColumn() throws(KeychainError) {
        try withConnection { db throws(KeychainError) in
            let columns = try db.statement("SELECT 1 FROM pragma_table_info('items') WHERE name = 'details'")
            if try !columns.step() { try db.execute("ALTER TABLE items ADD COLUMN details BLOB") }
        }
    }

    // MARK: Groups

    private func groupExists(_ db: SQLiteConnection, _ group: String) throws(KeychainError) -> Bool {
        try db.statement("SELECT 1 FROM groups WHERE name = ?").bind(1, group).step()
    }

    func groupExists(_ group: String) throws(KeychainError) -> Bool {
        try withConnection { db throws(KeychainError) in try groupExists(db, group) }
    }

    func groups() throws(KeychainError) -> [String] {
        try withConnection { db throws(KeychainError) in
            let query = try db.statement("SELECT name FROM groups ORDER BY name")
            var names: [String] = []
            while try query.step() { names.append(query.text(0)) }
            return names
        }
    }

    func createGroup(_ group: String) throws(KeychainError) {
        try withConnection { db throws(KeychainError) in
            try db.statement("INSERT OR IGNORE INTO groups(name) VALUES (?)").bind(1, group).run()
            if db.changes == 0 { throw .duplicateItem }
            committed(.groupCreated(group))
        }
        announce(.groupCreated(group))
    }

    /// Removes an empty group: ``KeychainError/badRequest`` if it holds items.
    func removeGroup(_ group: String) throws(KeychainError) {
        try withConnection { db throws(KeychainError) in
            try db.transaction { () throws(KeychainError) in
                guard try groupExists(db, group) else { throw .itemNotFound }
                if try db.statement("SELECT 1 FROM items WHERE grp = ? LIMIT 1").bind(1, group).step() {
                    throw .badRequest
                }
                try db.statement("DELETE FROM groups WHERE name = ?").bind(1, group).run()
            }
            committed(.groupRemoved(group))
        }
        announce(.groupRemoved(group))
    }

    /// Makes every committed transaction durable against power loss: a FULL
    /// checkpoint fsyncs the WAL and copies it into the database file, fsynced.
    func sync() throws(KeychainError) {
        try withConnection { db throws(KeychainError) in try db.execute("PRAGMA wal_checkpoint(FULL)") }
    }

    /// WAL mode: a commit is one append to the log (fast, and durable
    /// against a crash of the process with synchronous=NORMAL).
    func startWriteAheadLog() throws(KeychainError) {
        guard !isReadOnly else { return }  // the mode is written in the file's header
        try withConnection { db throws(KeychainError) in try db.execute("PRAGMA journal_mode=WAL") }
    }

    /// Checkpoints everything into the database file and leaves WAL mode,
    /// which deletes the -wal file (SQLite: journal_mode=DELETE checkpoints first).
    func closeLog() throws(KeychainError) {
        guard !isReadOnly else { return }
        try withConnection { db throws(KeychainError) in
            try db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            try db.execute("PRAGMA journal_mode=DELETE")
        }
    }
}
