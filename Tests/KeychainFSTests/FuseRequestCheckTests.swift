import Testing
@testable import KeychainFS

/// The check every FUSE request passes before libfuse parses it: the
/// lengths and counts a forged request stated past its end (the crashes in
/// docs/SECURITY.md, "Service mode under attack") are refused; the
/// kernel's own requests pass.
@Suite struct FuseRequestCheckTests {
    static func request(_ opcode: UInt32, _ body: [UInt8], length: Int? = nil) -> [UInt8] {
        var header = [UInt8](repeating: 0, count: 40)
        header.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: UInt32(length ?? 40 + body.count), toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: opcode, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: UInt64(1), toByteOffset: 16, as: UInt64.self)
        }
        return header + body
    }

    static func le32(_ value: UInt32) -> [UInt8] { withUnsafeBytes(of: value.littleEndian, Array.init) }

    static func problem(_ bytes: [UInt8]) -> String? { bytes.withUnsafeBytes { FuseRequestCheck.problem(in: $0) } }

    @Test func requestsAsTheKernelSendsThemPass() {
        #expect(Self.problem(Self.request(1, Array("default\0".utf8))) == nil)  // LOOKUP
        #expect(Self.problem(Self.request(3, [UInt8](repeating: 0, count: 16))) == nil)  // GETATTR
        let write =
            Self.le32(0) + Self.le32(0) + Self.le32(0) + Self.le32(0) + Self.le32(3) + [UInt8](repeating: 0, count: 20)
        #expect(Self.problem(Self.request(16, write + Array("abc".utf8))) == nil)  // WRITE of 3 bytes
        let setxattr =
            Self.le32(4) + Self.le32(0) + Array("user.keychain.accessible\0".utf8) + Array("always".utf8.prefix(4))
        #expect(Self.problem(Self.request(21, setxattr)) == nil)
        #expect(Self.problem(Self.request(42, Self.le32(1) + Self.le32(0) + [UInt8](repeating: 0, count: 16))) == nil)
        #expect(Self.problem(Self.request(4242, [])) == nil)  // unknown: libfuse answers ENOSYS unread
    }

    @Test func lengthsAndCountsPastTheEndAreRefused() {
        #expect(Self.problem([1, 2, 3]) != nil)
        #expect(Self.problem(Self.request(1, Array("x\0".utf8), length: 4096)) != nil)  // header length lies
        #expect(Self.problem(Self.request(1, Array("unended".utf8))) != nil)
        #expect(Self.problem(Self.request(4, [UInt8](repeating: 0, count: 87))) != nil)  // SETATTR cut short
        let setxattr = Self.le32(1_000_000) + Self.le32(0) + Array("user.keychain.accessible\0x".utf8)
        #expect(Self.problem(Self.request(21, setxattr))?.contains("1000000") == true)
        #expect(
            Self.problem(Self.request(42, Self.le32(100_000) + Self.le32(0) + [UInt8](repeating: 0, count: 16))) != nil)
        let write = [UInt8](repeating: 0, count: 16) + Self.le32(1 << 20) + [UInt8](repeating: 0, count: 20)
        #expect(Self.problem(Self.request(16, write + Array("abc".utf8))) != nil)
        #expect(Self.problem(Self.request(45, [UInt8](repeating: 0, count: 16) + Array("a\0b".utf8))) != nil)
    }
}
