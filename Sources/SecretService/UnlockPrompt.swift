import KeychainCore
import KeychainProtocol
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The prompt an `Unlock` of a locked keychain returns: when its client
/// calls `Prompt`, pinentry asks for the passcode (three tries; each wrong
/// one counts toward the device's lockout, as at any other door).
final class UnlockPrompt: Sendable {
    let owner: String
    let objects: [String]
    /// `cancelled` stays set: a client gone before its pinentry has said
    /// hello (no `pinentry` yet to stop) must still see none shown.
    private let state = Mutex<(started: Bool, cancelled: Bool, pinentry: Pinentry?)>((false, false, nil))

    init(owner: String, objects: [String]) {
        self.owner = owner
        self.objects = objects
    }

    /// Marks it shown; false if it was already.
    func start() -> Bool {
        state.withLock { state in
            defer { state.started = true }
            return !state.started
        }
    }

    /// Stops a pinentry that is showing, or keeps one from showing;
    /// false when none is showing yet.
    @discardableResult
    func cancel() -> Bool {
        state.withLock { state in
            state.cancelled = true
            state.pinentry?.cancel()
            return state.pinentry != nil
        }
    }

    static let attempts = 3

    /// Asks (on the calling thread, which it blocks) until `unlock` takes a
    /// passcode; nil when the device was unlocked, else why not (for the log:
    /// a client sees only a dismissed prompt).
    func run(program: String, program asker: pid_t?, unlock: (SecureBytes) -> DeviceOutcome<Done>) -> String? {
        let pinentry: Pinentry
        // With no display (over SSH), at the terminal of the program that asks, when it runs in its
        // foreground: the passcode was asked nowhere, and the lookup failed without a word (a first day's report).
        let terminal = Pinentry.hasDisplay ? nil : asker.flatMap { AskerTerminal.foreground(of: $0) }
        do {
            pinentry = try Pinentry(program: program, at: terminal)
        } catch {
            return "the pinentry could not ask: \(error.description); no display or terminal?"
        }
        // Cancelled while the pinentry started (its greeting not yet read):
        // it ends here, never asking.
        let cancelled = state.withLock { state in
            if !state.cancelled { state.pinentry = pinentry }
            return state.cancelled
        }
        guard !cancelled else {
            pinentry.end()
            return "dismissed by the client"
        }
        defer {
            state.withLock { $0.pinentry = nil }
            pinentry.end()
        }
        let who = asker.flatMap { ProgramIdentities.subject(process: $0, uid: getuid()).executable } ?? "a program"
        var error: String?
        for _ in 0..<Self.attempts {
            let answer: Pinentry.Answer
            do throws(Pinentry.Failure) {
                answer = try pinentry.ask(description: "\(who) asks to unlock your keychain.", error: error)
            } catch {
                return "the pinentry could not ask: \(error.description); no display or terminal?"
            }
            guard case .passcode(let passcode) = answer else { return "the person cancelled" }
            switch unlock(passcode) {
            case .success: return nil
            case .failure(.keychain(.authFailed, _)): error = "Wrong passcode"
            case .failure(.unexpected): return "the device did not unlock"
            case .failure(let refusal): error = refusal.sentence
            }
        }
        return "\(Self.attempts) wrong passcodes"
    }
}
