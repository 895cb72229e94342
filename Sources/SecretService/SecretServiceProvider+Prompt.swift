import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// The `org.freedesktop.Secret.Prompt` objects: an Unlock's passcode prompt.
extension SecretServiceProvider {
    /// `Prompt` (s).
    func showPrompt(_ call: BusCall, prompt: UnlockPrompt) throws(BusError) {
        guard let program = Pinentry.program() else {
            store.record(
                "unlock-prompt", result: "failed",
                subject: bus.senderProcess(of: call.message).map {
                    ProgramIdentities.subject(thread: $0.pid, uid: $0.uid)
                },
                detail: "no pinentry that root installed")
            throw .failed("no pinentry program: install pinentry-curses or pinentry-gnome3, or set KEYCHAINFS_PINENTRY")
        }
        guard prompt.start() else { throw .failed("the prompt is showing already") }
        let sender = bus.senderProcess(of: call.message)
        let path = call.path
        try bus.reply(to: call.message) { _ throws(BusError) in }
        let started = Threads.start { [self] in
            let subject = { sender.map { ProgramIdentities.subject(thread: $0.pid, uid: $0.uid) } }
            let failure = prompt.run(program: program, program: sender?.pid) { passcode in
                store.perform(.unlock(passcode: passcode), program: { nil }, subject: subject, audit: .always)
            }
            // The client sees only a dismissed prompt (secret-tool exits 1
            // and says nothing): the log says why (issue 39).
            if let failure { store.record("unlock-prompt", result: "failed", subject: subject(), detail: failure) }
            let unlocked = failure == nil
            bus.perform { [self] in completePrompt(path, dismissed: !unlocked, objects: unlocked ? prompt.objects : [])
            }
        }
        if started == nil { completePrompt(path, dismissed: true, objects: []) }
    }

    /// `Dismiss` (no arguments).
    func dismissPrompt(_ call: BusCall, prompt: UnlockPrompt) throws(BusError) {
        try bus.reply(to: call.message) { _ throws(BusError) in }
        if prompt.cancel() == false { completePrompt(call.path, dismissed: true, objects: []) }
    }

    /// The spec's Completed(dismissed, result): the objects unlocked.
    func completePrompt(_ path: String, dismissed: Bool, objects: [String]) {
        guard prompts.removeValue(forKey: path) != nil else { return }
        bus.emit(path: path, interface: Self.promptInterface, member: "Completed") { (signal) throws(BusError) in
            try signal.bool(dismissed)
            try signal.variant(.objectPaths(objects))
        }
    }
}
