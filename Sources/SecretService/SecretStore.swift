import KeychainCore
import KeychainProtocol
#if canImport(Glibc)
import Glibc
#endif

/// What the Secret Service needs of the device: its keychain's requests,
/// carried out as for every other client (the entitlement checks against
/// the program asking, the audit log, the mounts told of the change), and
/// its lock state and events. The device itself stays behind it, so that a
/// store of a test's own can stand in.
public protocol SecretStore: AnyObject, Sendable {
    /// Whether the `whenUnlocked` keys are absent.
    var isLocked: Bool { get }
    /// Whether the key of `protectionClass` is in memory now.
    func isAvailable(_ protectionClass: ProtectionClass) -> Bool
    /// Whether programs own the items they make in `group` over the bus
    /// (docs/SECRET-SERVICE.md, "Whose an item is").
    func appsOwnItems(inGroup group: String) -> Bool
    /// The groups whose entitlement policy admits `program`, whether they
    /// hold items yet or not (`program` is read only when some group has a policy).
    func policedGroups(admitting program: () -> ProgramIdentity?) -> Set<String>
    /// What the provider is doing, as `.control` and `STATUS=` say it (nil: not serving).
    func setSecretServiceState(_ state: String?)
    /// Calls `handler` after every lock, unlock and committed change; returns a token.
    func addObserver(_ handler: @escaping @Sendable (DeviceEvent) -> Void) -> Int
    func removeObserver(_ token: Int)
    /// Every group's item identifiers: the device's own listing (no
    /// program asks), for what the provider has to know of at start.
    func itemNames() -> [String: [String]]
    /// Process `pid` made this item, which no program could be identified
    /// for: it uses it unasked while it runs (``Device/noteMaker(ofUnidentified:inGroup:pid:)``).
    func noteMaker(ofUnidentified identifier: String, inGroup group: String, pid: pid_t)
    /// Whether process `pid` made `group/identifier`, an item of no identifiable program, and still runs.
    func isMaker(_ pid: pid_t, of identifier: String, inGroup group: String) -> Bool
    /// Carries out an item request of the program `program` (read lazily:
    /// only a group with an entitlement policy asks), recorded in the audit
    /// log with `subject` as `audit` says.
    /// The answer is the result itself, never its fields.
    func perform<Result: DeviceResult>(
        _ call: DeviceCall<Result>, program: () -> ProgramIdentity?, subject: () -> AuditSubject?,
        audit: AuditPolicy
    ) -> DeviceOutcome<Result>
    /// Puts a question of the owner rule to the person (blocking the
    /// calling thread), records it and its answer, and puts the program on
    /// the items' lists for "Always allow": the core's, as at every door.
    func answer(_ question: ConsentQuestion) -> ItemConsent.Answer
    /// Records what the provider did on its own in the audit log (an
    /// unlock prompt that failed, and why).
    func record(_ operation: String, result: String, subject: AuditSubject?, detail: String)
    /// The labels people gave collections, by group (a group without one
    /// is called by its name).
    func collectionLabels() -> [String: String]
    /// Gives `group`'s collection `label` (nil: its name again); ``KeychainError/param`` past the bounds.
    func setCollectionLabel(_ label: String?, of group: String) throws(KeychainError)
}

/// Which requests of the bus reach the audit log: every read of a value,
/// write and removal; of the listings behind properties and searches (a
/// search lists every group), only the refused ones.
public enum AuditPolicy: Sendable {
    case always
    case failures
}
