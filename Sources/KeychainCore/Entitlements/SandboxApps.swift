#if canImport(Glibc)
import Glibc
#endif

/// A sandboxed app, named by what its sandbox says of it, which the app
/// cannot change (docs/SECRET-SERVICE.md, "Sandboxed apps"): a Flatpak by the
/// app id in its `/.flatpak-info`, a snap by its AppArmor label. Its executable
/// names nothing (`/app/bin/x` is any app's path, and an update replaces it),
/// so the app is its name: its items are its own whichever build made them.
public enum SandboxApp: Sendable, Hashable {
    case flatpak(String)
    case snap(String)

    /// How a claim or an identity names it, in place of an executable's
    /// path: `flatpak:ID`, `snap:NAME` (no path starts so).
    public var claimName: String {
        switch self {
        case .flatpak(let id): "flatpak:" + id
        case .snap(let name): "snap:" + name
        }
    }

    public init?(claimName: String) {
        if claimName.hasPrefix("flatpak:"), SandboxApps.isFlatpakAppID(claimName.dropFirst(8)) {
            self = .flatpak(String(claimName.dropFirst(8)))
        } else if claimName.hasPrefix("snap:"), SandboxApps.isSnapName(claimName.dropFirst(5)) {
            self = .snap(String(claimName.dropFirst(5)))
        } else {
            return nil
        }
    }

    /// The app xdg-desktop-portal names by `id`: a Flatpak's app id is a
    /// reverse domain name (it has dots), a snap's name has none; nil for
    /// anything else.
    public init?(portalAppID id: String) {
        if SandboxApps.isFlatpakAppID(Substring(id)) {
            self = .flatpak(id)
        } else if SandboxApps.isSnapName(Substring(id)) {
            self = .snap(id)
        } else {
            return nil
        }
    }

    /// How a person reads it in a question or a listing.
    public var described: String {
        switch self {
        case .flatpak(let id): "the Flatpak app \(id)"
        case .snap(let name): "the snap \(name)"
        }
    }
}

/// What names a program: the path of its executable as the kernel resolved
/// it, or, for a sandboxed app, the app (whose executable names any app's
/// file). The compiler tells the two apart, where a string once held either
/// and `hasPrefix("/")` guessed which.
public enum ProgramName: Sendable, Hashable {
    case executable(String)
    case app(SandboxApp)

    /// As claims are stored and sent: the path, or `flatpak:ID`, `snap:NAME`
    /// (no path starts so).
    public var encoded: String {
        switch self {
        case .executable(let path): path
        case .app(let app): app.claimName
        }
    }

    /// ``encoded`` read back: an absolute path, or an app's name; nil for anything else.
    public init?(encoded: String) {
        if encoded.hasPrefix("/") {
            self = .executable(encoded)
        } else if let app = SandboxApp(claimName: encoded) {
            self = .app(app)
        } else {
            return nil
        }
    }

    /// The executable's path; nil for an app.
    public var path: String? {
        guard case .executable(let path) = self else { return nil }
        return path
    }

    /// Whether it names the same program byte for byte: never by Unicode
    /// equivalence, which `==` on strings uses (``EntitlementRule/sameBytes(_:_:)``).
    public func sameBytes(_ other: ProgramName) -> Bool {
        EntitlementRule.sameBytes(encoded, other.encoded)
    }

    /// Whether it reads back as itself: an absolute path, or an app whose
    /// name its sandbox could give.
    public var isWellFormed: Bool {
        ProgramName(encoded: encoded).map(sameBytes) ?? false
    }
}

