import Foundation
import KeychainCore

/// An ordinary (non-root) account made for one test and removed with every
/// process it left when the test ends: attacks are run as the user whose
/// keychain they target, as a real attacker of the same user would.
package final class OrdinaryUser: @unchecked Sendable {
    package let name: String
    package let uid: uid_t
    package let gid: gid_t
    package let home: String

    package init() throws {
        // Its mounts need /dev/fuse as a desktop has it.
        MachineFixtures.fuseOpenToEveryone()
        name = "kcfs\(UInt32.random(in: 100_000...999_999_999))"
        let made = Spawn.run(["/usr/sbin/useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name])
        guard made == 0, let entry = getpwnam(name) else {
            throw HarnessError("useradd \(name) failed: status \(made)")
        }
        uid = entry.pointee.pw_uid
        gid = entry.pointee.pw_gid
        home = String(cString: entry.pointee.pw_dir)
    }

    deinit {
        // Its device and anything an attack left running, then the account.
        _ = Spawn.run(["/usr/bin/pkill", "-KILL", "-u", name])
        _ = Spawn.run(
            ["/usr/sbin/userdel", "--remove", name],
            options: {
                var quiet = Spawn.Options()
                quiet.nullStandardStreams = true  // "mail spool not found"
                return quiet
            }())
    }

    /// Gives `path` (and, for a directory, everything in it) to this user.
    package func own(_ path: String) throws {
        guard Spawn.run(["/bin/chown", "-R", "\(uid):\(gid)", path]) == 0 else {
            throw HarnessError("chown of \(path) to \(name) failed")
        }
    }
}
