import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// The running device of a keychain, reached over its socket: the backend
/// of a ``PasswordManager`` that is a client of a device process (the
/// core's ``RemoteKeychain``).
package final class DeviceConnection: RemoteKeychain {
    let socketPath: String

    /// The device holding the keychain at `keychain`, if one answers on its socket.
    package init?(keychain: KeychainDirectory) {
        guard let socketPath = try? RuntimePaths.socketPath(for: keychain.path),
            DeviceClient.isServing(socketPath)
        else { return nil }
        self.socketPath = socketPath
    }

    /// The device answering at `socketPath` (the service), if one does.
    package init?(socketPath: String) {
        guard DeviceClient.isServing(socketPath) else { return nil }
        self.socketPath = socketPath
    }

    /// The device's answer to `call`; its core errors are thrown as they
    /// were thrown there, so "locked" stays "locked" across the socket.
    @discardableResult
    func call<Result>(_ call: DeviceCall<Result>) throws(KeychainError) -> Result {
        // nil: the device exited (its last mount went away) or stopped answering.
        guard let outcome = DeviceClient.send(call, to: socketPath) else { throw .io }
        return try outcome.get(orThrow: \.keychainError)
    }
}

extension DeviceConnection {
    package func lock() throws(KeychainError) { try call(.lock) }
    package func unlock(passcode: SecureBytes?) throws(KeychainError) { try call(.unlock(passcode: passcode)) }
    package func status() throws(KeychainError) -> DeviceStatus { try call(.status) }

    package func set(
        group: String, identifier: String, value: SecureBytes, protectionClass: ProtectionClass,
        condition: PasswordManager.WriteCondition, details: ItemDetails?
    ) throws(KeychainError) {
        try call(
            .set(
                group: group, identifier: identifier, value: value, protectionClass: protectionClass,
                condition: condition, details: details))
    }

    package func get(group: String, identifier: String) throws(KeychainError)
        -> (value: SecureBytes, protectionClass: ProtectionClass)
    {
        let item = try call(.get(group: group, identifier: identifier))
        return (item.value, item.protectionClass)
    }

    package func remove(group: String, identifier: String) throws(KeychainError) {
        try call(.remove(group: group, identifier: identifier))
    }

    package func info(group: String, identifier: String) throws(KeychainError) -> ItemInfo {
        try call(.info(group: group, identifier: identifier))
    }

    package func setClass(group: String, identifier: String, protectionClass: ProtectionClass)
        throws(KeychainError)
    {
        try call(.setClass(group: group, identifier: identifier, protectionClass: protectionClass))
    }

    package func rename(group: String, from identifier: String, to newIdentifier: String, replacing: Bool)
        throws(KeychainError)
    {
        try call(.rename(group: group, from: identifier, to: newIdentifier, replacing: replacing))
    }

    package func details(group: String, identifier: String?) throws(KeychainError)
        -> [(identifier: String, details: ItemDetails)]
    {
        try call(.details(group: group, identifier: identifier)).entries
    }

    package func setDetails(group: String, identifier: String, details: ItemDetails) throws(KeychainError) {
        try call(.setDetails(group: group, identifier: identifier, details: details))
    }

    package func groups() throws(KeychainError) -> [String] { try call(.groups).groups }

    package func items(inGroup group: String) throws(KeychainError) -> [(identifier: String, info: ItemInfo)] {
        try call(.items(inGroup: group)).items.map { ($0.identifier, $0.info) }
    }

    package func createGroup(_ group: String) throws(KeychainError) { try call(.createGroup(group)) }
    package func removeGroup(_ group: String) throws(KeychainError) { try call(.removeGroup(group)) }
    package func sync() throws(KeychainError) { try call(.sync) }
}

extension PasswordManager {
    /// This user's keychain in the keychainfs service (its socket:
    /// `socketPath`, else ``ServicePaths/socket()``); the device there
    /// decides every request from who this process is.
    /// ``KeychainError/notAvailable`` when no service answers.
    public static func openService(at socketPath: String? = nil) throws(KeychainError) -> PasswordManager {
        guard let path = socketPath ?? ServicePaths.socket(), let connection = DeviceConnection(socketPath: path) else {
            throw .notAvailable
        }
        return PasswordManager(remote: connection)
    }
}

