import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Who did something, as the audit log records it (never a value).
public struct AuditSubject: Sendable, Equatable {
    public var pid: Int32
    public var uid: UInt32
    public var executable: String?
    public var unit: String?

    public init(pid: Int32, uid: UInt32, executable: String?, unit: String?) {
        self.pid = pid
        self.uid = uid
        self.executable = executable
        self.unit = unit
    }
}

/// One event of the audit log: an item access or its denial, or a change
/// of the device (lock, unlock, failed unlock, grant, revoke). Names only:
/// never a value or a passcode.
public struct AuditEvent: Sendable, Equatable {
    /// What was asked: `read`, `write`, `create`, `remove`, `rename`,
    /// `set-class`, `list`, `lookup`, `stat`, `xattr`, `lock`, `unlock`,
    /// `grant`, `revoke`.
    public var operation: String
    /// `ok`, `denied` (no entitlement), `locked`, `absent`, `refused`
    /// (wrong passcode or lockout) or `error`.
    public var result: String
    public var group: String?
    public var identifier: String?
    public var subject: AuditSubject?
    /// More about it: a rename's target, a rule's executable.
    public var detail: String?

    public init(operation: String, result: String, group: String? = nil, identifier: String? = nil,
                subject: AuditSubject? = nil, detail: String? = nil) {
        self.operation = operation
        self.result = result
        self.group = group
        self.identifier = identifier
        self.subject = subject
        self.detail = detail
    }

