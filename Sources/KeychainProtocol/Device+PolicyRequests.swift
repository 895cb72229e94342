import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

extension Device {
    /// `grant`, `revoke` and `policy`, for the device's socket and for a
    /// keychain that no device holds (the command line then boots one).
    /// `executable`, when given, is the file a grant names, opened by the
    /// client (which the device might not be able to open by its path).
    /// `opensPaths` false (the service, whose account can read what its
    /// users cannot): a grant must come with its file, and a revoke's path
    /// is taken as the client resolved it; no path of a client's is opened.
    public func answer(
        policyRequest request: PolicyRequest, by subject: AuditSubject?,
        executable file: BorrowedDescriptor? = nil, opensPaths: Bool = true
    ) -> DeviceAnswer {
        let device = self
        do throws(KeychainError) {
            switch request {
            case .grant(let group, let executable, let unit, let uid, let passcode, let allowJIT):
                let program: (path: String, digest: [UInt8])
                switch Self.namedExecutable(executable, file: file, opensPaths: opensPaths) {
                case .success(let named): program = named
                case .failure(let refusal): return .failure(refusal.refusal)
                }
                let rule = EntitlementRule(
                    executable: program.path, digest: program.digest, unit: unit, uid: uid,
                    allowsJIT: allowJIT)
                try device.grant(rule, toGroup: group, passcode: passcode, by: subject)
                return .success(PinnedProgram(executable: rule.executable, digest: rule.digest))
            case .revoke(let group, let executable, let unit, let uid, let all, let passcode):
                // A binary removed since it was granted is named as it was.
                let resolved =
                    opensPaths
                    ? executable.map { path in realpath(path, nil).map { String(cString: $0, freeing: true) } ?? path }
                    : executable
                let count = try device.revoke(
                    group: group, executable: resolved, unit: unit, uid: uid, all: all,
                    passcode: passcode, by: subject)
                return .success(ReplyCount(count))
            case .access(let group, let identifier, let executable, let change, let passcode):
                do throws(KeychainError) {
                    if change == .remove {
                        let count = try device.disallow(
                            executable: executable, group: group, identifier: identifier,
                            passcode: passcode, by: subject)
                        return .success(ReplyCount(count))
                    }
                    let program: (path: String, digest: [UInt8])
                    switch Self.namedExecutable(executable, file: file, opensPaths: opensPaths) {
                    case .success(let named): program = named
                    case .failure(let refusal): return .failure(refusal.refusal)
                    }
                    let claim = ProgramClaim(
                        program: .executable(program.path), digest: program.digest,
                        package: PackageOwnership.package(of: program.path))
                    if change == .claim {
                        try device.claim(
                            group: group, identifier: identifier, for: claim, passcode: passcode, by: subject)
                    } else {
                        try device.allow(claim, group: group, identifier: identifier, passcode: passcode, by: subject)
                    }
                    return .success(PinnedProgram(executable: program.path, digest: claim.digest))
                } catch .badRequest where change == .claim {
                    return .failure(
                        .keychain(
                            .badRequest,
                            "\(group)/\(identifier) belongs to a program already (keychainfs acl shows which)"))
                } catch .badRequest {
                    return .failure(
                        .keychain(
                            .badRequest,
                            "\(group)/\(identifier) belongs to no program (it was made through a mount "
                                + "or the command line): every program of yours may use it; there is no list to change "
                                + "(--claim makes it a program's)"))
                } catch .interactionNotAllowed {
                    return .failure(
                        .keychain(.interactionNotAllowed, "\(group)/\(identifier) is locked: unlock the keychain first")
                    )
                } catch .itemNotFound where change == .remove {
                    return .failure(
                        .keychain(.itemNotFound, "no program at \(executable) is on the list of \(group)/\(identifier)")
                    )
                }
            case .apps(let group, let open, let passcode):
                if let open { try device.setAppsOwnItems(!open, inGroup: group, passcode: passcode, by: subject) }
                return .success(device.appsOwnItems(inGroup: group) ? GroupApps.own : GroupApps.open)
            case .policy(let group):
                let policies = device.entitlementPolicies
                if let group, policies[group] == nil { return .success(PolicyList([])) }
                let groups = group.map { [$0] } ?? policies.keys.sorted()
                return .success(
                    PolicyList(
                        groups.flatMap { group in
                            let rules = policies[group] ?? []
                            // A policy without rules admits no program: shown as a group without a rule.
                            if rules.isEmpty { return [PolicyListing(group: group, rule: nil)] }
                            return rules.map { PolicyListing(group: group, rule: $0) }
                        }
                    ))
            }
        } catch {
            return .failure(.keychain(error, error.description))
        }
    }
}

/// Why an executable a request names cannot be read.
struct ExecutableRefusal: Error {
    let refusal: DeviceRefusal
}

extension Device {
    /// The executable a grant or an access change names: the file the
    /// client passed (opened as the client), else, where the device may
    /// open paths (not the service), the path itself.
    static func namedExecutable(
        _ executable: String, file: BorrowedDescriptor?,
        opensPaths: Bool
    ) -> Result<(path: String, digest: [UInt8]), ExecutableRefusal> {
        if file == nil && !opensPaths {
            return .failure(
                ExecutableRefusal(
                    refusal: .system(
                        EINVAL,
                        "the executable must come with the request, opened by you: "
                            + "the keychainfs service opens no path for a client")))
        }
        let named =
            file.map { ProgramIdentities.executable(from: $0, path: executable) }
            ?? ProgramIdentities.executable(at: executable)
        guard let program = named else {
            return .failure(
                ExecutableRefusal(
                    refusal: .system(
                        ENOENT,
                        "cannot read the executable \(executable) "
                            + "(it must be a regular file the device can read)")))
        }
        return .success((program.path, program.digest))
    }
}

extension String {
    /// A C string malloc'd by the callee (realpath), freed once copied.
    init(cString pointer: UnsafeMutablePointer<CChar>, freeing: Bool) {
        self.init(cString: pointer)
        if freeing { free(pointer) }
    }
}
