import ArgumentParser
import KeychainCore
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
        guard !(verify && (follow || json || group != nil)) else { throw ValidationError("--verify takes no other option") }
    }

    func run() throws {
        let keychain = options.directory
        try keychain.requireExisting()
        if verify {
            let report: (lines: Int, problems: [String])
            do {
                report = try AuditLog.verify(directory: keychain)
            } catch {
                throw fail("cannot verify the audit log: \(error)")
            }
            guard report.problems.isEmpty else {
                for problem in report.problems { printError("keychainfs: audit log: " + problem) }
                throw ExitStatus.failure
            }
            print("the audit log is intact: \(report.lines) lines")
            return
        }
        var follower = LogFollower(directory: keychain.path)
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
            out = "{" + line.fields.filter { $0.key != "prev" }.map { field in
                let numeric = ["seq", "pid", "uid"].contains(field.key) && Int64(field.value) != nil
                return jsonString(field.key) + ":" + (numeric ? field.value : jsonString(field.value))
            }.joined(separator: ",") + "}"
        } else {
            // Names, paths and details are anyone's text: a program at
            // `/tmp/x exe=/usr/bin/app` must not print a second `exe=`.
            // Space-separated fields escape spaces; the detail, in
            // parentheses, escapes them.
            let item = [line.value("group"), line.value("id")].compactMap { $0 }.joined(separator: "/")
            out = [line.value("time") ?? "", line.value("op") ?? "", line.value("result") ?? "",
                   LineEscaping.escaped(item, also: " ")]
                .filter { !$0.isEmpty }.joined(separator: " ")
            if let detail = line.value("detail") { out += " (" + LineEscaping.escaped(detail, also: "()") + ")" }
            for key in ["pid", "uid", "exe", "unit"] {
                if let value = line.value(key) { out += " \(key)=" + LineEscaping.escaped(value, also: " ") }
            }
        }
        // Written at once: a follower reading through a pipe sees every event as it happens.
        _ = try? Descriptor.writeAll(1, Array((out + "\n").utf8))
    }
}

/// Reads the log's lines, and waits for new ones (inotify on the keychain
/// directory), following the file across rotations.
private struct LogFollower {
    let directory: String
    private var fd: Int32 = -1
    private var inode: ino_t = 0
    private var pending: [UInt8] = []
    private var watch: Int32 = -1

    init(directory: String) { self.directory = directory }

    /// Every complete line of `file`; with `keepingPosition`, the file stays
    /// open to read what is appended later.
    mutating func readAll(_ file: String, keepingPosition: Bool) -> [String] {
        if keepingPosition {
            // Watch before reading, so that nothing appended in between is missed.
            watch = inotify_init1(Int32(IN_CLOEXEC))
            _ = inotify_add_watch(watch, directory, UInt32(IN_MODIFY | IN_CREATE | IN_MOVED_TO))
        }
        let descriptor = open(directory + "/" + file, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return [] }
        pending = []
        let lines = readAvailable(descriptor)
        if keepingPosition {
            fd = descriptor
            var info = stat()
            fstat(descriptor, &info)
            inode = info.st_ino
        } else {
            close(descriptor)
        }
        return lines
    }

    /// Blocks until the log grows (or rotates); returns the new complete lines.
    mutating func waitForMore() -> [String] {
        var events = [UInt8](repeating: 0, count: 4096)
        _ = read(watch, &events, events.count)
        var lines = fd >= 0 ? readAvailable(fd) : []
        var info = stat()
        if stat(directory + "/" + AuditLog.fileName, &info) == 0, info.st_ino != inode {
            // Rotated: the old file is complete; continue with the new one from its start.
            if fd >= 0 { close(fd) }
            fd = open(directory + "/" + AuditLog.fileName, O_RDONLY | O_CLOEXEC)
            inode = info.st_ino
            pending = []
            if fd >= 0 { lines += readAvailable(fd) }
        }
        return lines
    }

    private mutating func readAvailable(_ descriptor: Int32) -> [String] {
        pending += (try? Descriptor.readAll(descriptor, limit: 64 << 20)) ?? []
        guard let end = pending.lastIndex(of: UInt8(ascii: "\n")) else { return [] }
        let complete = pending[..<end]
        pending = Array(pending[(end + 1)...])
        return complete.split(separator: UInt8(ascii: "\n")).map { String(decoding: $0, as: UTF8.self) }
    }
}