extension Swift.Result {
    /// The success, or the failure as the error `transform` makes of it.
    package func get<Thrown: Error>(orThrow transform: (Failure) -> Thrown) throws(Thrown) -> Success {
        switch self {
        case .success(let value): return value
        case .failure(let failure): throw transform(failure)
        }
    }
}

extension DeviceStatus {
    /// The status as protocol fields: locked, unlocked since boot, retry
    /// after, failed attempts, has passcode, auto-lock delay and grace;
    /// then, when known, the key protection (`tpm2` or `file`), the TPM's
    /// failure count, its maximum, its recovery seconds, whether its lockout
    /// auth is set (`1`, `0`), the rollback counter, the fewest failures
    /// the TPM can count unless reset and whether the keychain is bound to
    /// its passcode (`1`, `0`; each empty when unknown) and the TCTI its
    /// TPM is reached at (empty: none, or through the service); then, when
    /// known, who decides (``DeviceJudge/fields``); then, with both, the
    /// serving process's facts (``ServingFacts/fields``).
    public var fields: [String] {
        let base = [
            isLocked ? "1" : "0", hasUnlockedSinceBoot ? "1" : "0", String(retryAfter), String(failedAttempts),
            hasPasscode ? "1" : "0", String(autoLockAfter), String(autoLockGrace)
        ]
        guard let keys = keyProtection else { return base }
        return base + [
            keys.protection.rawValue, keys.tpmFailures.map(String.init) ?? "",
            keys.tpmMaximumFailures.map(String.init) ?? "", keys.tpmRecoverySeconds.map(String.init) ?? "",
            keys.tpmLockoutAuthSet.map { $0 ? "1" : "0" } ?? "", keys.rollbackCounter.map(String.init) ?? "",
            keys.tpmFailuresExpected.map(String.init) ?? "", keys.passcodeBound.map { $0 ? "1" : "0" } ?? "",
            keys.tcti ?? ""
        ] + (judge.map { $0.fields + (serving?.fields ?? []) } ?? [])
    }

    /// Parses ``fields``; nil for anything else.
    init?(parsing fields: [String]) {
        guard [7, 16, 19, 19 + ServingFacts.fieldCount].contains(fields.count), let retryAfter = Int64(fields[2]),
            let failedAttempts = UInt64(fields[3]),
            let after = Int(fields[5]), let grace = Int(fields[6])
        else { return nil }
        let flags = [fields[0], fields[1], fields[4]]
        guard flags.allSatisfy({ $0 == "0" || $0 == "1" }) else { return nil }
        self.init(
            isLocked: flags[0] == "1", hasUnlockedSinceBoot: flags[1] == "1", retryAfter: retryAfter,
            failedAttempts: failedAttempts, hasPasscode: flags[2] == "1", autoLockAfter: after, autoLockGrace: grace)
        guard fields.count >= 16 else { return }
        guard let protection = KeyProtection(rawValue: fields[7]) else { return nil }
        func number<N: FixedWidthInteger>(_ field: String) -> N?? {
            field.isEmpty ? .some(nil) : N(field).map { .some($0) }
        }
        guard let failures: UInt32? = number(fields[8]), let maximum: UInt32? = number(fields[9]),
            let recovery: UInt32? = number(fields[10]), ["", "0", "1"].contains(fields[11]),
            let counter: UInt64? = number(fields[12]), let expected: UInt32? = number(fields[13]),
            ["", "0", "1"].contains(fields[14])
        else { return nil }
        keyProtection = KeyProtectionStatus(
            protection: protection, tpmFailures: failures, tpmMaximumFailures: maximum,
            tpmRecoverySeconds: recovery, tpmLockoutAuthSet: fields[11].isEmpty ? nil : fields[11] == "1",
            rollbackCounter: counter, tpmFailuresExpected: expected,
            passcodeBound: fields[14].isEmpty ? nil : fields[14] == "1",
            tcti: fields[15].isEmpty ? nil : fields[15])
        guard fields.count >= 19 else { return }
        judge = DeviceJudge(fields: fields[16..<19])
        guard fields.count == 19 + ServingFacts.fieldCount else { return }
        guard let serving = ServingFacts(fields: fields[19...]) else { return nil }
        self.serving = serving
    }
}
