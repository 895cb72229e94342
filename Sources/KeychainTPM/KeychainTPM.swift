import KeychainCore
import KeychainProtocol
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Keeps each person's share of the TPM's dictionary-attack budget: a try
/// of a passcode (`attempt`) is refused once the person's wrong ones used
/// it, and counted when wrong. The service's broker keeps them, for the
/// keychains it holds as for the per-user devices it serves.
protocol GuessShares: Sendable {
    func attempt<R>(by person: UInt32, on tpm: KeychainTPM, _ body: () throws(KeychainError) -> R)
        throws(KeychainError) -> R
}

/// The TPM a keychain's keys are sealed by, reached at the TCTI given
/// (nil: the machine's, `/dev/tpmrm0`, never tpm2-tss's default list), with
/// its failures in a keychain's terms. The TPM is used at boot, unlock,
/// passcode changes and counter bumps only: each use opens its own
/// connection, except within a boot (``sharingSession(tcti:_:)``).
struct KeychainTPM: KeyProtector {
    let tcti: String?
    /// The person whose share of the TPM's lockout a wrong passcode here
    /// uses (``GuessShares``), for the keychains the service holds for
    /// each user; nil: none is kept (a per-user device's own TPM).
    var person: UInt32? = nil
    /// Who keeps the shares in this process: the service's broker.
    static let guessShares = Mutex<(any GuessShares)?>(nil)
    /// The name of the storage primary key the keychain was sealed under
    /// (nil: not recorded yet): no session is salted with another.
    var storageKey: [UInt8]?
    /// Reached through the keychainfs service (``TPMBroker``), for a user
    /// who cannot reach the TPM: every use is a request on the service's
    /// socket (``ServicePaths/socket()``), and what it seals opens only
    /// through the service, for this uid.
    let throughService: Bool

    init(tcti: String?, storageKey: [UInt8]? = nil) {
        self.tcti = tcti
        self.storageKey = storageKey
        self.throughService = false
    }

    /// The TPM the service reaches for this user.
    init(throughServiceWith storageKey: [UInt8]?) {
        self.tcti = nil
        self.storageKey = storageKey
        self.throughService = true
    }

    /// The TPM a sealed file names: the service's for this user, or the one at `tcti`.
    static func sealedBy(tcti: String?, storageKey: [UInt8]?, throughService: Bool) -> KeychainTPM {
        throughService ? KeychainTPM(throughServiceWith: storageKey) : KeychainTPM(tcti: tcti, storageKey: storageKey)
    }

    /// Set in the service's own process: it reaches the TPM itself or not
    /// at all, never through its own socket.
    static let isTheService = Atomic(false)

    /// The TPM the service reaches for this user, when a service answers
    /// and its TPM does.
    static func throughServiceIfItAnswers() -> KeychainTPM? {
        guard !isTheService.load(ordering: .relaxed), let socket = ServicePaths.socket(),
            case .success? = DeviceClient.send(.tpmLockout, to: socket)
        else { return nil }
        return KeychainTPM(throughServiceWith: nil)
    }

    /// The service's answer to `call`, or why there is none: its core error
    /// (its sentence logged, unless it is a wrong passcode's), or
    /// ``KeychainError/tpmUnavailable`` when no service answers.
    private static func askService<Result>(_ call: DeviceCall<Result>) throws(KeychainError) -> Result {
        guard let socket = ServicePaths.socket(), let outcome = DeviceClient.send(call, to: socket) else {
            Diagnostics.log("the keychain's TPM is reached through the keychainfs service, which does not answer")
            throw .tpmUnavailable
        }
        switch outcome {
        case .success(let result): return result
        case .failure(let refusal):
            // A wrong auth is the caller's to count; a counter gone, the caller's to explain (or to expect: a probe).
            if ![.authFailed, .rollbackCounterGone].contains(refusal.keychainError) {
                Diagnostics.log("the keychainfs service: \(refusal.sentence)")
            }
            throw refusal == .unexpected ? .tpmUnavailable : refusal.keychainError
        }
    }

    /// The TPM that answers at `tcti`, or nil when none does (the caller
    /// says how the keys are kept instead).
    static func present(tcti: String?) -> KeychainTPM? {
        (try? TrustedPlatformModule(tcti: tcti)).map { _ in KeychainTPM(tcti: tcti) }
    }

