import Foundation
import KeychainCore

/// A software TPM 2.0 (`swtpm`, from Debian) for one test: its own state
/// directory and TCP ports on the loopback address, started in the
/// foreground as a child of the test and killed when the test ends.
/// `restart()` keeps the state (a reboot); a second instance is another
/// TPM (another storage seed).
package final class SoftwareTPM: @unchecked Sendable {
    package let stateDirectory: String
    package private(set) var port: Int = 0
    private var pid: pid_t = 0

    /// The TCTI configuration that reaches it, as `$TPM2TOOLS_TCTI` takes it.
    package var tcti: String { "swtpm:host=127.0.0.1,port=\(port)" }

    /// A new TPM, or, given `state`, a copy of the TPM whose state
    /// directory that is (a committed fixture's: the copy is this test's).
    package init(copyingState state: String? = nil) throws {
        stateDirectory = try makeTemporaryDirectory("kcfs-tpm")
        if let state {
            for file in try FileManager.default.contentsOfDirectory(atPath: state) {
                try FileManager.default.copyItem(atPath: state + "/" + file, toPath: stateDirectory + "/" + file)
            }
        }
        try start()
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: stateDirectory)
    }

    /// Stops and starts it again on its state: what a machine's reboot is to a TPM.
    package func restart() throws {
        stop()
        try start()
    }

    package func stop() {
        guard pid > 0 else { return }
        kill(pid, SIGTERM)
        _ = Spawn.wait(pid)
        pid = 0
    }

    /// Starts swtpm on a free pair of ports (a taken one makes it exit at
    /// once: another pair is tried) and waits until it accepts a connection.
    private func start() throws {
        for _ in 0..<20 {
            let candidate = Int.random(in: 20_000...60_000) & ~1
            var options = Spawn.Options()
            options.nullStandardStreams = true
            guard
                let started = Spawn.start(
                    [
                        "/usr/bin/swtpm", "socket", "--tpm2",
                        "--server", "type=tcp,port=\(candidate),bindaddr=127.0.0.1",
                        "--ctrl", "type=tcp,port=\(candidate + 1),bindaddr=127.0.0.1",
                        "--tpmstate", "dir=\(stateDirectory)", "--flags", "not-need-init,startup-clear"
                    ], options: options)
            else { throw HarnessError("cannot run swtpm (apt install swtpm)") }
            let deadline = Date().addingTimeInterval(5)
            while Date() < deadline {
                if MachineFixtures.loopbackAccepts(port: candidate) {
                    pid = started
                    port = candidate
                    return
                }
                var status: Int32 = 0
                if waitpid(started, &status, WNOHANG) == started { break }  // the port was taken
                usleep(10_000)
            }
            kill(started, SIGKILL)
            _ = Spawn.wait(started)
        }
        throw HarnessError("swtpm did not start")
    }

}

/// tpm2-tools (Debian's `tpm2-tools`) against a software TPM, as anyone
/// who reaches a TPM can run them: the attacks in docs/SECURITY.md,
/// "Bound to this machine, against whoever holds the files and the TPM".
package enum TPMTools {
    /// Runs `script` with `sh -c`, `$TPM2TOOLS_TCTI` naming `tpm`; stdout and stderr together.
    package static func run(_ script: String, on tpm: SoftwareTPM) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", script]
        var environment = ProcessInfo.processInfo.environment
        environment["TPM2TOOLS_TCTI"] = tpm.tcti
        environment["TSS2_LOG"] = "all+NONE"
        process.environment = environment
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    /// The handles of the TPM's persistent objects (0x81xxxxxx), in order.
    package static func persistentHandles(on tpm: SoftwareTPM) throws -> [UInt32] {
        let listed = try run("tpm2_getcap handles-persistent", on: tpm)
        guard listed.status == 0 else { throw HarnessError("tpm2_getcap failed: \(listed.output)") }
        return listed.output.split(separator: "\n").compactMap { line in
            UInt32(line.trimmingCharacters(in: CharacterSet(charactersIn: "- ")).dropFirst(2), radix: 16)
        }.sorted()
    }

    /// The NV indexes defined in the owner range keychains take (0x01810000 and up), in order.
    package static func counterIndexes(on tpm: SoftwareTPM) throws -> [UInt32] {
        let listed = try run("tpm2_getcap handles-nv-index", on: tpm)
        guard listed.status == 0 else { throw HarnessError("tpm2_getcap failed: \(listed.output)") }
        return listed.output.split(separator: "\n").compactMap { line in
            let hex = line.trimmingCharacters(in: CharacterSet(charactersIn: "- ")).dropFirst(2)
            return UInt32(hex, radix: 16)
        }.filter { $0 >= 0x0181_0000 && $0 <= 0x01BF_FFFF }.sorted()
    }
}
