#if canImport(Glibc)
import Glibc
#endif

/// Searches every readable mapping of a process (this one by default) for
/// byte patterns, through `/proc/PID/maps` and `/proc/PID/mem` (reading
/// another process's memory needs ptrace rights: root, or the same user and
/// a dumpable process).
public enum MemoryScan {
    /// The places where any pattern occurs, as "NAME at 0xADDRESS", except
    /// inside `excluded` (where the patterns themselves live, when scanning
    /// this process). The chunk window is wiped after every chunk, so that
    /// the scan leaves no copy of what it read.
    public static func find(
        _ patterns: [(name: String, bytes: UnsafeRawBufferPointer)], in pid: pid_t? = nil,
        excluding excluded: [Range<UInt>] = []
    ) -> [String] {
        let process = pid.map(String.init) ?? "self"
        let chunkSize = 1 << 20, overlap = 256
        let window = UnsafeMutableRawBufferPointer.allocate(byteCount: chunkSize + overlap, alignment: 16)
        defer { window.deallocate() }
        let windowRange =
            UInt(bitPattern: window.baseAddress)..<(UInt(bitPattern: window.baseAddress) + UInt(window.count))
        let mem = open("/proc/\(process)/mem", O_RDONLY | O_CLOEXEC)
        guard mem >= 0 else { return ["cannot open /proc/\(process)/mem: errno \(errno)"] }
        defer { close(mem) }
        var found: [String] = []
        for region in readableRegions(process) {
            var start = region.lowerBound
            while start < region.upperBound {
                let length = Int(min(UInt(chunkSize + overlap), region.upperBound - start))
                let read = pread(mem, window.baseAddress, length, off_t(Int64(bitPattern: UInt64(start))))
                if read <= 0 { break }
                for pattern in patterns {
                    for offset in matches(of: pattern.bytes, in: UnsafeRawBufferPointer(rebasing: window[0..<read])) {
                        let address = start + UInt(offset)
                        if pid == nil && windowRange.contains(address) { continue }
                        if excluded.contains(where: { $0.contains(address) }) { continue }
                        found.append("\(pattern.name) at 0x\(String(address, radix: 16))")
                    }
                }
                explicit_bzero(window.baseAddress!, read)
                start += UInt(chunkSize)
            }
        }
        return found
    }

    /// Where a buffer lives, to exclude it.
    public static func range(of bytes: UnsafeRawBufferPointer) -> Range<UInt> {
        let start = UInt(bitPattern: bytes.baseAddress)
        return start..<(start + UInt(bytes.count))
    }

    private static func matches(of needle: UnsafeRawBufferPointer, in haystack: UnsafeRawBufferPointer) -> [Int] {
        guard let base = haystack.baseAddress, let first = needle.first, haystack.count >= needle.count else {
            return []
        }
        var result: [Int] = []
        var offset = 0
        while offset <= haystack.count - needle.count {
            guard let hit = memchr(base + offset, Int32(first), haystack.count - needle.count + 1 - offset) else {
                break
            }
            let position = base.distance(to: UnsafeRawPointer(hit))
            if memcmp(base + position, needle.baseAddress!, needle.count) == 0 { result.append(position) }
            offset = position + 1
        }
        return result
    }

    private static func readableRegions(_ process: String) -> [Range<UInt>] {
        (readFile("/proc/\(process)/maps") ?? "").split(separator: "\n").compactMap { line in
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 2, fields[1].hasPrefix("r") else { return nil }
            if let name = fields.last, name.hasPrefix("[v") { return nil }  // [vvar], [vsyscall]: not real memory
            let bounds = fields[0].split(separator: "-").compactMap { UInt($0, radix: 16) }
            return bounds.count == 2 ? bounds[0]..<bounds[1] : nil
        }
    }
}

/// The content of a file read in this process, whole (nil if it cannot be
/// read): in the test process itself, so that no child inherits a descriptor.
public func readFile(_ path: String) -> String? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
        let count = read(fd, &chunk, chunk.count)
        if count <= 0 { break }
        bytes += chunk[0..<count]
    }
    return String(decoding: bytes, as: UTF8.self)
}
