/// How two versions of one item become one (docs/SYNC.md, "The merge
/// rule"): a pure function of the two records, tested apart from git and
/// the network. No write is lost: of two concurrent changes of the same
/// secret, the newer is the item and the other is kept beside it as a
/// conflict copy; a removal wins only over the versions it saw.
package enum MergeRule {
    /// What a key holds after a merge, and the version that lost, which
    /// the caller keeps under a name of its own (``conflictName(of:host:changed:isTaken:)``).
    package struct Outcome: Sendable {
        package var result: SyncRecord?
        package var conflictCopy: SyncRecord?
    }

    /// The merge of this device's version of a key with the remote's.
    package static func merge(local: SyncRecord?, remote: SyncRecord?) -> Outcome {
        guard let local else { return Outcome(result: remote) }
        guard let remote else { return Outcome(result: local) }
        switch local.vector.compare(remote.vector) {
        case .equal, .after: return Outcome(result: local)
        case .before: return Outcome(result: remote)
        case .concurrent: break
        }
        let vector = local.vector.merged(with: remote.vector)
        let newer = isNewer(local, than: remote) ? local : remote
        let older = isNewer(local, than: remote) ? remote : local
        switch (local.content, remote.content) {
        case (nil, nil):
            // Both removed it: one tombstone that saw both.
            return Outcome(result: with(newer, vector))
        case (.some, nil):
            // A removal that did not see this change loses to it.
            return Outcome(result: with(local, vector))
        case (nil, .some):
            return Outcome(result: with(remote, vector))
        case (.some(let mine), .some(let theirs)):
            if mine.sameSecret(as: theirs) { return Outcome(result: with(newer, vector)) }
            return Outcome(result: with(newer, vector), conflictCopy: older)
        }
    }

    /// The later change by its device's clock; the larger device on a tie,
    /// so that every device picks the same one.
    static func isNewer(_ a: SyncRecord, than b: SyncRecord) -> Bool {
        a.changed != b.changed ? a.changed > b.changed : a.origin > b.origin
    }

    private static func with(_ record: SyncRecord, _ vector: VersionVector) -> SyncRecord {
        var merged = record
        merged.vector = vector
        return merged
    }

    /// The name a conflict copy of `identifier` gets, as iCloud Drive and
    /// Dropbox name theirs: `NAME (conflict from HOST, DATE)`, shortened to
    /// fit a name's 255 bytes, with ` 2`, ` 3`... when taken.
    package static func conflictName(
        of identifier: String, host: String, changed: UInt64, isTaken: (String) -> Bool
    ) -> String {
        let date = dateText(millisecondsSince1970: changed)
        for attempt in 1...1000 {
            let suffix = " (conflict from \(host), \(date))" + (attempt == 1 ? "" : " \(attempt)")
            let room = max(0, 255 - suffix.utf8.count)
            var stem = identifier
            while stem.utf8.count > room { stem.removeLast() }
            let name = stem + suffix
            if !isTaken(name) { return name }
        }
        return identifier + " (conflict \(changed))"
    }

    /// `YYYY-MM-DD HH.MM.SS` in UTC (no `:` or `/`, which some tools treat specially).
    static func dateText(millisecondsSince1970 milliseconds: UInt64) -> String {
        var seconds = Int(milliseconds / 1000)
        let second = seconds % 60, minute = (seconds / 60) % 60, hour = (seconds / 3600) % 24
        seconds /= 86_400
        // Howard Hinnant's days-to-civil.
        let z = seconds + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let day = doy - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        let year = yoe + era * 400 + (month <= 2 ? 1 : 0)
        func two(_ n: Int) -> String { n < 10 ? "0\(n)" : "\(n)" }
        return "\(year)-\(two(month))-\(two(day)) \(two(hour)).\(two(minute)).\(two(second))"
    }
}
