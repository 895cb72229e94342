import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Per-group entitlement policies: who may use a group, granted and
/// revoked with the passcode.
extension Device {
    /// The programs allowed to use `group`; nil when the group has no
    /// policy (every program of the user may use it).
    public func entitlementRules(forGroup group: String) -> [EntitlementRule]? {
        entitlements.withLock { $0.groups[group] }
    }

    /// The groups whose policy admits `program`, whether they exist yet or
    /// not; `program` is read only when some group has a policy.
    public func policedGroups(admitting program: () -> ProgramIdentity?) -> Set<String> {
        let policies = entitlements.withLock { $0.groups }
        guard !policies.isEmpty, let program = program() else { return [] }
        return Set(policies.filter { $0.value.contains { $0.admits(program) } }.keys)
    }

    /// Whether `group` has a policy (its items are then checked per caller).
    public func hasEntitlementPolicy(_ group: String) -> Bool {
        entitlements.withLock { $0.groups[group] != nil }
    }

    /// Whether any group has a policy.
    public var hasEntitlementPolicies: Bool { entitlements.withLock { !$0.groups.isEmpty } }

    /// Every group's rules.
    public var entitlementPolicies: [String: [EntitlementRule]] { entitlements.withLock { $0.groups } }

    /// ``KeychainError/missingEntitlement`` unless `program` may use
    /// `group`: the group has no policy, or one of its rules admits the
    /// program. `program` nil (it could not be identified) is admitted
    /// only by a group without a policy.
    public func checkEntitlement(_ group: String, program: () -> ProgramIdentity?) throws(KeychainError) {
        guard let rules = entitlementRules(forGroup: group) else { return }
        guard let program = program(), rules.contains(where: { $0.admits(program) }) else { throw .missingEntitlement }
    }

    /// Allows the program of `rule` to use `group` (giving the group a
    /// policy if it had none). Needs the passcode, as changing a macOS
    /// keychain's access control needs the keychain password: a program
    /// running as the user cannot grant itself. Granting a rule the group
    /// already has changes nothing.
    public func grant(
        _ rule: EntitlementRule, toGroup group: String, passcode: SecureBytes?,
        by subject: AuditSubject? = nil
    ) throws(KeychainError) {
        try ItemLimits.validate(name: group)
        guard rule.digest.count == ExecutableDigest.size, rule.executable.hasPrefix("/") else { throw .param }
        let detail =
            rule.executable + " sha256=" + rule.digestHex + (rule.unit.map { " unit=" + $0 } ?? "")
            + (rule.allowsJIT ? " allow-jit" : "")
            + (rule.uid.map { " uid=\($0)" } ?? "")
        _ = try audited("grant", group: group, detail: detail, by: subject) { () throws(KeychainError) in
            try changeEntitlements(group, passcode: passcode) { policy in
                var rules = policy.groups[group] ?? []
                // A new grant of the same program (a rebuilt binary) replaces its digest.
                rules.removeAll { $0.namesSameProgram(as: rule) }
                rules.append(rule)
                policy.groups[group] = rules
                return 1
            }
        }
    }

    /// Removes the rules of `group` that name `executable` (and `unit` and
    /// `uid`, when given); `all` removes the group's policy itself, which
    /// opens the group to every program again. Removing the last rule
    /// leaves a policy that admits no program. Needs the passcode. Returns
    /// how many rules were removed.
    @discardableResult
    public func revoke(
        group: String, executable: String?, unit: String?, uid: UInt32?, all: Bool,
        passcode: SecureBytes?, by subject: AuditSubject? = nil
    ) throws(KeychainError) -> Int {
        let detail =
            all
            ? "all"
            : [executable, unit.map { "unit=" + $0 }, uid.map { "uid=\($0)" }].compactMap { $0 }
                .joined(separator: " ")
        return try audited("revoke", group: group, detail: detail, by: subject) { () throws(KeychainError) -> Int in
            try changeEntitlements(group, passcode: passcode) { policy throws(KeychainError) -> Int in
                guard let rules = policy.groups[group] else { throw .itemNotFound }
                if all {
                    policy.groups[group] = nil
                    return rules.count
                }
                let kept = rules.filter { !$0.matches(executable: executable, unit: unit, uid: uid) }
                guard kept.count < rules.count else { throw .itemNotFound }
                policy.groups[group] = kept
                return rules.count - kept.count
            }
        }
    }

