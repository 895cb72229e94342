/// A TPM NV counter as a keychain knows it: its index, the name the TPM
/// gave it when it was made (nil: a version-1 counter, recorded without one),
/// and the auth that reads and increments it (nil: empty).
public struct CounterReference: Sendable {
    public var index: UInt32
    public var name: [UInt8]?
    public var auth: SecureBytes?

    public init(index: UInt32, name: [UInt8]?, auth: SecureBytes?) {
        self.index = index
        self.name = name
        self.auth = auth
    }
}

/// A TPM's dictionary-attack settings and count (TPM2_PT_LOCKOUT_COUNTER,
/// _MAX_AUTH_FAIL, _LOCKOUT_INTERVAL and TPMA_PERMANENT's lockoutAuthSet).
public struct TPMLockoutState: Sendable, Equatable {
    public var failures: UInt32
    public var maximum: UInt32
    public var recoverySeconds: UInt32
    public var lockoutAuthSet: Bool

    /// The most tries a TPM that limits guesses allows before it locks out:
    /// real TPMs ship with 5 to 32 (swtpm 3); a larger count is not a limit.
    public static let limitingMaximum: UInt32 = 32

    /// Whether the TPM limits passcode guesses now: a small count, and a
    /// recovery time (0 switches the dictionary-attack logic off).
    public var limitsGuesses: Bool { maximum > 0 && maximum <= Self.limitingMaximum && recoverySeconds > 0 }

    public init(failures: UInt32, maximum: UInt32, recoverySeconds: UInt32, lockoutAuthSet: Bool) {
        self.failures = failures
        self.maximum = maximum
        self.recoverySeconds = recoverySeconds
        self.lockoutAuthSet = lockoutAuthSet
    }
}
