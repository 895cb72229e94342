import KeychainCore
/// The TPM, asked through the service (docs/FORMAT.md, "The TPM through the
/// service"): what a per-user device whose user cannot reach the TPM has the
/// service do for it. The service binds every object and counter to the
/// caller's uid (``TPMBrokerAuth``), so no user gets the TPM itself: a blob or
/// a counter of another user's opens for nobody else, whoever holds its files.
public enum TPMRequest: Equatable, Sendable {
    /// Seal `secret` under `auth`; `guarded`: counted by the TPM's
    /// dictionary-attack lockout (a passcode's object), else not (the
    /// device secret's). Answers ``TPMSealed``.
    case seal(secret: SecureBytes, auth: SecureBytes, guarded: Bool)
    /// Unseal `blob` with `auth`, in a session salted only with the storage
    /// key named `storageKey`. Answers ``TPMUnsealed``.
    case unseal(blob: [UInt8], auth: SecureBytes, storageKey: [UInt8])
    /// Define a counter that `auth` reads and increments, at one of
    /// `candidates` (empty: chosen by the service). Answers ``TPMCounter``.
    case defineCounter(auth: SecureBytes, candidates: [UInt32])
    /// A counter's value. Answers ``TPMCounterValue``.
    case counterValue(TPMCounterHandle)
    /// Increments a counter. Answers ``Done``.
    case increment(TPMCounterHandle)
    /// Frees a counter (its auth proves it is the caller's). Answers ``Done``.
    case release(TPMCounterHandle)
    /// The TPM's dictionary-attack state and the caller's share of it.
    /// Answers ``TPMLockoutShare``.
    case lockout
}

/// A counter as a request names it: index, NV name, auth (all known).
public struct TPMCounterHandle: Equatable, Sendable {
    public let index: UInt32
    public let name: [UInt8]
    public let auth: SecureBytes

    public init(index: UInt32, name: [UInt8], auth: SecureBytes) {
        self.index = index
        self.name = name
        self.auth = auth
    }

    package init?(_ counter: CounterReference) {
        guard let name = counter.name, let auth = counter.auth else { return nil }
        self.init(index: counter.index, name: name, auth: auth)
    }

    package var reference: CounterReference { CounterReference(index: index, name: name, auth: auth) }
}

extension TPMRequest {
    /// The `kind` byte of each request of this group: unique among all
    /// groups (``DeviceRequest/kindsOfEachGroup``, checked by the protocol's tests),
    /// and never reused, since a byte means one request to every version.
    enum Kind: UInt8, CaseIterable {
        case seal = 35, unseal = 36, defineCounter = 37, counterValue = 38, increment = 39, release = 40, lockout = 41
    }

    /// The request's kind and fields. Binary fields (blobs, names) are
    /// lowercase hex, numbers canonical decimal.
    var frameParts: (Kind, [FrameField]) {
        switch self {
        case .seal(let secret, let auth, let guarded):
            return (.seal, [.optionalSecret(secret), .optionalSecret(auth), .text(guarded ? "1" : "0")])
        case .unseal(let blob, let auth, let storageKey):
            return (.unseal, [.text(Hex.string(blob)), .optionalSecret(auth), .text(Hex.string(storageKey))])
        case .defineCounter(let auth, let candidates):
            return (
                .defineCounter,
                [.optionalSecret(auth), .text(candidates.map { String($0) }.joined(separator: " "))]
            )
        case .counterValue(let counter): return (.counterValue, Self.fields(counter))
        case .increment(let counter): return (.increment, Self.fields(counter))
        case .release(let counter): return (.release, Self.fields(counter))
        case .lockout: return (.lockout, [])
        }
    }

    /// The request of `kind`, read from its fields.
    static func parsing(_ kind: Kind, _ reader: inout ByteReader<UnsafeRawBufferPointer>)
        throws(KeychainError) -> Self
    {
        switch kind {
        case .seal: return try parsingSeal(&reader)
        case .unseal: return try parsingUnseal(&reader)
        case .defineCounter: return try parsingDefineCounter(&reader)
        case .counterValue: return .counterValue(try counter(&reader))
        case .increment: return .increment(try counter(&reader))
        case .release: return .release(try counter(&reader))
        case .lockout: return .lockout
        }
    }

    private static func fields(_ counter: TPMCounterHandle) -> [FrameField] {
        [.text(String(counter.index)), .text(Hex.string(counter.name)), .optionalSecret(counter.auth)]
    }

    /// The fields of a `seal` request.
    static func parsingSeal(_ reader: inout ByteReader<UnsafeRawBufferPointer>) throws(KeychainError) -> Self {
        let secret = try Self.secret(&reader), auth = try Self.secret(&reader)
        let guarded = try reader.text()
        guard guarded == "1" || guarded == "0" else { throw .param }
        return .seal(secret: secret, auth: auth, guarded: guarded == "1")
    }

    /// The fields of an `unseal` request.
    static func parsingUnseal(_ reader: inout ByteReader<UnsafeRawBufferPointer>) throws(KeychainError) -> Self {
        let blob = try Self.hex(&reader), auth = try Self.secret(&reader)
        return .unseal(blob: blob, auth: auth, storageKey: try Self.hex(&reader))
    }

