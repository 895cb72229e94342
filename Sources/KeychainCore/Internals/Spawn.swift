internal import CLinux
#if canImport(Glibc)
import Glibc
#endif

/// Starting child processes with posix_spawn: an empty signal mask and
/// default signal actions, so that a child never inherits a blocked SIGTERM
/// (Swift Testing and our own device block it; docs/CONTRIBUTING.md, "Facts about this platform").
package enum Spawn {
    /// How a child's standard streams and extra descriptors are set up.
    package struct Options {
        /// Descriptors to place in the child: child fd <- parent fd.
        package var descriptors: [(child: Int32, parent: Int32)] = []
        /// Redirect stdin, stdout and stderr to /dev/null (unless in `descriptors`).
        package var nullStandardStreams = false
        /// Start a new session (detach from the terminal).
        package var newSession = false
        /// `NAME=value` entries replacing the inherited environment.
        package var environment: [String]?
        /// Inherit the streams, no new session.
        package init() {}
    }

    /// Starts `arguments[0]` (an absolute path); returns its pid.
    package static func start(_ arguments: [String], options: Options = Options()) -> Int32? {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        // Each descriptor reaches its place in two steps, through a number
        // above every one involved: one whose number is another's place (a
        // log on 3 going to 2 while a pipe goes to 3) would otherwise be
        // overwritten before it is copied.
        let above = (options.descriptors.flatMap { [$0.child, $0.parent] }.max() ?? 2) + 1
        for (index, (_, parent)) in options.descriptors.enumerated() {
            posix_spawn_file_actions_adddup2(&actions, parent, above + Int32(index))
        }
        if options.nullStandardStreams {
            for fd in Int32(0)...2 where !options.descriptors.contains(where: { $0.child == fd }) {
                posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0)
            }
        }
        for (index, (child, _)) in options.descriptors.enumerated() {
            posix_spawn_file_actions_adddup2(&actions, above + Int32(index), child)
        }
        // Nothing else of ours leaks into the child (after the dup2s above).
        _ = CLinux_spawn_close_from(&actions, max(3, (options.descriptors.map(\.child).max() ?? 2) + 1))
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGINT, SIGTERM, SIGHUP, SIGPIPE] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var flags = Int32(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF)
        if options.newSession { flags |= posixSpawnSetsid }
        posix_spawnattr_setflags(&attributes, Int16(flags))
        let argv = arguments.map { strdup($0) } + [nil]
        let envp = options.environment.map { $0.map { strdup($0) } + [nil] }
        defer {
            argv.forEach { free($0) }
            envp?.forEach { free($0) }
        }
        var pid: Int32 = 0
        let status = argv.withUnsafeBufferPointer { argv in
            if let envp {
                return envp.withUnsafeBufferPointer {
                    posix_spawn(&pid, arguments[0], &actions, &attributes, argv.baseAddress!, $0.baseAddress!)
                }
            }
            return posix_spawn(&pid, arguments[0], &actions, &attributes, argv.baseAddress!, environ)
        }
        return status == 0 ? pid : nil
    }

    /// glibc's POSIX_SPAWN_SETSID (spawn.h, visible only with _GNU_SOURCE).
    private static let posixSpawnSetsid: Int32 = 0x80

    /// Runs a command to its end; returns its exit status (-1 if it could not start or was killed).
    package static func run(_ arguments: [String], options: Options = Options()) -> Int32 {
        guard let pid = start(arguments, options: options) else { return -1 }
        return wait(pid)
    }

    /// Waits for a child; its exit status, or -1 if a signal ended it.
    package static func wait(_ pid: Int32) -> Int32 {
        var status: Int32 = 0
        guard (try? valueOrErrno({ waitpid(pid, &status, 0) })) != nil else { return -1 }
        // WIFEXITED / WEXITSTATUS are macros: decode the status word by hand.
        return status & 0x7f == 0 ? (status >> 8) & 0xff : -1
    }
}