    /// The TPM `choice` asks for at `tcti`: nil when declined, or when
    /// none answers at the default place and one is merely welcome;
    /// ``KeychainError/tpmUnavailable`` when one is required, or named (a
    /// TCTI given, or `$TPM2TOOLS_TCTI`), and none answers: a TPM the user
    /// pointed to is never silently replaced by a file.
    static func chosen(_ choice: TPMChoice, tcti: String?) throws(KeychainError) -> KeychainTPM? {
        switch choice {
        case .declined: return nil
        case .whenPresent:
            if declinedByEnvironment { return nil }
            if let found = present(tcti: tcti) { return found }
            if let tcti {
                Diagnostics.log("no TPM answers at \(tcti), the TCTI named")
                throw .tpmUnavailable
            }
            return throughServiceIfItAnswers()
        case .required:
            if let found = present(tcti: tcti) { return found }
            guard tcti == nil, let brokered = throughServiceIfItAnswers() else { throw .tpmUnavailable }
            return brokered
        }
    }

    /// `KEYCHAINFS_TPM=none`: keychains made where no choice is given (`init`
    /// without `--tpm`, the service's) keep their keys in a file, as
    /// `--no-tpm` does: for a machine whose TPM is not to be used for them.
    static var declinedByEnvironment: Bool {
        getenv("KEYCHAINFS_TPM").map { String(cString: $0) == "none" } ?? false
    }

    /// The connections kept open now: only while a
    /// ``sharingSession(tcti:_:)`` runs (a boot), for the thread that runs
    /// it (the service boots several keychains at once; ESAPI serves one
    /// thread at a time), opened at its first use (a keychain kept in a file
    /// never reaches for a TPM). Each new ESAPI connection costs a TCTI's
    /// set-up and a startup, and each session its salt; a connection is not
    /// kept beyond that: some TCTIs hold the TPM for themselves while open
    /// (`device:/dev/tpm0` without the kernel's resource manager, a `cmd:`
    /// program, a swtpm's single connection), and a device that runs for
    /// days must not shut everyone else out.
    private static let connections = Mutex<[pthread_t: (tcti: String?, module: TrustedPlatformModule?)]>([:])

    /// Runs `body`, whose uses of the TPM at `tcti` on this thread share one
    /// connection and one salted session (``TrustedPlatformModule/sharesSession``):
    /// a boot's unseal and counter read pay for one of each, not two. The
    /// session is flushed and the connection closed after, also on failure.
    static func sharingSession<R>(tcti: String?, _ body: () throws(KeychainError) -> R) throws(KeychainError) -> R {
        let thread = pthread_self()
        connections.withLock { $0[thread] = (tcti, nil) }
        defer { connections.withLock { $0.removeValue(forKey: thread) }?.module?.endSharedSession() }
        return try body()
    }

    /// The connection this thread's ``sharingSession(tcti:_:)`` keeps for
    /// this TPM, opened now if it has none yet; nil outside one.
    private func keptConnection() throws(TPMError) -> TrustedPlatformModule? {
        let thread = pthread_self()
        guard let entry = Self.connections.withLock({ $0[thread] }), entry.tcti == tcti else { return nil }
        if let module = entry.module { return module }
        let opened = try TrustedPlatformModule(tcti: tcti)
        opened.sharesSession = true
        Self.connections.withLock { $0[thread]?.module = opened }
        return opened
    }

    /// Drops this thread's kept connection after it failed: the uses that follow open a new one.
    private func dropKeptConnection() {
        let thread = pthread_self()
        let dropped = Self.connections.withLock { table in table[thread]?.module }
        Self.connections.withLock { $0[thread]?.module = nil }
        dropped?.endSharedSession()
    }

    /// Whether a failure says the connection itself is broken (the TPM
    /// restarted, the resource manager went away), rather than the TPM
    /// refusing a command: then the uses that follow start on a new one.
    private static func breaksConnection(_ error: TPMError) -> Bool {
        switch error {
        case .unavailable, .busy, .failed: return true
        case .authFailed, .lockedOut, .notThisTPM, .indexTaken, .counterMissing, .counterReplaced, .storageKeyChanged:
            return false
        }
    }

