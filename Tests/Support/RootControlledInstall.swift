import Foundation

/// The build installed where only root can change it, as the Debian package
/// installs `/usr/bin/keychainfs` (and its position-independent half in
/// `../libexec/keychainfs/`): root's files in root's directories that nobody
/// else can write, under `/opt` (not `/tmp`, which every user may write).
/// pam_keychainfs gives the login password only to a device running such a
/// program (docs/SECURITY.md, "The login password goes only to the device").
/// Removed when the test ends.
package final class RootControlledInstall {
    package let directory: String
    /// The command, as `keychainfs=` in a PAM line names it.
    package var binary: String { directory + "/bin/keychainfs" }

    package init() throws {
        directory = try makeTemporaryDirectory("kcfs-installed", in: "/opt/")
        chmod(directory, 0o755)  // its users run it
        try MountHarness.copyBuild(try MountHarness.builtBinary(), into: directory)
        for path in [directory + "/bin", directory + "/libexec", directory + "/libexec/keychainfs"] {
            chmod(path, 0o755)
        }
    }

    deinit {
        try? FileManager.default.removeItem(atPath: directory)
    }
}
