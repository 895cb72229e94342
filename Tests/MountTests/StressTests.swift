import Foundation
import KeychainFS
import Synchronization
import Testing
import TestSupport
@testable import KeychainCore

extension SerialTests {
    /// Promises kept under load and at the worst moments. Sizes are bounded for
    /// CI; `KEYCHAINFS_STRESS_SCALE=N` (scripts/stress) multiplies them.
    @Suite struct StressTests {
        static let scale = Int(ProcessInfo.processInfo.environment["KEYCHAINFS_STRESS_SCALE"] ?? "") ?? 1

        /// `kill -9` of the device at random moments under four writers: every
        /// write whose close returned 0 reads back exactly, the one in flight
        /// is the old or the new value, the database passes integrity_check, and
        /// the next mount works at once.
        @Test func killingTheDeviceAtRandomMomentsLosesNoAcknowledgedWrite() throws {
            let harness = try MountHarness()
            let mnt = harness.root + "/mnt"
            var ledger = WriteLedger()
            for round in 0..<(20 * Self.scale) {
                let pid = try harness.mountForeground()
                try harness.unlock(mnt)
                // Every value acknowledged so far is there, exactly (or the in-flight one).
                for (path, allowed) in ledger.allowedValues() {
                    let value = readFile(mnt + path)
                    #expect(
                        allowed.contains(value), "round \(round): \(path) is \(value ?? "absent"), allowed \(allowed)")
                }
                ledger.settle { readFile(mnt + $0) }
                let writers = (0..<4).map { writer in
                    WriterThread(mnt: mnt, writer: writer, round: round, ledger: ledger.shared)
                }
                usleep(UInt32.random(in: 20_000...150_000))  // a random moment: this is the experiment, not a wait
                #expect(kill(pid, SIGKILL) == 0)
                _ = Spawn.wait(pid)
                writers.forEach { $0.join() }
                ledger.collect()
                #expect(try integrityCheck(harness.keychain) == "ok")
            }
            #expect(ledger.acknowledgedCount > 20 * Self.scale, "too few writes were acknowledged to test anything")
        }

        /// Sixteen threads write, read, rename and delete across two groups
        /// while another locks and unlocks: no torn value, no errno but EACCES
        /// (locked) and ENOENT (renamed or removed), no hang, no descriptor left
        /// open in the device.
        @Test func sixteenThreadsAndALockTogglerSeeOnlyWholeValuesAndExpectedErrors() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(mkdir(mnt + "/second", 0o700) == 0)
            let pid = try #require(MountHarness.devicePid(mnt))
            let descriptorsBefore = openDescriptors(pid)
            let run = ChurnRun()
            let done = DispatchGroup()
            for worker in 0..<16 {
                done.enter()
                Thread {
                    churn(mnt: mnt, worker: worker, run: run)
                    done.leave()
                }.start()
            }
            done.enter()
            Thread {
                while !run.stop.load(ordering: .relaxed) {
                    _ = writeErrno(mnt + "/.control", "lock\n")
                    _ = writeErrno(mnt + "/.control", "unlock \(MountHarness.passcode)\n")
                }
                done.leave()
            }.start()
            run.finish(after: 2 * Self.scale, threads: done)
            #expect(openDescriptors(pid) == descriptorsBefore)
            #expect(isRunning(pid))
            withExtendedLifetime(harness) {}  // its deinit unmounts
        }
    }
}