    func changeEntitlements(
        _ group: String, passcode: SecureBytes?,
        _ change: (inout EntitlementPolicy) throws(KeychainError) -> Int
    ) throws(KeychainError) -> Int {
        let count = try withPasscode(passcode) { () throws(KeychainError) -> Int in
            var policy = entitlements.withLock { $0 }
            let count = try change(&policy)
            try writePolicy(policy)
            saveAuditAnchor()
            entitlements.withLock { $0 = policy }
            return count
        }
        bumpRollbackCounter("policy change")
        notify(.entitlementsChanged(group: group))
        return count
    }

    // MARK: An item's access list (docs/SECRET-SERVICE.md, "Whose an item is")

    /// Puts `program` on the access list of an item that has an owner
    /// (`keychainfs acl --add`), as the person's "Always allow" does. Needs
    /// the passcode, as `grant` does: a program of the user cannot add itself.
    public func allow(
        _ program: ProgramClaim, group: String, identifier: String, passcode: SecureBytes?,
        by subject: AuditSubject? = nil
    ) throws(KeychainError) {
        try audited(
            "acl-add", group: group,
            detail: identifier + " " + program.program.encoded + " sha256=" + program.digestHex,
            by: subject
        ) { () throws(KeychainError) in
            try withPasscode(passcode) { () throws(KeychainError) in
                try PasswordManager(device: self).allow(program, forIdentifier: identifier, inGroup: group)
            }
        }
    }

    /// Takes every program at `executable` off an item's access list
    /// (`keychainfs acl --remove`); returns how many. Needs the passcode.
    @discardableResult
    public func disallow(
        executable: String, group: String, identifier: String, passcode: SecureBytes?,
        by subject: AuditSubject? = nil
    ) throws(KeychainError) -> Int {
        try audited("acl-remove", group: group, detail: identifier + " " + executable, by: subject) {
            () throws(KeychainError) -> Int in
            try withPasscode(passcode) { () throws(KeychainError) -> Int in
                try PasswordManager(device: self).disallow(
                    executable: executable, forIdentifier: identifier, inGroup: group)
            }
        }
    }

    /// Makes an item of no program `program`'s (`keychainfs acl --claim`):
    /// an item imported from another provider, or made through a mount or
    /// the command line, then answers over the bus as if `program` had made
    /// it. Needs the passcode. ``KeychainError/badRequest`` when it has an owner.
    public func claim(
        group: String, identifier: String, for program: ProgramClaim, passcode: SecureBytes?,
        by subject: AuditSubject? = nil
    ) throws(KeychainError) {
        try audited(
            "acl-claim", group: group,
            detail: identifier + " " + program.program.encoded + " sha256=" + program.digestHex,
            by: subject
        ) { () throws(KeychainError) in
            try withPasscode(passcode) { () throws(KeychainError) in
                try PasswordManager(device: self).claim(identifier, inGroup: group, for: program)
            }
        }
    }

    /// Whether the programs that make items of `group` over the bus own
    /// them (the default), or the group's items are every program's
    /// (`keychainfs policy GROUP --apps open`, gnome-keyring's way).
    public func appsOwnItems(inGroup group: String) -> Bool {
        !entitlements.withLock { $0.appsOpen.contains(group) }
    }

    /// Opens `group`'s items to every program over the bus, or gives them
    /// back to their owners. Needs the passcode; the owners recorded stay.
    public func setAppsOwnItems(
        _ own: Bool, inGroup group: String, passcode: SecureBytes?,
        by subject: AuditSubject? = nil
    ) throws(KeychainError) {
        try ItemLimits.validate(name: group)
        _ = try audited("apps", group: group, detail: own ? "own" : "open", by: subject) {
            () throws(KeychainError) -> Int in
            try changeEntitlements(group, passcode: passcode) { policy in
                if own { policy.appsOpen.remove(group) } else { policy.appsOpen.insert(group) }
                return 1
            }
        }
    }
}
