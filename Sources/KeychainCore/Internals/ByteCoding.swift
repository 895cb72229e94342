/// Little-endian fixed-width fields for the binary records the keychain keeps
/// (keybag, lockout, associated data), written and read in one place.
package struct ByteWriter {
    package private(set) var bytes: [UInt8] = []

    package init() {}

    /// A writer whose buffer holds `capacity` bytes before it grows.
    package init(capacity: Int) { bytes.reserveCapacity(capacity) }

    package mutating func append(_ value: UInt8) { bytes.append(value) }

    package mutating func append(_ value: UInt64) {
        for shift in stride(from: 0, to: 64, by: 8) { bytes.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
    }

    package mutating func append(_ value: Int64) { append(UInt64(bitPattern: value)) }

    package mutating func append(_ value: UInt16) {
        bytes.append(UInt8(truncatingIfNeeded: value))
        bytes.append(UInt8(truncatingIfNeeded: value >> 8))
    }

    package mutating func append(_ value: UInt32) {
        for shift in stride(from: 0, to: 32, by: 8) { bytes.append(UInt8(truncatingIfNeeded: value >> UInt32(shift))) }
    }

    package mutating func append(_ raw: [UInt8]) { bytes += raw }

    /// A length-prefixed (u16) string, so that ("ab", "c") and ("a", "bc") differ.
    package mutating func appendPrefixed(_ string: String) {
        let count = string.utf8.count
        precondition(count <= Int(UInt16.max))
        bytes.append(UInt8(count & 0xff))
        bytes.append(UInt8(count >> 8))
        bytes.append(contentsOf: string.utf8)
    }
}

/// Reads what ``ByteWriter`` wrote, and the frames of the device's protocol
/// (``DeviceProtocol``): little-endian fixed-width fields and length-prefixed
/// ones, each checked against the end. Running past the end, or any other
/// malformed input, throws `malformed` (``KeychainError/decode`` for stored
/// records, ``KeychainError/param`` for requests).
///
/// Inlinable: the wire protocol reads every frame with it from another
/// module, where calls it could not specialise had the runtime instantiate
/// its type by name on a process's first reply, most of a `keychainfs
/// get`'s instructions (docs/BENCHMARKS.md).
package struct ByteReader<Bytes: RandomAccessCollection<UInt8>> where Bytes.Index == Int {
    @usableFromInline let bytes: Bytes
    @usableFromInline var offset: Int
    package let malformed: KeychainError

    @inlinable package init(_ bytes: Bytes, malformed: KeychainError = .decode) {
        self.bytes = bytes
        self.offset = bytes.startIndex
        self.malformed = malformed
    }

    @inlinable package var isAtEnd: Bool { offset == bytes.endIndex }

    /// The bytes not read yet.
    @inlinable package var remaining: Int { bytes.endIndex - offset }

    /// The next `count` bytes, in place.
    @inlinable package mutating func take(_ count: Int) throws(KeychainError) -> Bytes.SubSequence {
        guard count >= 0, bytes.endIndex - offset >= count else { throw malformed }
        defer { offset += count }
        return bytes[offset..<offset + count]
    }

    @inlinable package mutating func read(_ count: Int) throws(KeychainError) -> [UInt8] { Array(try take(count)) }

    @inlinable package mutating func readByte() throws(KeychainError) -> UInt8 {
        guard offset < bytes.endIndex else { throw malformed }
        defer { offset += 1 }
        return bytes[offset]
    }

    /// Byte by byte, through `bytes`'s own subscript: no slice, reversal or
    /// reduction, whose generic types an unspecialised call (from another
    /// module) had the runtime look up on a process's first read
    /// (docs/BENCHMARKS.md).
    @inlinable mutating func readLittleEndian<I: FixedWidthInteger & UnsignedInteger>(_: I.Type) throws(KeychainError)
        -> I
    {
        let size = MemoryLayout<I>.size
        guard bytes.endIndex - offset >= size else { throw malformed }
        var value: UInt64 = 0
        for index in 0..<size { value |= UInt64(bytes[offset + index]) << UInt64(8 * index) }
        offset += size
        return I(truncatingIfNeeded: value)
    }

    @inlinable package mutating func readUInt64() throws(KeychainError) -> UInt64 { try readLittleEndian(UInt64.self) }

    @inlinable package mutating func readInt64() throws(KeychainError) -> Int64 { Int64(bitPattern: try readUInt64()) }

    @inlinable package mutating func readUInt32() throws(KeychainError) -> UInt32 { try readLittleEndian(UInt32.self) }

    @inlinable package mutating func readUInt16() throws(KeychainError) -> UInt16 { try readLittleEndian(UInt16.self) }

    @inlinable package mutating func readInt32() throws(KeychainError) -> Int32 { Int32(bitPattern: try readUInt32()) }

    /// A string written by ``ByteWriter/appendPrefixed(_:)``; `malformed` unless UTF-8.
    @inlinable package mutating func readPrefixed() throws(KeychainError) -> String {
        let length = Int(try readLittleEndian(UInt16.self))
        guard let string = String(validating: try take(length), as: UTF8.self) else { throw malformed }
        return string
    }
}

/// Lowercase hexadecimal, as `sha256sum` prints digests: the audit log's MACs
/// and the entitlement rules' digests.
package enum Hex {
    package static func string(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        append(bytes, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends the lowercase hex digits of `bytes` to `out`.
    static func append(_ bytes: [UInt8], to out: inout [UInt8]) {
        out.reserveCapacity(out.count + bytes.count * 2)
        for byte in bytes {
            out.append(digit(byte >> 4))
            out.append(digit(byte & 15))
        }
    }

    /// Writes the lowercase hex digits of `bytes` at `out` (room for twice their count).
    static func write(_ bytes: [UInt8], to out: UnsafeMutablePointer<UInt8>) {
        for (index, byte) in bytes.enumerated() {
            out[2 * index] = digit(byte >> 4)
            out[2 * index + 1] = digit(byte & 15)
        }
    }

    private static func digit(_ value: UInt8) -> UInt8 {
        value < 10 ? UInt8(ascii: "0") + value : UInt8(ascii: "a") + value - 10
    }

    /// The bytes `text` spells in lowercase hex, of any length; nil for
    /// an odd count of digits or any other spelling (one spelling only).
    package static func bytes(_ text: String) -> [UInt8]? {
        guard text.utf8.count % 2 == 0, let bytes = bytes(text, count: text.utf8.count / 2), string(bytes) == text
        else { return nil }
        return bytes
    }

    /// The `count` bytes `text` spells; nil for any other length or a non-hex digit.
    package static func bytes(_ text: String, count: Int) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard digits.count == 2 * count else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(count)
        for index in stride(from: 0, to: digits.count, by: 2) {
            guard let byte = UInt8(String(decoding: digits[index..<index + 2], as: UTF8.self), radix: 16) else {
                return nil
            }
            bytes.append(byte)
        }
        return bytes
    }
}
