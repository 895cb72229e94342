import ArgumentParser
import KeychainCore
import KeychainProtocol
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct StatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status", abstract: "Print the device status of a mount, or of the keychain's device.",
        discussion: """
            With a mount point: its .control file. Without: the keychain's device, through its \
            socket (state: stopped when none runs: the keychain is locked). Either way key: value \
            lines, among them key-protection (tpm2 or file) and, sealed by a TPM, tpm (which one: the \
            machine's /dev/tpmrm0, one $TPM2TOOLS_TCTI named, or the service's), tpm-lockout and \
            rollback-counter; with --json one object of the same keys (numbers as numbers).
            """)

    @OptionGroup var target: MountpointOrKeychain

    @Flag(help: "Print one JSON object of the same keys and values.")
    var json = false

    func run() throws {
        let report = try self.report()
        guard json else {
            print(report.text, terminator: "")
            return
        }
        let members = report.map { entry in
            switch entry.value {
            case .text(let text): return jsonString(entry.key) + ": " + jsonString(text)
            case .number(let number): return jsonString(entry.key) + ": " + String(number)
            }
        }
        print("{" + members.joined(separator: ", ") + "}")
    }

    /// The device's report (``DeviceStatus/report()``), over its socket
    /// (a mount's: with the mount's group); a keychain no device holds is
    /// `state: stopped`.
    private func report() throws -> [StatusEntry] {
        var report = try deviceReport()
        // Where this user's devices listen, and why there, where XDG_RUNTIME_DIR did not say it
        // (cron, `su -`, ssh without pam_systemd: a command there looks elsewhere than the session's).
        if case .directory = target.options.place, target.mount == nil {
            let runtime = RuntimePaths.chosen
            if !runtime.fromEnvironment {
                report.append(StatusEntry("runtime-directory", runtime.path + " (" + runtime.why + ")"))
            }
        }
        return report
    }

    private func deviceReport() throws -> [StatusEntry] {
        if let mount = target.mount {
            return try mount.device().call(.status(ofMount: mount.path), about: .action("no status")).report()
        }
        guard let device = try target.runningDevice() else {
            let mode: ServingFacts.Mode = if case .service = target.options.place { .service } else { .perUser }
            // How the keys are kept is in the device-secret file (no TPM asked).
            guard case .directory(let keychain) = target.options.place else {
                return DeviceStatus.stoppedReport(mode: mode, keyProtection: nil)
            }
            return DeviceStatus.stoppedReport(mode: mode, keyProtection: try? keychain.keyProtection())
        }
        return try device.status().report()
    }
}
