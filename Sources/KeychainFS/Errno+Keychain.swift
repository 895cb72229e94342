import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

extension KeychainError {
    /// The errno the filesystem reports for a core error: the one place the
    /// mapping is written (SPEC, "Errors").
    var errno: Int32 {
        switch self {
        case .itemNotFound, .noSuchKeychain: return ENOENT
        case .duplicateItem: return EEXIST
        case .interactionNotAllowed, .authFailed: return EACCES
        case .missingEntitlement: return EPERM
        case .decode, .io: return EIO
        case .param: return EINVAL
        case .nameTooLong: return ENAMETOOLONG
        case .valueTooLarge: return EFBIG
        // Only removing a group that still holds items is a bad request.
        case .badRequest: return ENOTEMPTY
        case .keychainInUse: return EBUSY
        case .insecurePermissions: return EACCES
        default: return EIO
        }
    }
}

/// A failed filesystem operation: the errno to reply with.
struct FSError: Error {
    let errno: Int32
    init(_ errno: Int32) { self.errno = errno }

    /// The audit log's word for it (``AuditEvent/result(of:)``).
    var auditResult: String {
        switch errno {
        case EPERM: return "denied"
        case EACCES: return "locked"
        case ENOENT: return "absent"
        default: return "error"
        }
    }
    init(_ error: KeychainError) { self.errno = error.errno }
}

/// Runs a core call, turning its error into the errno to reply with.
@inline(__always)
func core<R>(_ body: () throws(KeychainError) -> R) throws(FSError) -> R {
    do {
        return try body()
    } catch {
        throw FSError(error)
    }
}
