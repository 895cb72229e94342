internal import CLinux
import KeychainCore
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

/// The system account the keychainfs service runs as (the package's
/// sysusers.d entry makes it): the only one that can read the state directory.
public enum ServiceAccount {
    /// The account's name.
    public static let defaultName = "keychainfs"

    /// Started as root (without systemd, or by a unit without `User=`):
    /// makes the state directory the account's (mode 0700) and becomes the
    /// account, keeping CAP_SYS_PTRACE only (to identify callers).
    public static func become(_ name: String, stateDirectory: String) throws(MountError) {
        guard let entry = getpwnam(name) else {
            throw MountError(
                "no account \(name): install the keychainfs package, whose sysusers.d entry makes it, or run: systemd-sysusers with that entry (scripts/debian/keychainfs.sysusers)"
            )
        }
        let uid = entry.pointee.pw_uid, gid = entry.pointee.pw_gid
        guard uid != 0 else { throw MountError("the service must not run as root (\(name) is uid 0)") }
        do {
            try makeDirectoryUnlessPresent(stateDirectory, mode: 0o700)
        } catch {
            throw MountError("cannot create \(stateDirectory): \(error)")
        }
        var info = stat()
        guard lstat(stateDirectory, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
            throw MountError("\(stateDirectory) is not a directory")
        }
        guard chown(stateDirectory, uid, gid) == 0, chmod(stateDirectory, 0o700) == 0 else {
            throw MountError("cannot give \(stateDirectory) to \(name): \(Errno.current.description)")
        }
        guard CLinux_become_service_account(uid, gid) == 0 else {
            throw MountError("cannot become \(name): \(Errno.current.description)")
        }
    }

    /// Why the state directory cannot hold the users' keychains (nil: it is
    /// ours and private).
    public static func stateDirectoryProblem(_ path: String) -> String? {
        var info = stat()
        guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
            return "the state directory \(path) does not exist"
        }
        if info.st_uid != geteuid() {
            return "the state directory \(path) belongs to uid \(info.st_uid), not to the service (uid \(geteuid()))"
        }
        if info.st_mode & 0o077 != 0 { return "the state directory \(path) is open to others; run `chmod 700 \(path)`" }
        return nil
    }

    /// Why the directory of the service's socket cannot hold it (nil: it
    /// is root's or the account's, and no one else may write it). In a
    /// directory another user can write, that user could put their own
    /// socket in the service's place and hear every client's passcodes.
    public static func socketDirectoryProblem(_ path: String, account: String) -> String? {
        var info = stat()
        guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
            return "the socket's directory \(path) is not a directory"
        }
        let accountUID = getpwnam(account).map { $0.pointee.pw_uid }
        if info.st_uid != 0 && info.st_uid != accountUID && info.st_uid != geteuid() {
            return
                "the socket's directory \(path) belongs to uid \(info.st_uid): use a directory of root's or \(account)'s"
        }
        if info.st_mode & 0o022 != 0 {
            return "the socket's directory \(path) can be written by others; run `chmod go-w \(path)`"
        }
        return nil
    }

    /// Whether the service can read other users' /proc/PID/maps and exe
    /// (CAP_SYS_PTRACE): without it, no caller of a policed group can be
    /// identified, and every one is refused.
    public static var canIdentifyCallers: Bool { CLinux_can_read_other_users_processes() != 0 }
}
