internal import CLinux
import KeychainCore
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

/// The system account the keychainfs service runs as (the package's
/// sysusers.d entry makes it): the only one that can read the state directory.
public enum ServiceAccount {
    /// The locked memory every user's requests share: what the unit sets
    /// (`LimitMEMLOCK=128M`), and what the service raises itself to, as
    /// root, when it was started without systemd (`--daemon` inherits a
    /// shell's 8 MiB, which one user's flood of large requests filled).
    public static let lockedMemory: UInt64 = 128 << 20

    /// Raises RLIMIT_MEMLOCK to ``lockedMemory`` where it is lower (before
    /// the service leaves root); a sentence for the log when it stays lower.
    public static func raiseLockedMemory() -> String? {
        let now = CLinux_raise_locked_memory(lockedMemory)
        guard now < lockedMemory else { return nil }
        return "the service's locked memory is limited to \(now >> 20) MiB (RLIMIT_MEMLOCK), which its users' "
            + "large requests share: past it they are refused; raise it to 128 MiB (LimitMEMLOCK=128M, or "
            + "`ulimit -l 131072` before `service --daemon`)"
    }

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
        if let failed = becomeAccount(uid: uid, gid: gid) {
            throw MountError("cannot become \(name): \(failed.description)")
        }
    }

    /// CAP_SYS_PTRACE (linux/capability.h): what the kernel asks of a
    /// reader of another user's /proc/PID/maps, exe and ns/user
    /// (ptrace_may_access, PTRACE_MODE_READ_FSCREDS), the files by which
    /// the service tells who its callers are.
    private static let keptCapability: Int32 = 19
    /// _LINUX_CAPABILITY_VERSION_3.
    private static let capabilityVersion: UInt32 = 0x2008_0522

    /// Becomes `uid` and `gid`, keeping only ``keptCapability``: every
    /// other capability leaves the bounding set first (which needs
    /// CAP_SETPCAP, still held), the supplementary groups go, the ids
    /// change with the capabilities kept across (PR_SET_KEEPCAPS), the
    /// permitted and effective sets become the one capability, and no
    /// program it could run gains privileges (PR_SET_NO_NEW_PRIVS). The
    /// first failure's errno, or nil.
    private static func becomeAccount(uid: uid_t, gid: gid_t) -> Errno? {
        for capability in Int32(0)...63 where capability != keptCapability {
            // EINVAL: a capability this kernel does not have.
            if CLinux_prctl(PR_CAPBSET_DROP, UInt(capability)) != 0 && Errno.current.rawValue != EINVAL {
                return .current
            }
        }
        guard CLinux_prctl(PR_SET_KEEPCAPS, 1) == 0, setgroups(0, nil) == 0, setresgid(gid, gid, gid) == 0,
            setresuid(uid, uid, uid) == 0
        else { return .current }
        var header = CLinux_capability_header(version: capabilityVersion, pid: 0)
        var data = [CLinux_capability_data](repeating: CLinux_capability_data(), count: 2)
        data[0].effective = 1 << UInt32(keptCapability)
        data[0].permitted = data[0].effective
        guard CLinux_capset(&header, &data) == 0, CLinux_prctl(PR_SET_KEEPCAPS, 0) == 0,
            CLinux_prctl(PR_SET_NO_NEW_PRIVS, 1) == 0
        else { return .current }
        return nil
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
    public static var canIdentifyCallers: Bool {
        var header = CLinux_capability_header(version: capabilityVersion, pid: 0)
        var data = [CLinux_capability_data](repeating: CLinux_capability_data(), count: 2)
        return CLinux_capget(&header, &data) == 0 && data[0].effective >> UInt32(keptCapability) & 1 != 0
    }
}
