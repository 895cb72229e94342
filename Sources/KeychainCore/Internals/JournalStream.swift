internal import CLinux
#if canImport(Glibc)
import Glibc
#endif

/// sd_journal_stream_fd(3) without libsystemd: a stream socket to
/// journald's `stdout` socket, introduced by the header journald expects
/// (identifier, unit id, priority, level prefix, then whether to forward
/// to syslog, kmsg and the console), after which every line written is a
/// journal entry. For a device started in the background (docs/SECURITY.md,
/// "Bound to this machine, against whoever holds the files and the TPM"): its
/// diagnostics, a failed bump of the TPM counter among them, are seen
/// (`journalctl -t keychainfs`), not lost on /dev/null.
package enum JournalStream {
    static let socketPath = "/run/systemd/journal/stdout"

    /// A descriptor whose lines go to the journal as `identifier`, at
    /// warning priority; nil when no journald listens.
    package static func open(identifier: String) -> FileDescriptor? {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let path = Array(socketPath.utf8)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: path) }
        guard let fd = FileDescriptor(socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0))
        else { return nil }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd.raw, $0, socklen_t(MemoryLayout<sa_family_t>.size + path.count + 1))
            }
        }
        // LOG_WARNING (4); no level prefix; forwarded to syslog as journald is configured, not to kmsg or the console.
        var header = "\(identifier)\n\n4\n0\n1\n0\n0\n"
        let sent =
            connected == 0 ? header.withUTF8 { send(fd.raw, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } : -1
        guard sent == header.utf8.count, shutdown(fd.raw, Int32(SHUT_RD)) == 0 else { return nil }
        return fd
    }
}
