#if canImport(Glibc)
import Glibc
#endif

/// Whether a process can be taken for the program its executable names.
///
/// The executable alone is not enough: a process of the same user can make
/// its own user namespace and point its `/proc/PID/exe` at a granted binary
/// (`prctl(PR_SET_MM, PR_SET_MM_MAP)`), run the granted binary with its own
/// code loaded into it (`LD_PRELOAD`, `LD_LIBRARY_PATH`, a JIT), or drive it
/// with ptrace. A process is trusted only when none of that shows in
/// `/proc`: it is in the device's user namespace, no thread of it is
/// traced, and every executable mapping is its executable or a file owned
/// by root that no one else may write (the loader, libc, system libraries).
/// What this cannot see is written in docs/SECURITY.md (writes through
/// `/proc/PID/mem` by the same user, without Yama's ptrace restrictions).
enum CallerTrust {
    /// Why the process of `thread` cannot be trusted, as a phrase for the
    /// audit log (nil when nothing says so), and whether it runs code from
    /// anonymous memory (a JIT: only a rule that allows one admits it).
    /// `executable` is the file it runs (its mapping is admitted whoever owns it).
    static func assess(thread: pid_t, executable: stat) -> (problem: String?, runsAnonymousCode: Bool) {
        if let problem = userNamespaceProblem(thread) ?? tracerProblem(thread) { return (problem, false) }
        return codeProblem(thread, executable: executable)
    }

    // MARK: User namespace

    /// The device's own user namespace, as the kernel names it (device and inode of `/proc/self/ns/user`).
    private static let ownUserNamespace: (UInt64, UInt64)? = namespace("/proc/self/ns/user")

    private static func namespace(_ path: UnsafePointer<CChar>) -> (UInt64, UInt64)? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return (UInt64(info.st_dev), UInt64(info.st_ino))
    }

    /// In another user namespace a process holds every capability over
    /// itself, `PR_SET_MM` included: what its `/proc/PID/exe` says is its own word.
    private static func userNamespaceProblem(_ thread: pid_t) -> String? {
        let theirs = ProgramIdentities.withProcPath(thread, "ns/user") { namespace($0) }
        guard let theirs, let ours = ownUserNamespace else { return "its user namespace cannot be read" }
        return theirs == ours ? nil : "it runs in another user namespace"
    }

    // MARK: Tracers

    /// ptrace attaches to threads one by one, and a tracer of any of them
    /// can write the process's code: every thread's `TracerPid` must be 0.
    static func tracerProblem(_ thread: pid_t) -> String? {
        guard let tasks = ProgramIdentities.withProcPath(thread, "task", { opendir($0) }) else {
            return "its threads cannot be listed"
        }
        defer { closedir(tasks) }
        while let entry = readdir(tasks) {
            let name = entry.name
            guard let task = pid_t(name) else { continue }
            // A thread that ended meanwhile has no status: nothing to trace.
            guard let status = ProgramIdentities.readProcFile(task, "status", limit: 8 << 10) else { continue }
            guard let tracer = ProcStatus.number("TracerPid:", in: status) else { return "its status cannot be read" }
            if tracer != 0 { return "it is being traced by process \(tracer)" }
        }
        return nil
    }

    // MARK: Code

    /// This process's own code, judged as a caller's is: a library it did
    /// not link (a preload whose constructor then rewrote `LD_PRELOAD=` in
    /// the environment, so that no variable shows it) or code in anonymous
    /// memory; nil when there is none.
    package static func ownCodeProblem() -> String? {
        var executable = stat()
        guard stat("/proc/self/exe", &executable) == 0 else { return "its executable cannot be read" }
        let (problem, anonymous) = codeProblem(getpid(), executable: executable)
        return problem ?? (anonymous ? "it runs code from anonymous memory" : nil)
    }

    /// Every executable mapping of the process (proc(5), `/proc/PID/maps`):
    /// `start-end perms offset major:minor inode path`. Scanned as bytes,
    /// and only executable lines are looked at: this runs for every
    /// request to a policed group.
    private static func codeProblem(_ thread: pid_t, executable: stat) -> (problem: String?, runsAnonymousCode: Bool) {
        guard let maps = ProgramIdentities.readProcFile(thread, "maps", limit: 16 << 20), !maps.isEmpty else {
            return ("its memory map cannot be read", false)
        }
        var anonymous = false
        let problem = maps.withUnsafeBufferPointer { bytes -> String? in
            var lineStart = 0
            while lineStart < bytes.count {
                let lineEnd = bytes[lineStart...].firstIndex(of: UInt8(ascii: "\n")) ?? bytes.count
                defer { lineStart = lineEnd + 1 }
                var fields = MapsLine(bytes[lineStart..<lineEnd])
                guard fields.skip(), let permissions = fields.next() else { return "its memory map cannot be read" }
                guard permissions.count >= 3, permissions[permissions.startIndex + 2] == UInt8(ascii: "x") else {
                    continue
                }
                guard fields.skip(), let deviceField = fields.next(), let inodeField = fields.next(),
                    let device = deviceNumber(deviceField), let inode = decimal(inodeField)
                else {
                    return "its memory map cannot be read"
                }
                let path = fields.rest
                if inode == 0 {
                    // The kernel's own code pages for every process are not anonymous code.
                    if !path.elementsEqual("[vdso]".utf8) && !path.elementsEqual("[vsyscall]".utf8) { anonymous = true }
                    continue
                }
                if device == UInt64(executable.st_dev) && inode == UInt64(executable.st_ino) { continue }
                var info = stat()
                let found =
                    path.withContiguousStorageIfAvailable { raw in
                        withUnsafeTemporaryAllocation(of: CChar.self, capacity: raw.count + 1) { name in
                            raw.withMemoryRebound(to: CChar.self) { _ = name.initialize(fromContentsOf: $0) }
                            name[raw.count] = 0
                            return stat(name.baseAddress!, &info) == 0
                        }
                    } ?? false
                let name = { String(decoding: path, as: UTF8.self) }
                // The path must still name the mapped file (a replaced or deleted one cannot be judged).
                guard found, UInt64(info.st_dev) == device, UInt64(info.st_ino) == inode else {
                    return "it runs code from \(name()), which is no longer at that path"
                }
                guard info.st_uid == 0, info.st_mode & 0o022 == 0 else {
                    return "it runs code from \(name()), a file not owned by root or writable by others"
                }
            }
            return nil
        }
        return (problem, anonymous)
    }

    /// The space-separated fields of one line of `/proc/PID/maps`.
    private struct MapsLine {
        private let line: Slice<UnsafeBufferPointer<UInt8>>
        private var index: Int

        init(_ line: Slice<UnsafeBufferPointer<UInt8>>) {
            self.line = line
            index = line.startIndex
        }

        /// The next field; nil at the end of the line.
        mutating func next() -> Slice<UnsafeBufferPointer<UInt8>>? {
            while index < line.endIndex, line[index] == UInt8(ascii: " ") { index += 1 }
            guard index < line.endIndex else { return nil }
            let start = index
            while index < line.endIndex, line[index] != UInt8(ascii: " ") { index += 1 }
            return line[start..<index]
        }

        /// Passes over one field; false at the end of the line.
        mutating func skip() -> Bool { next() != nil }

        /// The path: what follows the inode, past its padding (it may hold spaces).
        var rest: Slice<UnsafeBufferPointer<UInt8>> {
            var start = index
            while start < line.endIndex, line[start] == UInt8(ascii: " ") { start += 1 }
            return line[start..<line.endIndex]
        }
    }

    private static func decimal(_ field: Slice<UnsafeBufferPointer<UInt8>>) -> UInt64? {
        guard !field.isEmpty else { return nil }
        var value: UInt64 = 0
        for byte in field {
            guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) else { return nil }
            value = value &* 10 &+ UInt64(byte - UInt8(ascii: "0"))
        }
        return value
    }

    private static func hexadecimal(_ field: Slice<UnsafeBufferPointer<UInt8>>) -> UInt64? {
        guard !field.isEmpty else { return nil }
        var value: UInt64 = 0
        for byte in field {
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            default: return nil
            }
            value = value << 4 | UInt64(digit)
        }
        return value
    }

    /// `major:minor` in hexadecimal, as glibc's `makedev` packs it into `st_dev`.
    private static func deviceNumber(_ field: Slice<UnsafeBufferPointer<UInt8>>) -> UInt64? {
        guard let colon = field.firstIndex(of: UInt8(ascii: ":")),
            let major = hexadecimal(field[field.startIndex..<colon]),
            let minor = hexadecimal(field[(colon + 1)..<field.endIndex])
        else { return nil }
        return (major & 0xffff_f000) << 32 | (major & 0xfff) << 8 | (minor & 0xffff_ff00) << 12 | (minor & 0xff)
    }
}