/// Which sandboxed app a process is, from `/proc`.
enum SandboxApps {
    /// The app `thread` runs as, and why it cannot be taken for it (nil
    /// when nothing says so); nil when it runs in no sandbox we know.
    static func app(of thread: pid_t) -> (app: SandboxApp, problem: String?)? {
        // Both kinds of sandbox have a mount namespace of their own (snap-confine
        // makes one per snap): a process in the device's is none, for one stat
        // (this runs for every identification, a policed read's among them).
        guard let mountNamespace = mountNamespace(of: thread), let ours = ownMountNamespace,
            mountNamespace != ours
        else { return nil }
        if let label = appArmorLabel(of: thread), let name = snapName(fromLabel: label) {
            // AppArmor confines the snap to its label: it cannot take another.
            return (.snap(name), tracerProblem(thread))
        }
        let info = ProgramIdentities.withProcPath(thread, "root") { root -> [UInt8]? in
            guard let directory = FileDescriptor(open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) else { return nil }
            guard
                let fd = FileDescriptor(
                    openat(directory.raw, ".flatpak-info", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC))
            else { return nil }
            var status = stat()
            guard fstat(fd.raw, &status) == 0, status.st_mode & S_IFMT == S_IFREG else { return nil }
            return try? fd.borrowed.readAll(limit: 64 << 10)
        }
        guard let info, let id = flatpakAppID(fromInfo: String(decoding: info, as: UTF8.self)) else { return nil }
        return (
            .flatpak(id),
            sandboxProblem(thread) ?? nestingProblem(thread, in: mountNamespace, host: ours) ?? tracerProblem(thread)
        )
    }

    // MARK: Flatpak

    /// The `name` of the `[Application]` group of a `.flatpak-info` (a
    /// GKeyFile, as flatpak writes it); nil when there is none or it is no app id.
    static func flatpakAppID(fromInfo text: String) -> String? {
        var group = ""
        for raw in text.split(separator: "\n", omittingEmptySubsequences: true) {
            let line = raw.trimmingCharacters(in: " \t\r")
            if line.hasPrefix("[") && line.hasSuffix("]") {
                group = String(line.dropFirst().dropLast())
            } else if group == "Application", let equals = line.firstIndex(of: "="),
                line[..<equals].trimmingCharacters(in: " \t") == "name"
            {
                let id = line[line.index(after: equals)...].trimmingCharacters(in: " \t")
                return isFlatpakAppID(id[...]) ? id : nil
            }
        }
        return nil
    }

    /// flatpak's rule for an app id: at most 255 bytes, three elements or
    /// more, separated by dots, of ASCII letters, digits, `_` and `-`, none
    /// empty or starting with a digit.
    static func isFlatpakAppID(_ id: Substring) -> Bool {
        guard id.utf8.count <= 255 else { return false }
        let elements = id.split(separator: ".", omittingEmptySubsequences: false)
        return elements.count >= 3
            && elements.allSatisfy { element in
                guard let first = element.unicodeScalars.first, !("0"..."9").contains(first) else { return false }
                return element.unicodeScalars.allSatisfy {
                    $0.isASCII
                        && (("a"..."z").contains($0) || ("A"..."Z").contains($0) || ("0"..."9").contains($0)
                            || $0 == "_" || $0 == "-")
                }
            }
    }

    /// A mount namespace, as the kernel names it (device and inode of `ns/mnt`).
    private struct Namespace: Equatable {
        let device: UInt64
        let inode: UInt64
    }

    /// The device's own: only a process in another one can see a
    /// `/.flatpak-info` of its sandbox's.
    private static let ownMountNamespace: Namespace? = {
        var info = stat()
        guard stat("/proc/self/ns/mnt", &info) == 0 else { return nil }
        return Namespace(device: UInt64(info.st_dev), inode: UInt64(info.st_ino))
    }()

    private static func mountNamespace(of process: pid_t) -> Namespace? {
        var info = stat()
        guard ProgramIdentities.withProcPath(process, "ns/mnt", { stat($0, &info) }) == 0 else { return nil }
        return Namespace(device: UInt64(info.st_dev), inode: UInt64(info.st_ino))
    }

