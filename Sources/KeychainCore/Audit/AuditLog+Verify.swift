import Synchronization
#if canImport(Glibc)
import Glibc
#endif

extension AuditLog {
    /// Checks the chain of `directory`'s audit log (the rotated file first,
    /// then the current one) and that it reaches the newest line the
    /// keychain recorded. Returns the lines checked and the problems found
    /// (none: intact). Needs the device secret, not the passcode (unsealed
    /// through `keyProtectors`). The KeychainTPM target's `verify(directory:)` is the public one.
    package static func verify(directory: KeychainDirectory, keyProtectors: any KeyProtectors) throws(KeychainError)
        -> VerifyReport
    {
        let (secret, _) = try directory.openDeviceSecret(
            tcti: KeyProtection.configuredTCTI, keyProtectors: keyProtectors)
        let anchor = try storedAnchor(directory: directory, secret: secret)
        let chainKey = Crypto.KeyedHash(key: secret.auditKey.pointer.assumingMemoryBound(to: UInt8.self))
        var problems: [String] = []
        var checked = 0
        var previous: (sequence: UInt64, mac: [UInt8])?
        var oldest: AuditLine?
        for name in [rotatedName, fileName] {
            let path = directory.path + "/" + name
            guard let fd = FileDescriptor(open(path, O_RDONLY | O_CLOEXEC)) else {
                if name == fileName { problems.append("\(name) is missing") }
                continue
            }
            let read = Result { () throws(Errno) in try fd.borrowed.readAll(limit: 4 * rotationSize) }
            guard case .success(let bytes) = read else {
                problems.append("\(name) cannot be read")
                continue
            }
            if !bytes.isEmpty && bytes.last != UInt8(ascii: "\n") {
                problems.append("\(name): the last line is incomplete")
            }
            for (index, raw) in bytes.split(separator: UInt8(ascii: "\n")).enumerated() {
                let where_ = "\(name) line \(index + 1)"
                guard let line = AuditLine(parsing: String(decoding: raw, as: UTF8.self)) else {
                    problems.append("\(where_): not a log line")
                    previous = nil
                    continue
                }
                checked += 1
                if oldest == nil { oldest = line }
                var chainedFrom = previous
                if index == 0 {
                    guard let prev = line.value("prev").flatMap({ Hex.bytes($0, count: Crypto.macSize) }) else {
                        problems.append(
                            "\(where_): the file's first line does not say what it continues (its start was cut)")
                        previous = (line.sequence, line.mac)
                        continue
                    }
                    if let before = previous, before.sequence + 1 != line.sequence || before.mac != prev {
                        problems.append("\(where_): does not continue \(rotatedName)")
                    }
                    chainedFrom = (line.sequence - 1, prev)
                }
                if let from = chainedFrom {
                    if from.sequence + 1 != line.sequence {
                        problems.append(
                            "\(where_): sequence \(line.sequence) follows \(from.sequence) (lines removed or reordered)"
                        )
                    } else if Array(line.body.utf8).withUnsafeBytes({
                        chain(key: chainKey, previous: from.mac, body: $0)
                    }) != line.mac {
                        problems.append("\(where_): its MAC does not match (the line was edited, or one before it)")
                    }
                }
                if let anchor, line.sequence == anchor.sequence, line.mac != anchor.mac {
                    problems.append(
                        "\(where_): differs from the line the keychain recorded as number \(anchor.sequence)")
                }
                previous = (line.sequence, line.mac)
            }
        }
        if let anchor, anchor.sequence > (previous?.sequence ?? 0) {
            problems.append(
                "the log ends at line \(previous?.sequence ?? 0), but the keychain recorded line \(anchor.sequence): its end was cut"
            )
        }
        // Rotation drops the oldest file whole: what it held is counted
        // by the sequence numbers, and ended where the oldest kept line starts.
        return VerifyReport(
            lines: checked, problems: problems,
            rotatedAway: (oldest?.sequence ?? 1) - 1, keptSince: oldest?.value("time"))
    }

    /// What ``verify(directory:keyProtectors:)`` found.
    public struct VerifyReport: Sendable {
        /// The lines checked.
        public var lines: Int
        /// Each problem found, in a sentence (none: intact).
        public var problems: [String]
        /// Lines rotated away before the oldest kept one (its sequence number less one).
        public var rotatedAway: UInt64
        /// The time of the oldest kept line (nil: no line).
        public var keptSince: String?

        public init(lines: Int, problems: [String], rotatedAway: UInt64, keptSince: String?) {
            self.lines = lines
            self.problems = problems
            self.rotatedAway = rotatedAway
            self.keptSince = keptSince
        }

        /// As the protocol's verifyLog reply carries it (docs/PROTOCOL.md).
        public var fields: [String] { [String(lines), String(rotatedAway), keptSince ?? ""] + problems }

        /// From a verifyLog reply's fields; a device that sends no rotation
        /// figures (an older build) is read as having rotated nothing away.
        package init?(parsing fields: [String]) {
            guard let lines = fields.first.flatMap({ Int($0) }) else { return nil }
            if fields.count >= 3, let rotated = UInt64(fields[1]) {
                self.init(
                    lines: lines, problems: Array(fields.dropFirst(3)), rotatedAway: rotated,
                    keptSince: fields[2].isEmpty ? nil : fields[2])
            } else {
                self.init(lines: lines, problems: Array(fields.dropFirst()), rotatedAway: 0, keptSince: nil)
            }
        }
    }

    static func storedAnchor(directory: KeychainDirectory, secret: DeviceSecret) throws(KeychainError) -> Anchor? {
        // The anchor is bound to the rollback counter's epoch, if any.
        if let rollback = try RawMetadata.read(directory, RollbackRecord.recordKey) {
            secret.epoch.value = try RollbackRecord(decoding: rollback, secret: secret).epoch
        }
        return try RawMetadata.read(directory, anchorKey).map { (raw) throws(KeychainError) in
            try Anchor(decoding: raw, secret: secret)
        }
    }
}