    /// The fields of a `define counter` request.
    static func parsingDefineCounter(_ reader: inout ByteReader<UnsafeRawBufferPointer>) throws(KeychainError)
        -> Self
    {
        let auth = try Self.secret(&reader), list = try reader.text()
        let candidates =
            try list.isEmpty
            ? []
            : list.split(separator: " ", omittingEmptySubsequences: false).map {
                (text) throws(KeychainError) in try Self.index(String(text))
            }
        return .defineCounter(auth: auth, candidates: candidates)
    }

    private static func secret(_ reader: inout ByteReader<UnsafeRawBufferPointer>) throws(KeychainError)
        -> SecureBytes
    {
        guard let secret = try reader.optionalSecret() else { throw .param }
        return secret
    }

    private static func hex(_ reader: inout ByteReader<UnsafeRawBufferPointer>) throws(KeychainError) -> [UInt8] {
        guard let bytes = Hex.bytes(try reader.text()), !bytes.isEmpty else { throw .param }
        return bytes
    }

    /// An NV index in canonical decimal.
    private static func index(_ text: String) throws(KeychainError) -> UInt32 {
        guard let index = UInt32(text), String(index) == text else { throw .param }
        return index
    }

    /// The fields that name a counter.
    static func counter(_ reader: inout ByteReader<UnsafeRawBufferPointer>) throws(KeychainError)
        -> TPMCounterHandle
    {
        let index = try index(try reader.text()), name = try hex(&reader)
        return TPMCounterHandle(index: index, name: name, auth: try secret(&reader))
    }
}

// MARK: Answers

/// `seal`: the sealed blob and the name of the storage key it is sealed under.
public struct TPMSealed: DeviceResultFields, Equatable {
    public let blob: [UInt8]
    public let storageKey: [UInt8]

    public init(blob: [UInt8], storageKey: [UInt8]) {
        self.blob = blob
        self.storageKey = storageKey
    }

    public var fields: [String] { [Hex.string(blob), Hex.string(storageKey)] }

    public init(fields: [String]) throws(KeychainError) {
        guard fields.count == 2, let blob = Hex.bytes(fields[0]), let key = Hex.bytes(fields[1]),
            !blob.isEmpty, !key.isEmpty
        else { throw .io }
        self.init(blob: blob, storageKey: key)
    }
}

/// `unseal`: the secret, in secret memory (a value reply: it never becomes a string).
public struct TPMUnsealed: DeviceResult {
    public let secret: SecureBytes

    public init(secret: SecureBytes) { self.secret = secret }

    public var reply: DeviceReply { .value(secret, .always) }

    public init(reply: DeviceReply) throws(KeychainError) {
        guard case .value(let secret, .always) = reply else { throw .io }
        self.secret = secret
    }
}

/// `define counter`: where it is, its NV name and its value.
public struct TPMCounter: DeviceResultFields, Equatable {
    public let index: UInt32
    public let name: [UInt8]
    public let value: UInt64

    public init(index: UInt32, name: [UInt8], value: UInt64) {
        self.index = index
        self.name = name
        self.value = value
    }

    public var fields: [String] { [String(index), Hex.string(name), String(value)] }

    public init(fields: [String]) throws(KeychainError) {
        guard fields.count == 3, let index = UInt32(fields[0]), let name = Hex.bytes(fields[1]),
            let value = UInt64(fields[2])
        else { throw .io }
        self.init(index: index, name: name, value: value)
    }
}

/// `counter value`.
public struct TPMCounterValue: DeviceResultFields, Equatable {
    public let value: UInt64

    public init(value: UInt64) { self.value = value }

    public var fields: [String] { [String(value)] }

    public init(fields: [String]) throws(KeychainError) {
        guard fields.count == 1, let value = UInt64(fields[0]) else { throw .io }
        self.init(value: value)
    }
}

/// `lockout`: the TPM's dictionary-attack state, and how many wrong
/// passcodes of the caller's the service still passes to it now.
public struct TPMLockoutShare: DeviceResultFields, Equatable {
    public let state: TPMLockoutState
    public let triesLeft: UInt32

    public init(state: TPMLockoutState, triesLeft: UInt32) {
        self.state = state
        self.triesLeft = triesLeft
    }

    public var fields: [String] {
        [
            String(state.failures), String(state.maximum), String(state.recoverySeconds),
            state.lockoutAuthSet ? "1" : "0", String(triesLeft)
        ]
    }

    public init(fields: [String]) throws(KeychainError) {
        guard fields.count == 5, let failures = UInt32(fields[0]), let maximum = UInt32(fields[1]),
            let recovery = UInt32(fields[2]), fields[3] == "0" || fields[3] == "1", let left = UInt32(fields[4])
        else { throw .io }
        self.init(
            state: TPMLockoutState(
                failures: failures, maximum: maximum, recoverySeconds: recovery, lockoutAuthSet: fields[3] == "1"),
            triesLeft: left)
    }
}