    /// Why the sandbox the process runs in may be one it made itself,
    /// inside the sandbox of another app: an app that makes a user and
    /// mount namespace of its own (where bubblewrap's sandbox allows one)
    /// can mount any `/.flatpak-info` there, then drop its capabilities
    /// and run a program. A sandbox that flatpak (bubblewrap) made is
    /// entered once, from the host: every ancestor of the process up to
    /// the first in the host's mount namespace (bubblewrap's own, outside)
    /// is in the process's mount namespace (bubblewrap's init inside, the
    /// app's own processes). An ancestor in a third one is the sandbox
    /// that made the process's; and a process whose parent is gone is
    /// reparented to its sandbox's init or subreaper, so the chain cannot
    /// skip that sandbox.
    private static func nestingProblem(_ thread: pid_t, in sandbox: Namespace, host: Namespace) -> String? {
        var current = thread
        for _ in 0..<64 {
            guard let status = ProgramIdentities.readProcFile(current, "status", limit: 8 << 10),
                let parent = ProcStatus.number("PPid:", in: status), parent > 0,
                let namespace = mountNamespace(of: parent)
            else { return "its sandbox cannot be examined" }
            if namespace == host { return nil }
            if namespace != sandbox { return "it runs in a namespace made inside another sandbox" }
            current = parent
        }
        return "its sandbox cannot be examined"
    }

    /// Why the process may have written its own `/.flatpak-info`: a
    /// capability in its namespace would let it mount another file there.
    /// (An app that made a namespace of its own holds none once it runs a
    /// program: ``nestingProblem(_:in:host:)`` tells that one.)
    private static func sandboxProblem(_ thread: pid_t) -> String? {
        guard let status = ProgramIdentities.readProcFile(thread, "status", limit: 8 << 10),
            let capabilities = ProcStatus.mask("CapEff:", in: status)
        else { return "its sandbox cannot be examined" }
        return capabilities == 0 ? nil : "it holds capabilities in its sandbox"
    }

    private static func tracerProblem(_ thread: pid_t) -> String? { CallerTrust.tracerProblem(thread) }

    // MARK: Snap

    /// The AppArmor label of the process (Linux 5.8's `attr/apparmor/current`, or the older `attr/current`).
    private static func appArmorLabel(of thread: pid_t) -> String? {
        let label =
            ProgramIdentities.readProcFile(thread, "attr/apparmor/current", limit: 4096)
            ?? ProgramIdentities.readProcFile(thread, "attr/current", limit: 4096)
        return label.map { String(decoding: $0, as: UTF8.self) }
    }

    /// The snap a label confines: `snap.NAME.APP (enforce)` (or a hook's,
    /// `snap.NAME.hook.HOOK`). A label in complain mode confines nothing: no snap.
    static func snapName(fromLabel label: String) -> String? {
        let trimmed = label.trimmingCharacters(in: " \n\0")
        guard trimmed.hasSuffix(" (enforce)") else { return nil }
        let profile = trimmed.dropLast(" (enforce)".count)
        let parts = profile.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count >= 3, parts[0] == "snap", isSnapName(parts[1]) else { return nil }
        return String(parts[1])
    }

    /// snapd's rule for a name: lowercase letters, digits and `-`, at most
    /// 40, at least one letter, no `-` at either end or twice in a row
    /// (an instance key, `_x`, is allowed after it).
    static func isSnapName(_ name: Substring) -> Bool {
        let base = name.split(separator: "_", maxSplits: 1, omittingEmptySubsequences: false)
        guard let snap = base.first, !snap.isEmpty, snap.count <= 40, !snap.hasPrefix("-"), !snap.hasSuffix("-"),
            !snap.contains("--"), snap.contains(where: { ("a"..."z").contains($0) })
        else { return false }
        let allowed: (Character) -> Bool = { ("a"..."z").contains($0) || ("0"..."9").contains($0) || $0 == "-" }
        guard snap.allSatisfy(allowed) else { return false }
        if base.count == 2 {
            let key = base[1]
            return !key.isEmpty && key.count <= 10
                && key.allSatisfy { ("a"..."z").contains($0) || ("0"..."9").contains($0) }
        }
        return true
    }
}

extension StringProtocol {
    /// The text without `characters` at either end.
    fileprivate func trimmingCharacters(in characters: String) -> String {
        let set = Set(characters)
        guard let first = firstIndex(where: { !set.contains($0) }) else { return "" }
        let last = lastIndex(where: { !set.contains($0) })!
        return String(self[first...last])
    }
}
