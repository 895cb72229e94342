import KeychainCore

/// Where a machine keeps its ``SyncState``: `sync/state.db`, SQLite in
/// WAL mode, one table per part, so that a round writes what it changed
/// (an item's agreed version, a record's digest, a bucket's index), not
/// the whole state: `meta` (the circle and this machine, one row), `base`
/// (per item: generation and version vector), `processed` (per record
/// name: the digest agreed with), `indexes` (per bucket: the index file's
/// digest and entries). Each save is one transaction: all of it lasts, or none.
final class SyncStateStore {
    private let db: SQLiteConnection
    /// The state as last written or read here, and the save it is (another
    /// engine of the same keychain, in a test, may have saved since).
    private var known: (state: SyncState, save: Int64)?

    init(path: String) throws(SyncFailure) {
        do throws(KeychainError) {
            db = try SQLiteConnection(path: path, create: true)
            try db.execute("PRAGMA journal_mode=WAL")
            try db.execute("PRAGMA synchronous=FULL")
            try db.execute(
                """
                CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 1), save INTEGER NOT NULL, head BLOB NOT NULL);
                CREATE TABLE IF NOT EXISTS base (grp TEXT NOT NULL, ident TEXT NOT NULL, generation INTEGER NOT NULL,
                    vector BLOB NOT NULL, PRIMARY KEY (grp, ident)) WITHOUT ROWID;
                CREATE TABLE IF NOT EXISTS processed (name BLOB PRIMARY KEY, digest BLOB NOT NULL) WITHOUT ROWID;
                CREATE TABLE IF NOT EXISTS indexes (bucket INTEGER PRIMARY KEY, digest BLOB NOT NULL, entries BLOB NOT NULL);
                """)
        } catch {
            throw SyncFailure(.store(error), "\(path) could not be opened (\(error))")
        }
    }

    /// The state; nil when this keychain is in no circle.
    func load() throws(SyncFailure) -> SyncState? {
        do throws(KeychainError) {
            defer { db.finishStatements() }
            let meta = try db.statement("SELECT save, head FROM meta WHERE id = 1")
            guard try meta.step() else {
                known = nil
                return nil
            }
            let save = meta.int64(0)
            if let known, known.save == save { return known.state }
            var state = try SyncState(head: meta.blob(1))
            let base = try db.statement("SELECT grp, ident, generation, vector FROM base")
            while try base.step() {
                var reader = ByteReader(base.blob(3))
                state.base[ItemKey(group: base.text(0), identifier: base.text(1))] = SyncState.Base(
                    vector: try VersionVector(reading: &reader), generation: base.int64(2))
            }
            let processed = try db.statement("SELECT name, digest FROM processed")
            while try processed.step() { state.processed[processed.blob(0)] = processed.blob(1) }
            let indexes = try db.statement("SELECT bucket, digest, entries FROM indexes")
            while try indexes.step() {
                let entries = indexes.blob(2)
                guard entries.count % 64 == 0 else { throw .decode }
                var map: [[UInt8]: [UInt8]] = [:]
                for offset in stride(from: 0, to: entries.count, by: 64) {
                    map[Array(entries[offset..<offset + 32])] = Array(entries[offset + 32..<offset + 64])
                }
                state.indexes[UInt8(truncatingIfNeeded: indexes.int64(0))] = (indexes.blob(1), map)
            }
            known = (state, save)
            return state
        } catch {
            throw SyncFailure(
                .store(.decode),
                "this machine's sync state is damaged (\(error)): `keychainfs sync leave`, then join again")
        }
    }

    /// Writes `state`: what differs from the state last written or read, in one transaction.
    func save(_ state: SyncState) throws(SyncFailure) {
        do throws(KeychainError) {
            defer { db.finishStatements() }
            let previous = known?.state
            let next = (known?.save ?? 0) + 1
            try db.transaction { () throws(KeychainError) in
                try db.statement("INSERT OR REPLACE INTO meta (id, save, head) VALUES (1, ?, ?)")
                    .bind(1, next).bind(2, state.encodedHead).run()
                for (key, entry) in state.base where previous?.base[key] != entry {
                    var vector = ByteWriter()
                    entry.vector.encode(into: &vector)
                    try db.statement("INSERT OR REPLACE INTO base (grp, ident, generation, vector) VALUES (?, ?, ?, ?)")
                        .bind(1, key.group).bind(2, key.identifier).bind(3, entry.generation).bind(4, vector.bytes)
                        .run()
                }
                for key in previous?.base.keys.filter({ state.base[$0] == nil }) ?? [] {
                    try db.statement("DELETE FROM base WHERE grp = ? AND ident = ?").bind(1, key.group)
                        .bind(2, key.identifier).run()
                }
                // Emptied with a new key: written afresh.
                let rewrite = previous == nil || state.processed.count < (previous?.processed.count ?? 0)
                if rewrite { try db.execute("DELETE FROM processed") }
                for (name, digest) in state.processed where rewrite || previous?.processed[name] != digest {
                    try db.statement("INSERT OR REPLACE INTO processed (name, digest) VALUES (?, ?)")
                        .bind(1, name).bind(2, digest).run()
                }
                for (bucket, index) in state.indexes where previous?.indexes[bucket]?.digest != index.digest {
                    var entries: [UInt8] = []
                    entries.reserveCapacity(index.entries.count * 64)
                    for (name, digest) in index.entries { entries += name + digest }
                    try db.statement("INSERT OR REPLACE INTO indexes (bucket, digest, entries) VALUES (?, ?, ?)")
                        .bind(1, Int64(bucket)).bind(2, index.digest).bind(3, entries).run()
                }
                for bucket in previous?.indexes.keys.filter({ state.indexes[$0] == nil }) ?? [] {
                    try db.statement("DELETE FROM indexes WHERE bucket = ?").bind(1, Int64(bucket)).run()
                }
            }
            known = (state, next)
        } catch {
            if error == .diskFull {
                throw SyncFailure(.store(.diskFull), "no space left to save this machine's sync state")
            }
            throw SyncFailure(.store(error), "this machine's sync state could not be saved (\(error))")
        }
    }

    /// Forgets the circle (`sync leave`).
    func clear() throws(SyncFailure) {
        do throws(KeychainError) {
            try db.transaction { () throws(KeychainError) in
                for table in ["meta", "base", "processed", "indexes"] { try db.execute("DELETE FROM \(table)") }
            }
            known = nil
        } catch {
            throw SyncFailure(.store(error), "this machine's sync state could not be cleared (\(error))")
        }
    }
}