extension SerialTests.StressTests {
    /// A name replaced atomically (`rename` over it) always exists: readers
    /// racing the replacements never see ENOENT, and never ESTALE (the
    /// kernel looks a name up again after one ESTALE, but only once, so
    /// an open that raced two replacements used to fail with it;
    /// docs/FILESYSTEM.md, "The device process").
    @Test func readersRacingAtomicReplacementsNeverSeeAbsenceOrStale() throws {
        let (harness, mnt) = try MountHarness.unlockedMount()
        /// Creates or replaces `path` with `value`; errno, or 0.
        @Sendable func store(_ path: String, _ value: String) -> Int32 {
            let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
            if fd < 0 { return errno }
            let count = value.utf8.count
            let written = value.withCString { write(fd, $0, count) }
            let error = written == count ? 0 : errno
            return close(fd) == 0 ? error : errno
        }
        #expect(store(mnt + "/default/x", "value 0") == 0)
        let run = ChurnRun()
        let done = DispatchGroup()
        for worker in 0..<2 {
            done.enter()
            Thread {
                var sequence = 0
                while !run.stop.load(ordering: .relaxed) {
                    sequence += 1
                    let temporary = mnt + "/default/tmp-\(worker)"
                    guard store(temporary, "value \(worker)-\(sequence)") == 0,
                        rename(temporary, mnt + "/default/x") == 0
                    else {
                        run.failures.withLock { $0.append("replace: errno \(errno)") }
                        break
                    }
                }
                done.leave()
            }.start()
        }
        for _ in 0..<6 {
            done.enter()
            Thread {
                var buffer = [UInt8](repeating: 0, count: 256)
                while !run.stop.load(ordering: .relaxed) {
                    let fd = open(mnt + "/default/x", O_RDONLY | O_CLOEXEC)
                    if fd < 0 {
                        let error = errno
                        run.failures.withLock { $0.append("open: errno \(error)") }
                        continue
                    }
                    let count = read(fd, &buffer, buffer.count)
                    close(fd)
                    if count <= 0 || !String(decoding: buffer[0..<max(count, 0)], as: UTF8.self).hasPrefix("value ") {
                        run.failures.withLock { $0.append("read: \(count)") }
                    }
                    run.operations.add(1, ordering: .relaxed)
                }
                done.leave()
            }.start()
        }
        // stat of the name: the kernel answers from the inode it looked up,
        // which a replacement may have detached by the time it asks.
        for _ in 0..<2 {
            done.enter()
            Thread {
                var info = stat()
                while !run.stop.load(ordering: .relaxed) {
                    if stat(mnt + "/default/x", &info) != 0 {
                        let error = errno
                        run.failures.withLock { $0.append("stat: errno \(error)") }
                    }
                    run.operations.add(1, ordering: .relaxed)
                }
                done.leave()
            }.start()
        }
        run.finish(after: 3 * Self.scale, threads: done)
        withExtendedLifetime(harness) {}
    }
}

// MARK: kill -9

/// What the writers were told: per item, the value acknowledged last and
/// the one being written when the device died.
private struct WriteLedger {
    final class Shared: @unchecked Sendable {
        let lock = NSLock()
        var acknowledged: [String: String] = [:]
        var inFlight: [String: String] = [:]
        var count = 0
    }
    let shared = Shared()
    private(set) var acknowledgedCount = 0

    /// Per item, what it may hold now (nil: absent): what was acknowledged,
    /// or what was in flight; an item whose creation was in flight may also
    /// be absent or empty (created, not yet written).
    func allowedValues() -> [(String, Set<String?>)] {
        shared.lock.withLock {
            shared.acknowledged.map { path, value in (path, Set([value, shared.inFlight[path] ?? value])) }
                + shared.inFlight.filter { shared.acknowledged[$0.key] == nil }.map { ($0.key, [$0.value, "", nil]) }
        }
    }

    /// After a check: what each item holds now is what it holds.
    func settle(_ read: (String) -> String?) {
        shared.lock.withLock {
            for path in shared.inFlight.keys {
                if let value = read(path) { shared.acknowledged[path] = value }
            }
            shared.inFlight.removeAll()
        }
    }

    mutating func collect() {
        acknowledgedCount = shared.lock.withLock { shared.count }
    }
}

/// Writes `w<writer>-<n>` items in a loop until the mount dies.
private final class WriterThread: @unchecked Sendable {
    private let finished = DispatchSemaphore(value: 0)

