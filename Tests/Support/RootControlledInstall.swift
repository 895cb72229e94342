import Foundation
import KeychainCore

/// The build installed where only root can change it, as the Debian package
/// installs `/usr/bin/keychainfs` (and its position-independent half in
/// `../libexec/keychainfs/`, and the device build in
/// `../libexec/keychainfs/device/`, setgid to a group that owns nothing):
/// root's files in root's directories that nobody else can write, under
/// `/opt` (not `/tmp`, which every user may write). pam_keychainfs gives the
/// login password only to a device running such a program, started setgid
/// (docs/SECURITY.md, "The login password and the session", its row "the login password goes only to the device", "A
/// device undumpable from its first instruction"). The device build's group
/// is made for the install, as the package makes `keychainfs-device`.
/// Removed, with the group, when the test ends.
package final class RootControlledInstall {
    package let directory: String
    /// The group the device build is setgid to.
    package let deviceGroup: String
    package let deviceGID: gid_t
    /// The command, as `keychainfs=` in a PAM line names it.
    package var binary: String { directory + "/bin/keychainfs" }
    /// The device build, setgid to ``deviceGroup``.
    package var deviceBuild: String { directory + "/libexec/keychainfs/device/keychainfs" }

    package init() throws {
        deviceGroup = "kcfsdev\(UInt32.random(in: 100_000...999_999_999))"
        guard Spawn.run(["/usr/sbin/groupadd", "--system", deviceGroup]) == 0, let group = getgrnam(deviceGroup) else {
            throw HarnessError("groupadd \(deviceGroup) failed")
        }
        deviceGID = group.pointee.gr_gid
        directory = try makeTemporaryDirectory("kcfs-installed", in: "/opt/")
        chmod(directory, 0o755)  // its users run it
        let built = try MountHarness.builtBinary()
        try MountHarness.copyBuild(built, into: directory)
        let manager = FileManager.default
        try manager.createDirectory(atPath: directory + "/libexec/keychainfs/device", withIntermediateDirectories: true)
        let served = directory + "/libexec/keychainfs/keychainfs"
        try manager.copyItem(atPath: manager.isExecutableFile(atPath: served) ? served : built, toPath: deviceBuild)
        for path in [
            directory + "/bin", directory + "/libexec", directory + "/libexec/keychainfs",
            directory + "/libexec/keychainfs/device"
        ] {
            chmod(path, 0o755)
        }
        // As dpkg-statoverride sets it: root's, the group's, setgid.
        guard chown(deviceBuild, 0, deviceGID) == 0, chmod(deviceBuild, 0o2755) == 0 else {
            throw HarnessError("cannot make \(deviceBuild) setgid")
        }
    }

    deinit {
        try? FileManager.default.removeItem(atPath: directory)
        _ = Spawn.run(["/usr/sbin/groupdel", deviceGroup])
    }
}
