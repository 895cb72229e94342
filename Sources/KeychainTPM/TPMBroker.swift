import KeychainCore
import KeychainProtocol
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The TPM for every user (docs/FORMAT.md, "The TPM through the service"): the
/// service, whose account is in group `tss`, seals, unseals and keeps counters
/// for a per-user device whose user cannot reach `/dev/tpmrm0`
/// (``TPMRequest``). No user gets the TPM itself:
/// - every auth is bound to the caller's uid (``boundAuth(_:uid:)``), so
///   a blob or counter of one user's opens, reads or moves for no other,
///   whoever holds the keychain's files;
/// - a counter is read, moved or freed only for the uid that defined it
///   through the broker, by index and NV name as recorded then, and freed
///   only by whoever proves its auth;
/// - each uid passes at most ``share(of:)`` wrong passcodes to the TPM
///   before waiting out the TPM's own recovery time, so one user cannot
///   lock the TPM out for everyone (its lockout counts for the machine);
/// - each person holds at most ``countersPerUser`` NV counters (NV space is
///   the machine's), and shares and quotas are a person's: a passwd
///   account's, its subordinate uids counted with it (``MachinePeople``).
/// What a uid has used is kept in `STATE/tpm-broker/UID`, which only the
/// service's account reads: a restart of the service forgives nothing.
public final class TPMBroker: GuessShares, Sendable {
    /// NV counters one uid may hold: a keychain uses two (rollback and
    /// passcode binding), a move between protections two more for a moment.
    public static let countersPerUser = 8
    /// NV counters the broker holds for everyone together: a TPM's NV is
    /// small (a few kilobytes on real chips, about 70 bytes an index), and
    /// the machine's own uses (systemd's, the firmware's) need room that no
    /// number of people, each within their own share, may take.
    public static let countersForEveryone = 64
    /// The seconds after which a wrong passcode is forgiven when the TPM
    /// forgives none (its lockout switched off): the share still limits a uid.
    static let fallbackRecoverySeconds: UInt32 = 600

    let directory: String
    let tcti: String?
    /// One request at a time changes a uid's ledger.
    private let ledgers = Mutex(())
    private let clock: @Sendable () -> Int64

    /// The broker of the service whose state directory is `stateDirectory`.
    public init(
        stateDirectory: String, tcti: String? = TrustedPlatformModule.configuredTCTI,
        clock: @escaping @Sendable () -> Int64 = { Int64(time(nil)) }
    ) {
        KeychainTPM.isTheService.store(true, ordering: .relaxed)
        directory = stateDirectory + "/tpm-broker"
        self.tcti = tcti
        self.clock = clock
        _ = mkdir(directory, 0o700)
    }

    /// The auth the TPM gets for `auth` asked by `uid`: BLAKE2b-256 keyed
    /// by a fixed domain key, over the uid and the auth. Another uid's
    /// request makes another auth, so it fails as a wrong one would.
    static func boundAuth(_ auth: SecureBytes, uid: UInt32) -> SecureBytes {
        let domain = Crypto.hash(Array("kcfs-tpm-broker-v1".utf8))
        return domain.withUnsafeBufferPointer { key in
            withUnsafeBytes(of: uid.littleEndian) { uidBytes in
                auth.withUnsafeBytes { Crypto.deriveKey(key: key.baseAddress!, [uidBytes, $0]) }
            }
        }
    }

    /// The most NV indexes one definition may name: each taken one costs a
    /// TPM command, and a request must not keep the TPM busy for others.
    public static let candidatesPerDefinition = 16