    init(mnt: String, writer: Int, round: Int, ledger: WriteLedger.Shared) {
        Thread { [finished] in
            var sequence = 0
            while true {
                let path = "/default/w\(writer)-\(sequence % 5)"
                let value =
                    "round \(round) writer \(writer) write \(sequence) " + String(repeating: "v", count: sequence % 300)
                ledger.lock.withLock { ledger.inFlight[path] = value }
                let fd = open(mnt + path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
                if fd < 0 { break }
                let count = value.utf8.count
                let written = value.withCString { write(fd, $0, count) }
                let closed = close(fd)
                guard written == count, closed == 0 else { break }
                ledger.lock.withLock {
                    ledger.acknowledged[path] = value
                    ledger.inFlight[path] = nil
                    ledger.count += 1
                }
                sequence += 1
            }
            finished.signal()
        }.start()
    }

    func join() { finished.wait() }
}

/// PRAGMA integrity_check of a keychain's database, as the device left it.
private func integrityCheck(_ keychain: String) throws -> String {
    let db = try SQLiteConnection(path: keychain + "/keychain.db", create: false)
    let query = try db.statement("PRAGMA integrity_check")
    defer { db.finishStatements() }
    return try query.step() ? query.text(0) : "no answer"
}

// MARK: Churn

/// A value that carries its own check: a reader can tell a whole one from a torn one.
private func wholeValue(worker: Int, sequence: Int) -> String {
    let body = "worker \(worker) value \(sequence) " + String(repeating: "x", count: (worker * 37 + sequence) % 500)
    return body + " len=\(body.utf8.count)"
}

private func isWhole(_ value: String) -> Bool {
    guard let marker = value.range(of: " len=", options: .backwards) else { return false }
    return Int(value[marker.upperBound...]) == value[..<marker.lowerBound].utf8.count
}

/// What the churning threads share.
private final class ChurnRun: Sendable {
    let stop = Atomic<Bool>(false)
    let failures = Mutex<[String]>([])
    let operations = Atomic<Int>(0)

    /// Lets the threads run for `seconds` (the length of the run is the
    /// experiment, not a wait for something), stops them, and expects that
    /// every one ended, nothing failed and enough happened.
    func finish(after seconds: Int, threads: DispatchGroup, sourceLocation: SourceLocation = #_sourceLocation) {
        usleep(UInt32(seconds * 1_000_000))
        stop.store(true, ordering: .relaxed)
        #expect(
            threads.wait(timeout: .now() + 30) == .success, "a filesystem call hung", sourceLocation: sourceLocation)
        let failures = failures.withLock { $0 }
        let count = operations.load(ordering: .relaxed)
        #expect(
            failures.count == 0, "\(failures.count) failures in \(count) operations: \(failures.prefix(10))",
            sourceLocation: sourceLocation)
        #expect(count > 100, sourceLocation: sourceLocation)
    }
}

private func churn(mnt: String, worker: Int, run: ChurnRun) {
    let groups = ["default", "second"]
    var sequence = 0
    func fail(_ what: String) { run.failures.withLock { $0.append("worker \(worker): \(what)") } }
    func expected(_ error: Int32) -> Bool { error == EACCES || error == ENOENT }
    while !run.stop.load(ordering: .relaxed) {
        sequence += 1
        let group = groups[sequence % 2]
        let item = "\(mnt)/\(group)/item-\(Int.random(in: 0..<6))"
        switch Int.random(in: 0..<10) {
        case 0..<4:
            let value = wholeValue(worker: worker, sequence: sequence)
            let fd = open(item, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
            if fd < 0 { if !expected(errno) { fail("open for write: errno \(errno)") }; continue }
            let count = value.utf8.count
            if value.withCString({ write(fd, $0, count) }) != count, !expected(errno) { fail("write: errno \(errno)") }
            if close(fd) != 0, !expected(errno) { fail("close: errno \(errno)") }
        case 4..<8:
            let fd = open(item, O_RDONLY | O_CLOEXEC)
            if fd < 0 { if !expected(errno) { fail("open for read: errno \(errno)") }; continue }
            var bytes = [UInt8](repeating: 0, count: 4096)
            let count = read(fd, &bytes, bytes.count)
            let error = errno
            close(fd)
            if count < 0 {
                if !expected(error) { fail("read: errno \(error)") }
            } else if count > 0 {
                let value = String(decoding: bytes[0..<count], as: UTF8.self)
                // Empty: created and not written yet, or emptied by O_TRUNC before its write (docs/FILESYSTEM.md).
                if !isWhole(value) { fail("torn value \(value.prefix(40).debugDescription)") }
            }
        case 8:
            let target = "\(mnt)/\(group)/item-\(Int.random(in: 0..<6))"
            if rename(item, target) != 0, !expected(errno) { fail("rename: errno \(errno)") }
        default:
            if unlink(item) != 0, !expected(errno) { fail("unlink: errno \(errno)") }
        }
        run.operations.add(1, ordering: .relaxed)
    }
}

private func openDescriptors(_ pid: pid_t) -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
}