    /// The result word for a core error.
    public static func result(of error: KeychainError?) -> String {
        switch error {
        case nil: return "ok"
        case .missingEntitlement?: return "denied"
        case .interactionNotAllowed?: return "locked"
        case .itemNotFound?: return "absent"
        case .authFailed?: return "refused"
        default: return "error"
        }
    }
}

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
    private static let anchorDomain = "kcfs-audit-anchor-v1"
    /// A file past this size is rotated (by default).
    public static let rotationSize = 4 << 20
    private let rotationSize: Int

    private struct State {
        var fd: Int32
        var size: Int
        var sequence: UInt64
        var mac: [UInt8]
        /// `YYYY-MM-DDTHH:MM:SS` of the second it was made for: lines come
        /// many to a second, and formatting the date was a tenth of a line.
        var second = -1
        var secondText: [UInt8] = []
    }
    private let state: Mutex<State>
    /// The audit key, absorbed: used under `state`'s lock only (one thread at a time).
    private let chainKey: Crypto.KeyedHash
    private let directory: KeychainDirectory

    /// Opens the log to append to it, continuing the chain from its last
    /// line (or from `anchor` when the file is empty or missing).
    init(directory: KeychainDirectory, key: SecureBytes, anchor: Anchor?,
         rotationSize: Int = AuditLog.rotationSize) throws(KeychainError) {
        self.directory = directory
        self.rotationSize = rotationSize
        chainKey = Crypto.KeyedHash(key: key.pointer.assumingMemoryBound(to: UInt8.self))
        let path = directory.path + "/" + Self.fileName
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw fileFailure("open", path) }
        var info = stat()
        fstat(fd, &info)
        let last = Self.lastLine(path).flatMap(AuditLine.init(parsing:))
        let sequence = last?.sequence ?? anchor?.sequence ?? 0
        let mac = last?.mac ?? anchor?.mac ?? [UInt8](repeating: 0, count: Crypto.macSize)
        state = Mutex(State(fd: fd, size: Int(info.st_size), sequence: sequence, mac: mac))
    }

    deinit {
        _ = state.withLock { close($0.fd) }
    }

    /// The newest line's sequence number and MAC.
    var head: Anchor { state.withLock { Anchor(sequence: $0.sequence, mac: $0.mac) } }

    /// Appends one event. A failure to write is reported to the diagnostics
    /// log, not to the request (the access itself happened or was denied).
    public func record(_ event: AuditEvent) {
        // Built as bytes, escaping only what needs it, without an
        // intermediate String, and outside the lock: this runs for every
        // audited request (docs/BENCHMARKS.md, the audit log's cost).
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
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        state.withLock { state in
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
                try Descriptor.writeAll(state.fd, line.bytes)
            } catch {
                Diagnostics.log("could not append to the audit log: \(error)")
                return
            }
            state.size += line.count
            state.sequence += 1
            state.mac = mac
        }
    }

    /// An audit line being built: tab-separated `key=value` fields, in
    /// memory of its own that grows by doubling. Not an `[UInt8]`: its
    /// per-append checks were half the cost of a line (callgrind: 400
    /// instructions to append a six-byte key).
    private struct LineBuilder: ~Copyable {
        private var base: UnsafeMutablePointer<UInt8>
        private var capacity: Int
        private(set) var count = 0

        init(capacity: Int) {
            self.capacity = max(capacity, 16)
            base = .allocate(capacity: self.capacity)
        }

        deinit { base.deallocate() }

        /// The line so far (valid until the next append).
        var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: base, count: count) }

        /// Room for `extra` more bytes; returns where they go.
        private mutating func claim(_ extra: Int) -> UnsafeMutablePointer<UInt8> {
            if count + extra > capacity {
                let grown = max(capacity * 2, count + extra)
                let moved = UnsafeMutablePointer<UInt8>.allocate(capacity: grown)
                moved.update(from: base, count: count)
                base.deallocate()
                base = moved
                capacity = grown
            }
            defer { count += extra }
            return base + count
        }

        mutating func append(_ byte: UInt8) { claim(1).pointee = byte }

        mutating func append(_ bytes: UnsafeRawBufferPointer) {
            guard let source = bytes.baseAddress, bytes.count > 0 else { return }
            UnsafeMutableRawPointer(claim(bytes.count)).copyMemory(from: source, byteCount: bytes.count)
        }

        mutating func append(_ bytes: [UInt8]) { bytes.withUnsafeBytes { append($0) } }

        private mutating func key(_ key: StaticString) {
            let separator = count > 0 ? 1 : 0
            let out = claim(separator + key.utf8CodeUnitCount + 1)
            if separator == 1 { out.pointee = UInt8(ascii: "\t") }
            (out + separator).update(from: key.utf8Start, count: key.utf8CodeUnitCount)
            out[separator + key.utf8CodeUnitCount] = UInt8(ascii: "=")
        }

        mutating func field(_ key: StaticString, _ value: String) {
            self.key(key)
            // Native strings are contiguous UTF-8: scanned and copied as bytes.
            let plain = value.utf8.withContiguousStorageIfAvailable { utf8 -> Bool in
                guard utf8.allSatisfy(Self.needsNoEscape) else { return false }
                append(UnsafeRawBufferPointer(utf8))
                return true
            }
            if plain != true { append(Array(LineEscaping.escaped(value).utf8)) }
        }

        /// What ``LineEscaping`` leaves as it is: not a control character,
        /// DEL, a backslash, or the lead byte of U+0080...U+009F.
        private static func needsNoEscape(_ byte: UInt8) -> Bool {
            byte >= 0x20 && byte != 0x7f && byte != UInt8(ascii: "\\") && byte != 0xc2
        }

        mutating func field(_ key: StaticString, _ value: Int64) {
            self.key(key)
            if value < 0 { append(UInt8(ascii: "-")) }
            appendDecimal(value.magnitude)
        }

        mutating func field(_ key: StaticString, _ value: UInt64) {
            self.key(key)
            appendDecimal(value)
        }

        mutating func hexField(_ key: StaticString, _ value: [UInt8]) {
            self.key(key)
            Hex.write(value, to: claim(2 * value.count))
        }

        /// `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC), from ``utcSecond(_:)``'s text.
        mutating func timestamp(_ key: StaticString, second: [UInt8], nanoseconds: Int) {
            self.key(key)
            append(second)
            append(".", Int32(nanoseconds / 1_000_000), width: 3)
            append(UInt8(ascii: "Z"))
        }

        /// `YYYY-MM-DDTHH:MM:SS` (UTC) of a second since the epoch.
        static func utcSecond(_ seconds: Int) -> [UInt8] {
            var parts = tm()
            var seconds = seconds
            gmtime_r(&seconds, &parts)
            var text = LineBuilder(capacity: 20)
            text.appendDecimal(UInt64(max(0, parts.tm_year + 1900)))
            text.append("-", parts.tm_mon + 1, width: 2)
            text.append("-", parts.tm_mday, width: 2)
            text.append("T", parts.tm_hour, width: 2)
            text.append(":", parts.tm_min, width: 2)
            text.append(":", parts.tm_sec, width: 2)
            return Array(text.bytes)
        }

        private mutating func append(_ separator: Unicode.Scalar, _ value: Int32, width: Int) {
            append(UInt8(ascii: separator))
            appendDecimal(UInt64(max(0, value)), width: width)
        }

        /// `value` in decimal, zero-padded to `width` digits (at most 20).
        private mutating func appendDecimal(_ value: UInt64, width: Int = 1) {
            var digits = 1
            var rest = value / 10
            while rest > 0 {
                digits += 1
                rest /= 10
            }
            let length = max(digits, min(width, 20))
            let out = claim(length)
            var value = value
            for index in stride(from: length - 1, through: 0, by: -1) {
                out[index] = UInt8(ascii: "0") + UInt8(value % 10)
                value /= 10
            }
        }
    }

    private func rotate(_ state: inout State) {
        let path = directory.path + "/" + Self.fileName
        guard rename(path, directory.path + "/" + Self.rotatedName) == 0 else {
            Diagnostics.log("could not rotate the audit log: \(String(cString: strerror(errno)))")
            return
        }
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            Diagnostics.log("could not start a new audit log: \(String(cString: strerror(errno)))")
            return
        }
        close(state.fd)
        state.fd = fd
        state.size = 0
    }

    // MARK: The chain

    /// Each line's MAC: BLAKE2b(audit key, domain || previous MAC || line).
    static func chain(key: Crypto.KeyedHash, previous: [UInt8], body: UnsafeRawBufferPointer) -> [UInt8] {
        var mac = [UInt8](repeating: 0, count: Crypto.macSize)
        macDomainBytes.withUnsafeBytes { domain in
            previous.withUnsafeBytes { previous in mac.withUnsafeMutableBytes { key.mac(domain, previous, body, into: $0) } }
        }
        return mac
    }

    private static let macDomainBytes = Array(macDomain.utf8)


    /// The last complete line of a file (reads only its end).
    private static func lastLine(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_size > 0 else { return nil }
        let window = min(Int(info.st_size), 64 << 10)
        var bytes = [UInt8](repeating: 0, count: window)
        let count = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress, window, off_t(Int(info.st_size) - window)) }
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
            return secret.authenticatedRecord(AuditLog.anchorDomain, writer.bytes)
        }

        init(sequence: UInt64, mac: [UInt8]) {
            self.sequence = sequence
            self.mac = mac
        }

        init(decoding record: [UInt8], secret: DeviceSecret) throws(KeychainError) {
            var reader = ByteReader(try secret.authenticatedBody(AuditLog.anchorDomain, record, length: 8 + Crypto.macSize))
            sequence = try reader.readUInt64()
            mac = try reader.read(Crypto.macSize)
        }
    }
}

