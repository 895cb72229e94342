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
    /// Bound to the rollback counter since version 2 of the rollback record:
    /// putting back an older record (fewer failures) fails beside newer
    /// records.
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

/// The TPM's count of wrong auths as this keychain last saw it, right after
/// one of its own wrong passcodes (meta key `tpm-lockout`, docs/FORMAT.md,
/// "meta records"): the count, the wall-clock second, and the seconds after
/// which the TPM forgets one. The TPM's count never drops faster than that
/// unless someone resets it (TPM2_DictionaryAttackLockReset, which an empty
/// lockout auth allows anyone who reaches the TPM), so a count below
/// ``fewestFailures(at:)`` says it was reset: between guesses, an attacker
/// does that to guess without end. Bound to the rollback counter.
struct TPMFailuresSeen: Equatable {
    static let recordKey = "tpm-lockout"
    static let macDomain = "kcfs-tpm-lockout-v1"

    var count: UInt32
    var at: Int64
    var recoverySeconds: UInt32

    init(count: UInt32, at: Int64, recoverySeconds: UInt32) {
        self.count = count
        self.at = at
        self.recoverySeconds = recoverySeconds
    }

    func encoded(secret: DeviceSecret) -> [UInt8] {
        var writer = ByteWriter()
        writer.append(count)
        writer.append(at)
        writer.append(recoverySeconds)
        return secret.boundRecord(Self.macDomain, writer.bytes)
    }

    init(decoding record: [UInt8], secret: DeviceSecret) throws(KeychainError) {
        var reader = ByteReader(try secret.boundBody(Self.macDomain, record, length: 16))
        count = try reader.readUInt32()
        at = try reader.readInt64()
        recoverySeconds = try reader.readUInt32()
    }

    /// The fewest wrong auths the TPM can count at `now` if nobody reset
    /// its count: one forgotten per recovery interval, and one more, as the
    /// TPM's interval may have begun before the failure seen (TPM 2.0 Part
    /// 1, 19.8.4: its self-healing runs on its own time, which stops while
    /// it is powered off: it forgets no faster than this). Zero when
    /// nothing can be said: a TPM that does not count (no recovery time),
    /// or a wall clock set back since.
    func fewestFailures(at now: Int64) -> UInt32 {
        guard recoverySeconds > 0, now >= at else { return 0 }
        let forgotten = (now - at) / Int64(recoverySeconds) + 1
        return UInt32(clamping: max(0, Int64(count) - forgotten))
    }
}
