import Foundation
import KeychainCore
import Synchronization

/// What some tests need of the machine beyond the repository, which
/// ./scripts/setup does not make (it changes nothing outside the
/// repository): made by the first test that needs it, the way the package
/// makes it, and undone when the test process exits.
package enum MachineFixtures {
    /// Whether something accepts TCP connections on 127.0.0.1:`port` now
    /// (a server a test started: swtpm, sshd).
    package static func loopbackAccepts(port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }

    /// The repository these tests belong to.
    package static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent()
        .deletingLastPathComponent().path

    /// The ELF type of the executable at `path` (elf(5): e_type, a
    /// little-endian UInt16 at offset 16): ``fixedAddresses`` or
    /// ``positionIndependent``; nil when unreadable.
    package static func elfType(_ path: String) -> UInt16? {
        guard let handle = FileHandle(forReadingAtPath: path),
            let header = try? handle.read(upToCount: 18), header.count == 18
        else { return nil }
        return UInt16(header[16]) | UInt16(header[17]) << 8
    }
    package static let fixedAddresses: UInt16 = 2  // ET_EXEC
    package static let positionIndependent: UInt16 = 3  // ET_DYN

    /// The undoing of each change made, run at exit in reverse order.
    private static let undo = Mutex<[[String]]>([])

    private static func registerUndo(_ command: [String]) {
        undo.withLock { steps in
            if steps.isEmpty { atexit { MachineFixtures.undoAll() } }
            steps.append(command)
        }
    }

    private static func undoAll() {
        for command in undo.withLock({ $0 }).reversed() {
            var quiet = Spawn.Options()
            quiet.nullStandardStreams = true
            _ = Spawn.run(command, options: quiet)
        }
    }

    /// Service mode's account, made from the package's own sysusers.d
    /// entry (scripts/debian/keychainfs.sysusers) when the machine has none.
    package static func serviceAccount() throws {
        try serviceAccountMade.get()
    }

    private static let serviceAccountMade: Result<Void, HarnessError> = {
        guard getpwnam("keychainfs") == nil else { return .success(()) }
        // The same file makes the device build's group: undone too when it is made here.
        let hadDeviceGroup = getgrnam("keychainfs-device") != nil
        let sysusers = repository + "/scripts/debian/keychainfs.sysusers"
        let status = Spawn.run(["/usr/bin/systemd-sysusers", sysusers])
        guard status == 0, getpwnam("keychainfs") != nil else {
            return .failure(
                HarnessError("systemd-sysusers \(sysusers) did not make the keychainfs account: status \(status)"))
        }
        registerUndo(["/usr/sbin/userdel", "keychainfs"])
        if !hadDeviceGroup { registerUndo(["/usr/sbin/groupdel", "keychainfs-device"]) }
        return .success(())
    }()

    /// /dev/fuse open to every user, as the kernel creates it (mode 0666,
    /// fs/fuse/dev.c) and udev leaves it; some containers make it 0600,
    /// and then only root could mount. Put back as it was at exit.
    package static func fuseOpenToEveryone() {
        _ = fuseOpened
    }

    private static let fuseOpened: Void = {
        var info = stat()
        guard stat("/dev/fuse", &info) == 0, info.st_mode & 0o777 != 0o666 else { return }
        let mode = String(info.st_mode & 0o777, radix: 8)
        chmod("/dev/fuse", 0o666)
        registerUndo(["/bin/chmod", mode, "/dev/fuse"])
    }()
}