    /// The answer to `request` of the peer `uid`, whose use counts toward
    /// `person`'s share and quota (nil: its own; the service passes the
    /// passwd account a subordinate uid belongs to, ``MachinePeople/person(of:)``).
    public func answer(_ request: TPMRequest, uid: UInt32, person: UInt32? = nil) -> DeviceReply {
        let person = person ?? uid
        // `KEYCHAINFS_TPM=none`: the service's TPM is not to be used, for its keychains or anyone's.
        guard !KeychainTPM.declinedByEnvironment else {
            return .keychainError(.tpmUnavailable, "the keychainfs service uses no TPM (KEYCHAINFS_TPM=none)")
        }
        let tpm = KeychainTPM(tcti: tcti)
        do throws(KeychainError) {
            switch request {
            case .seal(let secret, let auth, let guarded):
                let (blob, storageKey) = try tpm.seal(
                    secret, auth: Self.boundAuth(auth, uid: uid), guarded: guarded)
                return TPMSealed(blob: blob, storageKey: storageKey).reply
            case .unseal(let blob, let auth, let storageKey):
                return try unseal(blob, auth: auth, storageKey: storageKey, uid: uid, person: person)
            case .defineCounter(let auth, let candidates):
                return try defineCounter(auth: auth, candidates: candidates, uid: uid, person: person, on: tpm)
            case .counterValue(let counter):
                try requireDefined(counter, by: person)
                return TPMCounterValue(value: try tpm.value(of: Self.bound(counter, uid: uid))).reply
            case .increment(let counter):
                try requireDefined(counter, by: person)
                try tpm.increment(Self.bound(counter, uid: uid))
                return Done().reply
            case .release(let counter):
                try requireDefined(counter, by: person)
                return try release(counter, uid: uid, person: person, on: tpm)
            case .lockout:
                guard let state = tpm.lockout() else { throw .tpmUnavailable }
                let share = Self.share(of: state)
                let used = ledgers.withLock { _ in
                    var ledger = ledger(of: person)
                    return ledger.failures(now: clock(), every: share.every)
                }
                return TPMLockoutShare(state: state, triesLeft: share.tries - min(share.tries, used)).reply
            }
        } catch {
            return .keychainError(error, "the TPM, through the keychainfs service: \(error)")
        }
    }

    // MARK: Wrong passcodes

    /// How many wrong passcodes one uid passes to the TPM, and after how
    /// many seconds one is forgiven: fewer than half of what the TPM
    /// allows (at least one), so that one uid alone never locks it out.
    static func share(of state: TPMLockoutState) -> (tries: UInt32, every: UInt32) {
        let maximum = state.limitsGuesses ? state.maximum : TPMLockoutState.limitingMaximum
        let every = state.limitsGuesses ? state.recoverySeconds : fallbackRecoverySeconds
        return (max(1, (maximum - 1) / 2), max(1, every))
    }

    private func unseal(_ blob: [UInt8], auth: SecureBytes, storageKey: [UInt8], uid: UInt32, person: UInt32)
        throws(KeychainError) -> DeviceReply
    {
        let tpm = KeychainTPM(tcti: tcti, storageKey: storageKey)
        // Only an object the lockout counts (a passcode's) can lock the TPM out.
        guard TPMObjects.isCounted(blob) else {
            return TPMUnsealed(secret: try tpm.unseal(blob, auth: Self.boundAuth(auth, uid: uid)).secret).reply
        }
        do throws(KeychainError) {
            return try attempt(by: person, on: tpm) { () throws(KeychainError) -> DeviceReply in
                TPMUnsealed(secret: try tpm.unseal(blob, auth: Self.boundAuth(auth, uid: uid)).secret).reply
            }
        } catch .tpmLockedOut {
            return .keychainError(.tpmLockedOut, shareSentence(of: person, on: tpm))
        }
    }

    /// Runs `body`, a try of a passcode of `person`'s on `tpm`: refused
    /// (``KeychainError/tpmLockedOut``) once that person's wrong passcodes
    /// used their share, counted when it is wrong. Checked and counted under
    /// the ledger's lock: concurrent guesses of one person cannot all pass
    /// the check before one is counted.
    func attempt<R>(by person: UInt32, on tpm: KeychainTPM, _ body: () throws(KeychainError) -> R)
        throws(KeychainError) -> R
    {
        guard let state = tpm.lockout() else { throw .tpmUnavailable }
        let share = Self.share(of: state)
        return try ledgers.withLock { _ throws(KeychainError) -> R in
            let now = clock()
            var ledger = ledger(of: person)
            guard ledger.failures(now: now, every: share.every) < share.tries else { throw .tpmLockedOut }
            do throws(KeychainError) {
                return try body()
            } catch .authFailed {
                // A right passcode forgives nothing: otherwise a uid would
                // alternate guesses at another's blob with its own unlocks.
                ledger.countFailure(now: now, every: share.every)
                write(ledger, of: person)
                throw .authFailed
            }
        }
    }

