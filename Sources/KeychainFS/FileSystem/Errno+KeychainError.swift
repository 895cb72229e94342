import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

extension Errno {
    /// The errno the filesystem reports for a core error: the one place the
    /// mapping is written (docs/FILESYSTEM.md, "Operations and errno").
    init(_ error: KeychainError) {
        switch error {
        case .itemNotFound, .noSuchKeychain: self = .noSuchFile
        case .duplicateItem, .nameConflict: self = .exists
        case .interactionNotAllowed, .authFailed, .tpmLockedOut, .insecurePermissions, .ownerDenied:
            self = .permissionDenied
        case .missingEntitlement: self = .notPermitted
        case .decode, .io: self = .ioError
        case .param: self = .invalidArgument
        case .nameTooLong: self = .nameTooLong
        case .valueTooLarge: self = .fileTooLarge
        // Only removing a group that still holds items is a bad request.
        case .badRequest: self = .notEmpty
        case .keychainInUse: self = .busy
        // write(2)'s word for a quota (POSIX): the old value stays.
        case .quotaExceeded: self = Errno(EDQUOT)
        case .diskFull: self = Errno(ENOSPC)
        case .readOnly: self = Errno(EROFS)
        default: self = .ioError
        }
    }

    /// The audit log's word for it (``AuditEvent/result(of:)``).
    var auditResult: String {
        switch self {
        case .notPermitted: return "denied"
        case .permissionDenied: return "locked"
        case .noSuchFile: return "absent"
        default: return "error"
        }
    }
}

/// Runs a core call, turning its error into the errno to reply with.
@inline(__always)
func core<R>(_ body: () throws(KeychainError) -> R) throws(Errno) -> R {
    do {
        return try body()
    } catch {
        throw Errno(error)
    }
}
