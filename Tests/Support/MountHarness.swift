import Foundation
import KeychainCore

/// What a shell command did.
package struct ShellResult: CustomStringConvertible {
    package var status: Int32
    package var stdout: String
    package var stderr: String
    package var succeeded: Bool { status == 0 }
    package var description: String {
        "status \(status), stdout \(stdout.debugDescription), stderr \(stderr.debugDescription)"
    }
}

/// A keychain in a temporary directory with its own runtime directory, the
/// `keychainfs` binary to drive it, and the mounts a test made, all of which
/// are unmounted (lazily if need be) and whose device is killed if it is
/// still alive when the test ends, passed or failed.
package final class MountHarness: @unchecked Sendable {
    package static let passcode = "1234"
    /// A TCTI at which no TPM answers (the loopback's port 1 refuses at once),
    /// with `KEYCHAINFS_TPM=none`, which makes `init` keep the keys in a file
    /// rather than fail at a TPM named that does not answer (docs/SECURITY.md,
    /// "The TPM is the machine's, or none").
    package static let noTPM = "swtpm:host=127.0.0.1,port=1"

    package let root: String
    package let keychain: String
    package let runtime: String
    package let binary: String
    package private(set) var mountpoints: [String] = []
    /// Whom every command runs as (nil: this process's user, root).
    package let user: OrdinaryUser?
    /// The service that holds the keychain (nil: the user's own device, in `keychain`).
    package let service: ServiceHarness?
    /// Variables every command gets besides the harness's own (a TPM's TCTI).
    package var extraEnvironment: [String: String]
    /// The option that names the keychain in a command: none for the service's.
    package var keychainOption: String { service == nil ? " --keychain \"$KC\"" : "" }

    /// A keychain of `user` (nil: of this process's user), in a new temporary
    /// directory, or, with `service`, the user's keychain in that service;
    /// not created yet when `creating` is false (a test that runs `init` itself).
    package init(
        passcode: String? = MountHarness.passcode, as user: OrdinaryUser? = nil,
        service: ServiceHarness? = nil, environment extra: [String: String] = [:], creating: Bool = true
    ) throws {
        extraEnvironment = extra
        root = try makeTemporaryDirectory("kcfs-fs")
        keychain = root + "/keychain"
        runtime = root + "/run"
        let built = try Self.builtBinary()
        if user != nil {
            // The build may lie where only root can reach (a clone under
            // /root, a .build of mode 0750): the user runs its own copy.
            binary = root + "/bin/keychainfs"
            try Self.copyBuild(built, into: root)
        } else {
            binary = built
        }
        self.user = user
        self.service = service
        try FileManager.default.createDirectory(
            atPath: runtime, withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700])
        try user?.own(root)
        guard creating else { return }
        let created =
            passcode.map { sh("\"$K\" init" + keychainOption, stdin: $0 + "\n" + $0 + "\n") }
            ?? sh("\"$K\" init --no-passcode" + keychainOption)
        guard created.succeeded else { throw HarnessError("init failed: \(created)") }
    }

    deinit {
        for mountpoint in mountpoints.reversed() {
            // The service is not this harness's to kill (ServiceHarness stops it).
            let pid = service == nil ? Self.devicePid(mountpoint) : nil
            _ = sh("\"$K\" unmount \"$1\"", arguments: [mountpoint])
            if isMounted(mountpoint) { _ = sh("fusermount3 -u -z \"$1\"", arguments: [mountpoint]) }
            if let pid, isRunning(pid) { kill(pid, SIGKILL) }
        }
        // A device a client started without a mount (keychainfs start) runs until stopped.
        if service == nil { _ = sh("\"$K\" stop --keychain \"$KC\"") }
        // A scratch directory of `keychainfs edit` that a failed test left mounted.
        _ = sh("grep -o \" $XDG_RUNTIME_DIR/keychainfs/edit\\.[^ ]*\" /proc/mounts | xargs -r -n 1 fusermount3 -u -z")
        try? FileManager.default.removeItem(atPath: root)
    }

    /// Copies the build `built` to `root/bin/keychainfs`, and a release
    /// build's position-independent half, where the command looks for it,
    /// to `root/libexec/keychainfs/keychainfs` (docs/SECURITY.md, "Two
    /// builds of one program"; a debug build is position-independent alone).
    package static func copyBuild(_ built: String, into root: String) throws {
        let manager = FileManager.default
        try manager.createDirectory(atPath: root + "/bin", withIntermediateDirectories: true)
        try manager.copyItem(atPath: built, toPath: root + "/bin/keychainfs")
        guard MachineFixtures.elfType(built) == MachineFixtures.fixedAddresses else { return }
        let half = positionIndependentHalf(of: built)
        guard manager.isExecutableFile(atPath: half) else { return }
        try manager.createDirectory(atPath: root + "/libexec/keychainfs", withIntermediateDirectories: true)
        try manager.copyItem(atPath: half, toPath: root + "/libexec/keychainfs/keychainfs")
    }

    /// Where the position-independent half of the release build `built`
    /// lies: the command's own rule (``ExecutableImage/positionIndependentBuild(of:)``),
    /// from the file `built` names, links resolved.
    package static func positionIndependentHalf(of built: String) -> String {
        ExecutableImage.positionIndependentBuild(of: URL(fileURLWithPath: built).resolvingSymlinksInPath().path)
    }

    /// The keychainfs binary built beside this test bundle.
    package static func builtBinary() throws -> String {
        if let explicit = ProcessInfo.processInfo.environment["KEYCHAINFS_BINARY"] { return explicit }
        let executable = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        let candidate = (executable as NSString).deletingLastPathComponent + "/keychainfs"
        guard FileManager.default.isExecutableFile(atPath: candidate) else {
            throw HarnessError("keychainfs binary not found at \(candidate); run swift build first")
        }
        return candidate
    }

    /// A new keychain mounted whole and unlocked, for tests that start there.
    package static func unlockedMount() throws -> (MountHarness, String) {
        let harness = try MountHarness()
        let mountpoint = try harness.mount()
        try harness.unlock(mountpoint)
        return (harness, mountpoint)
    }

    /// Mounts (detached, as a user would) at `root/name`; returns the path.
    @discardableResult
    package func mount(_ name: String = "mnt", group: String? = nil) throws -> String {
        let mountpoint = try prepareMountpoint(name)
        let result = sh(
            "\"$K\" mount \"$1\"" + keychainOption + (group.map { " --group '\($0)'" } ?? ""),
            arguments: [mountpoint])
        guard result.succeeded else { throw HarnessError("mount failed: \(result)") }
        return mountpoint
    }

    /// An empty directory for a mount, remembered for the teardown.
    package func prepareMountpoint(_ name: String) throws -> String {
        let mountpoint = root + "/" + name
        try? FileManager.default.createDirectory(atPath: mountpoint, withIntermediateDirectories: true)
        try user?.own(mountpoint)
        if !mountpoints.contains(mountpoint) { mountpoints.append(mountpoint) }
        return mountpoint
    }

    /// Starts `keychainfs mount --foreground` as a child process (the device);
    /// returns its pid once the mount is ready.
    package func mountForeground(_ name: String = "mnt", environment extra: [String] = []) throws -> pid_t {
        let mountpoint = try prepareMountpoint(name)
        return try Self.startReady(
            [binary, "mount", mountpoint, "--foreground", "--keychain", keychain],
            environment: environment() + extra)
    }

    /// Starts a device process (`ARGUMENTS --ready-fd 3`) and returns its
    /// pid once it said "ok" on the pipe; kills it if it said anything else.
    package static func startReady(_ arguments: [String], environment: [String]? = nil) throws -> pid_t {
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0 else { throw POSIXError(.EIO) }
        var options = Spawn.Options()
        options.environment = environment
        options.descriptors = [(3, ends[1])]
        options.nullStandardStreams = true
        let pid = Spawn.start(arguments + ["--ready-fd", "3"], options: options)
        close(ends[1])
        defer { close(ends[0]) }
        guard let pid else { throw HarnessError("could not start \(arguments)") }
        var line: [UInt8] = []
        var byte: UInt8 = 0
        while read(ends[0], &byte, 1) == 1 && byte != UInt8(ascii: "\n") { line.append(byte) }
        guard String(decoding: line, as: UTF8.self) == "ok" else {
            kill(pid, SIGKILL)
            _ = Spawn.wait(pid)
            throw HarnessError("\(arguments[1]) failed to start: \(String(decoding: line, as: UTF8.self))")
        }
        return pid
    }

    package func environment() -> [String] {
        var environment = ProcessInfo.processInfo.environment
        environment["XDG_RUNTIME_DIR"] = runtime
        environment["K"] = binary
        environment["KC"] = keychain
        environment["R"] = root
        environment["LC_ALL"] = "C"
        // No TPM unless a test brings its own (SoftwareTPM): a machine's
        // real one would seal every test's keychain and keep an NV counter
        // for each, and the tests must not depend on the machine.
        environment["TPM2TOOLS_TCTI"] = MountHarness.noTPM
        if extraEnvironment["TPM2TOOLS_TCTI"] == nil { environment["KEYCHAINFS_TPM"] = "none" }
        environment.merge(extraEnvironment) { _, extra in extra }
        // Only where a test asks for it: a service installed on this machine is not the test's.
        // A per-user keychain's user may reach the TPM through a service (docs/FORMAT.md,
        // "The TPM through the service"): the test names it.
        environment["KEYCHAINFS_SERVICE"] = service?.socket ?? extraEnvironment["KEYCHAINFS_SERVICE"] ?? ""
        if let user {
            environment["HOME"] = user.home
            environment["USER"] = user.name
        }
        return environment.map { "\($0.key)=\($0.value)" }
    }

    /// Runs a shell script (under `timeout`, so a hung filesystem fails the
    /// test instead of hanging it) with `$K`, `$KC`, `$R` set and `$1...` =
    /// arguments, as the harness's user, or as root (`asRoot`: what a
    /// system's own programs do to it, e.g. PAM's).
    /// `limit`: the seconds after which the script is taken for hung; a
    /// guard against a hang, not a measure of speed (what takes long on a
    /// loaded machine, building a package, gets a limit of its own).
    package func sh(
        _ script: String, arguments: [String] = [], stdin: String? = nil, asRoot: Bool = false, limit: Int = 30
    ) -> ShellResult {
        let id = UUID().uuidString
        let input = root + "/.in-" + id, output = root + "/.out-" + id, errors = root + "/.err-" + id
        _ = FileManager.default.createFile(atPath: input, contents: Data((stdin ?? "").utf8))
        defer { for path: String in [input, output, errors] { unlink(path) } }
        var options = Spawn.Options()
        options.environment = environment()
        let inFD = open(input, O_RDONLY), outFD = open(output, O_WRONLY | O_CREAT | O_TRUNC, 0o600),
            errFD = open(errors, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        defer { [inFD, outFD, errFD].forEach { close($0) } }
        options.descriptors = [(0, inFD), (1, outFD), (2, errFD)]
        let asUser = asRoot ? [] : user.map { ["/usr/sbin/runuser", "-u", $0.name, "--"] } ?? []
        let status = Spawn.run(
            asUser + ["/usr/bin/timeout", "-k", "5", String(limit), "/bin/sh", "-c", script, "sh"] + arguments,
            options: options)
        return ShellResult(
            status: status,
            stdout: (try? String(contentsOfFile: output, encoding: .utf8)) ?? "",
            stderr: (try? String(contentsOfFile: errors, encoding: .utf8)) ?? "")
    }

    package func unlock(_ mountpoint: String, passcode: String = MountHarness.passcode) throws {
        let result = sh("\"$K\" unlock \"$1\"", arguments: [mountpoint], stdin: passcode + "\n")
        guard result.succeeded else { throw HarnessError("unlock failed: \(result)") }
    }

    package func control(_ mountpoint: String, _ command: String) -> ShellResult {
        // coreutils printf, whose error names the errno (dash's builtin says "I/O error").
        sh("/usr/bin/printf '%s\\n' \"$2\" > \"$1/.control\"", arguments: [mountpoint, command])
    }

    package func status(_ mountpoint: String) -> [String: String] {
        var status: [String: String] = [:]
        // Another user's FUSE mount is closed to root too (no allow_other).
        let text =
            user == nil
            ? (try? String(contentsOfFile: mountpoint + "/.control", encoding: .utf8)) ?? ""
            : sh("cat \"$1/.control\"", arguments: [mountpoint]).stdout
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: ":", maxSplits: 1)
            if parts.count == 2 { status[String(parts[0])] = String(parts[1].dropFirst()) }
        }
        return status
    }

    package func isMounted(_ mountpoint: String) -> Bool {
        let mounts = (try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8)) ?? ""
        return mounts.split(separator: "\n").contains {
            $0.split(separator: " ").dropFirst().first.map(String.init) == mountpoint
        }
    }

    package static func devicePid(_ mountpoint: String) -> pid_t? {
        let text = (try? String(contentsOfFile: mountpoint + "/.control", encoding: .utf8)) ?? ""
        for line in text.split(separator: "\n") where line.hasPrefix("pid: ") {
            return pid_t(line.dropFirst(5))
        }
        return nil
    }
}

