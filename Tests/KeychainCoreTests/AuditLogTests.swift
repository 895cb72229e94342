import Glibc
import Testing
@testable import KeychainCore
@testable import KeychainTPM

/// The audit log's chain: what is recorded, and that editing, removing,
/// reordering or cutting lines is found, across rotations and restarts.
@Suite struct AuditLogTests {
    static let subject = AuditSubject(pid: 7, uid: 1000, executable: "/usr/bin/app\twith tab", unit: "a.service")

    func lines(_ keychain: TemporaryKeychain, _ name: String = AuditLog.fileName) throws -> [String] {
        let text = try #require(readFileText(keychain.directory.path + "/" + name))
        return text.split(separator: "\n").map(String.init)
    }

    func write(_ keychain: TemporaryKeychain, _ lines: [String], _ name: String = AuditLog.fileName) {
        let text = lines.map { $0 + "\n" }.joined()
        let fd = open(keychain.directory.path + "/" + name, O_WRONLY | O_TRUNC)
        _ = Array(text.utf8).withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        close(fd)
    }

    @Test func eventsAreRecordedWithWhoAskedAndNeverAValueOrPasscode() throws {
        let keychain = try TemporaryKeychain()
        do {
            let device = try keychain.device()
            expectError(.authFailed) { try device.unlock(passcode: secure("wrong-passcode"), by: Self.subject) }
            try device.unlock(passcode: secure(TemporaryKeychain.passcode), by: Self.subject)
            device.audit.record(
                AuditEvent(
                    operation: "read", result: "ok", group: "g", identifier: "line\nbreak",
                    subject: Self.subject))
            device.lock(by: nil)
        }
        let all = try lines(keychain)
        #expect(all.count == 4)
        let parsed = all.compactMap(AuditLine.init(parsing:))
        #expect(parsed.map { $0.value("op") } == ["unlock", "unlock", "read", "lock"])
        #expect(parsed.map { $0.value("result") } == ["refused", "ok", "ok", "ok"])
        #expect(parsed[2].value("id") == "line\nbreak" && parsed[2].value("exe") == "/usr/bin/app\twith tab")
        #expect(parsed[2].value("unit") == "a.service" && parsed[2].value("pid") == "7")
        #expect(parsed[0].value("prev") == String(repeating: "0", count: 64))
        let text = all.joined(separator: "\n")
        #expect(!text.contains("wrong-passcode") && !text.contains(TemporaryKeychain.passcode))
        #expect(try AuditLog.verify(directory: keychain.directory).problems == [])
    }

    /// Lines carry the UTC time to the millisecond (`date -u +%FT%T.%3NZ`),
    /// the second's part formatted once and reused by the lines after it.
    @Test func linesCarryTheUTCTimeToTheMillisecond() throws {
        let keychain = try TemporaryKeychain()
        var before = timespec(), after = timespec()
        clock_gettime(CLOCK_REALTIME, &before)
        do {
            let device = try keychain.device()
            for _ in 0..<3 {
                device.audit.record(AuditEvent(operation: "read", result: "ok", group: "g", identifier: "i"))
            }
            device.shutDown()
        }
        clock_gettime(CLOCK_REALTIME, &after)
        func text(_ time: timespec) -> String {
            var parts = tm()
            var seconds = time.tv_sec
            gmtime_r(&seconds, &parts)
            func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
            return
                "\(parts.tm_year + 1900)-\(two(parts.tm_mon + 1))-\(two(parts.tm_mday))T\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec))"
        }
        let times = try lines(keychain).compactMap(AuditLine.init(parsing:)).compactMap { $0.value("time") }
        #expect(times.count >= 3)
        for time in times {
            #expect(time.count == 24 && time.hasSuffix("Z"), "\(time)")
            let second = String(time.prefix(19))
            #expect(text(before) <= second && second <= text(after), "\(time)")
            #expect(time.dropFirst(19).first == "." && Int(time.dropFirst(20).prefix(3)) != nil, "\(time)")
        }
    }

