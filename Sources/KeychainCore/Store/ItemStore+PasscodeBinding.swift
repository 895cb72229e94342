/// Where a keychain's passcode binding (``PasscodeBinding``) stands in its store.
enum StoreBinding: Sendable {
    /// A keychain without one: kept in a file, without a passcode, or
    /// sealed in format 5, before passcode bindings, and not unlocked since.
    case none
    /// A bound keychain whose binding key is not in memory yet (before the
    /// first passcode of a boot): rows of passcode classes can only be
    /// removed, and are noted in ``BindingRemovals``.
    case awaitingKey
    /// Checked, with its key: writes keep it up to date.
    case keyed(PasscodeBindingKey)
}

extension ItemStore {
    /// Keeps the binding of a write's rows, inside its transaction.
    func updateBinding(_ db: SQLiteConnection, removing old: [SealedItem], adding new: [SealedItem])
        throws(KeychainError)
    {
        let removed = old.filter { PasscodeBinding.binds($0.protectionClass) }
        let added = new.filter { PasscodeBinding.binds($0.protectionClass) }
        guard !removed.isEmpty || !added.isEmpty else { return }
        switch binding.withLock({ $0.state }) {
        case .none:
            return
        case .awaitingKey:
            // A passcode class is written only with its key in memory, and
            // the binding key comes with the first passcode: never here.
            guard added.isEmpty else { throw .interactionNotAllowed }
            var removals = try readRemovals(db)
            removals.rows += removed.map {
                BindingRemovals.Row(
                    group: $0.group, identifier: $0.identifier, protectionClass: $0.protectionClass.rawValue,
                    generation: $0.generation,
                    contentDigest: PasscodeBindingKey.contentDigest(nonce: $0.nonce, details: $0.details))
            }
            try putMetadata(db, BindingRemovals.recordKey, removals.encoded)
        case .keyed(let key):
            var record = try readBinding(db, key: key)
            for row in removed + added { ItemSetState.xor(&record.rows, key.rowDigest(row)) }
            try putMetadata(db, PasscodeBinding.recordKey, record.encoded(key: key))
        }
        binding.withLock { $0.changed = true }
    }

    /// Checks the binding against the rows of the passcode classes, the
    /// rows removed before its key was known, and the entitlement policy
    /// record, as one snapshot; folds the removals in, and keeps `key` for
    /// the writes from now on. ``KeychainError/decode`` when it is missing,
    /// forged, or does not match (rows or policy put back from an older
    /// copy). `checkCounter` checks its counter first.
    func checkBinding(key: PasscodeBindingKey, checkCounter: (PasscodeBinding) throws(KeychainError) -> Void)
        throws(KeychainError)
    {
        try withConnection { db throws(KeychainError) in
            try db.transaction { () throws(KeychainError) in
                var record = try readBinding(db, key: key)
                try checkCounter(record)
                var (digest, generations) = try boundRows(db, key: key)
                let removals = try readRemovals(db)
                var removed = ItemSetState.emptyDigest
                for row in removals.rows {
                    guard let protectionClass = ProtectionClass(rawValue: row.protectionClass),
                        PasscodeBinding.binds(protectionClass), !generations.contains(row.generation)
                    else { try refuseBinding("a row noted as removed is still there, or was never bound") }
                    let share = key.rowDigest(
                        group: row.group, identifier: row.identifier, protectionClass: row.protectionClass,
                        generation: row.generation, contentDigest: row.contentDigest)
                    ItemSetState.xor(&removed, share)
                    generations.insert(row.generation)
                }
                ItemSetState.xor(&digest, removed)
                guard Crypto.constantTimeEqual(digest, record.rows) else {
                    try refuseBinding(
                        "the items of the passcode classes do not match the passcode binding: rows from an older "
                            + "copy, re-signed without the passcode")
                }
                guard Crypto.constantTimeEqual(try policyDigest(db, key: key), record.policy) else {
                    try refuseBinding(
                        "the entitlement policy does not match the passcode binding: an older policy, re-signed "
                            + "without the passcode")
                }
                if !removals.rows.isEmpty {
                    ItemSetState.xor(&record.rows, removed)
                    try putMetadata(db, PasscodeBinding.recordKey, record.encoded(key: key))
                    try removeMetadata(db, BindingRemovals.recordKey)
                }
                binding.withLock { $0 = (.keyed(key), $0.changed || !removals.rows.isEmpty) }
            }
        }
    }

    /// A new binding of the rows and policy there are now, at `counter`'s
    /// `value`, written with `records` in one transaction (the keybag of an
    /// upgrade, a recovery or an accepted rollback); `key` is kept.
    func bind(
        key: PasscodeBindingKey, counter: CounterReference, value: UInt64,
        writing records: [(key: String, value: [UInt8])] = []
    ) throws(KeychainError) {
        try withConnection { db throws(KeychainError) in
            try db.transaction { () throws(KeychainError) in
                for (name, value) in records { try putMetadata(db, name, value) }
                let (digest, _) = try boundRows(db, key: key)
                let record = PasscodeBinding(
                    counter: counter, value: value, rows: digest, policy: try policyDigest(db, key: key))
                try putMetadata(db, PasscodeBinding.recordKey, record.encoded(key: key))
                try removeMetadata(db, BindingRemovals.recordKey)
            }
            binding.withLock { $0 = (.keyed(key), false) }
        }
    }

