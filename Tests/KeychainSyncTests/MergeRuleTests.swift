import Testing
@testable import KeychainCore
@testable import KeychainSync

/// The merge rule alone: no git, no device (docs/SYNC.md, "The merge rule").
@Suite struct MergeRuleTests {
    static let key = ItemKey(group: "default", identifier: "github.com")

    static func item(_ value: String, _ vector: [UInt64: UInt64], changed: UInt64, origin: UInt64) throws -> SyncRecord
    {
        SyncRecord(
            key: key, vector: VersionVector(vector),
            body: .item(SyncedContent(protectionClass: .whenUnlocked, value: try SecureBytes(value), details: nil)),
            changed: changed, origin: origin)
    }

    static func tombstone(_ vector: [UInt64: UInt64], changed: UInt64, origin: UInt64) -> SyncRecord {
        SyncRecord(key: key, vector: VersionVector(vector), body: .tombstone, changed: changed, origin: origin)
    }

    static func value(_ record: SyncRecord?) -> String? { record?.content?.value.string() }

    @Test func versionsThatSawEachOtherAreOrdered() {
        let a = VersionVector([1: 2, 2: 1])
        #expect(a.compare(VersionVector([1: 2, 2: 1])) == .equal)
        #expect(a.compare(VersionVector([1: 3, 2: 1])) == .before)
        #expect(a.compare(VersionVector([1: 1])) == .after)
        #expect(a.compare(VersionVector([1: 1, 2: 2])) == .concurrent)
        #expect(a.merged(with: VersionVector([1: 1, 3: 4])) == VersionVector([1: 2, 2: 1, 3: 4]))
    }

    @Test func theVersionThatSawTheOtherWinsFromEitherSide() throws {
        let old = try Self.item("old", [1: 1], changed: 5_000, origin: 1)
        // Seen by device 2, which changed it later by the vector but earlier by its clock: the vector decides.
        let new = try Self.item("new", [1: 1, 2: 1], changed: 1_000, origin: 2)
        #expect(Self.value(MergeRule.merge(local: old, remote: new).result) == "new")
        #expect(Self.value(MergeRule.merge(local: new, remote: old).result) == "new")
        #expect(MergeRule.merge(local: old, remote: new).conflictCopy?.key == nil)
    }

    @Test func concurrentChangesKeepTheNewerAsTheItemAndTheOtherBesideIt() throws {
        let mine = try Self.item("mine", [1: 1, 2: 1], changed: 2_000, origin: 1)
        let theirs = try Self.item("theirs", [1: 1, 3: 1], changed: 3_000, origin: 3)
        for (local, remote) in [(mine, theirs), (theirs, mine)] {
            let outcome = MergeRule.merge(local: local, remote: remote)
            #expect(Self.value(outcome.result) == "theirs")
            #expect(Self.value(outcome.conflictCopy) == "mine")
            // The result saw both, so every device that gets it takes it.
            #expect(outcome.result?.vector.compare(mine.vector) == .after)
            #expect(outcome.result?.vector.compare(theirs.vector) == .after)
        }
    }

    @Test func equalClocksAreBrokenByDeviceSoEveryDevicePicksTheSame() throws {
        let a = try Self.item("a", [1: 1], changed: 7, origin: 1)
        let b = try Self.item("b", [2: 1], changed: 7, origin: 2)
        #expect(Self.value(MergeRule.merge(local: a, remote: b).result) == "b")
        #expect(Self.value(MergeRule.merge(local: b, remote: a).result) == "b")
    }

    @Test func aRemovalLosesToAChangeItDidNotSee() throws {
        let change = try Self.item("changed", [1: 1, 2: 1], changed: 1_000, origin: 2)
        let removal = Self.tombstone([1: 1, 3: 1], changed: 9_000, origin: 3)
        for (local, remote) in [(change, removal), (removal, change)] {
            let outcome = MergeRule.merge(local: local, remote: remote)
            #expect(Self.value(outcome.result) == "changed")
            #expect(outcome.conflictCopy?.key == nil)
            #expect(outcome.result?.vector.compare(removal.vector) == .after)
        }
        // A removal that saw the change wins.
        let seen = Self.tombstone([1: 1, 2: 1, 3: 1], changed: 9_000, origin: 3)
        #expect(MergeRule.merge(local: change, remote: seen).result?.isTombstone == true)
    }

    @Test func theSameSecretChangedTwiceNeedsNoCopy() throws {
        let a = try Self.item("same", [1: 1, 2: 1], changed: 1, origin: 2)
        let b = try Self.item("same", [1: 1, 3: 1], changed: 2, origin: 3)
        let outcome = MergeRule.merge(local: a, remote: b)
        #expect(outcome.conflictCopy?.key == nil)
        #expect(Self.value(outcome.result) == "same")
    }

    @Test func aConflictCopyIsNamedForItsHostAndDateAndFitsAName() {
        let name = MergeRule.conflictName(of: "github.com", host: "laptop", changed: 1_795_000_000_000) { _ in false }
        #expect(name == "github.com (conflict from laptop, 2026-11-18 11.06.40)")
        let long = String(repeating: "é", count: 127)
        let fitted = MergeRule.conflictName(of: long, host: "laptop", changed: 0) { _ in false }
        #expect(fitted.utf8.count <= 255)
        #expect(fitted.hasSuffix("(conflict from laptop, 1970-01-01 00.00.00)"))
        let second = MergeRule.conflictName(of: "x", host: "h", changed: 0) {
            $0 == "x (conflict from h, 1970-01-01 00.00.00)"
        }
        #expect(second == "x (conflict from h, 1970-01-01 00.00.00) 2")
    }
}
