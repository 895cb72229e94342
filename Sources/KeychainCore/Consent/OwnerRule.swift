import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Who is asking, as a door knows it: the program (read lazily: most
/// items have no owner, and reading a caller costs a scan of its
/// processes) and who it is for the audit log (its pid names the
/// process chain of the question).
package struct ConsentCaller {
    package let program: () -> ProgramIdentity?
    package let subject: () -> AuditSubject?
    /// Whether the caller still waits for the answer (``ClientPresence``):
    /// once none of the callers of a question waits, its pinentry is ended.
    package let waiting: @Sendable () -> Bool

    package init(
        program: @escaping () -> ProgramIdentity?, subject: @escaping () -> AuditSubject?,
        waiting: @escaping @Sendable () -> Bool = { true }
    ) {
        self.program = program
        self.subject = subject
        self.waiting = waiting
    }
}

/// A question to put to the person: made where the request arrived, asked
/// on a thread that may wait (``PasswordManager/answer(_:)``).
public struct ConsentQuestion: Sendable {
    package let asked: [ItemConsent.Asked]
    package let verb: String
    package let text: String
    package let subject: AuditSubject?
    /// The program to put on the items' lists if the person says "Always
    /// allow"; nil when it may be allowed only once (a deputy, or a
    /// process that cannot be taken for its executable).
    package let claim: ProgramClaim?
    /// Who started the asking process, as the question names them (empty: not known).
    var startedBy: String = ""
    /// Concurrent questions with the same key wait for one answer.
    let key: String
    let asker: String
    /// Whether its caller still waits for the answer.
    package var waiting: @Sendable () -> Bool = { true }
    /// Where it is asked when no display can show it: the asker's terminal, in its foreground (nil: none).
    var terminal: AskerTerminal?
}

/// The owner rule, the same at every door (docs/SECURITY.md, "An application's
/// secrets on every door"): the bus, every socket command and the mount call it
/// before they hand out or change an item, with the program that asked.
extension PasswordManager {
    /// The question to put to the person before `caller` may `verb` the
    /// items `identifiers` of `group`; nil when none needs asking (they
    /// have no owner, the caller is their owner or on their list, or the
    /// group is open to every program).
    package func consentQuestion(
        group: String, identifiers: [String], verb: String, caller: ConsentCaller
    ) -> ConsentQuestion? {
        guard localDevice.appsOwnItems(inGroup: group) else { return nil }
        let candidates = identifiers.filter { mayHaveOwner($0, inGroup: group) }.map { identifier in
            let changes = ownerIndex.withLock { $0.changes }
            let details = try? detailsForConsent(identifier, inGroup: group)
            ownerIndex.withLock {
                $0.resolve(group, identifier, owned: details?.owner != nil, ifNoChangeSince: changes)
            }
            return (group: group, identifier: identifier, details: details)
        }
        return question(among: candidates, verb: verb, caller: caller)
    }

    /// The question about those of `candidates` that `caller` must be asked about; nil when none.
    func question(
        among candidates: [(group: String, identifier: String, details: ItemDetails?)], verb: String,
        caller: ConsentCaller
    ) -> ConsentQuestion? {
        var (asked, program) = ItemConsent.asked(among: candidates, program: caller.program)
        if !asked.isEmpty, let pid = caller.subject()?.pid { asked = localDevice.withoutItemsMade(by: pid, asked) }
        guard !asked.isEmpty else { return nil }
        var question = Self.question(asked: asked, verb: verb, program: program, subject: caller.subject())
        question.waiting = caller.waiting
        return question
    }

    /// Whether the item may have an owner: false for the items the index
    /// knows to have none (most: every item made through a mount or the
    /// command line), which the rule then lets through without a query.
    /// The index is read from the store at first use (each item's details
    /// once) and kept by the device's change events; an item changed since
    /// is looked at again.
    func mayHaveOwner(_ identifier: String, inGroup group: String) -> Bool {
        let key = OwnerIndex.key(group, identifier)
        if let known = ownerIndex.withLock({ $0.loaded ? $0.mayHaveOwner(key) : nil }) { return known }
        var owned = Set<String>()
        for group in (try? groups()) ?? [] {
            for (identifier, details) in (try? itemsWithDetails(inGroup: group)) ?? [] where details.owner != nil {
                owned.insert(OwnerIndex.key(group, identifier))
            }
        }
        return ownerIndex.withLock { index in
            if !index.loaded {
                index.owned = owned
                // A change that raced the reading stays to be looked at (it is in `unchecked`).
                index.loaded = true
            }
            return index.mayHaveOwner(key)
        }
    }

    /// The question of `asked` for `program`, which `subject` names in the log.
    package static func question(
        asked: [ItemConsent.Asked], verb: String, program: ProgramIdentity?, subject: AuditSubject?
    ) -> ConsentQuestion {
        let claim = program.map(ProgramClaim.init)
        // An interpreter running a script file is that script, no deputy
        // (docs/SECRET-SERVICE.md, "Whose an item is").
        var deputy = program?.program.path.map(Deputies.isDeputy) ?? false
        var unidentified = program?.distrust
        switch program?.script {
        case .file?: deputy = false
        case .unidentifiable(let why)?: unidentified = unidentified ?? why
        case nil: break
        }
        let chain = subject.map { ProcessChain.described(from: $0.pid) } ?? []
        let text = ItemConsent.question(
            asker: claim, unidentified: unidentified, chain: chain, deputy: deputy, items: asked, asking: verb)
        // Never for good: a deputy, a process that cannot be taken for its
        // executable, or one running code from anonymous memory.
        let trusted = program.map { unidentified == nil && !$0.runsAnonymousCode && !deputy } ?? false
        let asker = claim.map { $0.program.encoded + "\u{0}" + $0.digestHex } ?? "unidentified"
        let items = asked.map { $0.group + "/" + $0.identifier }.sorted().joined(separator: "\u{0}")
        return ConsentQuestion(
            asked: asked, verb: verb, text: text, subject: subject, claim: trusted ? claim : nil,
            startedBy: chain.dropFirst().map(\.logged).joined(separator: " ← "),
            key: asker + "\u{1}" + ConsentQuestions.process(subject) + "\u{1}" + verb + "\u{1}" + items, asker: asker,
            terminal: subject.flatMap { AskerTerminal.foreground(of: $0.pid) })
    }

    /// Puts `question` to the person (blocking the calling thread until
    /// they answer, or ``ItemConsent/timeout``), records the question and
    /// its answer in the audit log, and puts the program on the items'
    /// lists for "Always allow".
    package func answer(_ question: ConsentQuestion) -> ItemConsent.Answer {
        let given = ConsentQuestions.shared.ask(question)
        let answer = given.answer == .allowedAlways && question.claim == nil ? .allowedOnce : given.answer
        for item in question.asked {
            localDevice.audit.record(
                AuditEvent(
                    operation: "ask", result: answer.rawValue, group: item.group,
                    identifier: item.identifier, subject: question.subject,
                    detail: "to \(question.verb); owner \(item.owner.program.encoded)"
                        + (item.owner.package.map { " package=" + $0 } ?? "")
                        + (question.startedBy.isEmpty ? "" : "; started by " + question.startedBy)
                        + (given.unasked.map { "; not asked: " + $0 } ?? "")))
        }
        if answer == .allowedAlways, let claim = question.claim {
            for item in question.asked {
                do throws(KeychainError) {
                    try allow(claim, forIdentifier: item.identifier, inGroup: item.group)
                } catch {
                    Diagnostics.log(
                        "could not add \(claim.program.encoded) to the access list of \(item.group)/\(item.identifier): "
                            + error.description)
                }
            }
        }
        return answer
    }

    /// ``KeychainError/ownerDenied`` unless `caller` may `verb` the items
    /// of `group` (asking the person when the rule says so).
    package func requireConsent(
        group: String, identifiers: [String], verb: String, caller: ConsentCaller
    ) throws(KeychainError) {
        guard let question = consentQuestion(group: group, identifiers: identifiers, verb: verb, caller: caller)
        else { return }
        guard answer(question) != .denied else { throw .ownerDenied }
    }
}

/// An item made by a program that could not be identified (`python3 -m`,
/// `python3 -c`, a script by a relative path) belongs to no program, so
/// every program is asked about it: the process that made it was asked
/// about its own item a moment later, and with no one to ask was refused
/// it (secretstorage's and keyring's own tests). The process that made it
/// (its pid and start time, which name one process for good) uses it
/// unasked for as long as it runs and the item is not removed or renamed;
/// no other process does (docs/SECRET-SERVICE.md, "Whose an item is").
extension Device {
    /// Remembers that process `pid` made `group/identifier`, an item of no identifiable program.
    package func noteMaker(ofUnidentified identifier: String, inGroup group: String, pid: pid_t) {
        guard let process = DevicePeerAdmission.Process.now(pid) else { return }
        unidentifiedMakers.withLock { $0[group + "\u{0}" + identifier] = process }
    }

    /// Whether process `pid` made `group/identifier` (``noteMaker(ofUnidentified:inGroup:pid:)``) and still runs.
    package func isMaker(_ pid: pid_t, of identifier: String, inGroup group: String) -> Bool {
        guard let maker = unidentifiedMakers.withLock({ $0[group + "\u{0}" + identifier] }) else { return false }
        return DevicePeerAdmission.Process.now(pid) == maker
    }

    /// `asked` without the items of no identifiable program that process `pid` made.
    package func withoutItemsMade(by pid: pid_t, _ asked: [ItemConsent.Asked]) -> [ItemConsent.Asked] {
        asked.filter { $0.owner != .unidentified || !isMaker(pid, of: $0.identifier, inGroup: $0.group) }
    }

    /// A removed or renamed item is no longer its maker's: a name made again is another item.
    func forgetMaker(after change: ItemChange) {
        switch change {
        case .removed(let group, let identifier), .renamed(let group, let identifier, _):
            _ = unidentifiedMakers.withLock { $0.removeValue(forKey: group + "\u{0}" + identifier) }
        case .groupRemoved(let group):
            unidentifiedMakers.withLock { $0 = $0.filter { !$0.key.hasPrefix(group + "\u{0}") } }
        case .written, .groupCreated:
            break
        }
    }
}

/// The items of a keychain that have an owner, as the owner rule needs to
/// know at every open: `owned` as read from the store, and the items changed
/// since (`unchecked`), which are read again when asked about.
struct OwnerIndex: Sendable {
    var loaded = false
    var owned: Set<String> = []
    var unchecked: Set<String> = []
    var changes: UInt64 = 0

    static func key(_ group: String, _ identifier: String) -> String { group + "\u{0}" + identifier }

    func mayHaveOwner(_ key: String) -> Bool { owned.contains(key) || unchecked.contains(key) }

    mutating func changed(_ group: String, _ identifier: String) {
        unchecked.insert(Self.key(group, identifier))
        changes &+= 1
    }

    /// What a read of the item's details found, kept unless something
    /// changed meanwhile (then it stays to be looked at again).
    mutating func resolve(_ group: String, _ identifier: String, owned isOwned: Bool, ifNoChangeSince seen: UInt64) {
        guard changes == seen else { return }
        let key = Self.key(group, identifier)
        unchecked.remove(key)
        if isOwned { owned.insert(key) } else { owned.remove(key) }
    }

    mutating func removed(_ group: String, _ identifier: String) {
        let key = Self.key(group, identifier)
        owned.remove(key)
        unchecked.remove(key)
        changes &+= 1
    }
}

/// The questions being asked now: one per process and item set at a
/// time (concurrent calls of one process wait for the same answer), a few
/// per program, and a few in all. A question answers the process it
/// names and no other: another process of the same program, one that
/// arrives while the question is shown, gets its own question, so that a
/// hidden process cannot ride on the person's "Allow once" for the
/// command they typed (docs/SECURITY.md, "One answer, one process"). Past that a call is denied without asking, and the
/// log says so: a flood of calls starts no flood of pinentries.
package final class ConsentQuestions: Sendable {
    static let shared = ConsentQuestions(asker: ItemConsent.ask)

    /// Questions one program may have open at once, and all programs.
    package static let perProgram = 3
    package static let overall = 8

    /// Puts a question to the person: pinentry, or a test's stand-in. The
    /// last argument tells whether every caller of the question left.
    private let asker: @Sendable (String, Bool, AskerTerminal?, @escaping @Sendable () -> Bool) -> ItemConsent.Answer
    /// Calls placed so far (asked, waiting or refused), for tests.
    private let placed = Atomic<Int>(0)
    package var arrivals: Int { placed.load(ordering: .acquiring) }

    package init(
        asker:
            @escaping @Sendable (
                _ question: String, _ always: Bool, _ terminal: AskerTerminal?,
                _ abandoned: @escaping @Sendable () -> Bool
            ) -> ItemConsent.Answer
    ) {
        self.asker = asker
    }

    private final class Pending: @unchecked Sendable {
        // Guarded by the table's mutex; `done` is posted once the answer is set.
        var answer: ItemConsent.Answer?
        var waiters = 0
        /// Whether each caller (the asker first) still waits.
        var callers: [@Sendable () -> Bool] = []
        let done = UnsafeMutablePointer<sem_t>.allocate(capacity: 1)
        init() { sem_init(done, 0, 0) }
        deinit {
            sem_destroy(done)
            done.deallocate()
        }
    }

    private let pending = Mutex<[String: Pending]>([:])

    /// The process a question answers, as its key names it: its pid and
    /// start time (a pid used again is another process); a caller whose
    /// process is not known shares its question with none.
    static func process(_ subject: AuditSubject?) -> String {
        guard let subject, subject.pid > 0, let started = ProcessChain.startTime(of: subject.pid) else {
            return "unknown " + String(unknownCallers.add(1, ordering: .relaxed).newValue)
        }
        return String(subject.pid) + " " + String(started)
    }
    private static let unknownCallers = Atomic<UInt64>(0)

    /// The answer, and why the person was not asked when they were not.
    package func ask(_ question: ConsentQuestion) -> (answer: ItemConsent.Answer, unasked: String?) {
        enum Role {
            case asker(Pending)
            case waiter(Pending)
            case refused(String)
        }
        let role = pending.withLock { table -> Role in
            defer { placed.add(1, ordering: .releasing) }
            if let open = table[question.key] {
                open.waiters += 1
                open.callers.append(question.waiting)
                return .waiter(open)
            }
            if table.count >= Self.overall { return .refused("too many questions are open") }
            if table.keys.count(where: { $0.hasPrefix(question.asker + "\u{1}") }) >= Self.perProgram {
                return .refused("this program has too many questions open")
            }
            let open = Pending()
            open.callers = [question.waiting]
            table[question.key] = open
            return .asker(open)
        }
        switch role {
        case .refused(let reason):
            return (.denied, reason)
        case .waiter(let open):
            while sem_wait(open.done) != 0 && Errno.current.rawValue == EINTR {}
            return (pending.withLock { _ in open.answer } ?? .denied, nil)
        case .asker(let open):
            let abandoned: @Sendable () -> Bool = { [self] in
                !pending.withLock { _ in open.callers }.contains { $0() }
            }
            let answer = asker(question.text, question.claim != nil, question.terminal, abandoned)
            let waiters = pending.withLock { table in
                open.answer = answer
                table.removeValue(forKey: question.key)
                return open.waiters
            }
            for _ in 0..<waiters { sem_post(open.done) }
            return (answer, nil)
        }
    }
}