    /// Why `person`'s try was refused: their share ran out (the TPM was not
    /// asked), or the TPM itself is in lockout, whoever's wrong passcodes
    /// put it there; which one, and for how long.
    func shareSentence(of person: UInt32, on tpm: KeychainTPM) -> String {
        guard let state = tpm.lockout() else { return "the TPM does not answer" }
        let share = Self.share(of: state)
        let (used, wait) = ledgers.withLock { _ in
            var ledger = ledger(of: person)
            let used = ledger.failures(now: clock(), every: share.every)
            return (used, ledger.secondsUntilForgiven(now: clock(), every: share.every))
        }
        guard used >= share.tries else {
            return "the TPM itself is in its lockout (\(state.failures) of \(state.maximum) wrong passcodes, not "
                + "all of them yours: root's or another program's that reaches the TPM count too); it refuses every "
                + "passcode for now and forgives one every \(state.recoverySeconds) s"
        }
        return "your user's wrong passcodes used its share of the TPM's lockout (\(share.tries) of "
            + "\(state.maximum), one forgiven every \(share.every) s): the service passes no more "
            + "of yours for \(wait) s; the TPM itself stays open for other users"
    }

    // MARK: Counters

    /// ``KeychainError/rollbackCounterGone`` unless `counter` is one `uid`
    /// defined through this broker: its index in the keychains' range and
    /// its NV name as recorded when it was made. Otherwise the request would
    /// be the TPM's on any index the caller names, with a name the caller
    /// chose: on an index that counts wrong auths (`tpm2_nvdefine`'s
    /// default), each such read is a dictionary-attack failure of the
    /// machine's TPM that no share of the caller's counts.
    private func requireDefined(_ counter: TPMCounterHandle, by person: UInt32) throws(KeychainError) {
        guard KeyProtection.counterIndexes.contains(counter.index) else { throw .param }
        let defined = ledgers.withLock { _ in
            ledger(of: person).counters.contains { $0.index == counter.index && $0.name == counter.name }
        }
        guard defined else { throw .rollbackCounterGone }
    }

    private static func bound(_ counter: TPMCounterHandle, uid: UInt32) -> CounterReference {
        CounterReference(index: counter.index, name: counter.name, auth: boundAuth(counter.auth, uid: uid))
    }

    private func defineCounter(
        auth: SecureBytes, candidates: [UInt32], uid: UInt32, person: UInt32, on tpm: KeychainTPM
    ) throws(KeychainError) -> DeviceReply {
        // Only where keychains' counters go: never systemd's range, nor an index of the platform's.
        guard candidates.count <= Self.candidatesPerDefinition,
            candidates.allSatisfy(KeyProtection.counterIndexes.contains)
        else { throw .param }
        return try ledgers.withLock { _ throws(KeychainError) -> DeviceReply in
            var ledger = ledger(of: person)
            if ledger.counters.count >= Self.countersPerUser {
                // Counters freed by other means (root's tpm2_nvundefine, a TPM clear) are not held any more.
                let held = (try? tpm.use { module throws(TPMError) in ledger.counters.filter { module.holds($0) } })
                ledger.counters = held ?? ledger.counters
                write(ledger, of: person)
            }
            guard heldByEveryone() < Self.countersForEveryone else {
                return .keychainError(
                    .quotaExceeded,
                    "the keychainfs service holds \(Self.countersForEveryone) TPM counters for this machine's users "
                        + "already, what it leaves the TPM's NV for the system; root frees those of keychains "
                        + "removed by hand with `tpm2_nvundefine`")
            }
            guard ledger.counters.count < Self.countersPerUser else {
                return .keychainError(
                    .quotaExceeded,
                    "your user holds \(Self.countersPerUser) TPM counters through the keychainfs service "
                        + "already (a keychain holds two; one removed by hand keeps its own: root frees them with "
                        + "`tpm2_nvundefine`)")
            }
            let (counter, value) = try tpm.defineCounter(
                auth: Self.boundAuth(auth, uid: uid), candidates: candidates.isEmpty ? nil : candidates)
            guard let name = counter.name else { throw .io }
            ledger.counters.append(CounterReference(index: counter.index, name: name, auth: nil))
            write(ledger, of: person)
            return TPMCounter(index: counter.index, name: name, value: value).reply
        }
    }

