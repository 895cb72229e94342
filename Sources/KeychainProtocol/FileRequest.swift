import KeychainCore
/// Files passed with the request or its reply: backups and the audit log.
public enum FileRequest: Equatable, Sendable {
    /// Write a backup of the migratable items to the file passed with the
    /// request (`path` names it in messages); policed groups only when
    /// named, with the keychain's passcode.
    case backup(path: String, password: SecureBytes, policedGroups: [String] = [], passcode: SecureBytes? = nil)
    /// Restore the backup file passed with the request (`path` names it in
    /// messages); writing into a policed group needs the keychain's passcode.
    case restore(path: String, password: SecureBytes, policy: RestoreConflictPolicy, passcode: SecureBytes? = nil)
    /// The audit log file (or the rotated one before it), passed back
    /// read-only with the reply.
    case auditLog(rotated: Bool)
    /// Check the audit log's chain: the reply is the number of lines, then
    /// one field per problem.
    case verifyLog
}

extension FileRequest {
    /// The `kind` byte of each request of this group: unique among all
    /// groups (``DeviceRequest/kindsOfEachGroup``, checked by the protocol's tests),
    /// and never reused, since a byte means one request to every version.
    enum Kind: UInt8, CaseIterable {
        case backup = 5, restore = 6, auditLog = 25, verifyLog = 26
    }

    /// The request's kind and fields.
    var frameParts: (Kind, [FrameField]) {
        switch self {
        case .backup(let path, let password, let policedGroups, let passcode):
            // Names hold no newline (ItemLimits): one text carries the list.
            return (
                .backup,
                [
                    .text(path), .optionalSecret(password), .text(policedGroups.joined(separator: "\n")),
                    .optionalSecret(passcode)
                ]
            )
        case .restore(let path, let password, let policy, let passcode):
            return (
                .restore,
                [.text(path), .optionalSecret(password), .text(String(policy.rawValue)), .optionalSecret(passcode)]
            )
        case .auditLog(let rotated): return (.auditLog, [.text(rotated ? "1" : "0")])
        case .verifyLog: return (.verifyLog, [])
        }
    }

    /// The request of `kind`, read from its fields.
    static func parsing(_ kind: Kind, _ reader: inout ByteReader<UnsafeRawBufferPointer>)
        throws(KeychainError) -> Self
    {
        switch kind {
        case .backup:
            let path = try reader.text()
            guard let password = try reader.optionalSecret() else { throw .param }
            let list = try reader.text()
            let policedGroups =
                list.isEmpty ? [] : list.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
            // One spelling per request: no empty or repeated name.
            guard !policedGroups.contains(""), Set(policedGroups).count == policedGroups.count else { throw .param }
            return .backup(
                path: path, password: password, policedGroups: policedGroups, passcode: try reader.optionalSecret())
        case .restore:
            let path = try reader.text()
            let passwordField = try reader.optionalSecret(), policyText = try reader.text()
            // Only the canonical spelling ("2", not "02"): a request means one thing only.
            guard let password = passwordField,
                let policy = RestoreConflictPolicy.allCases.first(where: { String($0.rawValue) == policyText })
            else {
                throw .param
            }
            return .restore(path: path, password: password, policy: policy, passcode: try reader.optionalSecret())
        case .auditLog: return .auditLog(rotated: try DeviceRequest.flag(try reader.text()))
        case .verifyLog: return .verifyLog
        }
    }
}
