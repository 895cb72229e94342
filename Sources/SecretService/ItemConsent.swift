import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Whose an item's secret is on the bus (issue 31): an item a program made
/// over the bus belongs to it. Its owner, and the programs the person
/// allowed for good, use it without a question; any other program's
/// GetSecret(s), SetSecret, Delete, replacing CreateItem or property change
/// waits while pinentry asks the person: Deny, Allow once, Always allow.
/// No way to ask (no pinentry, a timeout, a closed window) is Deny.
/// Searches still find the item, as the spec wants; only its secret and
/// its changes are the owner's. Items made through a mount or the command
/// line belong to no program (docs/SECRET-SERVICE.md, "Whose an item is").
enum ItemConsent {
    /// Seconds the person has to answer.
    static let timeout = 60

    /// The three buttons, in pinentry's order: OK is the default (Enter),
    /// as macOS's "Allow"; Escape is Deny.
    static let allowOnce = "Allow once"
    static let alwaysAllow = "Always allow"
    static let deny = "Deny"

    /// What the person said, as the audit log writes it.
    enum Answer: String, Sendable {
        case allowedOnce = "allowed-once"
        case allowedAlways = "allowed-always"
        case denied
    }

    /// An item another program's request touches, and its owner.
    struct Asked {
        let group: String
        let identifier: String
        let label: String
        let owner: ProgramClaim
    }

    /// Whether `program` uses the item of `details` without a question:
    /// an item without an owner, its owner, or a program on its list.
    static func isFree(_ details: ItemDetails?, for program: ProgramIdentity?) -> Bool {
        guard let owner = details?.owner else { return true }
        guard let program else { return false }
        return owner.admits(program) || details?.allowed.contains { $0.admits(program) } == true
    }

    /// The question, naming the program (its path, and its package where
    /// dpkg knows it) and the items (label, collection) and their owner.
    static func question(asker: ProgramClaim?, items: [Asked], asking verb: String) -> String {
        // Escaped: a label or path of another program's must not forge the question's text.
        let who = asker.map { LineEscaping.escaped($0.described) } ?? "a program that cannot be identified"
        let what =
            items.prefix(5).map { "\"\(LineEscaping.escaped($0.label))\" in \(LineEscaping.escaped($0.group))" }
            .joined(separator: ", ")
            + (items.count > 5 ? " and \(items.count - 5) more" : "")
        let owners = Set(items.map { LineEscaping.escaped($0.owner.described) }).sorted().joined(separator: ", ")
        return "\(who) wants to \(verb) \(what), which belongs to \(owners)."
    }

    /// Asks through pinentry on the calling thread (which it blocks).
    static func ask(_ description: String) -> Answer {
        guard let program = Pinentry.program(), let pinentry = try? Pinentry(program: program) else { return .denied }
        defer { pinentry.end() }
        switch pinentry.confirm(
            description: description, ok: allowOnce, notOK: alwaysAllow, cancel: deny, timeout: timeout)
        {
        case .ok: return .allowedOnce
        case .notOK: return .allowedAlways
        case .cancel: return .denied
        }
    }
}

extension SecretServiceProvider {
    /// The program behind a call, as ``perform(_:for:audit:)`` reads it.
    func callerIdentity(_ call: BusCall) -> ProgramIdentity? {
        guard let sender = bus.senderProcess(of: call.message), let pidfd = Pidfd.open(sender.pid) else { return nil }
        defer { close(pidfd) }
        guard var identity = ProgramIdentities.of(thread: sender.pid, uid: sender.uid), Pidfd.isAlive(pidfd) else {
            return nil
        }
        if identity.distrust == nil { identity.distrust = connectionDoubt(call.sender, pid: sender.pid, identity) }
        return identity
    }

