#if canImport(Glibc)
import Glibc
#endif

/// The files of one keychain: a directory (mode 0700) holding the SQLite
/// database, the device secret and the lock file that marks the one process
/// holding the keychain's keys.
public struct KeychainDirectory: Sendable, Equatable {
    /// The directory's path.
    public let path: String

    /// Names the keychain at `path` (nothing is read or created).
    public init(path: String) {
        self.path = path.count > 1 && path.hasSuffix("/") ? String(path.dropLast()) : path
    }

    var databasePath: String { path + "/keychain.db" }
    var deviceSecretPath: String { path + "/device-secret" }
    /// The file the running device holds an exclusive flock on; released by the kernel when it dies.
    public var lockFilePath: String { path + "/device.lock" }

    /// `$XDG_DATA_HOME/keychainfs`, or `~/.local/share/keychainfs` (XDG Base Directory spec).
    public static func defaultLocation() -> KeychainDirectory {
        if let data = getenv("XDG_DATA_HOME").map({ String(cString: $0) }), data.hasPrefix("/") {
            return KeychainDirectory(path: data + "/keychainfs")
        }
        let home = getenv("HOME").map { String(cString: $0) } ?? "/"
        return KeychainDirectory(path: home + "/.local/share/keychainfs")
    }

    /// Whether a keychain has been created here.
    public var exists: Bool { access(databasePath, F_OK) == 0 }

    /// Creates the directory (0700) if needed, refusing to reuse a keychain.
    func prepareForCreation() throws(KeychainError) {
        if exists { throw .duplicateKeychain }
        if mkdir(path, 0o700) != 0 && errno != EEXIST { throw .io }
        // The directory may have existed with looser permissions.
        guard chmod(path, 0o700) == 0 else { throw .io }
    }

    /// Writes the device secret under a temporary name and renames it into
    /// place, so that a secret left by an interrupted `init` (no database yet)
    /// is simply replaced by the next one.
    func writeDeviceSecret(_ secret: SecureBytes) throws(KeychainError) {
        let temporary = deviceSecretPath + ".new"
        unlink(temporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .io }
        let written = secret.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        let synced = fsync(fd) == 0
        close(fd)
        guard written == secret.count, synced, rename(temporary, deviceSecretPath) == 0 else {
            unlink(temporary)
            throw .io
        }
    }

    func readDeviceSecret() throws(KeychainError) -> SecureBytes {
        let fd = open(deviceSecretPath, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            Diagnostics.log("the keychain's device secret is missing at \(deviceSecretPath)")
            throw errno == ENOENT ? .decode : .io
        }
        defer { close(fd) }
        let secret = try SecureBytes(count: Crypto.keySize)
        let count = read(fd, secret.mutableBytes.baseAddress, Crypto.keySize + 1)
        guard count == Crypto.keySize else {
            Diagnostics.log("the keychain's device secret is damaged")
            throw .decode
        }
        return secret
    }
}
