import KeychainCore
/// One row of a `policy` reply: a group with an entitlement policy and one
/// of its rules (nil: a policy without rules, which admits no program).
/// The one encoder and decoder of the reply's six fields per row (group,
/// executable, SHA-256 in hex, unit, uid, `jit`; empty when not set).
public struct PolicyListing: Equatable, Sendable {
    public let group: String
    public let rule: EntitlementRule?

    public init(group: String, rule: EntitlementRule?) {
        self.group = group
        self.rule = rule
    }

    public static func fields(_ rows: [PolicyListing]) -> [String] {
        rows.flatMap { row in
            guard let rule = row.rule else { return [row.group, "", "", "", "", ""] }
            return [
                row.group, rule.executable, rule.digestHex, rule.unit ?? "", rule.uid.map { String($0) } ?? "",
                rule.allowsJIT ? "jit" : ""
            ]
        }
    }

    /// The rows a reply's fields list; `.io` for fields that are not whole
    /// rows of that shape (another build answered).
    public static func rows(fromFields fields: [String]) throws(KeychainError) -> [PolicyListing] {
        guard fields.count % 6 == 0 else { throw .io }
        return try stride(from: 0, to: fields.count, by: 6).map { (start) throws(KeychainError) in
            let row = Array(fields[start..<start + 6])
            guard !row[1].isEmpty else {
                guard row[2...].allSatisfy(\.isEmpty) else { throw .io }
                return PolicyListing(group: row[0], rule: nil)
            }
            guard let digest = Hex.bytes(row[2], count: 32), row[5].isEmpty || row[5] == "jit" else { throw .io }
            let uid: UInt32?
            if row[4].isEmpty {
                uid = nil
            } else {
                guard let parsed = UInt32(row[4]) else { throw .io }
                uid = parsed
            }
            return PolicyListing(
                group: row[0],
                rule: EntitlementRule(
                    executable: row[1], digest: digest,
                    unit: row[3].isEmpty ? nil : row[3], uid: uid,
                    allowsJIT: row[5] == "jit"))
        }
    }
}
