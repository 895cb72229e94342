import Synchronization
#if canImport(Glibc)
import Glibc
#endif

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
        guard let mac = Hex.bytes(String(line[line.index(tab, offsetBy: 5)...]), count: Crypto.macSize) else {
            return nil
        }
        self.mac = mac
        var fields: [(key: String, value: String)] = []
        for field in body.split(separator: "\t", omittingEmptySubsequences: false) {
            guard let equals = field.firstIndex(of: "="),
                let value = LineEscaping.unescaped(String(field[field.index(after: equals)...]))
            else { return nil }
            fields.append((String(field[..<equals]), value))
        }
        guard fields.first?.key == "seq", let sequence = UInt64(fields[0].value) else { return nil }
        self.fields = fields
        self.sequence = sequence
    }
}

extension AuditLog {
    /// An audit line being built: tab-separated `key=value` fields, in
    /// memory of its own that grows by doubling. Not an `[UInt8]`: its
    /// per-append checks were half the cost of a line (callgrind: 400
    /// instructions to append a six-byte key).
    struct LineBuilder: ~Copyable {
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
}

extension AuditLog {
    /// `YYYY-MM-DDTHH:MM:SSZ` (UTC) of `seconds` since the epoch: the time
    /// of the log's lines, to the second, for other records of when
    /// something happened (`keychainfs login status`).
    package static func utcTime(_ seconds: Int) -> String {
        String(decoding: LineBuilder.utcSecond(seconds), as: UTF8.self) + "Z"
    }
}
