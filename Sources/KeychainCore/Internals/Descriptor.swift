#if canImport(Glibc)
import Glibc
#endif

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

/// A descriptor this code uses and does not own, so has no way to close:
/// one an owner lends for a call (``FileDescriptor/borrowed``, valid while
/// that owner lives), or one the process keeps for its whole life (its
/// standard streams, one it was started with, one a library owns). A
/// function that takes one never closes it nor keeps it past the call,
/// and no other number (a pid, a count, a status) can be passed for it.
public struct BorrowedDescriptor: Hashable, Sendable {
    public let raw: Int32

    /// Lent by its owner.
    fileprivate init(lentBy raw: Int32) { self.raw = raw }

    /// A descriptor nobody here owns, valid for as long as it is used: one
    /// the process inherited at start and keeps (a ready pipe, the
    /// connection the PAM module passes as descriptor 3), or one a library
    /// owns (sd-bus's connection, libfuse's `/dev/fuse`). Never -1.
    public init(kept raw: Int32) {
        precondition(raw >= 0, "no descriptor")
        self.raw = raw
    }

    public static let standardInput = BorrowedDescriptor(kept: STDIN_FILENO)
    public static let standardOutput = BorrowedDescriptor(kept: STDOUT_FILENO)
    public static let standardError = BorrowedDescriptor(kept: STDERR_FILENO)

    // Whole reads and writes: short counts continued, EINTR retried,
    // failures thrown as ``Errno`` (through ``valueOrErrno(retryOnInterrupt:_:)``).

    /// One `read` (or `pread` at `offset`): the bytes read, 0 at the end of input.
    package func read(into buffer: UnsafeMutableRawBufferPointer, at offset: off_t? = nil) throws(Errno) -> Int {
        try valueOrErrno {
            if let offset { return pread(raw, buffer.baseAddress, buffer.count, offset) }
            return Glibc.read(raw, buffer.baseAddress, buffer.count)
        }
    }

    /// Fills `buffer`; false if the input ended first.
    package func readExactly(into buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Bool {
        var offset = 0
        while offset < buffer.count {
            let count = try read(into: UnsafeMutableRawBufferPointer(rebasing: buffer[offset...]))
            if count == 0 { return false }
            offset += count
        }
        return true
    }

    /// Reads until the end of input or `limit` bytes.
    package func readAll(limit: Int = 1 << 20) throws(Errno) -> [UInt8] {
        var result: [UInt8] = []
        try withUnsafeTemporaryAllocation(byteCount: 4096, alignment: 1) { (chunk) throws(Errno) in
            while result.count < limit {
                let count = try read(into: chunk)
                if count == 0 { break }
                result.append(contentsOf: UnsafeRawBufferPointer(rebasing: chunk[..<count]))
            }
        }
        return result
    }

    /// Writes every byte.
    package func writeAll(_ bytes: UnsafeRawBufferPointer) throws(Errno) {
        var offset = 0
        while offset < bytes.count {
            let written = try valueOrErrno { Glibc.write(raw, bytes.baseAddress! + offset, bytes.count - offset) }
            // write(2) returns 0 only for a zero count; never loop on it.
            if written == 0 { throw .ioError }
            offset += written
        }
    }

    /// Writes every byte.
    package func writeAll(_ bytes: [UInt8]) throws(Errno) {
        try bytes.withBytes { (raw) throws(Errno) in try writeAll(raw) }
    }
}

extension FileDescriptor {
    /// The descriptor lent for a call; valid while this owner lives.
    public var borrowed: BorrowedDescriptor { BorrowedDescriptor(lentBy: raw) }
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

    /// The descriptor lent for a call (nil: none).
    public var borrowed: BorrowedDescriptor? {
        switch self {
        case .some(let descriptor): descriptor.borrowed
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
