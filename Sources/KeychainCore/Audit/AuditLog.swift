import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The audit log of a keychain: `audit.log` in its directory, one line per
/// event, appended and never rewritten. Each line ends with a MAC under a
/// device key over the previous line's MAC and this line, so editing,
/// reordering or removing a line breaks the chain; the newest MAC the device
/// wrote is also kept in the keychain (the `audit` record) when the device
/// stops cleanly and at every grant or revocation, so cutting the end off is
/// caught too. Past ``rotationSize`` bytes the file moves to `audit.log.1`
/// (replacing the older one) and the new file's first line carries the MAC
/// it continues from.
///
/// Line: tab-separated `key=value` fields, values escaped as status lines
/// (``LineEscaping``): `seq`, `time` (UTC, ms), [`prev`], `op`, `result`,
/// [`group`, `id`, `pid`, `uid`, `exe`, `unit`, `detail`], `mac` (hex).
public final class AuditLog: Sendable {
    public static let fileName = "audit.log"
    public static let rotatedName = "audit.log.1"
    static let anchorKey = "audit"
    private static let macDomain = "kcfs-audit-v1"
    /// Bound to the rollback counter (``DeviceSecret/boundRecord(_:_:)``).
    static let anchorDomain = "kcfs-audit-anchor-v1"
    /// A file past this size is rotated (by default): with `audit.log.1`,
    /// the log keeps 32 to 64 MiB, some 150,000 lines at the least.
    public static let rotationSize = 32 << 20
    private let rotationSize: Int
    /// Denials one program (uid and executable) has written one by one at
    /// once, and per second after that; past them they are counted, and
    /// the count written as one line (a flood of cheap denials rotated an
    /// earlier denial out of both files: docs/SECURITY.md, "Service mode under
    /// attack").
    static let denialBurst = 200.0
    static let denialsPerSecond = 20.0

    private struct State: ~Copyable {
        /// The log file, appended to; closed with the log (or replaced at a rotation).
        var file: FileDescriptor
        var size: Int
        var sequence: UInt64
        var mac: [UInt8]
        /// `YYYY-MM-DDTHH:MM:SS` of the second it was made for: lines come
        /// many to a second, and formatting the date was a tenth of a line.
        var second = -1
        var secondText: [UInt8] = []
        var denials = DenialFolding()
    }

    /// What the log folds of denials: identical ones in a row (the pid
    /// aside) become one line "… and N more"; a program past its rate
    /// has the rest counted on one line.
    struct DenialFolding {
        /// The last line written, if it was a denial, without its pid.
        var last: AuditEvent?
        /// The latest denial identical to it, and how many came since it was written.
        var latest: AuditEvent?
        var repeats = 0
        var buckets: [Program: (tokens: Double, at: Double)] = [:]
        /// Per program past its rate: its latest denial, how many were
        /// counted, and since when (the count is written every 10 s at most).
        var suppressed: [Program: (event: AuditEvent, count: Int, since: Double)] = [:]

        struct Program: Hashable {
            var uid: UInt32?
            var executable: String?
        }

        /// A denial as identical ones compare: its pid aside.
        private static func key(_ event: AuditEvent) -> AuditEvent {
            var key = event
            key.subject?.pid = 0
            return key
        }

        /// Whether `event` is to be written now (false: it was counted).
        mutating func admit(_ event: AuditEvent, now: Double) -> Bool {
            guard event.result == "denied" else { return true }
            if Self.key(event) == last {
                repeats += 1
                latest = event
                return false
            }
            let program = Program(uid: event.subject?.uid, executable: event.subject?.executable)
            var bucket = buckets[program] ?? (AuditLog.denialBurst, now)
            bucket.tokens = min(AuditLog.denialBurst, bucket.tokens + (now - bucket.at) * AuditLog.denialsPerSecond)
            bucket.at = now
            guard bucket.tokens >= 1 else {
                buckets[program] = bucket
                var folded = suppressed[program] ?? (event, 0, now)
                folded.event = event
                folded.count += 1
                suppressed[program] = folded
                return false
            }
            bucket.tokens -= 1
            // A full bucket is the default: forget it, so the table stays small.
            buckets[program] = bucket.tokens >= AuditLog.denialBurst - 1 && buckets.count > 1024 ? nil : bucket
            return true
        }

