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
}

/// What listing and `stat` learn without any key.
public struct ItemInfo: Sendable, Equatable {
    /// The item's class.
    public var protectionClass: ProtectionClass
    /// The exact length of the value in bytes.
    public var size: Int
}

/// The SQLite file of one keychain: the items, the groups, and a few metadata
/// records (keybag, lockout). WAL mode with synchronous=NORMAL: a committed
/// transaction survives the death of the process; ``sync()`` makes it survive
/// power loss too.
final class ItemStore: Sendable {
    static let schemaVersion: Int64 = 1

    private let connection: Mutex<SQLiteConnection>
    private let state: ItemSetState

    init(path: String, create: Bool, state: ItemSetState) throws(KeychainError) {
        self.state = state
        let db = try SQLiteConnection(path: path, create: create)
        try db.execute("PRAGMA journal_mode=WAL")
        try db.execute("PRAGMA synchronous=NORMAL")
        try db.execute("PRAGMA secure_delete=ON")
        if create {
            try db.transaction { () throws(KeychainError) in
                try db.execute("""
                    CREATE TABLE meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;
                    CREATE TABLE groups(name TEXT PRIMARY KEY) WITHOUT ROWID;
                    CREATE TABLE items(
                        grp TEXT NOT NULL REFERENCES groups(name),
                        ident TEXT NOT NULL,
                        class INTEGER NOT NULL,
                        generation INTEGER NOT NULL,
                        nonce BLOB NOT NULL,
                        sealed BLOB NOT NULL,
                        PRIMARY KEY (grp, ident)) WITHOUT ROWID;
                    INSERT INTO groups(name) VALUES ('\(ItemLimits.defaultGroup)');
                    INSERT INTO meta(key, value) VALUES ('schema', \(ItemStore.schemaVersion));
                    INSERT INTO meta(key, value) VALUES ('generation', 0);
                    """)
                try db.statement("INSERT INTO meta(key, value) VALUES (?, ?)")
                    .bind(1, ItemSetState.recordKey).bind(2, state.sealed(ItemSetState.emptyDigest)).run()
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

    private func withConnection<R: Sendable>(_ body: (SQLiteConnection) throws(KeychainError) -> R) throws(KeychainError) -> R {
        try connection.withLock { (db: inout SQLiteConnection) throws(KeychainError) -> R in
            defer { db.finishStatements() }
            return try body(db)
        }
    }

    // MARK: Metadata

    func metadata(_ key: String) throws(KeychainError) -> [UInt8]? {
        try withConnection { db throws(KeychainError) in
            let query = try db.statement("SELECT value FROM meta WHERE key = ?").bind(1, key)
            return try query.step() ? query.blob(0) : nil
        }
    }

    func setMetadata(_ key: String, _ value: [UInt8]) throws(KeychainError) {
        try withConnection { db throws(KeychainError) in
            try db.statement("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value")
                .bind(1, key).bind(2, value).run()
        }
    }

    // MARK: Items

    func item(group: String, identifier: String) throws(KeychainError) -> SealedItem? {
        try withConnection { db throws(KeychainError) in try currentRow(db, group: group, identifier: identifier) }
    }

    func info(group: String, identifier: String) throws(KeychainError) -> ItemInfo? {
        try withConnection { db throws(KeychainError) in
            let query = try db.statement("SELECT class, length(sealed) FROM items WHERE grp = ? AND ident = ?")
                .bind(1, group).bind(2, identifier)
            guard try query.step() else { return nil }
            return try Self.info(class: query.int64(0), sealedLength: query.int64(1))
        }
    }

    private static func info(class raw: Int64, sealedLength: Int64) throws(KeychainError) -> ItemInfo {
        guard let protectionClass = ProtectionClass(rawValue: raw), sealedLength >= Crypto.tagSize else { throw .decode }
        return ItemInfo(protectionClass: protectionClass, size: Int(sealedLength) - Crypto.tagSize)
    }

    /// Writes one item in one transaction: `seal` gets the current row (nil
    /// if none) and the new generation, and returns the encrypted row, or
    /// throws to abandon the write with nothing changed. The old row is
    /// replaced in place (INSERT ... ON CONFLICT DO UPDATE), never deleted
    /// first, so no failure can leave the item missing.
    /// Returns the row replaced (nil if none) and the generation written.
    @discardableResult
    func write(group: String, identifier: String,
               seal: (_ existing: SealedItem?, _ generation: Int64) throws(KeychainError) -> SealedItem)
        throws(KeychainError) -> (replaced: SealedItem?, generation: Int64) {
        try withConnection { db throws(KeychainError) in
            try db.transaction { () throws(KeychainError) in
                let existing = try currentRow(db, group: group, identifier: identifier)
                let row = try seal(existing, try nextGeneration(db))
                try updateState(db, removing: [existing].compactMap { $0 }, adding: [row])
                try db.statement("INSERT OR IGNORE INTO groups(name) VALUES (?)").bind(1, group).run()
                try upsert(db, row)
                return (existing, row.generation)
            }
        }
    }

    private func upsert(_ db: SQLiteConnection, _ row: SealedItem) throws(KeychainError) {
        try db.statement("""
            INSERT INTO items(grp, ident, class, generation, nonce, sealed) VALUES (?, ?, ?, ?, ?, ?)
            ON CONFLICT(grp, ident) DO UPDATE SET class = excluded.class,
                generation = excluded.generation, nonce = excluded.nonce, sealed = excluded.sealed
            """)
            .bind(1, row.group).bind(2, row.identifier).bind(3, row.protectionClass.rawValue)
            .bind(4, row.generation).bind(5, row.nonce).bind(6, row.sealed).run()
    }

    /// Puts `previous` back in place of the row of generation `written`,
    /// exactly as it was (no key needed: the row is not re-sealed). Does
    /// nothing and returns false when the item changed since (another write,
    /// a rename or a removal): a revert never undoes someone else's write.
    func revert(group: String, identifier: String, written: Int64, previous: SealedItem) throws(KeychainError) -> Bool {
        try withConnection { db throws(KeychainError) in
            try db.transaction { () throws(KeychainError) -> Bool in
                guard let current = try currentRow(db, group: group, identifier: identifier),
                      current.generation == written else { return false }
                try updateState(db, removing: [current], adding: [previous])
                try upsert(db, previous)
                return true
            }
        }
    }

    private func currentRow(_ db: SQLiteConnection, group: String, identifier: String) throws(KeychainError) -> SealedItem? {
        let query = try db.statement("SELECT class, generation, nonce, sealed FROM items WHERE grp = ? AND ident = ?")
            .bind(1, group).bind(2, identifier)
        guard try query.step() else { return nil }
        guard let protectionClass = ProtectionClass(rawValue: query.int64(0)) else { throw .decode }
        return SealedItem(group: group, identifier: identifier, protectionClass: protectionClass,
                          generation: query.int64(1), nonce: query.blob(2), sealed: query.blob(3))
    }

    private func nextGeneration(_ db: SQLiteConnection) throws(KeychainError) -> Int64 {
        let query = try db.statement("UPDATE meta SET value = value + 1 WHERE key = 'generation' RETURNING value")
        guard try query.step() else { throw .decode }
        let generation = query.int64(0)
        try query.run()
        return generation
    }

    /// Moves an item to a new identifier in one transaction, re-sealed by
    /// `reseal` (the identifier is part of the associated data). Replaces an
    /// existing target only when `replacing` is true.
    func rename(group: String, from source: String, to target: String, replacing: Bool,
                reseal: (SealedItem, Int64) throws(KeychainError) -> SealedItem) throws(KeychainError) {
        try withConnection { db throws(KeychainError) in
            try db.transaction { () throws(KeychainError) in
                guard let old = try currentRow(db, group: group, identifier: source) else { throw .itemNotFound }
                if source == target { return }
                let replaced = try currentRow(db, group: group, identifier: target)
                if !replacing, replaced != nil { throw .duplicateItem }
                let row = try reseal(old, try nextGeneration(db))
                try updateState(db, removing: [old] + [replaced].compactMap { $0 }, adding: [row])
                try db.statement("DELETE FROM items WHERE grp = ? AND ident = ?").bind(1, group).bind(2, target).run()
                try db.statement("""
                    UPDATE items SET ident = ?, class = ?, generation = ?, nonce = ?, sealed = ?
                    WHERE grp = ? AND ident = ?
                    """)
                    .bind(1, row.identifier).bind(2, row.protectionClass.rawValue).bind(3, row.generation)
                    .bind(4, row.nonce).bind(5, row.sealed).bind(6, group).bind(7, source).run()
            }
        }
    }

    /// Deletes an item; false if there was none.
    func delete(group: String, identifier: String) throws(KeychainError) -> Bool {
        try withConnection { db throws(KeychainError) in
            try db.transaction { () throws(KeychainError) -> Bool in
                guard let existing = try currentRow(db, group: group, identifier: identifier) else { return false }
                try updateState(db, removing: [existing], adding: [])
                try db.statement("DELETE FROM items WHERE grp = ? AND ident = ?").bind(1, group).bind(2, identifier).run()
                return true
            }
        }
    }

    // MARK: Item-set state (rollback detection)

    /// XORs rows out of and into the authenticated state, inside the caller's transaction.
    private func updateState(_ db: SQLiteConnection, removing old: [SealedItem], adding new: [SealedItem]) throws(KeychainError) {
        let query = try db.statement("SELECT value FROM meta WHERE key = ?").bind(1, ItemSetState.recordKey)
        guard try query.step() else { throw .decode }
        var digest = try state.digest(from: query.blob(0))
        for row in old + new { ItemSetState.xor(&digest, state.rowDigest(row)) }
        try db.statement("UPDATE meta SET value = ? WHERE key = ?")
            .bind(1, state.sealed(digest)).bind(2, ItemSetState.recordKey).run()
    }

    /// Checks every row against the authenticated state: ``KeychainError/decode``
    /// when a row was rolled back, removed or added outside keychainfs. A
    /// keychain without a state record (written before it existed) gets one.
    func verifyItemSet() throws(KeychainError) {
        try withConnection { db throws(KeychainError) in
            var digest = ItemSetState.emptyDigest
            let rows = try db.statement("SELECT grp, ident, class, generation FROM items")
            while try rows.step() {
                ItemSetState.xor(&digest, state.rowDigest(group: rows.text(0), identifier: rows.text(1),
                                                          protectionClass: rows.int64(2), generation: rows.int64(3)))
            }
            let query = try db.statement("SELECT value FROM meta WHERE key = ?").bind(1, ItemSetState.recordKey)
            guard try query.step() else {
                try db.statement("INSERT INTO meta(key, value) VALUES (?, ?)")
                    .bind(1, ItemSetState.recordKey).bind(2, state.sealed(digest)).run()
                return
            }
            guard Crypto.constantTimeEqual(try state.digest(from: query.blob(0)), digest) else {
                Diagnostics.log("the keychain's items do not match their authenticated state: a row was rolled back, removed or added outside keychainfs")
                throw .decode
            }
        }
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
        }
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
        }
    }

    /// Makes every committed transaction durable against power loss: a FULL
    /// checkpoint fsyncs the WAL and copies it into the database file, fsynced.
    func sync() throws(KeychainError) {
        try withConnection { db throws(KeychainError) in try db.execute("PRAGMA wal_checkpoint(FULL)") }
    }
}
