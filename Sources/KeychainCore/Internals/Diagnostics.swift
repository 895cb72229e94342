#if canImport(Glibc)
import Glibc
#endif

/// Operational messages to standard error. Callers pass only non-secret facts
/// (names of operations, error codes): never a key, value or passcode.
public enum Diagnostics {
    /// Writes one line to standard error.
    public static func log(_ message: String) {
        var line = "keychainfs: " + message + "\n"
        line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
    }
}

/// A failed file operation: logs which operation on which path failed and
/// why (errno's text), and returns ``KeychainError/io`` to throw. Read errno
/// first thing: any later call may change it.
func fileFailure(_ operation: String, _ path: String, errno code: Int32 = Errno.current.rawValue) -> KeychainError {
    Diagnostics.log("cannot \(operation) \(path): \(String(cString: strerror(code)))")
    return .io
}
