import ArgumentParser
import KeychainCore
import KeychainTPM
#if canImport(Glibc)
import Glibc
#endif

struct LogCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "log",
        abstract: "Show the keychain's audit log: every item access and denial, lock, unlock, grant and revoke.",
        discussion: """
            One line per event: time, operation, result (ok, denied, locked, absent, refused, error), \
            GROUP/IDENTIFIER, and the process that asked (pid, uid, executable, systemd unit). Never a \
            value or a passcode. The log is chained with a MAC under a device key: --verify checks \
            that no line was edited, removed, reordered, and that its end was not cut off; it exits 1 \
            and names each problem otherwise. Works with or without a running device.
            """
    )

    @Flag(name: .long, help: "Keep printing events as they are recorded.")
    var follow = false

    @Option(name: .long, help: "Only events of this access group.")
    var group: String?

    @Flag(name: .long, help: "One JSON object per event.")
    var json = false

    @Flag(name: .long, help: "Check the chain of MACs instead of printing.")
    var verify = false

    @OptionGroup var options: KeychainOptions

    func validate() throws {
        guard !(verify && (follow || json || group != nil)) else {
            throw ValidationError("--verify takes no other option")
        }
    }

    func run() throws {
        let place = options.place
        try place.requireExisting()
        guard case .directory(let keychain) = place else {
            let service = RunningDevice(listeningAt: try place.socketPath())
            if verify { return try report(verifyReply(service)) }
            return try show(LogFollower(source: .service(service)))
        }
        if verify {
            do {
                return try report(AuditLog.verify(directory: keychain))
            } catch {
                throw fail("cannot verify the audit log: \(error)")
            }
        }
        try show(LogFollower(source: .directory(keychain.path)))
    }

    /// The service's verification of this user's log.
    private func verifyReply(_ service: RunningDevice) throws -> AuditLog.VerifyReport {
        let report = try service.call(.verifyLog, about: .action("cannot verify the audit log"))
        return report
    }

    private func report(_ report: AuditLog.VerifyReport) throws {
        guard report.problems.isEmpty else {
            for problem in report.problems { printError("keychainfs: audit log: " + problem) }
            throw ExitStatus.failure
        }
        print("the audit log is intact: \(report.lines) lines")
        // Rotation is no tampering, but what it took is said: how much, and until when.
        if report.rotatedAway > 0 {
            print(
                "\(report.rotatedAway) older lines were rotated away, all before \(report.keptSince ?? "the oldest kept line")"
            )
        }
    }

    private func show(_ follower: consuming LogFollower) throws {
        var follower = follower
        for file in [AuditLog.rotatedName, AuditLog.fileName] {
            let lines = follower.readAll(file, keepingPosition: file == AuditLog.fileName)
            lines.forEach(show)
        }
        guard follow else { return }
        while true { follower.waitForMore().forEach(show) }
    }

    private func show(_ raw: String) {
        guard let line = AuditLine(parsing: raw) else { return }
        if let group, line.value("group") != group { return }
        var out: String
        if json {
            out =
                "{"
                + line.fields.filter { $0.key != "prev" }.map { field in
                    let numeric = ["seq", "pid", "uid"].contains(field.key) && Int64(field.value) != nil
                    return jsonString(field.key) + ":" + (numeric ? field.value : jsonString(field.value))
                }.joined(separator: ",") + "}"
        } else {
            // Names, paths and details are anyone's text: a program at
            // `/tmp/x exe=/usr/bin/app` must not print a second `exe=`.
            // Space-separated fields escape spaces; the detail, in
            // parentheses, escapes them.
            let item = [line.value("group"), line.value("id")].compactMap { $0 }.joined(separator: "/")
            out = [
                line.value("time") ?? "", line.value("op") ?? "", line.value("result") ?? "",
                LineEscaping.shown(item, also: " ")
            ]
            .filter { !$0.isEmpty }.joined(separator: " ")
            if let detail = line.value("detail") { out += " (" + LineEscaping.shown(detail, also: "()") + ")" }
            for key in ["pid", "uid", "exe", "unit"] {
                if let value = line.value(key) { out += " \(key)=" + LineEscaping.shown(value, also: " ") }
            }
        }
        // Written at once: a follower reading through a pipe sees every event as it happens.
        _ = try? BorrowedDescriptor.standardOutput.writeAll(Array((out + "\n").utf8))
    }
}