    /// Writes the entitlement policy record, and its digest into the
    /// binding, in one transaction.
    func writePolicy(_ record: [UInt8]) throws(KeychainError) {
        try withConnection { db throws(KeychainError) in
            try db.transaction { () throws(KeychainError) in
                try putMetadata(db, EntitlementPolicy.recordKey, record)
                switch binding.withLock({ $0.state }) {
                case .none: return
                case .awaitingKey: throw .interactionNotAllowed  // a policy changes only with the passcode
                case .keyed(let key):
                    var bound = try readBinding(db, key: key)
                    bound.policy = key.policyDigest(ofRecord: record)
                    try putMetadata(db, PasscodeBinding.recordKey, bound.encoded(key: key))
                    binding.withLock { $0.changed = true }
                }
            }
        }
    }

    /// The binding as it stands, with its key (nil: none, or no key yet).
    func currentBinding() throws(KeychainError) -> (PasscodeBinding, PasscodeBindingKey)? {
        guard case .keyed(let key) = binding.withLock({ $0.state }) else { return nil }
        return try withConnection { db throws(KeychainError) in (try readBinding(db, key: key), key) }
    }

    /// Moves the binding to `value` when it changed since it last moved
    /// (the first half of a bump: the caller increments its counter after).
    /// Returns the binding moved, nil when nothing changed.
    func moveBinding(to value: (PasscodeBinding) -> UInt64) throws(KeychainError) -> (
        PasscodeBinding, PasscodeBindingKey
    )? {
        try withConnection { db throws(KeychainError) in
            guard case .keyed(let key) = binding.withLock({ $0.state }), binding.withLock({ $0.changed }) else {
                return nil
            }
            var record = try readBinding(db, key: key)
            record.value = value(record)
            try putMetadata(db, PasscodeBinding.recordKey, record.encoded(key: key))
            binding.withLock { $0.changed = false }
            return (record, key)
        }
    }

    /// The XOR of the binding shares of every row of a passcode class, and their generations.
    private func boundRows(_ db: SQLiteConnection, key: PasscodeBindingKey) throws(KeychainError) -> (
        [UInt8], Set<Int64>
    ) {
        let unbound = ProtectionClass.allCases.filter { !PasscodeBinding.binds($0) }.map { String($0.rawValue) }
        let query = try db.statement(
            "SELECT grp, ident, class, generation, nonce, details FROM items WHERE class NOT IN (\(unbound.joined(separator: ", ")))"
        )
        var digest = ItemSetState.emptyDigest
        var generations = Set<Int64>()
        while try query.step() {
            let generation = query.int64(3)
            generations.insert(generation)
            ItemSetState.xor(
                &digest,
                key.rowDigest(
                    group: query.text(0), identifier: query.text(1), protectionClass: query.int64(2),
                    generation: generation,
                    contentDigest: PasscodeBindingKey.contentDigest(
                        nonce: query.blob(4), details: query.isNull(5) ? nil : query.blob(5))))
        }
        return (digest, generations)
    }

    /// ``PasscodeBinding/policy`` of the entitlement policy record as stored.
    private func policyDigest(_ db: SQLiteConnection, key: PasscodeBindingKey) throws(KeychainError) -> [UInt8] {
        key.policyDigest(ofRecord: try readMetadata(db, EntitlementPolicy.recordKey) ?? [])
    }

    private func readBinding(_ db: SQLiteConnection, key: PasscodeBindingKey) throws(KeychainError)
        -> PasscodeBinding
    {
        guard let raw = try readMetadata(db, PasscodeBinding.recordKey) else {
            try refuseBinding("the keychain's passcode binding is missing")
        }
        do throws(KeychainError) {
            return try PasscodeBinding(decoding: raw, key: key)
        } catch {
            try refuseBinding("the keychain's passcode binding failed authentication")
        }
    }

    private func readRemovals(_ db: SQLiteConnection) throws(KeychainError) -> BindingRemovals {
        try readMetadata(db, BindingRemovals.recordKey).map { (raw) throws(KeychainError) in
            try BindingRemovals(decoding: raw)
        } ?? BindingRemovals()
    }

    private func refuseBinding(_ reason: String) throws(KeychainError) -> Never {
        Diagnostics.log(reason)
        throw .decode
    }

    /// Forgets the binding (a passcode removed: nothing is bound to one).
    func unbind() throws(KeychainError) {
        try withConnection { db throws(KeychainError) in
            try db.transaction { () throws(KeychainError) in
                try removeMetadata(db, PasscodeBinding.recordKey)
                try removeMetadata(db, BindingRemovals.recordKey)
            }
            binding.withLock { $0 = (.none, false) }
        }
    }
}
