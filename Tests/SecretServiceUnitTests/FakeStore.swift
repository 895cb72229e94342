import KeychainCore
import KeychainProtocol
import Synchronization
@testable import SecretService
#if canImport(Glibc)
import Glibc
#endif

/// The groups and items the test gives it (by default one item,
/// `work/mail`), and what each request of a value gets, set by the test.
/// It answers with values, as the device does in its own process:
/// no fields to get wrong (the fake once answered `info` with one
/// field, which only a hand read let pass). Its policy is the test's too:
/// the groups that admit the caller and those that refuse it.
final class FakeStore: SecretStore, @unchecked Sendable {
    typealias Answer = DeviceAnswer
    let answers: Mutex<[String: Answer]>
    let asked = Mutex<[String]>([])
    /// The program every item belongs to (nil: none): any other caller is
    /// asked about, and the person answers `consent`.
    let owner: ProgramClaim?
    let consent: ItemConsent.Answer
    /// The owner questions the person was shown.
    let questions = Mutex<[String]>([])

    /// Whether the keychain is locked: no class key is available then, and
    /// the device refuses every value (interactionNotAllowed), as a device
    /// booted and not unlocked does.
    let locked: Bool

    /// Each group's items with the details kept with them (nil: none, as
    /// an item made through a mount has), as the device holds them.
    let contents: Mutex<[String: [String: ItemDetails?]]>
    /// The policed groups whose policy admits the caller
    /// (``SecretStore/policedGroups(admitting:)``).
    let admitting: Set<String>
    /// The groups whose policy does not admit the caller: the device
    /// refuses every request about them (missingEntitlement), after the
    /// store was asked.
    let refusing: Set<String>

    init(
        get: Answer, set: Answer, remove: Answer, owner: ProgramClaim? = nil, consent: ItemConsent.Answer = .denied,
        locked: Bool = false, contents: [String: [String: ItemDetails?]] = ["work": ["mail": nil]],
        admitting: Set<String> = [], refusing: Set<String> = []
    ) {
        answers = Mutex(["get": get, "set": set, "remove": remove])
        self.owner = owner
        self.consent = consent
        self.locked = locked
        self.contents = Mutex(contents)
        self.admitting = admitting
        self.refusing = refusing
    }

    var isLocked: Bool { locked }
    func isAvailable(_ protectionClass: ProtectionClass) -> Bool { !locked }
    func appsOwnItems(inGroup group: String) -> Bool { owner != nil }
    func policedGroups(admitting program: () -> ProgramIdentity?) -> Set<String> { admitting }
    func setSecretServiceState(_ state: String?) {}
    func addObserver(_ handler: @escaping @Sendable (DeviceEvent) -> Void) -> Int { 1 }
    func removeObserver(_ token: Int) {}
    func itemNames() -> [String: [String]] { contents.withLock { $0.mapValues { $0.keys.sorted() } } }
    func noteMaker(ofUnidentified identifier: String, inGroup group: String, pid: pid_t) {}
    func isMaker(_ pid: pid_t, of identifier: String, inGroup group: String) -> Bool { false }
    func answer(_ question: ConsentQuestion) -> ItemConsent.Answer {
        questions.withLock { $0.append(question.text) }
        return consent
    }
    func record(_ operation: String, result: String, subject: AuditSubject?, detail: String) {}
    let labels = Mutex<[String: String]>([:])
    func collectionLabels() -> [String: String] { labels.withLock { $0 } }
    func setCollectionLabel(_ label: String?, of group: String) throws(KeychainError) {
        labels.withLock { $0[group] = label }
    }

    func perform<Result: DeviceResult>(
        _ call: DeviceCall<Result>, program: () -> ProgramIdentity?, subject: () -> AuditSubject?,
        audit: AuditPolicy
    ) -> DeviceOutcome<Result> {
        answer(call.request).outcome(of: call)
    }

    static func refusal(_ error: KeychainError) -> Answer { .failure(.keychain(error, error.description)) }

    private func answer(_ request: DeviceRequest) -> Answer {
        guard case .item(let item) = request else {
            return .failure(.keychain(.badRequest, "not in this test"))
        }
        let info = ItemInfo(protectionClass: .whenUnlocked, size: 6)
        if let group = item.group, refusing.contains(group) {
            asked.withLock { $0.append("refused " + (item.auditOperation ?? "")) }
            return Self.refusal(.missingEntitlement)
        }
        let kind: String
        switch item {
        case .list(nil):
            return .success(GroupList(contents.withLock { $0.keys.sorted() }))
        case .list(let group?):
            let identifiers = contents.withLock { $0[group]?.keys.sorted() ?? [] }
            return .success(ItemList(identifiers.map { ItemListing(identifier: $0, info: info) }))
        case .details(let group, let identifier):
            let items = contents.withLock { $0[group] ?? [:] }
            return .success(
                DetailsList(
                    items.keys.sorted().filter { identifier == nil || $0 == identifier }.compactMap { name in
                        guard
                            var details = (items[name] ?? nil)
                                ?? owner.map({ _ in ItemDetails(label: name, attributes: [:]) })
                        else { return nil }
                        details.owner = owner
                        return (name, details)
                    }))
        case .info(let group, let identifier):
            // As the device answers for a name it does not hold.
            guard contents.withLock({ $0[group]?[identifier] != nil }) else { return Self.refusal(.itemNotFound) }
            return .success(info)
        case .setDetails(let group, let identifier, let details):
            asked.withLock { $0.append("set-details") }
            return contents.withLock { (contents) -> Answer in
                guard contents[group]?[identifier] != nil else { return Self.refusal(.itemNotFound) }
                contents[group]?[identifier] = details
                return .success(Done())
            }
        case .get: kind = "get"
        case .set: kind = "set"
        case .remove: kind = "remove"
        case .setClass, .rename, .createGroup, .removeGroup:
            return .failure(.keychain(.badRequest, "not in this test"))
        }
        asked.withLock { $0.append(kind) }
        if locked && kind == "get" {
            return Self.refusal(.interactionNotAllowed)
        }
        let answer = answers.withLock { $0[kind]! }
        if case .success = answer {
            contents.withLock { (contents) in
                switch item {
                case .set(let group, let identifier, _, _, _, let details):
                    contents[group, default: [:]][identifier] = .some(details)
                case .remove(let group, let identifier): contents[group]?[identifier] = nil
                default: break
                }
            }
        }
        return answer
    }
}
