import KeychainCore

/// Why all of a descriptor's bytes could not be read as a secret.
enum SecretInputError: Error {
    case read(Errno)
    case tooLarge
}

/// All bytes from `fd` up to its end (a value on stdin, what a clipboard
/// tool prints), gathered in secret memory: never an ordinary array.
/// ``SecretInputError/tooLarge`` past 1 MiB, an item's limit.
func readSecret(from fd: BorrowedDescriptor) throws(SecretInputError) -> SecureBytes {
    let buffer = SecureBuffer()
    defer { buffer.wipe() }
    var chunk = [UInt8](repeating: 0, count: 65536)
    defer { chunk.withUnsafeMutableBytes { wipeMemory($0) } }
    while true {
        let count: Int
        do throws(Errno) {
            count = try chunk.withMutableBytes { (raw) throws(Errno) in try fd.read(into: raw) }
        } catch {
            throw .read(error)
        }
        if count == 0 { break }
        do {
            try chunk[0..<count].withUnsafeBytes { try buffer.append($0) }
        } catch {
            throw .tooLarge
        }
    }
    do { return try buffer.snapshot() } catch { throw .tooLarge }
}
