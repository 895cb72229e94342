import Foundation
import KeychainCore

/// The logins a test's terminals stand for, recorded as logind records a
/// session (`/run/systemd/sessions/ID`, root's: `UID=`, `TTY=`): the device
/// asks a question only at the terminal of a login root recorded
/// (docs/SECURITY.md, "Asked at a terminal"). A program of the test's user
/// that stands for a person at a login writes `+pts/N` (its terminal) to
/// ``fifo``, or `-` for none, and waits for ``pythonRecordLogin``'s record;
/// this object, as root, writes one record at a time, and removes it, and
/// the directory if it made it, when the test ends.
package final class LoginRecords: @unchecked Sendable {
    package let fifo: String
    private let uid: uid_t
    private let madeDirectory: Bool
    private let finished = DispatchSemaphore(value: 0)
    private static let directory = "/run/systemd/sessions"

    package init(uid: uid_t, in root: String) throws {
        self.uid = uid
        fifo = root + "/logins"
        madeDirectory = !FileManager.default.fileExists(atPath: Self.directory)
        try FileManager.default.createDirectory(atPath: Self.directory, withIntermediateDirectories: true)
        guard mkfifo(fifo, 0o666) == 0, chmod(fifo, 0o666) == 0 else { throw HarnessError("mkfifo \(fifo) failed") }
        // Read and write: the reader never sees an end while no writer has it open.
        guard let reading = FileHandle(forUpdatingAtPath: fifo) else { throw HarnessError("cannot open \(fifo)") }
        // The thread holds none of `self`, whose deinit stops it.
        Thread.detachNewThread { [uid, finished] in
            var pending = Data()
            reading: while true {
                let chunk = reading.availableData
                if chunk.isEmpty { break }
                pending.append(chunk)
                while let end = pending.firstIndex(of: UInt8(ascii: "\n")) {
                    let line = String(decoding: pending[pending.startIndex..<end], as: UTF8.self)
                    pending.removeSubrange(pending.startIndex...end)
                    if line == "stop" { break reading }
                    Self.removeRecords(of: uid)
                    if line.hasPrefix("+") {
                        let fields = line.dropFirst().split(separator: " ")
                        Self.record(
                            String(fields.first ?? ""), of: uid, beganAgo: fields.count > 1 ? Int(fields[1]) ?? 0 : 0)
                    }
                }
            }
            try? reading.close()
            finished.signal()
        }
    }

    deinit {
        if let writing = FileHandle(forWritingAtPath: fifo) {
            writing.write(Data("stop\n".utf8))
            try? writing.close()
            finished.wait()
        }
        Self.removeRecords(of: uid)
        unlink(fifo)
        if madeDirectory { rmdir(Self.directory) }
    }

    /// The record for `terminal` (`pts/N`) of `uid`'s login, begun
    /// `beganAgo` seconds ago (logind's `REALTIME=`, in microseconds).
    private static func record(_ terminal: String, of uid: uid_t, beganAgo: Int) {
        let path = directory + "/kcfs-test-\(uid)-" + terminal.replacingOccurrences(of: "/", with: "-")
        let began = (Int(Date().timeIntervalSince1970) - beganAgo) * 1_000_000
        try? "UID=\(uid)\nSTATE=active\nTYPE=tty\nTTY=\(terminal)\nREALTIME=\(began)\n".write(
            toFile: path, atomically: true, encoding: .utf8)
        chmod(path, 0o644)
    }

    private static func removeRecords(of uid: uid_t) {
        let prefix = "kcfs-test-\(uid)-"
        for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] where name.hasPrefix(prefix)
        {
            unlink(directory + "/" + name)
        }
    }

    /// Python for a test's program: `record_login(True)` in a process whose
    /// standard input is its terminal records that terminal as a login's
    /// and waits for the record; `record_login(False)` records none;
    /// `record_login(True, 60)` records a login begun a minute before.
    package static let pythonRecordLogin = """
        def record_login(recorded, began_ago=0):
            import os, time
            name = os.ttyname(0)[len("/dev/"):]
            with open(os.environ["R"] + "/logins", "w") as logins:
                logins.write(("+%s %d" % (name, began_ago) if recorded else "-") + "\\n")
            record = "/run/systemd/sessions/kcfs-test-%d-%s" % (os.getuid(), name.replace("/", "-"))
            while os.path.exists(record) != recorded:
                time.sleep(0.01)
        """
}