/// One parsed line of the audit log.
public struct AuditLine: Sendable, Equatable {
    /// The fields in order, unescaped, without `mac`.
    public var fields: [(key: String, value: String)]
    public var sequence: UInt64
    public var mac: [UInt8]
    /// The line up to (not including) the tab before `mac=`: what the MAC covers.
    var body: String

    public static func == (a: AuditLine, b: AuditLine) -> Bool {
        a.body == b.body && a.mac == b.mac
    }

    public func value(_ key: String) -> String? { fields.first { $0.key == key }?.value }

    public init?(parsing line: String) {
        // Values are escaped: the last tab starts the MAC field.
        guard let tab = line.lastIndex(of: "\t"), line[line.index(after: tab)...].hasPrefix("mac=") else { return nil }
        body = String(line[..<tab])
        guard let mac = Hex.bytes(String(line[line.index(tab, offsetBy: 5)...]), count: Crypto.macSize) else { return nil }
        self.mac = mac
        var fields: [(key: String, value: String)] = []
        for field in body.split(separator: "\t", omittingEmptySubsequences: false) {
            guard let equals = field.firstIndex(of: "="),
                  let value = LineEscaping.unescaped(String(field[field.index(after: equals)...])) else { return nil }
            fields.append((String(field[..<equals]), value))
        }
        guard fields.first?.key == "seq", let sequence = UInt64(fields[0].value) else { return nil }
        self.fields = fields
        self.sequence = sequence
    }
}

