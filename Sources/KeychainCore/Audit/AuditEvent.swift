/// Who did something, as the audit log records it (never a value).
public struct AuditSubject: Sendable, Equatable {
    public var pid: Int32
    public var uid: UInt32
    public var executable: String?
    public var unit: String?

    public init(pid: Int32, uid: UInt32, executable: String?, unit: String?) {
        self.pid = pid
        self.uid = uid
        self.executable = executable
        self.unit = unit
    }
}

/// One event of the audit log: an item access or its denial, or a change
/// of the device (lock, unlock, failed unlock, grant, revoke). Names only:
/// never a value or a passcode.
public struct AuditEvent: Sendable, Equatable {
    /// What was asked: `read`, `write`, `create`, `remove`, `rename`,
    /// `set-class`, `list`, `lookup`, `stat`, `xattr`, `lock`, `unlock`,
    /// `grant`, `revoke`.
    public var operation: String
    /// `ok`, `denied` (no entitlement), `locked`, `absent`, `refused`
    /// (wrong passcode or lockout) or `error`.
    public var result: String
    public var group: String?
    public var identifier: String?
    public var subject: AuditSubject?
    /// More about it: a rename's target, a rule's executable.
    public var detail: String?

    public init(
        operation: String, result: String, group: String? = nil, identifier: String? = nil,
        subject: AuditSubject? = nil, detail: String? = nil
    ) {
        self.operation = operation
        self.result = result
        self.group = group
        self.identifier = identifier
        self.subject = subject
        self.detail = detail
    }

    /// The result word for a core error.
    public static func result(of error: KeychainError?) -> String {
        switch error {
        case nil: return "ok"
        case .missingEntitlement?, .ownerDenied?: return "denied"
        case .interactionNotAllowed?: return "locked"
        case .itemNotFound?: return "absent"
        case .authFailed?, .tpmLockedOut?: return "refused"
        default: return "error"
        }
    }
}
