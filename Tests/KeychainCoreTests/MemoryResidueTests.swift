import Foundation
import Testing
@testable import KeychainCore

/// After `lock`, nothing derived from the passcode and no key of a locked
/// class may remain anywhere in the process: heap, stacks of live and exited
/// threads, libsodium's buffers. The test scans its own memory for them.
@Suite struct MemoryResidueTests {
    @Test func noPasscodeMaterialOrLockedClassKeyRemainsInMemoryAfterLock() throws {
        let root = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let directory = KeychainDirectory(path: root + "/keychain")
        // Random bytes, never a String: a String would be a copy of our own.
        let passcode = SecureBytes.random(count: 24)
        try Device.createKeychain(at: directory, passcode: passcode, kdf: .insecureFastForTests)
        // What an attacker would look for, computed where no copy stays behind.
        let secrets = try SecretThread.run { () throws -> [SecureBytes] in
            let secret = DeviceSecret(secret: try directory.readDeviceSecret())
            let db = try SQLiteConnection(path: directory.databasePath, create: false)
            let query = try db.statement("SELECT value FROM meta WHERE key = 'keybag'")
            #expect(try query.step())
            let bag = try Keybag(decoding: query.blob(0), secret: secret)
            db.finishStatements()
            let stretched = try Crypto.stretch(passcode: passcode, salt: bag.salt, parameters: bag.kdf)
            let passcodeKey = try bag.passcodeKey(secret: secret, passcode: passcode)
            let classKeys = try [ProtectionClass.whenUnlocked, .whenUnlockedThisDeviceOnly].map {
                try bag.unwrap($0, secret: secret, passcodeKey: passcodeKey)
            }
            return try [stretched] + ([passcodeKey] + classKeys).map { key in
                try key.withKey { try SecureBytes(copying: UnsafeRawBufferPointer(start: $0, count: Crypto.keySize)) }
            }
        }

        let device = try Device(directory: directory)
        // As a libfuse worker does: unlock on another thread, which stays
        // alive (its stack below the current frame keeps whatever the calls
        // left there; glibc zeroes most of a stack only when its thread exits).
        let worker = ParkedWorker { try device.unlock(passcode: passcode) }
        defer { worker.finish() }
        try worker.waitForWork()
        #expect(!device.isLocked)
        device.lock()

        let patterns = [("passcode", passcode)] + zip(["stretched passcode", "passcode key", "whenUnlocked key",
                                                        "whenUnlockedThisDeviceOnly key"], secrets).map { ($0, $1) }
        // A canary: a plain copy that the scan must find, so that it cannot pass by seeing nothing.
        let canary = SecureBytes.random(count: 32)
        let canaryCopy = canary.bytes()
        let found = try MemoryScan.find(patterns + [("canary", canary)])
        withExtendedLifetime(canaryCopy) {}
        #expect(found.contains { $0.hasPrefix("canary") }, "the scan did not find a planted copy")
        let residue = found.filter { !$0.hasPrefix("canary") }
        #expect(residue.isEmpty, "left in memory after lock: \(residue)")
    }
}

/// A thread that runs one piece of work, then stays parked until `finish`.
private final class ParkedWorker: @unchecked Sendable {
    private let work: () throws -> Void
    private var error: Error?
    private let done = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
    private var thread = pthread_t()

    init(_ work: @escaping () throws -> Void) {
        self.work = work
        let context = Unmanaged.passRetained(self)
        let started = pthread_create(&thread, nil, { raw in
            let worker = Unmanaged<ParkedWorker>.fromOpaque(raw!).takeRetainedValue()
            do { try worker.work() } catch { worker.error = error }
            worker.done.signal()
            worker.release.wait()
            return nil
        }, context.toOpaque())
        precondition(started == 0)
    }

    /// Waits until the work is done; rethrows its error.
    func waitForWork() throws {
        done.wait()
        if let error { throw error }
    }

    func finish() {
        release.signal()
        pthread_join(thread, nil)
    }
}

/// Searches every readable mapping of this process for byte patterns, except
/// where the patterns themselves live.
enum MemoryScan {
    static func find(_ patterns: [(name: String, bytes: SecureBytes)]) throws -> [String] {
        let own = patterns.map { $0.bytes.withUnsafeBytes { UInt(bitPattern: $0.baseAddress) } }
        let chunkSize = 1 << 19, overlap = 64
        // The window lives in secret memory and is wiped after each chunk, so
        // what it copies is neither left around nor found twice.
        let window = try SecureBytes(count: chunkSize + overlap)
        let windowStart = window.withUnsafeBytes { UInt(bitPattern: $0.baseAddress) }
        let windowRange = windowStart..<(windowStart + UInt(window.count))
        let mem = open("/proc/self/mem", O_RDONLY)
        guard mem >= 0 else { throw POSIXError(.EACCES) }
        defer { close(mem) }
        var found: [String] = []
        for region in readableRegions() {
            var start = region.lowerBound
            while start < region.upperBound {
                let length = Int(min(UInt(chunkSize + overlap), region.upperBound - start))
                let read = pread(mem, window.mutableBytes.baseAddress, length, off_t(Int64(bitPattern: UInt64(start))))
                if read <= 0 { break }
                for (index, pattern) in patterns.enumerated() {
                    for offset in matches(of: pattern.bytes, in: UnsafeRawBufferPointer(start: window.mutableBytes.baseAddress, count: read)) {
                        let address = start + UInt(offset)
                        if address == own[index] || windowRange.contains(address) { continue }
                        found.append("\(pattern.name) at 0x\(String(address, radix: 16))")
                    }
                }
                wipeMemory(UnsafeMutableRawBufferPointer(start: window.mutableBytes.baseAddress, count: read))
                start += UInt(chunkSize)
            }
        }
        return found
    }

    private static func matches(of pattern: SecureBytes, in haystack: UnsafeRawBufferPointer) -> [Int] {
        pattern.withUnsafeBytes { needle in
            guard let base = haystack.baseAddress, haystack.count >= needle.count else { return [] }
            var result: [Int] = []
            var offset = 0
            let first = Int32(needle[0])
            while offset <= haystack.count - needle.count {
                guard let hit = memchr(base + offset, first, haystack.count - needle.count + 1 - offset) else { break }
                let position = base.distance(to: UnsafeRawPointer(hit))
                if memcmp(base + position, needle.baseAddress!, needle.count) == 0 { result.append(position) }
                offset = position + 1
            }
            return result
        }
    }

    private static func readableRegions() -> [Range<UInt>] {
        let maps = (try? String(contentsOfFile: "/proc/self/maps", encoding: .utf8)) ?? ""
        return maps.split(separator: "\n").compactMap { line in
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 2, fields[1].hasPrefix("r") else { return nil }
            if let name = fields.last, name.hasPrefix("[v") { return nil }  // [vvar], [vsyscall]: not real memory
            let bounds = fields[0].split(separator: "-").compactMap { UInt($0, radix: 16) }
            return bounds.count == 2 ? bounds[0]..<bounds[1] : nil
        }
    }
}
