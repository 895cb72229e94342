import Foundation
import KeychainCore

/// A keychainfs service for one test: started as root, as a systemd unit
/// would (it becomes the `keychainfs` account, which the package makes and
/// ``MachineFixtures/serviceAccount()`` makes where it is missing),
/// with its own state directory and socket; stopped with SIGTERM when the
/// test ends, passed or failed.
package final class ServiceHarness: @unchecked Sendable {
    /// Holds the state directory and the socket; mode 0711, so that every
    /// user can reach the socket and none can list anything.
    package let root: String
    package let stateDirectory: String
    package let socket: String
    package private(set) var pid: pid_t = 0
    package let binary: String

    /// Extra arguments of `keychainfs service` (limits), and the most
    /// descriptors it may open (nil: as inherited).
    private let options: [String]
    private let descriptorLimit: Int?
    /// The service's RLIMIT_MEMLOCK, which it may then not raise (no
    /// CAP_SYS_RESOURCE): a machine that gives it less than the unit asks.
    private let lockedMemoryLimit: Int?
    /// Variables the service gets besides this process's (a TPM's TCTI).
    private let environment: [String: String]

    /// `started`: false for a test that starts the service its own way
    /// (socket activation), at ``socket`` with ``stateDirectory``.
    package init(
        started: Bool = true, options: [String] = [], descriptorLimit: Int? = nil, lockedMemoryLimit: Int? = nil,
        environment: [String: String] = [:]
    ) throws {
        self.options = options
        self.lockedMemoryLimit = lockedMemoryLimit
        self.environment = environment
        self.descriptorLimit = descriptorLimit
        try MachineFixtures.serviceAccount()
        root = try makeTemporaryDirectory("kcfs-svc")
        chmod(root, 0o711)
        stateDirectory = root + "/state"
        socket = root + "/socket"
        binary = root + "/keychainfs"
        // A link, not a copy: a copy's write descriptor, inherited for an
        // instant by a child another test spawns, makes exec fail (ETXTBSY).
        // Root runs it, as systemd runs the installed one.
        try FileManager.default.createSymbolicLink(atPath: binary, withDestinationPath: try MountHarness.builtBinary())
        if started { try start() }
    }

    /// Starts the service process and waits until it listens.
    private func start() throws {
        // prlimit sets the limit, then execs the service: the pid is the service's.
        var limited = descriptorLimit.map { ["/usr/bin/prlimit", "--nofile=\($0):\($0)", "--"] } ?? []
        if let lockedMemoryLimit {
            limited =
                ["/usr/bin/prlimit", "--memlock=\(lockedMemoryLimit):\(lockedMemoryLimit)", "--"]
                + ["/usr/bin/setpriv", "--bounding-set", "-sys_resource", "--"] + limited
        }
        // No TPM unless the test brings one (MountHarness.noTPM says why).
        let noTPM = environment["TPM2TOOLS_TCTI"] == nil ? ["KEYCHAINFS_TPM": "none"] : [:]
        let variables = ProcessInfo.processInfo.environment.merging(
            ["TPM2TOOLS_TCTI": MountHarness.noTPM].merging(noTPM) { _, ours in ours }
        ) { _, ours in ours }
        .merging(environment) { _, ours in ours }.map { "\($0.key)=\($0.value)" }
        pid = try MountHarness.startReady(
            limited + [
                binary, "service", "--state-directory", stateDirectory,
                "--socket", socket
            ] + options, environment: variables)
    }

    /// Starts the service again after ``stop()``: same state, same socket.
    package func restart() throws {
        stop()
        try start()
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: root)
    }

    /// Stops the service (SIGTERM) and waits for it; its users' mounts are dead from then on.
    package func stop() {
        guard pid > 0 else { return }
        kill(pid, SIGTERM)
        _ = Spawn.wait(pid)
        pid = 0
    }

    /// The directory of a user's keychain.
    package func keychain(of user: OrdinaryUser) -> String { stateDirectory + "/" + String(user.uid) }
}
