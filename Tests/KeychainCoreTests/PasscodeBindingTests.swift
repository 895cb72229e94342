import Foundation
import TestSupport
import Testing

@testable import KeychainCore

/// The store's side of the passcode binding, without a TPM: what the rows
/// and the removals noted before the first unlock may say (docs/FORMAT.md,
/// "The passcode binding (format 6)"). (The attacks through a TPM are
/// `TPMAttackTests`.)
@Suite struct PasscodeBindingTests {
    /// A store with a binding keyed by a random binding key, and rows
    /// `a` and `b` of a passcode class and `c` of `always`, written with the key.
    struct BoundStore {
        let directory: String
        let store: ItemStore
        let key = PasscodeBindingKey(afterFirstUnlock: GuardedKey(copying: SecureBytes.random(count: Crypto.keySize)))

        init() throws {
            directory = try makeTemporaryDirectory()
            let secret = DeviceSecret(secret: SecureBytes.random(count: Crypto.keySize))
            store = try ItemStore(path: directory + "/keychain.db", create: true, state: ItemSetState(secret: secret))
            try store.setMetadata(EntitlementPolicy.recordKey, EntitlementPolicy().encoded(secret: secret))
            try store.bind(
                key: key, counter: CounterReference(index: 0x0181_0000, name: [1], auth: nil), value: 1)
            for (identifier, protectionClass) in [
                ("a", ProtectionClass.whenUnlocked), ("b", .afterFirstUnlockThisDeviceOnly), ("c", .always)
            ] {
                try store.write(group: "default", identifier: identifier) { _, generation in
                    SealedItem(
                        group: "default", identifier: identifier, protectionClass: protectionClass,
                        generation: generation, nonce: [], sealed: [1])
                }
            }
        }

        /// As at the next boot: the binding's key not in memory yet.
        func reboot() {
            store.binding.withLock { $0.state = .awaitingKey }
        }

        /// The check of the first passcode (its counter taken as current).
        func check() throws {
            try store.checkBinding(key: key, checkCounter: { _ in })
        }

        func row(_ identifier: String) throws -> SealedItem? {
            try store.item(group: "default", identifier: identifier)
        }

        /// A row put into the table behind the store's back, as an attacker with the file does.
        func insert(_ row: SealedItem) throws {
            try store.withConnection { db throws(KeychainError) in
                try db.statement(
                    "INSERT INTO items(grp, ident, class, generation, nonce, sealed) VALUES (?, ?, ?, ?, ?, ?)"
                )
                .bind(1, row.group).bind(2, row.identifier).bind(3, row.protectionClass.rawValue)
                .bind(4, row.generation).bind(5, row.nonce).bind(6, row.sealed).run()
            }
        }

        func removals() throws -> BindingRemovals? {
            try store.metadata(BindingRemovals.recordKey).map { (raw) throws(KeychainError) in
                try BindingRemovals(decoding: raw)
            }
        }
    }

    @Test func rowsRemovedBeforeTheFirstUnlockAreNotedAndFoldedIn() throws {
        let bound = try BoundStore()
        defer { try? FileManager.default.removeItem(atPath: bound.directory) }
        bound.reboot()
        #expect(try bound.store.delete(group: "default", identifier: "a"))
        #expect(try bound.store.delete(group: "default", identifier: "c"))
        #expect(try bound.removals()?.rows.map(\.identifier) == ["a"], "only the bound row is noted")
        try bound.check()
        #expect(try bound.removals() == nil, "the note is folded into the binding")
        // And the binding still holds what is left: b, then b written again with the key.
        bound.reboot()
        try bound.check()
        try bound.store.write(group: "default", identifier: "b") { old, generation in
            SealedItem(
                group: "default", identifier: "b", protectionClass: .afterFirstUnlockThisDeviceOnly,
                generation: generation, nonce: [], sealed: [2])
        }
        bound.reboot()
        try bound.check()
    }

    /// A note can only say that a bound row is gone: naming a row that is
    /// there (an older row put back beside the note of its removal), or
    /// one the binding never counted, fails; so does a row added without
    /// the key, or an older row of an item put back in place of its newer one.
    @Test func aNoteHidesNoRowPutBack() throws {
        let bound = try BoundStore()
        defer { try? FileManager.default.removeItem(atPath: bound.directory) }
        let a = try #require(try bound.row("a"))
        bound.reboot()
        #expect(try bound.store.delete(group: "default", identifier: "a"))
        try bound.insert(a)
        #expect(throws: KeychainError.decode) { try bound.check() }

        let other = try BoundStore()
        defer { try? FileManager.default.removeItem(atPath: other.directory) }
        other.reboot()
        let invented = BindingRemovals(rows: [
            .init(
                group: "default", identifier: "z", protectionClass: 1, generation: 99,
                contentDigest: ItemSetState.emptyDigest)
        ])
        try other.store.setMetadata(BindingRemovals.recordKey, invented.encoded)
        #expect(throws: KeychainError.decode) { try other.check() }

        let third = try BoundStore()
        defer { try? FileManager.default.removeItem(atPath: third.directory) }
        let older = try #require(try third.row("b"))
        try third.store.write(group: "default", identifier: "b") { _, generation in
            SealedItem(
                group: "default", identifier: "b", protectionClass: .afterFirstUnlockThisDeviceOnly,
                generation: generation, nonce: [], sealed: [3])
        }
        third.reboot()
        #expect(throws: KeychainError.interactionNotAllowed) {
            try third.store.write(group: "default", identifier: "d") { _, generation in
                SealedItem(
                    group: "default", identifier: "d", protectionClass: .whenUnlocked, generation: generation,
                    nonce: [], sealed: [4])
            }
        }
        try third.store.withConnection { db throws(KeychainError) in
            try db.statement("UPDATE items SET generation = ?, sealed = ? WHERE ident = 'b'")
                .bind(1, older.generation).bind(2, older.sealed).run()
        }
        #expect(throws: KeychainError.decode) { try third.check() }
    }

    /// A value sealed again under a generation it had before (a generation
    /// counter set back by whoever re-signs the state record makes the
    /// device hand one out twice) is another ciphertext, with another
    /// nonce: in place of the one the binding counted, it fails.
    @Test func anotherCiphertextUnderTheSameGenerationFails() throws {
        let bound = try BoundStore()
        defer { try? FileManager.default.removeItem(atPath: bound.directory) }
        let b = try #require(try bound.row("b"))
        bound.reboot()
        try bound.store.withConnection { db throws(KeychainError) in
            try db.statement("UPDATE items SET nonce = ?, sealed = ? WHERE ident = 'b'")
                .bind(1, [UInt8](repeating: 7, count: 24)).bind(2, b.sealed).run()
        }
        #expect(throws: KeychainError.decode) { try bound.check() }
    }
}