    /// Runs `body` with the connection kept by a ``sharingSession(tcti:_:)``,
    /// else with one of its own, pinned to ``storageKey``; a TPM's refusal
    /// becomes the keychain's error.
    func use<R>(_ body: (TrustedPlatformModule) throws(TPMError) -> R) throws(KeychainError) -> R {
        do throws(TPMError) {
            let kept = try keptConnection()
            let module: TrustedPlatformModule
            if let kept { module = kept } else { module = try TrustedPlatformModule(tcti: tcti) }
            module.pinnedStorageKey = storageKey
            do throws(TPMError) {
                return try body(module)
            } catch {
                if kept != nil, Self.breaksConnection(error) { dropKeptConnection() }
                throw error
            }
        } catch {
            switch error {
            case .authFailed: throw .authFailed
            case .lockedOut: throw .tpmLockedOut
            case .notThisTPM: throw .tpmMismatch
            case .storageKeyChanged:
                Diagnostics.log("\(error): another TPM, or something in between; nothing was sent to it")
                throw .tpmStorageKeyChanged
            case .counterMissing, .counterReplaced:
                Diagnostics.log("\(error)")
                throw .rollbackCounterGone
            case .unavailable, .busy:
                Diagnostics.log("\(error)")
                throw .tpmUnavailable
            case .indexTaken:
                Diagnostics.log("every NV index tried for the keychain's rollback counter is taken on the TPM")
                throw .io
            case .failed:
                Diagnostics.log("the TPM failed: \(error)")
                throw .io
            }
        }
    }

    /// Seals `secret` under `auth` (`guarded`: counted by the lockout);
    /// returns the blob and the name of the storage key it is sealed under.
    func seal(_ secret: SecureBytes, auth: SecureBytes, guarded: Bool) throws(KeychainError)
        -> (blob: [UInt8], storageKey: [UInt8])
    {
        if throughService {
            let sealed = try Self.askService(.tpmSeal(secret, auth: auth, guarded: guarded))
            return (sealed.blob, sealed.storageKey)
        }
        return try use { tpm throws(TPMError) in
            let blob = try tpm.seal(secret, auth: auth, guarded: guarded)
            guard let name = tpm.storageKeyName else { throw .failed("CreatePrimary", 0) }
            return (blob, name)
        }
    }

    /// What `blob` holds, and the name of the storage key it was unsealed under.
    func unseal(_ blob: [UInt8], auth: SecureBytes) throws(KeychainError) -> (secret: SecureBytes, storageKey: [UInt8])
    {
        if throughService {
            // Sealed through the service: its storage key was recorded then.
            guard let storageKey else { throw .decode }
            return (try Self.askService(.tpmUnseal(blob, auth: auth, storageKey: storageKey)).secret, storageKey)
        }
        let unseal = { () throws(KeychainError) -> (secret: SecureBytes, storageKey: [UInt8]) in
            try use { tpm throws(TPMError) in
                let secret = try tpm.unseal(blob, auth: auth)
                guard let name = tpm.storageKeyName else { throw .failed("CreatePrimary", 0) }
                return (secret, name)
            }
        }
        // A passcode's object (the lockout counts it) in a keychain the
        // service holds: the try uses its person's share, as the broker's do.
        if let person, TPMObjects.isCounted(blob), let shares = Self.guessShares.withLock({ $0 }) {
            return try shares.attempt(by: person, on: self, unseal)
        }
        return try unseal()
    }

    /// Seals `secret` with an empty auth, usable in a lockout: only this
    /// TPM opens it. Returns the contents of a sealed file
    /// (``DeviceSecretFile``) and the name of the storage key it is sealed
    /// under, to be pinned (``storageKey``).
    func sealDeviceSecret(_ secret: SecureBytes) throws(KeychainError) -> (file: SecureBytes, storageKey: [UInt8]) {
        let (blob, name) = try seal(secret, auth: try SecureBytes(count: 0), guarded: false)
        return (try DeviceSecretFile.sealedContents(blob, storageKey: name, throughService: throughService), name)
    }

    /// The device secret `blob` holds, and the name of the storage key it
    /// was unsealed under (the pinned one, or, for a keychain sealed before
    /// names were recorded, the one to pin now).
    func unsealDeviceSecret(_ blob: [UInt8]) throws(KeychainError) -> (secret: SecureBytes, storageKey: [UInt8]) {
        let secret: SecureBytes, name: [UInt8]
        do throws(KeychainError) {
            (secret, name) = try unseal(blob, auth: try SecureBytes(count: 0))
        } catch .authFailed where throughService {
            // Its auth is empty for its user: another uid's bound auth fails.
            throw .tpmMismatch
        }
        guard secret.count == Crypto.keySize else { throw .tpmMismatch }
        return (secret, name)
    }

