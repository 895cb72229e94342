import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct WatchCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Print the device's events as they happen (a mount's .events file, or the keychain's device).",
        discussion: """
            One line per event, fields separated by tabs (names escaped as in status lines): \
            the state first (locked or unlocked), then will-lock SECONDS, locked, unlocked, written \
            GROUP ID, removed GROUP ID, renamed GROUP FROM TO, group-created GROUP, group-removed \
            GROUP, policy GROUP; overflow when a slow reader missed some. Never a value. Events of \
            every client of the device are seen (mounts, the command line, the library); item \
            changes of a group with an entitlement policy only by programs it admits. Without a \
            mount point the keychain's device is followed (started if none runs). Runs until \
            interrupted; exits 1 when the mount or the device goes away.
            """
    )

    @OptionGroup var target: MountpointOrKeychain

    func run() throws {
        guard let mount = target.mount else {
            let device = try target.device()
            guard let followed = try device.follow(.watch) else { throw DeviceAccess.noAnswer() }
            try device.answer(followed.outcome, about: .action("cannot watch"))
            try copyToOutput(followed.connection.borrowed, ended: "the device went away")
            return
        }
        guard let fd = FileDescriptor(open(mount.path + "/.events", O_RDONLY | O_CLOEXEC)) else {
            let reason = Errno.current.rawValue
            if MountControlFile.text(mount.path) == nil { throw fail(mount.missingControl) }
            throw fail("cannot read the events of \(mount.path): \(String(cString: strerror(reason)))")
        }
        try copyToOutput(fd.borrowed, ended: "the mount went away")
    }

    /// Copies event lines to standard output until `fd` ends (an error
    /// saying `ended`) or the reader of our output goes away (done).
    private func copyToOutput(_ fd: BorrowedDescriptor, ended: String) throws {
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let count: Int
            do throws(Errno) {
                count = try buffer.withMutableBytes { (raw) throws(Errno) in try fd.read(into: raw) }
            } catch {
                throw fail(error.description)
            }
            guard count > 0 else { throw fail(ended) }
            guard
                buffer.withUnsafeBytes({
                    (try? BorrowedDescriptor.standardOutput.writeAll(UnsafeRawBufferPointer(rebasing: $0[0..<count])))
                        != nil
                })
            else {
                return
            }
        }
    }
}
