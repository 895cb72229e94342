import ArgumentParser
import KeychainCore
import KeychainProtocol
import KeychainTPM
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
            exists, and no --keychain is given. Runs until SIGTERM. Where systemd is not the init, \
            --daemon runs it in the background: the command returns once the service listens, its pid \
            in --pid-file and its messages appended to --log (docs/DESKTOP.md, "Without systemd").
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

    @Flag(help: "Run in the background; return once the service listens (an init without systemd).")
    var daemon = false

    @Option(name: .customLong("pid-file"), help: "With --daemon: where the service's pid is written.")
    var pidFile = "/run/keychainfs.pid"

    @Option(help: "With --daemon: the file the service's messages are appended to.")
    var log = "/var/log/keychainfs.log"

    @Option(name: .customLong("ready-fd"), help: .hidden)
    var readyFD: Int32?

    func run() throws {
        if daemon { return try runInTheBackground() }
        let stateDirectory = absolutePath(self.stateDirectory), socket = absolutePath(self.socket)
        let listener: FileDescriptor
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
        if let problem = ServiceAccount.raiseLockedMemory() { printError("keychainfs: " + problem) }
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
        // Every user's requests share this process's locked memory: a large body that cannot be
        // pinned is refused, never held where it may reach swap (docs/SECURITY.md).
        refuseUnlockedLargeSecretMemory()
        let device = DeviceProcess(serviceOf: stateDirectory, socketPath: socket, limits: limits)
        throw ExitCode(device.runService(listener: listener.borrowed) { ReadyReport(readyFD).ok() })
    }

    /// `--daemon` (docs/DESKTOP.md, "Without systemd": an init without systemd,
    /// as sysvinit's and OpenRC's scripts expect): this command, without
    /// `--daemon`, in a session of its own, its messages appended to `--log`;
    /// once it listens, its pid is written to `--pid-file` and this returns 0.
    /// A pid file naming a running service refuses a second one; a stale one
    /// (its process gone) is replaced. The service cannot remove the file once
    /// it is the account: `start-stop-daemon --remove-pidfile` does, as it
    /// stops it.
    private func runInTheBackground() throws {
        let pidFile = absolutePath(self.pidFile), log = absolutePath(self.log)
        if let running = Self.runningService(named: pidFile) {
            throw fail("the keychainfs service runs already (pid \(running), \(pidFile))")
        }
        // Read and written: what a service that does not start says is read back from it.
        guard let errors = FileDescriptor(open(log, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0o640)) else {
            let reason = Errno.current
            // An ordinary user who tried it met only the log's permission (a first day's report).
            let whose =
                geteuid() != 0 && reason == .permissionDenied
                ? "; the service serves every user, and root starts it (sudo keychainfs service --daemon, or "
                    + "systemctl start keychainfs.socket); your own keychain needs none (keychainfs start)" : ""
            throw fail("cannot open the log \(log): \(reason)" + whose)
        }
        let arguments = [
            "service", "--state-directory", absolutePath(stateDirectory), "--socket", absolutePath(socket),
            "--user", user, "--connections-per-user", String(connectionsPerUser), "--mounts-per-user",
            String(mountsPerUser), "--items-per-user", String(itemsPerUser), "--bytes-per-user", String(bytesPerUser),
            "--restore-bytes-per-user", String(restoreBytesPerUser)
        ]
        let logged = lseek(errors.raw, 0, SEEK_END)
        let started = DeviceLauncher.detach(arguments, errors: errors.borrowed)
        guard let pid = started.pid else {
            // What it said before it exited (detach reaped it) is in the log: said here too.
            var said = ""
            if logged >= 0, lseek(errors.raw, logged, SEEK_SET) == logged,
                let bytes = try? errors.borrowed.readAll(limit: 1 << 14)
            {
                // Its last line: why it stopped (warnings before it, such as a low locked-memory limit, are in the log).
                said = String(decoding: bytes, as: UTF8.self).split(separator: "\n").last.map(String.init) ?? ""
                if said.hasPrefix("keychainfs: ") { said = String(said.dropFirst(12)) }
            }
            throw fail("the service did not start: " + (said.isEmpty ? started.problem ?? "" : said))
        }
        do {
            try TextFile.write("\(pid)\n", to: pidFile)
        } catch {
            kill(pid, SIGTERM)
            throw error
        }
        print("keychainfs: the service runs (pid \(pid)); its log: \(log)")
    }

    /// The pid a pid file names when that process is a keychainfs service.
    private static func runningService(named pidFile: String) -> pid_t? {
        guard let text = TextFile.read(pidFile), let pid = pid_t(text.trimmingNewline), pid > 0,
            let command = TextFile.read("/proc/\(pid)/cmdline")
        else { return nil }
        let arguments = command.split(separator: "\0", omittingEmptySubsequences: false)
        return arguments.count > 1 && arguments[0].hasSuffix("keychainfs") && arguments[1] == "service" ? pid : nil
    }

    /// Where the TPM's lockout hierarchy is open (an empty auth, as most
    /// machines leave it) and the service's account reaches the TPM, the
    /// service takes it (``TPMLockoutHierarchy``), so that no other program
    /// that reaches the TPM can reset its count of wrong passcodes
    /// (docs/SECURITY.md, "Bound to this machine, against whoever holds the
    /// files and the TPM"). Taken already, or no TPM: nothing to do.
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
