import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The owner rule on the bus (docs/SECRET-SERVICE.md, "Whose an item is"):
/// the question is the core's
/// (``PasswordManager/consentQuestion(group:identifiers:verb:caller:)``),
/// the same as at the socket and the mount; only the waiting differs: the
/// bus thread goes on serving while the person decides.
extension SecretServiceProvider {
    /// The program behind a call, as ``outcome(_:for:audit:)`` reads it.
    func callerIdentity(_ call: BusCall) -> ProgramIdentity? {
        guard let sender = bus.senderProcess(of: call.message), let pidfd = Pidfd.open(sender.pid) else { return nil }
        // The pidfd stays open until the identity is checked against it.
        guard var identity = ProgramIdentities.of(thread: sender.pid, uid: sender.uid), Pidfd.isAlive(pidfd.borrowed)
        else {
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
        let candidates = items.compactMap { item -> (group: String, identifier: String, details: ItemDetails?)? in
            // A collection opened to every program (`policy GROUP --apps open`) asks nothing.
            guard store.appsOwnItems(inGroup: item.group),
                case .success(let found) = outcome(
                    .details(group: item.group, identifier: item.identifier), for: call,
                    audit: .failures)
            else { return nil }
            return (item.group, item.identifier, found.entries.first?.details)
        }
        let (asked, caller) = ItemConsent.asked(among: candidates) { callerIdentity(call) }
        guard !asked.isEmpty, let sender = bus.senderProcess(of: call.message) else { return (asked, caller) }
        // The process that made an item of no identifiable program uses it unasked (``Device/isMaker``).
        let others = asked.filter {
            $0.owner != .unidentified || !store.isMaker(sender.pid, of: $0.identifier, inGroup: $0.group)
        }
        return (others, caller)
    }

    /// Runs `body` for `call` once the person allowed the caller to use
    /// `items` (at once when no item needs asking: its reply is the
    /// answer): a question runs on a thread of its own, and `body` then
    /// runs on the bus thread, which went on serving meanwhile, and its
    /// reply is sent then. Denied: `denied` runs instead (nil: the call
    /// gets AccessDenied). Every question and answer is in the audit log.
    func withConsent(
        _ call: BusCall, to verb: String, items: [(group: String, identifier: String)],
        denied: ((BusCall, [ItemConsent.Asked]) throws(BusError) -> any MethodReply)? = nil,
        _ body: @escaping (BusCall) throws(BusError) -> any MethodReply
    ) throws(BusError) -> MethodAnswer {
        let (asked, caller) = itemsToAsk(items, call: call)
        guard !asked.isEmpty else { return .reply(try body(call)) }
        let subject = bus.senderProcess(of: call.message).map {
            ProgramIdentities.subject(process: $0.pid, uid: $0.uid)
        }
        var question = PasswordManager.question(asked: asked, verb: verb, program: caller, subject: subject)
        // Its pinentry ends when the caller leaves the bus.
        let sender = call.sender, waiting = waitingCallers
        waiting.enter(sender)
        question.waiting = { waiting.waits(sender) }
        let pending = PendingConsent(call: RetainedCall(call), asked: asked, body: body, denied: denied)
        let started = Threads.start { [self, question] in
            let answer = store.answer(question)
            waiting.leave(sender)
            bus.perform { [self] in finish(pending, answer) }
        }
        if started == nil {
            waiting.leave(sender)
            throw .failed("cannot ask the person now")
        }
        return .waitingForConsent
    }

    /// The person answered (the log and the list are written): on the bus thread, the call.
    private func finish(_ pending: PendingConsent, _ answer: ItemConsent.Answer) {
        let call = pending.call.call
        send(
            Result { () throws(BusError) in
                switch answer {
                case .denied:
                    guard let denied = pending.denied else {
                        throw .accessDenied("the person denied this program an item another program owns")
                    }
                    return .reply(try denied(call, pending.asked))
                case .allowedAlways, .allowedOnce:
                    return .reply(try pending.body(call))
                }
            }, to: call)
    }
}

/// A call waiting for the person's answer: made and used on the bus thread
/// only (the question's thread just hands it back), hence unchecked.
final class PendingConsent: @unchecked Sendable {
    let call: RetainedCall
    let asked: [ItemConsent.Asked]
    let body: (BusCall) throws(BusError) -> any MethodReply
    let denied: ((BusCall, [ItemConsent.Asked]) throws(BusError) -> any MethodReply)?

    init(
        call: RetainedCall, asked: [ItemConsent.Asked],
        body: @escaping (BusCall) throws(BusError) -> any MethodReply,
        denied: ((BusCall, [ItemConsent.Asked]) throws(BusError) -> any MethodReply)?
    ) {
        self.call = call
        self.asked = asked
        self.body = body
        self.denied = denied
    }
}

/// The bus names of callers that wait for the person's answer, and which
/// of them left the bus meanwhile (NameOwnerChanged): a question is for
/// nobody once its caller's name is gone. Names are unique per connection
/// and never reused, so a name left is left for good.
final class WaitingCallers: Sendable {
    private let state = Mutex<(waiting: [String: Int], left: Set<String>)>(([:], []))

    func enter(_ name: String) { state.withLock { $0.waiting[name, default: 0] += 1 } }

    func leave(_ name: String) {
        state.withLock { state in
            let count = (state.waiting[name] ?? 1) - 1
            state.waiting[name] = count > 0 ? count : nil
            if count <= 0 { state.left.remove(name) }
        }
    }

    /// The name left the bus: its questions are for nobody now.
    func departed(_ name: String) {
        state.withLock { state in
            if state.waiting[name] != nil { state.left.insert(name) }
        }
    }

    func waits(_ name: String) -> Bool { state.withLock { !$0.left.contains(name) } }
}
