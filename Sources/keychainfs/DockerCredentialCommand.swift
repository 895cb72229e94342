import ArgumentParser
import FoundationEssentials
import Glibc
import KeychainCore
import KeychainProtocol
import KeychainDevice
import KeychainFS

/// docker's credential helper (docker-credential-helpers' protocol): docker
/// runs `docker-credential-keychainfs store|get|erase|list|version` (a link
/// to this binary, which the package installs) with JSON or a server URL
/// on stdin, and reads JSON, or an error message, from stdout (status 1 on
/// an error). Credentials are items of the `docker` group, one per server
/// URL, holding `{"Username": ..., "Secret": ...}`.
struct DockerCredentialCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "docker-credential",
        abstract: "docker's credential helper: \"credsStore\": \"keychainfs\" in ~/.docker/config.json.",
        discussion: """
            Needs docker-credential-keychainfs (a link to keychainfs) on PATH. docker passes no \
            options: the keychain is $KEYCHAINFS_KEYCHAIN, or the default one. A locked keychain \
            is an error that says so (never "credentials not found").
            """)

    static let group = "docker"
    /// The message docker recognises as "no such credentials" (credentials/error.go).
    static let notFound = "credentials not found in native keychain"

    @Argument(help: "store, get, erase, list or version (from docker).")
    var action: String

    @OptionGroup var options: KeychainOptions

    /// Failures go to stdout with status 1, where docker reads them.
    struct Failure: Error {
        let message: String
    }

    func run() throws {
        do {
            try perform()
        } catch let failure as Failure {
            print(failure.message)
            throw ExitCode(1)
        }
    }

    private func perform() throws {
        switch action {
        case "version":
            // docker-credential-helpers print their name and version (`docker-credential-pass v0.8.2`).
            print("docker-credential-keychainfs \(KeychainFSCommand.version)")
            return
        case "store", "get", "erase", "list":
            break
        default:
            throw Failure(message: "Unknown credential action `\(action)`")
        }
        let device = try Self.device(options.place)
        switch action {
        case "store":
            let credentials = try Self.readCredentials()
            let value = try SecureBytes(
                "{\"Username\": \(jsonString(credentials.username)), \"Secret\": \(jsonString(credentials.secret))}")
            try Self.check(
                device.outcome(
                    .set(group: Self.group, identifier: ItemName.encoded(credentials.serverURL), value: value)))
        case "get":
            let serverURL = try Self.readServerURL()
            let stored = try Self.credentials(at: ItemName.encoded(serverURL), device: device)
            print(
                "{\"ServerURL\":\(jsonString(serverURL)),\"Username\":\(jsonString(stored.username)),\"Secret\":\(jsonString(stored.secret))}"
            )
        case "erase":
            let identifier = ItemName.encoded(try Self.readServerURL())
            try Self.check(device.outcome(.remove(group: Self.group, identifier: identifier)))
        default:  // list: every server URL with its username (which needs the key)
            let items = try Self.check(device.outcome(.items(inGroup: Self.group)), absentIs: ItemList([])).items
            var entries: [String] = []
            for item in items {
                guard let serverURL = ItemName.decoded(item.identifier) else { continue }
                let stored = try Self.credentials(at: item.identifier, device: device)
                entries.append("\(jsonString(serverURL)):\(jsonString(stored.username))")
            }
            print("{" + entries.joined(separator: ",") + "}")
        }
    }

    /// The keychain's device (started, locked, when none runs, as gpg-agent
    /// starts on first use), or a failure saying why there is none.
    private static func device(_ place: KeychainPlace) throws -> RunningDevice {
        let started = place.startedDevice()
        guard let socketPath = started.socketPath else {
            throw Failure(message: "no keychainfs device for \(place.name): \(started.problem ?? "")")
        }
        return RunningDevice(listeningAt: socketPath)
    }

    /// The answer; every refusal becomes the failure docker shows: its
    /// own words for an absent item (unless `absentIs` stands for it),
    /// which docker recognises, else the device's sentence.
    @discardableResult
    private static func check<Result>(_ outcome: DeviceOutcome<Result>?, absentIs absent: Result? = nil) throws
        -> Result
    {
        switch outcome {
        case .success(let result)?:
            return result
        case .failure(.keychain(.itemNotFound, _))?, .failure(.system(ENOENT, _))?:
            if let absent { return absent }
            throw Failure(message: notFound)
        case .failure(.keychain(.interactionNotAllowed, _))?:
            throw Failure(message: "the keychain is locked; unlock it to use docker credentials")
        case .failure(let refusal)?:
            throw Failure(message: DeviceAccess.explanation(of: refusal, about: .device).message)
        case nil:
            throw Failure(message: DeviceAccess.explanation(of: nil, about: .device).message)
        }
    }

    private static func credentials(at identifier: String, device: RunningDevice) throws -> (
        username: String, secret: String
    ) {
        let value = try check(device.outcome(.get(group: group, identifier: identifier))).value
        guard let stored = value.withUnsafeBytes({ try? JSONDecoder().decode(Stored.self, from: Data($0)) }) else {
            throw Failure(message: "the item \(group)/\(identifier) does not hold docker credentials")
        }
        return (stored.Username, stored.Secret)
    }

    /// What an item of the group holds (the names are docker's).
    private struct Stored: Decodable {
        let Username: String
        let Secret: String
    }

    /// What docker's `store` sends; `Secret` may be missing.
    private struct Sent: Decodable {
        let ServerURL: String?
        let Username: String?
        let Secret: String?
    }

    /// `{"ServerURL", "Username", "Secret"}` on stdin; the URL and username must not be empty.
    private static func readCredentials() throws -> (serverURL: String, username: String, secret: String) {
        let input = (try? BorrowedDescriptor.standardInput.readAll(limit: ItemLimits.maximumValueSize)) ?? []
        guard let sent = try? JSONDecoder().decode(Sent.self, from: Data(input)) else {
            throw Failure(message: "the credentials on standard input are not a JSON object")
        }
        guard let serverURL = sent.ServerURL.flatMap(normalized) else {
            throw Failure(message: "no credentials server URL")
        }
        guard let username = sent.Username, !username.isEmpty else {
            throw Failure(message: "no credentials username")
        }
        return (serverURL, username, sent.Secret ?? "")
    }

    private static func readServerURL() throws -> String {
        let input = String(
            decoding: (try? BorrowedDescriptor.standardInput.readAll(limit: ItemLimits.maximumValueSize)) ?? [],
            as: UTF8.self)
        guard let serverURL = normalized(input) else { throw Failure(message: "no credentials server URL") }
        return serverURL
    }

    /// A server URL as every action names it: without the white space
    /// around it (docker sends `get`'s with a trailing newline). `store`,
    /// `get` and `erase` all go through here, or `store` of
    /// `" padded.example "` would be found by no `get`. Nil when empty.
    static func normalized(_ serverURL: String) -> String? {
        let start = serverURL.firstIndex { !$0.isWhitespace } ?? serverURL.endIndex
        let end = serverURL.lastIndex { !$0.isWhitespace }.map(serverURL.index(after:)) ?? start
        let trimmed = String(serverURL[start..<end])
        return trimmed.isEmpty ? nil : trimmed
    }
}
