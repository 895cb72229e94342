/// The caller policy (docs/CONTRIBUTING.md, "Where a new piece goes"): what
/// every door (a mount, the socket, the bus) does about a request for a group's
/// items, written once:
/// 1. the group's entitlement policy admits the calling program (read only
///    for a group with a policy);
/// 2. the owner rule (docs/SECURITY.md, "An application's secrets on every
///    door"): an item another program owns is the person's to allow;
/// 3. the act;
/// 4. the entitlement once more, just before the answer leaves: a program
///    that let a tracer or foreign code in meanwhile gets nothing;
/// 5. the audit line: every refusal, with why a granted program was not
///    taken for its executable when that was the reason, and the successes
///    the door records.
/// A door whose request is one act (the socket, the bus) runs all five
/// with ``PasswordManager/policed(_:group:items:verb:recordingSuccess:_:)``;
/// the mount, whose acts are spread over a file's life (lookup, open,
/// read), runs 1 and 2 with ``PasswordManager/admit(_:group:items:verb:)``
/// and 4 with ``PasswordManager/confirm(group:program:)`` where they belong.
package struct PolicyCaller {
    /// The calling program, read when a group's policy asks for it.
    let program: () -> ProgramIdentity?
    /// Who the person is asked about; nil: no question (the Secret Service
    /// asked already, or the request hands out no secret).
    let consent: ConsentCaller?
    /// Records one outcome: its result (``AuditEvent/result(of:)``, or
    /// `ok`), and the doubt about the program when that refused it.
    let record: (_ result: String, _ doubt: String?) -> Void

    package init(
        program: @escaping () -> ProgramIdentity?, consent: ConsentCaller?,
        record: @escaping (_ result: String, _ doubt: String?) -> Void
    ) {
        self.program = program
        self.consent = consent
        self.record = record
    }
}

extension PasswordManager {
    /// Steps 1 and 2, before the act: the group's entitlement, then, with
    /// a `verb`, the owner rule for `items`. A refusal is recorded and thrown.
    package func admit(_ caller: PolicyCaller, group: String, items: [String], verb: String?) throws(KeychainError) {
        var seen: ProgramIdentity?
        do throws(KeychainError) {
            try check(caller, group: group, items: items, verb: verb, seen: &seen)
        } catch {
            caller.record(AuditEvent.result(of: error), error == .missingEntitlement ? seen?.doubt : nil)
            throw error
        }
    }

    /// Step 4, after the act: the entitlement of `program` again,
    /// unrecorded, since the door records the outcome it answers.
    package func confirm(group: String, program: () -> ProgramIdentity?) throws(KeychainError) {
        try localDevice.checkEntitlement(group, program: program)
    }

    /// Steps 1 to 5 around `act`, for a request about `group` (nil: about
    /// no group, such as the list of groups, which is not policed).
    /// `recordingSuccess`: the door records what was done, not only what
    /// was refused.
    package func policed<R>(
        _ caller: PolicyCaller, group: String?, items: [String], verb: String?, recordingSuccess: Bool,
        _ act: () throws(KeychainError) -> R
    ) throws(KeychainError) -> R {
        var seen: ProgramIdentity?
        do throws(KeychainError) {
            if let group { try check(caller, group: group, items: items, verb: verb, seen: &seen) }
            let result = try act()
            if let group { try entitlement(caller, group: group, seen: &seen) }
            if recordingSuccess { caller.record("ok", nil) }
            return result
        } catch {
            caller.record(AuditEvent.result(of: error), error == .missingEntitlement ? seen?.doubt : nil)
            throw error
        }
    }

    /// Steps 1 and 2, unrecorded; `seen`: the program as read, for a refusal's reason.
    private func check(
        _ caller: PolicyCaller, group: String, items: [String], verb: String?, seen: inout ProgramIdentity?
    ) throws(KeychainError) {
        try entitlement(caller, group: group, seen: &seen)
        if let consent = caller.consent, let verb {
            try requireConsent(group: group, identifiers: items, verb: verb, caller: consent)
        }
    }

    /// The group's entitlement for the caller's program, read into `seen`.
    private func entitlement(_ caller: PolicyCaller, group: String, seen: inout ProgramIdentity?) throws(KeychainError)
    {
        try localDevice.checkEntitlement(group) {
            seen = caller.program()
            return seen
        }
    }
}
