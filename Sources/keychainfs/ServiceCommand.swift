import ArgumentParser
import KeychainCore
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct ServiceCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "service",
        abstract: "Run the keychainfs service: one device for every user, as its own system account.",
        discussion: """
            Each user's keychain lives in STATE/UID/, which only the service's account can read; a \
            user reaches it only through the socket (their own keychain, by the peer's uid) and \
            through mounts they make with `keychainfs mount`. Started by systemd \
            (keychainfs.socket, keychainfs.service), or as root with this command, which then \
            becomes the account (keeping only CAP_SYS_PTRACE, to identify callers). Clients use \
            the service when $KEYCHAINFS_SERVICE names its socket, or \(ServicePaths.defaultSocket) \
            exists, and no --keychain is given. Runs until SIGTERM.
            """
    )

    @Option(name: .customLong("state-directory"), help: "Where the users' keychains live.")
    var stateDirectory = ServicePaths.defaultStateDirectory

    @Option(name: .long, help: "The socket to listen on, unless systemd passes one.")
    var socket = ServicePaths.defaultSocket

    @Option(name: .long, help: "The account to become when started as root.")
    var user = ServiceAccount.defaultName

    @Option(name: .customLong("connections-per-user"), help: "How many connections one user may hold open at once.")
    var connectionsPerUser = ServiceLimits().connectionsPerUser

    @Option(name: .customLong("mounts-per-user"), help: "How many mounts one user may have at once.")
    var mountsPerUser = ServiceLimits().mountsPerUser

    @Option(name: .customLong("items-per-user"), help: "How many items one user's keychain may hold.")
    var itemsPerUser = ServiceLimits().quota.items

    @Option(
        name: .customLong("bytes-per-user"), help: "How many bytes of values and details one user's keychain may hold.")
    var bytesPerUser = ServiceLimits().quota.bytes

    @Option(name: .customLong("restore-bytes-per-user"), help: "The largest backup file one user may restore.")
    var restoreBytesPerUser = ServiceLimits().restoreBytes

    @Option(name: .customLong("ready-fd"), help: .hidden)
    var readyFD: Int32?

    func run() throws {
        let stateDirectory = absolutePath(self.stateDirectory), socket = absolutePath(self.socket)
        let listener: Int32
        do {
            if let activated = try UnixSocket.activated() {
                listener = activated
            } else {
                let parent = String(socket[..<socket.lastIndex(of: "/")!])
                if !parent.isEmpty {
                    do {
                        try makeDirectoryUnlessPresent(parent, mode: 0o755)
                    } catch {
                        throw fail("cannot create \(parent): \(error)")
                    }
                }
                if let problem = ServiceAccount.socketDirectoryProblem(parent.isEmpty ? "/" : parent, account: user) {
                    throw fail(problem)
                }
                listener = try UnixSocket.listen(at: socket, everyone: true)
            }
        } catch let error as Errno {
            throw fail("cannot listen on \(socket): \(error)")
        }
        do {
            if geteuid() == 0 { try ServiceAccount.become(user, stateDirectory: stateDirectory) }
        } catch {
            throw fail(error.description)
        }
        if let problem = ServiceAccount.stateDirectoryProblem(stateDirectory) { throw fail(problem) }
        takeTPMLockout(stateDirectory)
        if !ServiceAccount.canIdentifyCallers {
            printError(
                "keychainfs: without CAP_SYS_PTRACE the service cannot identify callers of other users: "
                    + "every caller of a policed group is refused")
        }
        let limits = ServiceLimits(
            connectionsPerUser: connectionsPerUser, mountsPerUser: mountsPerUser,
            quota: StoreQuota(items: itemsPerUser, bytes: bytesPerUser),
            restoreBytes: restoreBytesPerUser)
        let device = DeviceProcess(serviceOf: stateDirectory, socketPath: socket, limits: limits)
        throw ExitCode(device.runService(listener: listener) { ReadyReport(readyFD).ok() })
    }

    /// Issue 38: where the TPM's lockout hierarchy is open (an empty auth,
    /// as most machines leave it) and the service's account reaches the
    /// TPM, the service takes it (``TPMLockoutHierarchy``), so that no
    /// other program that reaches the TPM can reset its count of wrong
    /// passcodes. Taken already, or no TPM: nothing to do.
    private func takeTPMLockout(_ stateDirectory: String) {
        guard !TPMLockoutHierarchy.declinedByEnvironment else { return }
        do throws(KeychainError) {
            let state = try TPMLockoutHierarchy.take(stateDirectory: stateDirectory)
            printError(
                "keychainfs: took the TPM's lockout hierarchy (\(state.maximum) tries); its auth is sealed in "
                    + "\(stateDirectory)/\(TPMLockoutHierarchy.fileName)")
        } catch .badRequest, .tpmUnavailable {
            return
        } catch {
            printError("keychainfs: could not take the TPM's lockout hierarchy: \(error)")
        }
    }
}
