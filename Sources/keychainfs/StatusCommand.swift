import ArgumentParser
import KeychainCore
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
            lines, among them key-protection (tpm2 or file) and, sealed by a TPM, tpm-lockout and \
            rollback-counter; with --json one object of the same keys (numbers as numbers).
            """)

    @OptionGroup var target: MountpointOrKeychain

    @Flag(help: "Print one JSON object of the same keys and values.")
    var json = false

    func run() throws {
        let lines: [String]
        if let mount = target.mount {
            guard let text = MountControlFile.text(mount.path) else { throw fail(mount.missingControl) }
            lines = String(decoding: text, as: UTF8.self).split(separator: "\n").map(String.init)
        } else {
            lines = try deviceLines()
        }
        guard json else {
            print(lines.joined(separator: "\n"))
            return
        }
        let members = lines.compactMap { line -> String? in
            let parts = line.split(separator: ":", maxSplits: 1)
            guard parts.count == 2 else { return nil }
            let value = String(parts[1].dropFirst())
            return jsonString(String(parts[0])) + ": " + (Int64(value).map(String.init) ?? jsonString(value))
        }
        print("{" + members.joined(separator: ", ") + "}")
    }

    private func deviceLines() throws -> [String] {
        let mode = if case .service = target.options.place { "service" } else { "per-user" }
        guard let device = try target.runningDevice() else {
            var lines = ["state: stopped", "mode: \(mode)"]
            // How the keys are kept is in the device-secret file (no TPM asked).
            if case .directory(let keychain) = target.options.place, let protection = try? keychain.keyProtection() {
                lines.append("key-protection: \(protection.rawValue)")
            }
            return lines
        }
        let status = try device.status()
        return status.lines() + ["mode: \(mode)"] + (status.keyProtection?.lines ?? []) + (status.judge?.lines ?? [])
    }
}
