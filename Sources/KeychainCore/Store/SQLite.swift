internal import CSQLite

/// A thin wrapper over one sqlite3 connection: every return code goes through
/// ``check(_:_:)``, so the conversion to ``KeychainError`` is written once.
/// Not thread-safe by itself; ``ItemStore`` serializes all use.
package final class SQLiteConnection {
    private let handle: OpaquePointer
    private var statements: [String: Statement] = [:]
    /// Statements handed out since the last ``finishStatements()``.
    private var active: [Statement] = []

    /// `readOnly`: every write fails with ``KeychainError/readOnly`` (a
    /// keychain whose files cannot be written).
    package init(path: String, create: Bool, readOnly: Bool = false) throws(KeychainError) {
        var db: OpaquePointer?
        let access = readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0)
        let flags = access | SQLITE_OPEN_NOMUTEX
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            if let db { sqlite3_close_v2(db) }
            if rc != SQLITE_CANTOPEN { Diagnostics.log("sqlite: cannot open \(path) (\(rc))") }
            throw rc == SQLITE_CANTOPEN ? .noSuchKeychain : .io
        }
        handle = db
        sqlite3_extended_result_codes(db, 1)
        sqlite3_busy_timeout(db, 5000)
    }

    deinit {
        statements.removeAll()
        sqlite3_close_v2(handle)
    }

    /// Runs SQL that returns no rows (schema, pragmas, transactions).
    package func execute(_ sql: String) throws(KeychainError) {
        try check(sqlite3_exec(handle, sql, nil, nil, nil), sql)
    }

    /// A cached prepared statement, reset and with its bindings cleared.
    package func statement(_ sql: String) throws(KeychainError) -> Statement {
        if let cached = statements[sql] {
            cached.reset()
            active.append(cached)
            return cached
        }
        var raw: OpaquePointer?
        try check(sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &raw, nil), sql)
        let statement = Statement(raw!, connection: self)
        statements[sql] = statement
        active.append(statement)
        return statement
    }

    /// Resets every statement used since the last call: a statement left on a
    /// row keeps its read transaction open, which blocks checkpoints.
    package func finishStatements() {
        for statement in active { statement.finish() }
        active.removeAll(keepingCapacity: true)
    }

    /// Rows changed by the last statement.
    package var changes: Int { Int(sqlite3_changes(handle)) }

    /// Runs `body` in one IMMEDIATE transaction: all of it commits, or none.
    package func transaction<R>(_ body: () throws(KeychainError) -> R) throws(KeychainError) -> R {
        try execute("BEGIN IMMEDIATE")
        do {
            let result = try body()
            try execute("COMMIT")
            return result
        } catch {
            try? execute("ROLLBACK")
            throw error
        }
    }

    func check(_ rc: Int32, _ context: @autoclosure () -> String) throws(KeychainError) {
        switch rc & 0xff {
        case SQLITE_OK, SQLITE_ROW, SQLITE_DONE:
            return
        case SQLITE_FULL:
            // A full disk is not damage: the transaction is rolled back and the user is told where.
            throw .diskFull
        case SQLITE_READONLY:
            // Opened read-only (its files cannot be written): nothing changed.
            throw .readOnly
        case SQLITE_CORRUPT, SQLITE_NOTADB:
            Diagnostics.log("sqlite: database corrupt (\(rc)) in \(context())")
            throw .decode
        default:
            // The message names the SQL and sqlite's text: neither holds secrets.
            Diagnostics.log("sqlite: \(String(cString: sqlite3_errmsg(handle))) (\(rc)) in \(context())")
            throw .io
        }
    }
}

/// A prepared statement. Blobs and texts are bound with SQLITE_TRANSIENT so
/// sqlite owns a copy and never points into a buffer we are about to wipe.
package final class Statement {
    private let raw: OpaquePointer
    private unowned let connection: SQLiteConnection

    init(_ raw: OpaquePointer, connection: SQLiteConnection) {
        self.raw = raw
        self.connection = connection
    }

    deinit { sqlite3_finalize(raw) }

    /// Ready for a new use; every parameter is bound again by the caller.
    func reset() {
        sqlite3_reset(raw)
    }

    /// Ends the current use: releases its read transaction and the copies of
    /// bound values (which may be ciphertext; never plaintext).
    func finish() {
        sqlite3_reset(raw)
        sqlite3_clear_bindings(raw)
    }

    @discardableResult
    package func bind(_ index: Int32, _ text: String) -> Statement {
        var text = text
        text.withUTF8 { utf8 in
            _ = utf8.withMemoryRebound(to: CChar.self) {
                CSQLite_bind_text_transient(raw, index, $0.baseAddress, Int32($0.count))
            }
        }
        return self
    }

    @discardableResult
    package func bind(_ index: Int32, _ value: Int64) -> Statement {
        sqlite3_bind_int64(raw, index, value)
        return self
    }

    @discardableResult
    package func bind(_ index: Int32, _ blob: [UInt8]) -> Statement {
        blob.withUnsafeBytes {
            _ = CSQLite_bind_blob_transient(
                raw, index, $0.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32($0.count))
        }
        return self
    }

    /// Binds `blob`, or NULL for nil.
    @discardableResult
    package func bind(_ index: Int32, _ blob: [UInt8]?) -> Statement {
        guard let blob else {
            sqlite3_bind_null(raw, index)
            return self
        }
        return bind(index, blob)
    }

    /// Steps once: true if a row is ready.
    package func step() throws(KeychainError) -> Bool {
        let rc = sqlite3_step(raw)
        try connection.check(rc, String(cString: sqlite3_sql(raw)))
        return rc == SQLITE_ROW
    }

    /// Steps to the end (a statement that returns no rows).
    package func run() throws(KeychainError) {
        while try step() {}
    }

    package func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(raw, column) }

    /// Whether the column holds an integer (SQLite's columns take any type).
    func isInteger(_ column: Int32) -> Bool { sqlite3_column_type(raw, column) == SQLITE_INTEGER }

    /// Whether the column holds NULL.
    package func isNull(_ column: Int32) -> Bool { sqlite3_column_type(raw, column) == SQLITE_NULL }

    package func text(_ column: Int32) -> String { String(decoding: textBytes(column), as: UTF8.self) }

    /// The column's text as bytes, valid until the next step (no string made).
    func textBytes(_ column: Int32) -> UnsafeRawBufferPointer {
        let bytes = sqlite3_column_text(raw, column)  // before _bytes: it may convert the value
        return UnsafeRawBufferPointer(start: bytes, count: bytes == nil ? 0 : Int(sqlite3_column_bytes(raw, column)))
    }

    package func blob(_ column: Int32) -> [UInt8] {
        let count = Int(sqlite3_column_bytes(raw, column))
        guard count > 0, let bytes = sqlite3_column_blob(raw, column) else { return [] }
        return Array(UnsafeRawBufferPointer(start: bytes, count: count))
    }
}