    /// The TPM's dictionary-attack state, for `status`; nil when it does not answer.
    func lockout() -> TPMLockoutState? {
        if throughService { return try? Self.askService(.tpmLockout).state }
        return try? use { tpm throws(TPMError) in try tpm.lockout() }
    }

    // MARK: The rollback counter

    /// Defines a new counter that only `auth` reads and increments, at a
    /// free index tried among `candidates` (nil: 16 at random in
    /// ``KeyProtection/counterIndexes``, so a taken one is passed over); returns it and its value.
    func defineCounter(auth: SecureBytes, candidates: [UInt32]?) throws(KeychainError)
        -> (counter: CounterReference, value: UInt64)
    {
        if throughService {
            let defined = try Self.askService(.tpmDefineCounter(auth: auth, candidates: candidates ?? []))
            return (CounterReference(index: defined.index, name: defined.name, auth: auth), defined.value)
        }
        let indexes = candidates ?? (0..<16).map { _ in UInt32.random(in: KeyProtection.counterIndexes) }
        return try use { tpm throws(TPMError) in
            for index in indexes {
                do throws(TPMError) {
                    let name = try tpm.defineCounter(at: index, auth: auth)
                    let counter = CounterReference(index: index, name: name, auth: auth)
                    return (counter, try tpm.value(of: counter))
                } catch .indexTaken {
                    continue
                }
            }
            throw .indexTaken
        }
    }

    /// The passcode binding counter of `key` the TPM holds at one of its
    /// indexes (nil: none), found by what the TPM holds alone. An index
    /// that is free, holds no counter of ours, or one of another auth
    /// (counters are outside the dictionary-attack logic: a wrong auth
    /// counts nothing) is passed over.
    func bindingCounter(of key: PasscodeBindingKey) throws(KeychainError) -> CounterReference? {
        let counters = key.counterCandidates.map {
            CounterReference(index: $0, name: TPMObjects.counterName(at: $0), auth: key.counterAuth)
        }
        guard throughService else {
            // One connection for all, and nothing logged for the indexes passed over.
            return try use { tpm throws(TPMError) in
                for counter in counters {
                    do throws(TPMError) {
                        _ = try tpm.value(of: counter)
                        return counter
                    } catch .counterMissing, .counterReplaced, .authFailed {
                        continue
                    }
                }
                return nil
            }
        }
        for counter in counters {
            do throws(KeychainError) {
                _ = try value(of: counter)
                return counter
            } catch .rollbackCounterGone, .authFailed {
                continue
            }
        }
        return nil
    }

    func value(of counter: CounterReference) throws(KeychainError) -> UInt64 {
        if throughService { return try Self.askService(.tpmCounterValue(try Self.handle(counter))).value }
        return try use { tpm throws(TPMError) in try tpm.value(of: counter) }
    }

    func increment(_ counter: CounterReference) throws(KeychainError) {
        if throughService {
            _ = try Self.askService(.tpmIncrement(try Self.handle(counter)))
            return
        }
        try use { tpm throws(TPMError) in try tpm.increment(counter) }
    }

    /// A counter as the service names it: one it defined has its name and auth recorded.
    private static func handle(_ counter: CounterReference) throws(KeychainError) -> TPMCounterHandle {
        guard let handle = TPMCounterHandle(counter) else { throw .rollbackCounterGone }
        return handle
    }

    /// Frees a counter the keychain no longer uses. A failure is logged:
    /// the index stays taken, nothing else is wrong.
    func release(_ counter: CounterReference) {
        do throws(KeychainError) {
            if throughService {
                _ = try Self.askService(.tpmRelease(try Self.handle(counter)))
            } else {
                // Its auth proven first, as the service does: an NV name
                // binds the index and attributes, never whose the counter is.
                try use { tpm throws(TPMError) in
                    _ = try tpm.value(of: counter)
                    try tpm.undefine(counter)
                }
            }
        } catch .rollbackCounterGone {
            return  // not there any more, or another's now: nothing of ours to free
        } catch {
            Diagnostics.log(
                "could not free the TPM NV index 0x\(String(counter.index, radix: 16)) of an older rollback counter: \(error)"
            )
        }
    }
}
