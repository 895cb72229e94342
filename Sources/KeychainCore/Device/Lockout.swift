/// How long unlocking is refused after consecutive wrong passcodes.
public struct LockoutPolicy: Sendable, Equatable {
    /// `delays[n]` seconds of lockout after the (n+1)th consecutive failure;
    /// the last entry repeats for every failure after it.
    public var delays: [Int64]

    /// A policy with these delays (at least one).
    public init(delays: [Int64]) {
        precondition(!delays.isEmpty)
        self.delays = delays
    }

    /// iOS: no delay for 4 attempts, then 1 min, 5 min, 15 min, 1 h.
    public static let iOS = LockoutPolicy(delays: [0, 0, 0, 0, 60, 300, 900, 3600])

    func delay(afterFailures failures: UInt64) -> Int64 {
        guard failures > 0 else { return 0 }
        return delays[min(Int(failures) - 1, delays.count - 1)]
    }
}

/// The persisted lockout state (meta key `lockout`): consecutive failures and
/// the wall-clock second before which unlocking is refused. Authenticated by
/// the device metadata key, so it cannot be reset by editing the database
/// without the device secret.
struct LockoutRecord: Equatable {
    static let recordKey = "lockout"
    /// Bound to the rollback counter since issue 38: putting back an older
    /// record (fewer failures) fails beside newer records.
    static let macDomain = "kcfs-lockout-v1"

    var failures: UInt64 = 0
    var deadline: Int64 = 0

    func encoded(secret: DeviceSecret) -> [UInt8] {
        var writer = ByteWriter()
        writer.append(failures)
        writer.append(deadline)
        return secret.boundRecord(Self.macDomain, writer.bytes)
    }

    init() {}

    init(decoding record: [UInt8], secret: DeviceSecret) throws(KeychainError) {
        var reader = ByteReader(try secret.boundBody(Self.macDomain, record, length: 16))
        failures = try reader.readUInt64()
        deadline = try reader.readInt64()
    }
}
