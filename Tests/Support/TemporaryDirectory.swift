import Foundation

/// A new directory of this process's user, mode 0700 (mkdtemp(3)): `prefix`
/// and six random characters, in `parent` (the system's temporary directory
/// unless a test needs a particular one).
package func makeTemporaryDirectory(_ prefix: String = "kcfs-test", in parent: String = NSTemporaryDirectory())
    throws -> String
{
    var template = Array((parent + prefix + "-XXXXXX").utf8CString)
    guard let made = mkdtemp(&template) else { throw POSIXError(.EIO) }
    return String(validatingCString: made)!
}
