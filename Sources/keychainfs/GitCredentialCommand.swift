import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

/// git's credential helper (gitcredentials(7), "custom helpers"): git runs
/// `git-credential-keychainfs [OPTIONS] get|store|erase` (a link to this
/// binary, which the package installs) with `key=value` lines on stdin.
/// Credentials are items of the `git` group, one per protocol, host and
/// path, holding `username=...` and `password=...` lines.
struct GitCredentialCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "git-credential",
        abstract: "git's credential helper: `git config credential.helper keychainfs`.",
        discussion: """
            Needs git-credential-keychainfs (a link to keychainfs) on PATH. While the keychain is \
            locked, get answers nothing and erase erases nothing; both say so on standard error; \
            a store says so too, and exits 3 (locked). \
            Without a running device, the same.
            """)

    static let group = "git"

    @Argument(help: "get, store or erase (from git).")
    var action: String

    @OptionGroup var options: KeychainOptions

    func run() throws {
        guard ["get", "store", "erase"].contains(action) else { return }  // git may add actions: ignore them
        let request = Self.readRequest()
        guard let proto = request["protocol"], let host = request["host"] else { return }
        let identifier = Self.identifier(protocol: proto, host: host, path: request["path"])
        // None runs: start it (locked), so that a `store` is never dropped unseen.
        let started = options.place.startedDevice()
        guard let socketPath = started.socketPath else {
            return Self.say("no device for the keychain (\(started.problem ?? "")); git credentials are not available")
        }
        // git reads no status: every refusal is a sentence on standard error, and the answer is empty.
        let device = RunningDevice(listeningAt: socketPath)
        switch action {
        case "get":
            switch try device.outcome(.get(group: Self.group, identifier: identifier)) {
            case .success(let item)?:
                let value = item.value
                if let username = request["username"], !Self.fields(value).contains("username=" + username) { return }
                _ = value.withUnsafeBytes { try? BorrowedDescriptor.standardOutput.writeAll($0) }
            case .failure(.keychain(.interactionNotAllowed, _))?:
                Self.say("the keychain is locked; unlock it to use the stored git credentials")
            case .failure?, nil:
                return
            }
        case "store":
            guard let username = request["username"], let password = request["password"] else { return }
            guard let value = try? SecureBytes("username=\(username)\npassword=\(password)\n") else { return }
            if case .failure(.keychain(let error, _))? = try device.outcome(
                .set(group: Self.group, identifier: identifier, value: value))
            {
                Self.say(
                    error == .interactionNotAllowed
                        ? "the keychain is locked; the credentials were not stored"
                        : "the credentials were not stored: \(error)")
                // A store that did not happen is no success (`git credential approve` shows the status).
                throw ExitStatus.of(error)
            }
        default:  // erase
            // Only the credential git names: read it first (which needs the key).
            switch try device.outcome(.get(group: Self.group, identifier: identifier)) {
            case .success(let item)?:
                if let username = request["username"], !Self.fields(item.value).contains("username=" + username) {
                    return
                }
                _ = try device.outcome(.remove(group: Self.group, identifier: identifier))
            case .failure(.keychain(.interactionNotAllowed, _))?:
                Self.say("the keychain is locked; nothing was erased")
            case .failure?, nil:
                return
            }
        }
    }

    /// The request's `key=value` lines, up to a blank line or the end.
    private static func readRequest() -> [String: String] {
        var request: [String: String] = [:]
        while let line = readLine(strippingNewline: true), !line.isEmpty {
            let parts = line.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            if parts.count == 2 { request[String(parts[0])] = String(parts[1]) }
        }
        return request
    }

    /// `protocol:host[:path]`, each part encoded as an item name with its
    /// `:` encoded too (see ``ItemName``): `host=example.com:8080` is
    /// `https:example.com%3A8080`, and `host=example.com path=8080`
    /// `https:example.com:8080`. (Before, both were the latter: a port's
    /// credentials were answered for a path. A credential stored then for a
    /// host with a port is asked for once more.)
    static func identifier(protocol proto: String, host: String, path: String?) -> String {
        ([proto, host] + (path.map { [$0] } ?? [])).map { ItemName.encoded($0, escaping: ":") }.joined(separator: ":")
    }

    private static func fields(_ value: SecureBytes) -> [String] {
        (value.string() ?? "").split(separator: "\n").map(String.init)
    }

    private static func say(_ message: String) {
        printError("keychainfs: " + message)
    }
}