/// Reads the log's lines, and waits for new ones, following the file
/// across rotations: with inotify on the keychain directory, or, for the
/// service's keychain (whose directory this user cannot read), on the
/// descriptors the service passes, checked once a second as `tail -f` does
/// where it cannot watch.
private struct LogFollower: ~Copyable {
    enum Source {
        case directory(String)
        case service(RunningDevice)
    }

    let source: Source
    /// The file followed (nil: none yet), and the inotify instance (nil: none).
    private var fd: FileDescriptor? = nil
    private var inode: ino_t = 0
    private var pending: [UInt8] = []
    private var watch: FileDescriptor? = nil

    init(source: Source) { self.source = source }

    /// A log file, open for reading; nil when there is none.
    private func open(_ file: String) -> FileDescriptor? {
        switch source {
        case .directory(let directory):
            return FileDescriptor(Glibc.open(directory + "/" + file, O_RDONLY | O_CLOEXEC))
        case .service(let service):
            var received: FileDescriptor?  // ours, whatever the answer
            let outcome = service.outcome(.auditLog(rotated: file == AuditLog.rotatedName), receiving: &received)
            guard case .success(.attached)? = outcome else { return nil }
            return received
        }
    }

    private static func inode(of fd: BorrowedDescriptor?) -> ino_t? {
        var info = stat()
        guard let fd, fstat(fd.raw, &info) == 0 else { return nil }
        return info.st_ino
    }

    /// Every complete line of `file`; with `keepingPosition`, the file stays
    /// open to read what is appended later.
    mutating func readAll(_ file: String, keepingPosition: Bool) -> [String] {
        if keepingPosition, case .directory(let directory) = source {
            // Watch before reading, so that nothing appended in between is missed.
            watch = FileDescriptor(inotify_init1(Int32(IN_CLOEXEC)))
            _ = inotify_add_watch(watch.raw ?? -1, directory, UInt32(IN_MODIFY | IN_CREATE | IN_MOVED_TO))
        }
        guard let descriptor = open(file) else { return [] }
        pending = []
        let lines = readAvailable(descriptor.borrowed)
        if keepingPosition {
            inode = Self.inode(of: descriptor.borrowed) ?? 0
            fd = .some(consume descriptor)
        }
        return lines
    }

    /// Blocks until the log grows (or rotates); returns the new complete lines.
    mutating func waitForMore() -> [String] {
        if let watching = watch.raw {
            var events = [UInt8](repeating: 0, count: 4096)
            _ = read(watching, &events, events.count)
        } else {
            sleep(1)
        }
        var lines: [String] = []
        if let following = fd.borrowed { lines = readAvailable(following) }
        let current = open(AuditLog.fileName)
        if let now = Self.inode(of: current.borrowed), now != inode {
            // Rotated: the old file is complete (closed here); continue with the new one from its start.
            fd = current
            inode = now
            pending = []
            if let following = fd.borrowed { lines += readAvailable(following) }
        }
        return lines
    }

    private mutating func readAvailable(_ descriptor: BorrowedDescriptor) -> [String] {
        pending += (try? descriptor.readAll(limit: 64 << 20)) ?? []
        guard let end = pending.lastIndex(of: UInt8(ascii: "\n")) else { return [] }
        let complete = pending[..<end]
        pending = Array(pending[(end + 1)...])
        return complete.split(separator: UInt8(ascii: "\n")).map { String(decoding: $0, as: UTF8.self) }
    }
}
