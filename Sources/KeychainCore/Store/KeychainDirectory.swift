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

    /// Whether this process cannot write the keychain's files: a read-only
    /// filesystem (a live system's home, a backup disk mounted read-only) or
    /// a directory or database without write permission. Its device reads
    /// and refuses every change (docs/FILESYSTEM.md, "A read-only keychain").
    public var isReadOnly: Bool {
        for file in [path, databasePath] where access(file, W_OK) != 0 {
            let reason = Errno.current
            if reason == Errno(EROFS) || reason == .permissionDenied { return true }
        }
        return false
    }

    /// Why the keychain's files cannot be trusted, with what to run to fix
    /// it; nil when the directory and every file in it are ours and private.
    /// As `ssh` refuses a private key that others can read: another user who
    /// can write the directory can replace the database or the device secret,
    /// and one who can read them can take both away for an offline attack.
    public func permissionProblem() -> String? {
        let me = geteuid()
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }  // missing: reported as such elsewhere
        if info.st_uid != me {
            return "the keychain directory \(path) belongs to uid \(info.st_uid), not to you (uid \(me))"
        }
        if info.st_mode & 0o077 != 0 {
            return
                "the keychain directory \(path) is accessible to others (mode \(String(info.st_mode & 0o777, radix: 8))); run `chmod 700 \(path)`"
        }
        for file in [
            databasePath, databasePath + "-wal", databasePath + "-shm", deviceSecretPath, lockFilePath,
            path + "/" + AuditLog.fileName, path + "/" + AuditLog.rotatedName
        ] {
            guard lstat(file, &info) == 0 else { continue }
            if info.st_mode & S_IFMT != S_IFREG { return "\(file) is not a regular file" }
            if info.st_uid != me { return "\(file) belongs to uid \(info.st_uid), not to you (uid \(me))" }
            if info.st_mode & 0o077 != 0 {
                return
                    "\(file) is accessible to others (mode \(String(info.st_mode & 0o777, radix: 8))); run `chmod 600 \(file)`"
            }
        }
        return nil
    }

    /// Creates the directory (0700) and any missing parent (0700 too: only
    /// the ones created here; a fresh account has no ~/.local/share yet),
    /// refusing to reuse a keychain.
    func prepareForCreation() throws(KeychainError) {
        if exists { throw .duplicateKeychain }
        var prefix = ""
        for component in path.split(separator: "/") {
            prefix += "/" + component
            do {
                try makeDirectoryUnlessPresent(prefix, mode: 0o700)
            } catch {
                throw fileFailure("create the directory", prefix, errno: error.rawValue)
            }
        }
        // The directory may have existed with looser permissions.
        guard chmod(path, 0o700) == 0 else { throw fileFailure("make private (chmod 700)", path) }
    }

    /// Writes the device secret (its 32 bytes, or as the TPM sealed it:
    /// ``DeviceSecretFile``) under a temporary name and renames it into
    /// place, so that a secret left by an interrupted `init` (no database
    /// yet) is simply replaced by the next one.
    func writeDeviceSecret(_ secret: SecureBytes) throws(KeychainError) {
        try Self.writePrivateFile(secret, at: deviceSecretPath)
    }

    /// Writes `contents` to `path` (mode 0600) under a temporary name,
    /// synced, and renames it into place, durably (a power loss must not
    /// bring back the file from before a move to the TPM).
    package static func writePrivateFile(_ contents: SecureBytes, at path: String) throws(KeychainError) {
        let temporary = path + ".new"
        unlink(temporary)
        guard let fd = FileDescriptor(open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)) else {
            throw fileFailure("create", temporary)
        }
        let written = contents.withUnsafeBytes { write(fd.raw, $0.baseAddress, $0.count) }
        let synced = fsync(fd.raw) == 0 ? 0 : Errno.current.rawValue
        _ = fd.close()  // synced already: what close could report, fsync did
        guard written == contents.count, synced == 0 else {
            let failure = fileFailure(
                "write", temporary, errno: written < 0 ? Errno.current.rawValue : synced == 0 ? EIO : synced)
            unlink(temporary)
            throw failure
        }
        guard rename(temporary, path) == 0 else {
            let failure = fileFailure("rename into place", path)
            unlink(temporary)
            throw failure
        }
        syncParent(of: path)
    }

    /// Makes a rename or creation of `path` durable: fsync of the directory holding it.
    static func syncParent(of path: String) {
        let parent = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        if let fd = FileDescriptor(open(parent.isEmpty ? "/" : parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
            fsync(fd.raw)
        }
    }

    /// The device-secret file as it is: the secret, or the TPM's blob.
    func readDeviceSecretFile() throws(KeychainError) -> DeviceSecretFile {
        try Self.readSealedFile(at: deviceSecretPath)
    }

    /// A file in the device-secret file's format (``DeviceSecretFile``):
    /// the device secret, or the TPM lockout auth (``TPMLockoutHierarchy``).
    package static func readSealedFile(at path: String) throws(KeychainError) -> DeviceSecretFile {
        guard let fd = FileDescriptor(open(path, O_RDONLY | O_CLOEXEC)) else {
            Diagnostics.log("\(path) is missing")
            throw Errno.current.rawValue == ENOENT ? .decode : .io
        }
        let buffer = try SecureBytes(count: DeviceSecretFile.maximumSize + 1)
        let count = read(fd.raw, buffer.mutableBytes.baseAddress, DeviceSecretFile.maximumSize + 1)
        guard count > 0, count <= DeviceSecretFile.maximumSize else {
            Diagnostics.log("\(path) is damaged")
            throw .decode
        }
        let contents = try buffer.withUnsafeBytes { (bytes) throws(KeychainError) in
            try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: bytes.prefix(count)))
        }
        return try DeviceSecretFile(contents)
    }

    /// The device secret, unsealed by the TPM at `tcti` when it is sealed;
    /// with the TPM that sealed it (nil: kept in the file), pinned to the
    /// storage key it is sealed under. A file sealed before that key's name
    /// was recorded gets it now (trusted on this first use, as at `init`).
    /// Only for the holder of the keychain's lock (a device, `recover`).
    package func openDeviceSecret(tcti: String?, keyProtectors: any KeyProtectors) throws(KeychainError)
        -> (DeviceSecret, sealedBy: (any KeyProtector)?)
    {
        switch try readDeviceSecretFile() {
        case .plain(let secret):
            return (DeviceSecret(secret: secret), nil)
        case .sealed(let blob, let pinned, let throughService):
            let sealer = keyProtectors.sealedBy(tcti: tcti, storageKey: pinned, throughService: throughService)
            let (secret, storageKey) = try sealer.unsealDeviceSecret(blob)
            if pinned == nil {
                try writeDeviceSecret(try DeviceSecretFile.sealedContents(blob, storageKey: storageKey))
            }
            return (
                DeviceSecret(secret: secret),
                keyProtectors.sealedBy(tcti: tcti, storageKey: storageKey, throughService: throughService)
            )
        }
    }

    /// How the keychain's device secret is kept (read from its file, no TPM asked).
    public func keyProtection() throws(KeychainError) -> KeyProtection {
        guard case .sealed(_, _, let throughService) = try readDeviceSecretFile() else { return .file }
        return throughService ? .tpm2Service : .tpm2
    }

    /// The device secret's 32 bytes (unsealed by the TPM when it is sealed).
    package func readDeviceSecret(tcti: String?, keyProtectors: any KeyProtectors) throws(KeychainError) -> SecureBytes
    {
        switch try readDeviceSecretFile() {
        case .plain(let secret): return secret
        case .sealed(let blob, let pinned, let throughService):
            return try keyProtectors.sealedBy(tcti: tcti, storageKey: pinned, throughService: throughService)
                .unsealDeviceSecret(blob).secret
        }
    }
}