    /// The items among `items` whose owner must be asked about for the
    /// caller, and the caller as read: only when an item has an owner (most
    /// have none, and reading a caller costs a scan of its processes).
    func itemsToAsk(
        _ items: [(group: String, identifier: String)],
        call: BusCall
    ) -> (asked: [ItemConsent.Asked], caller: ProgramIdentity?) {
        var caller: ProgramIdentity??
        let asked = items.compactMap { item -> ItemConsent.Asked? in
            // A collection opened to every program (`policy GROUP --apps open`) asks nothing.
            guard store.appsOwnItems(inGroup: item.group),
                case .ok(let fields) = perform(
                    .details(group: item.group, identifier: item.identifier), for: call,
                    audit: .failures),
                let details = (try? ItemDetails.listed(fromFields: fields))?.first?.details,
                let owner = details.owner
            else { return nil }
            if caller == nil { caller = .some(callerIdentity(call)) }
            guard !ItemConsent.isFree(details, for: caller ?? nil) else { return nil }
            return ItemConsent.Asked(group: item.group, identifier: item.identifier, label: details.label, owner: owner)
        }
        return (asked, caller ?? nil)
    }

    /// Runs `body` for `call` once the person allowed the caller to use
    /// `items` (at once when no item needs asking): a question runs on a
    /// thread of its own, and `body` then runs on the bus thread, which
    /// went on serving meanwhile. Denied: `denied` runs instead (nil: the
    /// call gets AccessDenied). Every question and answer is in the audit log.
    func withConsent(
        _ call: BusCall, to verb: String, items: [(group: String, identifier: String)],
        denied: ((BusCall, [ItemConsent.Asked]) throws(BusError) -> Void)? = nil,
        _ body: @escaping (BusCall) throws(BusError) -> Void
    ) throws(BusError) {
        let (asked, caller) = itemsToAsk(items, call: call)
        guard !asked.isEmpty else { return try body(call) }
        let claim = caller.map(ProgramClaim.init)
        let question = ItemConsent.question(asker: claim, items: asked, asking: verb)
        let subject = bus.senderProcess(of: call.message).map { ProgramIdentities.subject(thread: $0.pid, uid: $0.uid) }
        // A program that cannot be identified is never allowed for good.
        let pending = PendingConsent(
            call: RetainedCall(call), verb: verb, asked: asked, subject: subject,
            claim: caller?.distrust == nil ? claim : nil, body: body, denied: denied)
        let started = Threads.start { [self] in
            let answer = ItemConsent.ask(question)
            bus.perform { [self] in finish(pending, answer) }
        }
        if started == nil { throw .failed("cannot ask the person now") }
    }

    /// The person answered: on the bus thread, the log, the access list, then the call.
    private func finish(_ pending: PendingConsent, _ given: ItemConsent.Answer) {
        let answer = given == .allowedAlways && pending.claim == nil ? .allowedOnce : given
        for item in pending.asked {
            store.record(
                AuditEvent(
                    operation: "ask", result: answer.rawValue, group: item.group,
                    identifier: item.identifier, subject: pending.subject,
                    detail: "to \(pending.verb); owner \(item.owner.executable)"
                        + (item.owner.package.map { " package=" + $0 } ?? "")))
        }
        do throws(BusError) {
            switch answer {
            case .denied:
                guard let denied = pending.denied else {
                    throw .accessDenied("the person denied this program an item another program owns")
                }
                try denied(pending.call.call, pending.asked)
            case .allowedAlways:
                if let claim = pending.claim {
                    for item in pending.asked { store.allow(claim, group: item.group, identifier: item.identifier) }
                }
                try pending.body(pending.call.call)
            case .allowedOnce:
                try pending.body(pending.call.call)
            }
        } catch {
            bus.reply(to: pending.call.call.message, error: error)
        }
    }
}

/// A call waiting for the person's answer: made and used on the bus thread
/// only (the question's thread just hands it back), hence unchecked.
final class PendingConsent: @unchecked Sendable {
    let call: RetainedCall
    let verb: String
    let asked: [ItemConsent.Asked]
    let subject: AuditSubject?
    let claim: ProgramClaim?
    let body: (BusCall) throws(BusError) -> Void
    let denied: ((BusCall, [ItemConsent.Asked]) throws(BusError) -> Void)?

    init(
        call: RetainedCall, verb: String, asked: [ItemConsent.Asked], subject: AuditSubject?, claim: ProgramClaim?,
        body: @escaping (BusCall) throws(BusError) -> Void,
        denied: ((BusCall, [ItemConsent.Asked]) throws(BusError) -> Void)?
    ) {
        self.call = call
        self.verb = verb
        self.asked = asked
        self.subject = subject
        self.claim = claim
        self.body = body
        self.denied = denied
    }
}