/// Fields of `/proc/PID/status` (proc(5)): `Name:\tvalue` lines.
enum ProcStatus {
    /// The hexadecimal value of the line starting with `key` (the
    /// capability and signal masks: `CapEff:\t0000000000000000`).
    static func mask(_ key: String, in status: [UInt8]) -> UInt64? {
        for line in String(decoding: status, as: UTF8.self).split(separator: "\n") where line.hasPrefix(key) {
            return UInt64(line.dropFirst(key.count).filter { !$0.isWhitespace }, radix: 16)
        }
        return nil
    }

    /// The decimal value of the line starting with `key` (e.g. `Tgid:`), read as bytes.
    static func number<Bytes: RandomAccessCollection<UInt8>>(_ key: StaticString, in status: Bytes) -> Int32?
    where Bytes.Index == Int {
        let keyBytes = UnsafeBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount)
        var lineStart = status.startIndex
        while lineStart < status.endIndex {
            let lineEnd = status[lineStart...].firstIndex(of: UInt8(ascii: "\n")) ?? status.endIndex
            let line = status[lineStart..<lineEnd]
            if line.starts(with: keyBytes) {
                var value: Int32 = 0
                var sawDigit = false
                for byte in line.dropFirst(keyBytes.count) {
                    if byte == UInt8(ascii: "\t") || byte == UInt8(ascii: " ") {
                        if sawDigit { break } else { continue }
                    }
                    guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) else { return nil }
                    sawDigit = true
                    value = value &* 10 &+ Int32(byte - UInt8(ascii: "0"))
                }
                return sawDigit ? value : nil
            }
            lineStart = lineEnd + 1
        }
        return nil
    }
}