        /// The lines owed for what was counted, to be written before the
        /// next line: the repeats of the last denial, and each program's
        /// count past its rate once 10 s old (all of them when `all`).
        mutating func owed(now: Double, all: Bool = false) -> [AuditEvent] {
            var lines: [AuditEvent] = []
            if repeats > 0, var event = latest {
                event.detail = (event.detail.map { $0 + "; " } ?? "") + "and \(repeats) more like it"
                lines.append(event)
                repeats = 0
            }
            for (program, folded) in suppressed.sorted(by: { $0.value.since < $1.value.since })
            where all || now - folded.since >= 10 {
                var event = folded.event
                event.detail =
                    "and \(folded.count) more denials of this program, past \(Int(AuditLog.denialsPerSecond)) a second"
                lines.append(event)
                suppressed[program] = nil
            }
            return lines
        }

        /// `event` was written: the next identical denial folds into it;
        /// after any other line, none does.
        mutating func wrote(_ event: AuditEvent?) {
            last = event.flatMap { $0.result == "denied" ? Self.key($0) : nil }
        }
    }
    private let state: Mutex<State>
    /// The audit key, absorbed: used under `state`'s lock only (one thread at a time).
    private let chainKey: Crypto.KeyedHash
    private let directory: KeychainDirectory
    /// Nothing is written: the keychain is read-only.
    private let isDiscarding: Bool

    /// Opens the log to append to it, continuing the chain from its last
    /// line (or from `anchor` when the file is empty or missing).
    /// `discarding`: the keychain's files cannot be written, and nothing is
    /// (the device says so once, at boot).
    init(
        directory: KeychainDirectory, key: SecureBytes, anchor: Anchor?,
        rotationSize: Int = AuditLog.rotationSize, discarding: Bool = false
    ) throws(KeychainError) {
        self.directory = directory
        self.rotationSize = rotationSize
        isDiscarding = discarding
        chainKey = Crypto.KeyedHash(key: key.pointer.assumingMemoryBound(to: UInt8.self))
        let path = directory.path + "/" + Self.fileName
        let target = discarding ? "/dev/null" : path
        guard let file = FileDescriptor(open(target, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600)) else {
            throw fileFailure("open", target)
        }
        var info = stat()
        fstat(file.raw, &info)
        let last = Self.lastLine(path).flatMap(AuditLine.init(parsing:))
        let sequence = last?.sequence ?? anchor?.sequence ?? 0
        let mac = last?.mac ?? anchor?.mac ?? [UInt8](repeating: 0, count: Crypto.macSize)
        state = Mutex(State(file: file, size: Int(info.st_size), sequence: sequence, mac: mac))
    }

    /// The newest line's sequence number and MAC.
    var head: Anchor { state.withLock { Anchor(sequence: $0.sequence, mac: $0.mac) } }

    /// Appends one event. A failure to write is reported to the diagnostics
    /// log, not to the request (the access itself happened or was denied).
    /// A denial may be folded into a count (``DenialFolding``), written
    /// before the next line that is written, or by ``flush()``.
    public func record(_ event: AuditEvent) {
        // Built as bytes, escaping only what needs it, without an
        // intermediate String, and outside the lock: this runs for every
        // audited request (docs/BENCHMARKS.md, the audit log's cost).
        let tail = Self.tail(of: event)
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        state.withLock { state in
            guard state.denials.admit(event, now: Self.seconds(now)) else { return }
            writeOwed(at: now, all: false, to: &state)
            if append(tail, at: now, to: &state) { state.denials.wrote(event) }
        }
    }

    /// Writes the counts of folded denials now (a clean stop, a lock).
    public func flush() {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        state.withLock { state in
            writeOwed(at: now, all: true, to: &state)
            state.denials.wrote(nil)
        }
    }

    /// The lines ``DenialFolding/owed(now:all:)`` says are due.
    private func writeOwed(at now: timespec, all: Bool, to state: inout State) {
        for owed in state.denials.owed(now: Self.seconds(now), all: all) {
            append(Self.tail(of: owed), at: now, to: &state)
        }
    }

    private static func seconds(_ time: timespec) -> Double { Double(time.tv_sec) + Double(time.tv_nsec) / 1e9 }

    private static func tail(of event: AuditEvent) -> LineBuilder {
        var tail = LineBuilder(capacity: 256)
        tail.field("op", event.operation)
        tail.field("result", event.result)
        if let group = event.group { tail.field("group", group) }
        if let identifier = event.identifier { tail.field("id", identifier) }
        if let subject = event.subject {
            tail.field("pid", Int64(subject.pid))
            tail.field("uid", Int64(subject.uid))
            if let executable = subject.executable { tail.field("exe", executable) }
            if let unit = subject.unit { tail.field("unit", unit) }
        }
        if let detail = event.detail { tail.field("detail", detail) }
        return tail
    }