    /// Frees a counter once its auth is proven (the owner hierarchy, which
    /// undefines it, would free anyone's).
    private func release(_ counter: TPMCounterHandle, uid: UInt32, person: UInt32, on tpm: KeychainTPM)
        throws(KeychainError) -> DeviceReply
    {
        let bound = Self.bound(counter, uid: uid)
        _ = try tpm.value(of: bound)
        tpm.release(bound)
        ledgers.withLock { _ in
            var ledger = ledger(of: person)
            ledger.counters.removeAll { $0.index == counter.index && $0.name == counter.name }
            write(ledger, of: person)
        }
        return Done().reply
    }

    // MARK: The ledger

    private func path(of uid: UInt32) -> String { directory + "/" + String(uid) }

    /// The counters every person's ledger holds, together (under the ledgers' lock).
    private func heldByEveryone() -> Int {
        guard let entries = opendir(directory) else { return 0 }
        defer { closedir(entries) }
        var held = 0
        while let entry = readdir(entries) {
            let name = entry.name
            if let uid = UInt32(name) { held += ledger(of: uid).counters.count }
        }
        return held
    }

    /// What `uid` has used; empty when nothing is recorded (or the record
    /// is unreadable: logged, since only the service writes it).
    private func ledger(of uid: UInt32) -> BrokerLedger {
        guard let fd = FileDescriptor(open(path(of: uid), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) else {
            return BrokerLedger()
        }
        var bytes = [UInt8](repeating: 0, count: BrokerLedger.maximumSize)
        let count = bytes.withUnsafeMutableBytes { read(fd.raw, $0.baseAddress, $0.count) }
        guard count >= 0, let ledger = BrokerLedger(parsing: String(decoding: bytes.prefix(count), as: UTF8.self))
        else {
            Diagnostics.log("the TPM broker's record of uid \(uid) is unreadable; starting it afresh")
            return BrokerLedger()
        }
        return ledger
    }

    private func write(_ ledger: BrokerLedger, of uid: UInt32) {
        do throws(KeychainError) {
            try KeychainDirectory.writePrivateFile(try SecureBytes(Array(ledger.text.utf8)), at: path(of: uid))
        } catch {
            Diagnostics.log("could not record the TPM broker's use of uid \(uid): \(error)")
        }
    }
}

/// What one uid has used of the TPM through the service: its wrong
/// passcodes not yet forgiven (since when the oldest counts), and the
/// counters it holds (index and NV name). As text: `failures N SINCE`,
/// then `counter INDEX NAME-HEX` per counter.
struct BrokerLedger {
    static let maximumSize = 4096
    var failureCount: UInt32 = 0
    var failuresSince: Int64 = 0
    var counters: [CounterReference] = []

    init() {}

    init?(parsing text: String) {
        for line in text.split(separator: "\n") {
            let words = line.split(separator: " ").map(String.init)
            switch words.first {
            case "failures":
                guard words.count == 3, let count = UInt32(words[1]), let since = Int64(words[2]) else { return nil }
                (failureCount, failuresSince) = (count, since)
            case "counter":
                guard words.count == 3, let index = UInt32(words[1]), let name = Hex.bytes(words[2]) else { return nil }
                counters.append(CounterReference(index: index, name: name, auth: nil))
            default: return nil
            }
        }
    }

    var text: String {
        (["failures \(failureCount) \(failuresSince)"]
            + counters.map { "counter \($0.index) \(Hex.string($0.name ?? []))" }).joined(separator: "\n") + "\n"
    }

    /// The wrong passcodes not yet forgiven at `now`, one forgiven every `every` seconds.
    mutating func failures(now: Int64, every: UInt32) -> UInt32 {
        guard failureCount > 0, now > failuresSince else { return failureCount }
        let forgiven = min(Int64(failureCount), (now - failuresSince) / Int64(every))
        failureCount -= UInt32(forgiven)
        failuresSince += forgiven * Int64(every)
        return failureCount
    }

    func secondsUntilForgiven(now: Int64, every: UInt32) -> Int64 {
        max(1, failuresSince + Int64(every) - now)
    }

    mutating func countFailure(now: Int64, every: UInt32) {
        if failures(now: now, every: every) == 0 { failuresSince = now }
        failureCount += 1
    }
}
