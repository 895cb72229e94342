import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// The `org.freedesktop.Secret.Prompt` objects: an Unlock's passcode prompt.
extension SecretServiceProvider {
    /// `Prompt` (s).
    /// Its reply goes before `Completed`, which the bus thread sends only
    /// once this handler has returned (``BusConnection/perform(_:)``).
    func showPrompt(_ call: BusCall, prompt: UnlockPrompt) throws(BusError) -> EmptyReply {
        guard let program = Pinentry.program() else {
            store.record(
                "unlock-prompt", result: "failed",
                subject: bus.senderProcess(of: call.message).map {
                    ProgramIdentities.subject(process: $0.pid, uid: $0.uid)
                },
                detail: "no pinentry that root installed")
            throw .failed("no pinentry program: install pinentry-curses or pinentry-gnome3, or set KEYCHAINFS_PINENTRY")
        }
        guard prompt.start() else { throw .failed("the prompt is showing already") }
        let sender = bus.senderProcess(of: call.message)
        let path = call.path
        let started = Threads.start { [self] in
            let subject = { sender.map { ProgramIdentities.subject(process: $0.pid, uid: $0.uid) } }
            let failure = prompt.run(program: program, program: sender?.pid) { passcode in
                store.perform(.unlock(passcode: passcode), program: { nil }, subject: subject, audit: .always)
            }
            // The client sees only a dismissed prompt (secret-tool exits 1
            // and says nothing): the log says why.
            if let failure { store.record("unlock-prompt", result: "failed", subject: subject(), detail: failure) }
            let unlocked = failure == nil
            bus.perform { [self] in completePrompt(path, dismissed: !unlocked, objects: unlocked ? prompt.objects : [])
            }
        }
        if started == nil { bus.perform { [self] in completePrompt(path, dismissed: true, objects: []) } }
        return EmptyReply()
    }

    /// `Dismiss` (no arguments).
    func dismissPrompt(_ call: BusCall, prompt: UnlockPrompt) throws(BusError) -> EmptyReply {
        let path = call.path
        if prompt.cancel() == false { bus.perform { [self] in completePrompt(path, dismissed: true, objects: []) } }
        return EmptyReply()
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