    /// Several boots append to one chain.
    @Test func aRestartContinuesTheChain() throws {
        let keychain = try TemporaryKeychain()
        for _ in 0..<3 {
            let device = try keychain.device()
            device.audit.record(AuditEvent(operation: "read", result: "ok", group: "g", identifier: "i"))
            device.shutDown()
        }
        let report = try AuditLog.verify(directory: keychain.directory)
        #expect(report.lines == 3 && report.problems == [])
        #expect(try lines(keychain).compactMap(AuditLine.init(parsing:)).map(\.sequence) == [1, 2, 3])
    }

    @Test func anEditedRemovedOrSwappedLineBreaksTheChain() throws {
        let keychain = try TemporaryKeychain()
        do {
            let device = try keychain.device()
            for index in 0..<5 {
                device.audit.record(AuditEvent(operation: "read", result: "ok", group: "g", identifier: "item\(index)"))
            }
            device.shutDown()
        }
        let original = try lines(keychain)
        write(
            keychain,
            original.enumerated().map {
                $0.offset == 2 ? $0.element.replacingFirst("result=ok", "result=denied") : $0.element
            })
        #expect(
            try AuditLog.verify(directory: keychain.directory).problems
                == ["audit.log line 3: its MAC does not match (the line was edited, or one before it)"])
        write(keychain, original.enumerated().filter { $0.offset != 1 }.map(\.element))
        #expect(
            try AuditLog.verify(directory: keychain.directory).problems
                == ["audit.log line 2: sequence 3 follows 1 (lines removed or reordered)"])
        write(keychain, [original[0], original[2], original[1], original[3], original[4]])
        #expect(try !AuditLog.verify(directory: keychain.directory).problems.isEmpty)
        write(keychain, original)
        #expect(try AuditLog.verify(directory: keychain.directory).problems == [])
    }

    /// The keychain keeps the newest line's MAC (at a clean stop, a lock,
    /// a grant): a log cut short of it is found, also after a restart.
    @Test func cuttingTheEndIsFoundAgainstTheKeychainsAnchor() throws {
        let keychain = try TemporaryKeychain()
        do {
            let device = try keychain.device()
            for index in 0..<4 {
                device.audit.record(AuditEvent(operation: "read", result: "ok", identifier: "i\(index)"))
            }
            device.shutDown()
        }
        write(keychain, Array(try lines(keychain).prefix(2)))
        #expect(
            try AuditLog.verify(directory: keychain.directory).problems
                == ["the log ends at line 2, but the keychain recorded line 4: its end was cut"])
        // A device booted on the cut log continues from its last line, which
        // differs from the keychain's record of line 4 once the log gets there.
        do {
            let device = try keychain.device()
            for _ in 0..<3 { device.audit.record(AuditEvent(operation: "read", result: "ok")) }
        }
        #expect(
            try AuditLog.verify(directory: keychain.directory).problems
                == ["audit.log line 4: differs from the line the keychain recorded as number 4"])
    }

    @Test func rotationKeepsTheChainVerifiableAcrossBothFiles() throws {
        let keychain = try TemporaryKeychain()
        let secret = DeviceSecret(secret: try keychain.directory.readDeviceSecret())
        let small = try AuditLog(directory: keychain.directory, key: secret.auditKey, anchor: nil, rotationSize: 1000)
        for index in 0..<40 {
            small.record(AuditEvent(operation: "read", result: "ok", group: "g", identifier: "item-\(index)"))
        }
        let current = try lines(keychain), rotated = try lines(keychain, AuditLog.rotatedName)
        #expect(current.count + rotated.count < 40)  // older rotations are gone: the log is bounded
        #expect(AuditLine(parsing: current[0])?.value("prev") != nil)
        let report = try AuditLog.verify(directory: keychain.directory)
        #expect(report.problems == [])
        // What rotation took is counted, and when it ended is said.
        let oldest = try #require(AuditLine(parsing: rotated[0]))
        #expect(
            report.rotatedAway == 40 - UInt64(current.count + rotated.count)
                && report.rotatedAway == oldest.sequence - 1)
        #expect(report.keptSince == oldest.value("time"))
        #expect(try AuditLog.VerifyReport(fields: report.fields).rotatedAway == report.rotatedAway)
        // The rotated file's last line removed: the current file no longer continues it.
        write(keychain, Array(rotated.dropLast()), AuditLog.rotatedName)
        #expect(
            try AuditLog.verify(directory: keychain.directory).problems == [
                "audit.log line 1: does not continue audit.log.1"
            ])
    }

    /// Identical denials in a row (the pid aside) are one line and a
    /// count, written before the next line: a flood of them costs the log
    /// two lines, and no denial before it is pushed out.
    @Test func identicalDenialsAreCountedOnOneLine() throws {
        let keychain = try TemporaryKeychain()
        let device = try keychain.device()
        for pid in 0..<10_000 {
            var subject = Self.subject
            subject.pid = Int32(pid)
            device.audit.record(
                AuditEvent(operation: "read", result: "denied", group: "g", identifier: "i", subject: subject))
        }
        device.audit.record(
            AuditEvent(operation: "read", result: "ok", group: "g", identifier: "i", subject: Self.subject))
        device.shutDown()
        let parsed = try lines(keychain).compactMap(AuditLine.init(parsing:))
        #expect(parsed.map { $0.value("result") } == ["denied", "denied", "ok"])
        #expect(parsed[0].value("pid") == "0" && parsed[1].value("pid") == "9999")
        #expect(parsed[1].value("detail") == "and 9999 more like it")
        #expect(try AuditLog.verify(directory: keychain.directory).problems == [])
    }

    /// 24,000 different denials of one program in a burst (the review's
    /// flood, which rotated an earlier denial out of both files): past
    /// its rate they are counted, the count is written, and the earlier
    /// denial stays.
    @Test func aFloodOfDenialsIsCountedAndRotatesNothingAway() throws {
        let keychain = try TemporaryKeychain()
        let device = try keychain.device()
        let victim = AuditSubject(pid: 1, uid: 1000, executable: "/usr/bin/victim", unit: nil)
        device.audit.record(
            AuditEvent(operation: "read", result: "denied", group: "secure", identifier: "first", subject: victim))
        for index in 0..<24_000 {
            device.audit.record(
                AuditEvent(
                    operation: "read", result: "denied", group: "secure", identifier: "x\(index)",
                    subject: Self.subject))
        }
        device.shutDown()
        let parsed = try lines(keychain).compactMap(AuditLine.init(parsing:))
        #expect(parsed.first?.value("id") == "first" && parsed.first?.value("exe") == "/usr/bin/victim")
        #expect(access(keychain.directory.path + "/" + AuditLog.rotatedName, F_OK) != 0)
        let written = parsed.filter { $0.value("exe") == Self.subject.executable && $0.value("detail") == nil }.count
        let summaries = parsed.filter { $0.value("detail")?.contains("more denials of this program") == true }
        #expect(summaries.count == 1)
        let counted = summaries.map { Int($0.value("detail")!.split(separator: " ")[1]) ?? -1 }.reduce(0, +)
        #expect(written + counted == 24_000 && written < 1_000, "\(written) written, \(counted) counted")
        #expect(try AuditLog.verify(directory: keychain.directory).problems == [])
    }

    @Test func aTamperedAnchorStopsTheBoot() throws {
        let keychain = try TemporaryKeychain()
        try keychain.device().shutDown()
        try keychain.withRawDatabase { try $0.execute(changingByte(9, ofMetaRecord: "audit")) }
        expectError(.decode) { try keychain.device() }
    }
}

private func readFileText(_ path: String) -> String? {
    guard let fd = FileDescriptor(open(path, O_RDONLY)) else { return nil }
    return (try? fd.borrowed.readAll(limit: 64 << 20)).map { String(decoding: $0, as: UTF8.self) }
}

private extension String {
    func replacingFirst(_ target: String, _ replacement: String) -> String {
        guard let range = firstRange(of: target) else { return self }
        return replacingCharacters(in: range, with: replacement)
    }
}
