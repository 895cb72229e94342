#if canImport(Glibc)
import Glibc
#endif

/// Whole reads and writes on a descriptor: short counts continued, EINTR
/// retried, failures thrown as ``Errno`` (through ``valueOrErrno(retryOnInterrupt:_:)``).
package enum Descriptor {
    /// One `read` (or `pread` at `offset`): the bytes read, 0 at the end of input.
    package static func read(
        _ fd: Int32, into buffer: UnsafeMutableRawBufferPointer,
        at offset: off_t? = nil
    ) throws(Errno) -> Int {
        try valueOrErrno {
            if let offset { return pread(fd, buffer.baseAddress, buffer.count, offset) }
            return Glibc.read(fd, buffer.baseAddress, buffer.count)
        }
    }

    /// Fills `buffer`; false if the input ended first.
    package static func readExactly(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Bool {
        var offset = 0
        while offset < buffer.count {
            let count = try read(fd, into: UnsafeMutableRawBufferPointer(rebasing: buffer[offset...]))
            if count == 0 { return false }
            offset += count
        }
        return true
    }

    /// Reads until the end of input or `limit` bytes.
    package static func readAll(_ fd: Int32, limit: Int = 1 << 20) throws(Errno) -> [UInt8] {
        var result: [UInt8] = []
        try withUnsafeTemporaryAllocation(byteCount: 4096, alignment: 1) { (chunk) throws(Errno) in
            while result.count < limit {
                let count = try read(fd, into: chunk)
                if count == 0 { break }
                result.append(contentsOf: UnsafeRawBufferPointer(rebasing: chunk[..<count]))
            }
        }
        return result
    }

    /// Writes every byte.
    package static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) throws(Errno) {
        var offset = 0
        while offset < bytes.count {
            let written = try valueOrErrno { Glibc.write(fd, bytes.baseAddress! + offset, bytes.count - offset) }
            // write(2) returns 0 only for a zero count; never loop on it.
            if written == 0 { throw .ioError }
            offset += written
        }
    }

    /// Writes every byte.
    package static func writeAll(_ fd: Int32, _ bytes: [UInt8]) throws(Errno) {
        try bytes.withBytes { (raw) throws(Errno) in try writeAll(fd, raw) }
    }
}

/// A file descriptor this code owns: closed exactly once, when its owner
/// ends (a scope, a class's deinit) or it is consumed. Not copyable, so
/// no copy of it can be closed twice or outlive the close (a descriptor
/// number closed twice may by then be another thread's file).
public struct FileDescriptor: ~Copyable, Sendable {
    public let raw: Int32

    /// Takes ownership of `raw`; nil for a failed call's -1 (errno is left as the call set it).
    public init?(_ raw: Int32) {
        guard raw >= 0 else { return nil }
        self.raw = raw
    }

    deinit {
        // Linux releases the descriptor even when close(2) fails or is
        // interrupted: never retried (close(2), "Dealing with error returns").
        Glibc.close(raw)
    }

    /// Gives the descriptor up to another owner (a child's standard
    /// stream, a caller that keeps it as a raw number), unclosed.
    public consuming func release() -> Int32 {
        let raw = raw
        discard self
        return raw
    }

    /// A directory stream over it, which owns it from then on (closedir
    /// closes it); nil, and it closed, when fdopendir fails.
    public consuming func directoryStream() -> OpaquePointer? {
        let raw = release()
        guard let stream = fdopendir(raw) else {
            Glibc.close(raw)
            return nil
        }
        return stream
    }

    /// Closes it now, saying whether close(2) succeeded (a file written
    /// through it, for one, must report a failed close).
    public consuming func close() -> Bool {
        let result = Glibc.close(release())
        return result == 0
    }
}

extension Optional where Wrapped == FileDescriptor {
    /// The descriptor's number, borrowed (nil: none), for a call that
    /// takes one when there is one.
    public var raw: Int32? {
        switch self {
        case .some(let descriptor): descriptor.raw
        case .none: nil
        }
    }
}

extension UnsafeMutablePointer where Pointee == dirent {
    /// The entry's name: readdir(3)'s `d_name`, up to its NUL.
    package var name: String {
        withUnsafeBytes(of: pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
    }
}