// MARK: Verification

extension AuditLog {
    /// Checks the chain of `directory`'s audit log (the rotated file first,
    /// then the current one) and that it reaches the newest line the
    /// keychain recorded. Returns the lines checked and the problems found
    /// (none: intact). Needs the device secret, not the passcode.
    public static func verify(directory: KeychainDirectory) throws(KeychainError) -> (lines: Int, problems: [String]) {
        let secret = DeviceSecret(secret: try directory.readDeviceSecret())
        let anchor = try storedAnchor(directory: directory, secret: secret)
        let chainKey = Crypto.KeyedHash(key: secret.auditKey.pointer.assumingMemoryBound(to: UInt8.self))
        var problems: [String] = []
        var checked = 0
        var previous: (sequence: UInt64, mac: [UInt8])?
        for name in [rotatedName, fileName] {
            let path = directory.path + "/" + name
            let fd = open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else {
                if name == fileName { problems.append("\(name) is missing") }
                continue
            }
            let read = Result { () throws(Errno) in try Descriptor.readAll(fd, limit: 4 * rotationSize) }
            close(fd)
            guard case .success(let bytes) = read else {
                problems.append("\(name) cannot be read")
                continue
            }
            if !bytes.isEmpty && bytes.last != UInt8(ascii: "\n") { problems.append("\(name): the last line is incomplete") }
            for (index, raw) in bytes.split(separator: UInt8(ascii: "\n")).enumerated() {
                let where_ = "\(name) line \(index + 1)"
                guard let line = AuditLine(parsing: String(decoding: raw, as: UTF8.self)) else {
                    problems.append("\(where_): not a log line")
                    previous = nil
                    continue
                }
                checked += 1
                var chainedFrom = previous
                if index == 0 {
                    guard let prev = line.value("prev").flatMap({ Hex.bytes($0, count: Crypto.macSize) }) else {
                        problems.append("\(where_): the file's first line does not say what it continues (its start was cut)")
                        previous = (line.sequence, line.mac)
                        continue
                    }
                    if let before = previous, before.sequence + 1 != line.sequence || before.mac != prev {
                        problems.append("\(where_): does not continue \(rotatedName)")
                    }
                    chainedFrom = (line.sequence - 1, prev)
                }
                if let from = chainedFrom {
                    if from.sequence + 1 != line.sequence {
                        problems.append("\(where_): sequence \(line.sequence) follows \(from.sequence) (lines removed or reordered)")
                    } else if Array(line.body.utf8).withUnsafeBytes({ chain(key: chainKey, previous: from.mac, body: $0) }) != line.mac {
                        problems.append("\(where_): its MAC does not match (the line was edited, or one before it)")
                    }
                }
                if let anchor, line.sequence == anchor.sequence, line.mac != anchor.mac {
                    problems.append("\(where_): differs from the line the keychain recorded as number \(anchor.sequence)")
                }
                previous = (line.sequence, line.mac)
            }
        }
        if let anchor, anchor.sequence > (previous?.sequence ?? 0) {
            problems.append("the log ends at line \(previous?.sequence ?? 0), but the keychain recorded line \(anchor.sequence): its end was cut")
        }
        return (checked, problems)
    }

    static func storedAnchor(directory: KeychainDirectory, secret: DeviceSecret) throws(KeychainError) -> Anchor? {
        let db = try SQLiteConnection(path: directory.databasePath, create: false)
        defer { db.finishStatements() }
        let query = try db.statement("SELECT value FROM meta WHERE key = ?").bind(1, anchorKey)
        guard try query.step() else { return nil }
        return try Anchor(decoding: query.blob(0), secret: secret)
    }
}