/// Room kept on the keychain's filesystem for a removal: on a full disk a
/// removal needs space too (SQLite's log grows before the database
/// shrinks), and it is what a person does to free some. The device keeps
/// ``spaceReserveBytes`` allocated in `KEYCHAIN/space-reserve` (made at boot
/// and after a removal used it, when there is room), and a removal that
/// meets a full disk gives it up and tries once more.
extension KeychainDirectory {
    static let spaceReserveName = "space-reserve"
    /// A few removals' worth of log frames (4 KiB pages).
    static let spaceReserveBytes = 256 << 10

    private var spaceReservePath: String { path + "/" + Self.spaceReserveName }

    /// Allocates the reserve when it is not there (posix_fallocate: blocks
    /// really taken, not a sparse file); where there is no room for it, none.
    func keepSpaceReserve() {
        guard access(spaceReservePath, F_OK) != 0,
            let fd = FileDescriptor(open(spaceReservePath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600))
        else { return }
        if posix_fallocate(fd.raw, 0, off_t(Self.spaceReserveBytes)) != 0 { unlink(spaceReservePath) }
    }

    /// Gives the reserve up for a removal on a full disk; whether there was one.
    func releaseSpaceReserve() -> Bool {
        unlink(spaceReservePath) == 0
    }
}
