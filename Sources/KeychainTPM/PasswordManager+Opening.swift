import KeychainCore
import KeychainProtocol
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// The library's calls that open a keychain (README.md, "The Swift library"): through its
// running device over the wire protocol (KeychainProtocol's
// ``DeviceConnection``, the core's ``RemoteKeychain``), else a device booted
// in this process with this machine's TPM (``TPMKeyProtectors``). Here, the
// one target that sees both.
extension PasswordManager {
    /// The keychain at `directory` (an absolute path, as the device was
    /// given): through its running device when one holds it, otherwise by
    /// booting its device in this process (locked, before first unlock).
    public static func open(_ directory: KeychainDirectory = .defaultLocation()) throws(KeychainError)
        -> PasswordManager
    {
        if let connection = DeviceConnection(keychain: directory) {
            return PasswordManager(remote: connection)
        }
        return PasswordManager(device: try Device(directory: directory))
    }

    // MARK: Shared instance

    private static let sharedInstance = Mutex<PasswordManager?>(nil)

    /// The process-wide manager over the default keychain, opened on first
    /// use: this user's keychain in the service where one is installed and
    /// `$KEYCHAINFS_KEYCHAIN` names no other (``openService(at:)``), else
    /// `$XDG_DATA_HOME/keychainfs` (``open(_:)``).
    public static func shared() throws(KeychainError) -> PasswordManager {
        try sharedInstance.withLock { (instance: inout PasswordManager?) throws(KeychainError) -> PasswordManager in
            if let instance { return instance }
            let named = getenv("KEYCHAINFS_KEYCHAIN").map { String(cString: $0) } ?? ""
            let made = try named.isEmpty && ServicePaths.socket() != nil ? openService() : open(.defaultLocation())
            instance = made
            return made
        }
    }

    /// Drops the shared instance (its keys are wiped once no one holds it).
    public static func dropShared() {
        sharedInstance.withLock { $0 = nil }
    }
}
