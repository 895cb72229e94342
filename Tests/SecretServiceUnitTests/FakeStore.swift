import KeychainCore
import KeychainProtocol
import Synchronization
@testable import SecretService
#if canImport(Glibc)
import Glibc
#endif

/// One item, `work/mail`; what each request gets is set by the test.
/// It answers with values, as the device does in its own process:
/// no fields to get wrong (the fake once answered `info` with one
/// field, which only a hand read let pass).
final class FakeStore: SecretStore, @unchecked Sendable {
    typealias Answer = DeviceAnswer
    let answers: Mutex<[String: Answer]>
    let asked = Mutex<[String]>([])
    /// The program `work/mail` belongs to (nil: none): any other caller is
    /// asked about, and the person answers `consent`.
    let owner: ProgramClaim?
    let consent: ItemConsent.Answer
    /// The owner questions the person was shown.
    let questions = Mutex<[String]>([])

    /// Whether the keychain is locked: no class key is available then, and
    /// the device refuses every value (interactionNotAllowed), as a device
    /// booted and not unlocked does.
    let locked: Bool

    init(
        get: Answer, set: Answer, remove: Answer, owner: ProgramClaim? = nil, consent: ItemConsent.Answer = .denied,
        locked: Bool = false
    ) {
        answers = Mutex(["get": get, "set": set, "remove": remove])
        self.owner = owner
        self.consent = consent
        self.locked = locked
    }

    var isLocked: Bool { locked }
    func isAvailable(_ protectionClass: ProtectionClass) -> Bool { !locked }
    func appsOwnItems(inGroup group: String) -> Bool { owner != nil }
    func policedGroups(admitting program: () -> ProgramIdentity?) -> Set<String> { [] }
    func setSecretServiceState(_ state: String?) {}
    func addObserver(_ handler: @escaping @Sendable (DeviceEvent) -> Void) -> Int { 1 }
    func removeObserver(_ token: Int) {}
    func itemNames() -> [String: [String]] { ["work": ["mail"]] }
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

    private func answer(_ request: DeviceRequest) -> Answer {
        guard case .item(let item) = request else {
            return .failure(.keychain(.badRequest, "not in this test"))
        }
        let info = ItemInfo(protectionClass: .whenUnlocked, size: 6)
        let kind: String
        switch item {
        case .list(let group):
            return .success(
                group == nil ? GroupList(["work"]) : ItemList([ItemListing(identifier: "mail", info: info)]))
        case .details:
            guard let owner else { return .success(DetailsList([])) }
            var details = ItemDetails(label: "Mail", attributes: [:])
            details.owner = owner
            return .success(DetailsList([("mail", details)]))
        case .info(let group, let identifier):
            // As the device answers for a name it does not hold.
            guard group == "work" && identifier == "mail" else {
                return .failure(.keychain(.itemNotFound, KeychainError.itemNotFound.description))
            }
            return .success(info)
        case .get: kind = "get"
        case .set: kind = "set"
        case .remove: kind = "remove"
        case .setDetails, .setClass, .rename, .createGroup, .removeGroup:
            return .failure(.keychain(.badRequest, "not in this test"))
        }
        asked.withLock { $0.append(kind) }
        if locked && kind == "get" {
            return .failure(.keychain(.interactionNotAllowed, KeychainError.interactionNotAllowed.description))
        }
        return answers.withLock { $0[kind]! }
    }
}
