#if canImport(Glibc)
import Glibc
#endif

/// Whole reads and writes on a descriptor, retrying short counts and EINTR.
public enum Descriptor {
    /// Writes every byte; false on an error.
    public static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let written = Glibc.write(fd, bytes.baseAddress! + offset, bytes.count - offset)
            if written < 0 && errno == EINTR { continue }
            if written <= 0 { return false }
            offset += written
        }
        return true
    }

    /// Writes every byte; false on an error.
    public static func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { writeAll(fd, $0) }
    }

    /// Reads until the end of input (or `limit` bytes, or an error).
    public static func readAll(_ fd: Int32, limit: Int = 1 << 20) -> [UInt8] {
        var result: [UInt8] = []
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 4096) { chunk in
            while result.count < limit {
                let count = Glibc.read(fd, chunk.baseAddress, chunk.count)
                if count < 0 && errno == EINTR { continue }
                if count <= 0 { break }
                result.append(contentsOf: UnsafeBufferPointer(rebasing: chunk[0..<count]))
            }
        }
        return result
    }
}