package struct HarnessError: Error, CustomStringConvertible {
    package let description: String
    package init(_ description: String) { self.description = description }
}

/// errno of one write(2) of `bytes` to `path` (0 when all were written).
package func writeErrno(_ path: String, _ bytes: String) -> Int32 {
    let fd = open(path, O_WRONLY)
    if fd < 0 { return errno }
    defer { close(fd) }
    let count = bytes.utf8.count
    return bytes.withCString { write(fd, $0, count) } == count ? 0 : errno
}

/// errno of an open(2) of `path` with `flags` (0 when it succeeded).
package func openErrno(_ path: String, _ flags: Int32) -> Int32 {
    let fd = open(path, flags, 0o600)
    if fd < 0 { return errno }
    close(fd)
    return 0
}

/// Whether `pid` is a live process: a zombie (exited, not reaped yet by
/// whoever inherited the detached device) counts as gone.
package func isRunning(_ pid: pid_t) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let close = stat.lastIndex(of: ")")
    else { return false }
    return stat[stat.index(close, offsetBy: 2)] != "Z"
}

/// A libc function that Swift's Glibc module does not import (declared
/// only with _GNU_SOURCE, or in headers it leaves out), found at run time.
package func libcFunction<Function>(_ name: String, as type: Function.Type) -> Function {
    guard let symbol = dlsym(nil, name) else { fatalError("libc has no \(name)") }
    return unsafeBitCast(symbol, to: type)
}

/// renameat2(2) with its flags.
package let renameat2 = libcFunction(
    "renameat2", as: (@convention(c) (Int32, UnsafePointer<CChar>, Int32, UnsafePointer<CChar>, UInt32) -> Int32).self)
/// setxattr(2) with its flags (`XATTR_CREATE` 1, `XATTR_REPLACE` 2).
package let setxattr = libcFunction(
    "setxattr",
    as: (@convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>, UnsafeRawPointer, Int, Int32) -> Int32).self)