    /// Appends one line of `tail`'s fields, chained; whether it was written.
    @discardableResult
    private func append(_ tail: borrowing LineBuilder, at now: timespec, to state: inout State) -> Bool {
        guard !isDiscarding else { return false }
        if state.size >= rotationSize { rotate(&state) }
        var line = LineBuilder(capacity: tail.count + 200)
        line.field("seq", state.sequence + 1)
        if state.second != now.tv_sec {
            state.second = now.tv_sec
            state.secondText = LineBuilder.utcSecond(now.tv_sec)
        }
        line.timestamp("time", second: state.secondText, nanoseconds: now.tv_nsec)
        if state.size == 0 { line.hexField("prev", state.mac) }
        line.append(UInt8(ascii: "\t"))  // `tail` starts with its first field
        line.append(tail.bytes)
        let mac = Self.chain(key: chainKey, previous: state.mac, body: line.bytes)
        line.hexField("mac", mac)
        line.append(UInt8(ascii: "\n"))
        do throws(Errno) {
            try state.file.borrowed.writeAll(line.bytes)
        } catch {
            Diagnostics.log("could not append to the audit log: \(error)")
            return false
        }
        state.size += line.count
        state.sequence += 1
        state.mac = mac
        return true
    }

    private func rotate(_ state: inout State) {
        let path = directory.path + "/" + Self.fileName
        guard rename(path, directory.path + "/" + Self.rotatedName) == 0 else {
            Diagnostics.log("could not rotate the audit log: \(Errno.current.description)")
            return
        }
        guard let file = FileDescriptor(open(path, O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)) else {
            Diagnostics.log("could not start a new audit log: \(Errno.current.description)")
            return
        }
        state.file = file  // the rotated file's descriptor closes here
        state.size = 0
    }

    // MARK: The chain

    /// Each line's MAC: BLAKE2b(audit key, domain || previous MAC || line).
    static func chain(key: Crypto.KeyedHash, previous: [UInt8], body: UnsafeRawBufferPointer) -> [UInt8] {
        var mac = [UInt8](repeating: 0, count: Crypto.macSize)
        macDomainBytes.withUnsafeBytes { domain in
            previous.withUnsafeBytes { previous in
                mac.withUnsafeMutableBytes { key.mac(domain, previous, body, into: $0) }
            }
        }
        return mac
    }

    private static let macDomainBytes = Array(macDomain.utf8)

    /// The last complete line of a file (reads only its end).
    private static func lastLine(_ path: String) -> String? {
        guard let fd = FileDescriptor(open(path, O_RDONLY | O_CLOEXEC)) else { return nil }
        var info = stat()
        guard fstat(fd.raw, &info) == 0, info.st_size > 0 else { return nil }
        let window = min(Int(info.st_size), 64 << 10)
        var bytes = [UInt8](repeating: 0, count: window)
        let count = bytes.withUnsafeMutableBytes {
            pread(fd.raw, $0.baseAddress, window, off_t(Int(info.st_size) - window))
        }
        guard count == window, bytes.last == UInt8(ascii: "\n") else { return nil }
        let lines = bytes.dropLast().split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false)
        return lines.last.map { String(decoding: $0, as: UTF8.self) }
    }

    // MARK: The anchor

    /// The newest sequence number and MAC, kept in the keychain (authenticated).
    struct Anchor: Equatable {
        var sequence: UInt64
        var mac: [UInt8]

        func encoded(secret: DeviceSecret) -> [UInt8] {
            var writer = ByteWriter()
            writer.append(sequence)
            writer.append(mac)
            return secret.boundRecord(AuditLog.anchorDomain, writer.bytes)
        }

        init(sequence: UInt64, mac: [UInt8]) {
            self.sequence = sequence
            self.mac = mac
        }

        init(decoding record: [UInt8], secret: DeviceSecret) throws(KeychainError) {
            var reader = ByteReader(try secret.boundBody(AuditLog.anchorDomain, record, length: 8 + Crypto.macSize))
            sequence = try reader.readUInt64()
            mac = try reader.read(Crypto.macSize)
        }
    }
}
