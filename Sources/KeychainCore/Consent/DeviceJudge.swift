#if canImport(Glibc)
import Glibc
#endif

/// What decides who gets a secret at this device, as `status` shows it
/// (docs/SECRET-SERVICE.md, "The device's judge"): the pinentry that answers
/// for the person, the processes that started the device, and whether a program
/// of the user could replace the device's own program. None of it comes from a
/// caller: the device takes nothing of a caller's environment that would
/// decide.
public struct DeviceJudge: Sendable, Equatable {
    /// The pinentry that asks the person (nil: none, so every question is denied).
    public var pinentry: String?
    /// The device's own process and the two that started it (`keychainfs ← keychainfs ← bash`).
    public var startedBy: String
    /// The device's executable, when a program of the user could replace it
    /// (a build tree, ~/.local/bin); nil when root controls it.
    public var replaceableProgram: String?

    public init(pinentry: String?, startedBy: String, replaceableProgram: String?) {
        self.pinentry = pinentry
        self.startedBy = startedBy
        self.replaceableProgram = replaceableProgram
    }

    /// This process's judge. Who started it is read once, at first use
    /// (the device reads it as it starts: its parent may leave later).
    package static var current: DeviceJudge {
        DeviceJudge(pinentry: Pinentry.program(), startedBy: startChain, replaceableProgram: replaceableSelf)
    }

    package static let startChain: String = ProcessChain.names(from: getpid()).joined(separator: " ← ")

    private static let replaceableSelf: String? = ProgramIdentities.linkTarget("/proc/self/exe").flatMap {
        RootControlledFile.status(of: $0) == nil ? $0 : nil
    }

    /// The variables that make the dynamic loader run a caller's code
    /// inside the device (ld.so(8)): a device started with one would hand
    /// every secret to that code, so it refuses to start.
    package static let loaderVariables = ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT"]

    /// Why this process must not serve as a device; nil when it may.
    package static func startProblem() -> String? {
        if let problem = ExecutableImage.servingProblem { return problem }
        let set = loaderVariables.filter { getenv($0).map { $0.pointee != 0 } ?? false }
        guard !set.isEmpty else {
            // What is mapped, not what the environment says: a preloaded library can rename its variable.
            guard let problem = CallerTrust.ownCodeProblem() else { return nil }
            return "the device does not start: " + problem + "; the loader ran another program's code inside it, "
                + "where every secret is (a library preloaded?)"
        }
        return "the device does not start with \(set.joined(separator: ", ")) set: the loader would run the "
            + "caller's code inside it, where every secret is; start it without (env -u \(set[0]) keychainfs ...)"
    }

    /// One line for the audit log.
    package var auditDetail: String {
        "started by \(startedBy); pinentry \(pinentry ?? "none")"
            + (replaceableProgram.map { "; program replaceable by the user: \($0)" } ?? "")
    }

    /// The status fields: pinentry (empty: none), who started it, the replaceable program (empty: none).
    public var fields: [String] { [pinentry ?? "", startedBy, replaceableProgram ?? ""] }

    public init(fields: ArraySlice<String>) {
        let values = Array(fields)
        self.init(
            pinentry: values[0].isEmpty ? nil : values[0], startedBy: values[1],
            replaceableProgram: values[2].isEmpty ? nil : values[2])
    }

    /// What `status` says of it, with what a program of the user can still do here.
    public var entries: [StatusEntry] {
        var entries = [
            StatusEntry("pinentry", pinentry ?? "none (questions about other programs' items are denied)"),
            StatusEntry("started-by", startedBy)
        ]
        if let replaceableProgram {
            entries.append(
                StatusEntry(
                    "device-program",
                    "\(replaceableProgram) (any program of yours can replace it; install the package for /usr/bin/keychainfs)"
                ))
        }
        entries.append(StatusEntry("per-user-limit", Self.perUserLimit))
        return entries
    }

    /// ``entries`` as `key: value` lines.
    public var lines: [String] { entries.map(\.line) }

    /// What a program running as the user can still do, in one line (docs/SECURITY.md).
    static var perUserLimit: String {
        var text: [UInt8] = []
        if let fd = FileDescriptor(open("/proc/sys/kernel/yama/ptrace_scope", O_RDONLY | O_CLOEXEC)) {
            text = (try? fd.borrowed.readAll(limit: 16)) ?? []
        }
        let scope = Int(String(decoding: text.filter { $0 != UInt8(ascii: "\n") }, as: UTF8.self))
        let tracing =
            switch scope {
            case 0?, nil: "a program of yours can read your programs' memory (ptrace: Yama scope 0 or absent)"
            case 1?: "a program of yours can read the memory of the programs it starts (Yama scope 1)"
            default: "no program of yours can read another's memory (Yama scope \(scope!))"
            }
        return tracing + ", and can show a window that asks for your passcode (docs/SECURITY.md)"
    }
}
