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
