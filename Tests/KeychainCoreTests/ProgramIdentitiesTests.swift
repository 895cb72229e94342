@testable import KeychainCore
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// The audit log names who asked by `/proc/TID/exe`, built on the stack for
/// every request: a wrong digit there would name another process.
@Suite struct ProgramIdentitiesTests {
    @Test(arguments: [1, 9, 10, 99, 100, 32_767, 4_194_304, Int32.max])
    func procPathsNameTheThread(_ thread: Int32) {
        let built = ProgramIdentities.withProcPath(thread, "exe") { String(cString: $0) }
        #expect(built == "/proc/\(thread)/exe")
        let status = ProgramIdentities.withProcPath(thread, "status") { String(cString: $0) }
        #expect(status == "/proc/\(thread)/status")
    }

    /// The `unit=` of audit lines and the `--unit` of rules come from the
    /// caller's `/proc/PID/cgroup` (cgroups(7)).
    @Test(
        arguments: [
            // Pure cgroup v2, a user service nested in its manager's slice.
            ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/backup.service\n", "backup.service"),
            // A scope.
            ("0::/user.slice/user-1000.slice/session-2.scope\n", "session-2.scope"),
            // Hybrid: v2 says nothing, systemd's named hierarchy does.
            ("12:memory:/system.slice/cron.service\n1:name=systemd:/system.slice/cron.service\n0::/\n", "cron.service"),
            // Both: the unified hierarchy wins.
            ("1:name=systemd:/system.slice/old.service\n0::/system.slice/new.service\n", "new.service"),
            // A controller's path alone names nothing.
            ("4:memory:/system.slice/db.service\n0::/\n", nil),
            // No unit anywhere, a bare root, a malformed line, nothing at all.
            ("0::/process_api/f90b906877a4\n", nil),
            ("0::/\n", nil),
            ("garbage without colons\n0::/a.scope/b\n", "a.scope"),
            ("", nil)
        ] as [(String, String?)])
    func unitsComeFromTheCgroupFile(_ file: String, _ unit: String?) {
        #expect(ProgramIdentities.unit(ofCgroupFile: Array(file.utf8)) == unit)
    }

    @Test func thisProcessHasTheUnitOfItsCgroupFile() throws {
        let file = try String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8)
        #expect(ProgramIdentities.unit(of: getpid()) == ProgramIdentities.unit(ofCgroupFile: Array(file.utf8)))
    }
}

/// An interpreter's script, read from its command line the way the
/// interpreter reads it (docs/SECRET-SERVICE.md, "Whose an item is").
@Suite struct InterpreterScriptTests {
    @Test func theScriptIsTheFirstArgumentThatIsNoOption() {
        let python = Interpreters.kind(of: "/usr/bin/python3.11")
        #expect(python != nil && Interpreters.kind(of: "/usr/bin/cat") == nil)
        guard let python, let shell = Interpreters.kind(of: "/bin/dash"),
            let node = Interpreters.kind(of: "/usr/bin/node")
        else { return }
        let cases: [([String], Interpreters.Kind, Interpreters.ScriptArgument)] = [
            (["python3", "x.py", "-c", "y"], python, .path("x.py")),
            (["python3", "-u", "-W", "ignore", "x.py"], python, .path("x.py")),
            (["python3", "-c", "print(1)"], python, .inline("-c")),
            (["python3", "-Bc", "print(1)"], python, .inline("-Bc")),
            (["python3", "-m", "keyring", "get", "a", "b"], python, .module("keyring")),
            (["python3", "-u", "-mhttp.server"], python, .module("http.server")),
            (["python3"], python, .none),
            (["python3", "-"], python, .none),
            (["python3", "--", "-x.py"], python, .path("-x.py")),
            (["sh", "-e", "script.sh"], shell, .path("script.sh")),
            (["sh", "-ec", "echo"], shell, .inline("-ec")),
            (["sh", "-o", "errexit", "s.sh"], shell, .path("s.sh")),
            (["node", "--require", "/tmp/evil.js", "app.js"], node, .path("app.js")),
            (["node", "-e", "1"], node, .inline("-e"))
        ]
        for (arguments, kind, expected) in cases {
            #expect(Interpreters.scriptArgument(arguments, kind: kind) == expected, "\(arguments)")
        }
    }

    /// The identity of the interpreter `arguments` start, read while it
    /// waits on its standard input: through `launcher` (which execs it), or
    /// started directly when that is empty.
    static func identity(running launcher: [String], then arguments: [String]) throws -> ProgramIdentity {
        var ends: [Int32] = [0, 0]
        #expect(pipe(&ends) == 0)
        var options = Spawn.Options()
        options.descriptors = [(0, ends[0])]
        let pid = try #require(Spawn.start(launcher + arguments, options: options))
        close(ends[0])
        defer {
            close(ends[1])
            _ = Spawn.wait(pid)
        }
        // It runs once /proc shows its whole command line (execve names the new executable
        // before it sets up the arguments: fs/exec.c begin_new_exec, then create_elf_tables).
        let expected = Array(arguments.joined(separator: "\0").utf8) + [0]
        while ProgramIdentities.readProcFile(pid, "cmdline", limit: 4096) != expected { sched_yield() }
        return try #require(ProgramIdentities.of(thread: pid, uid: getuid()))
    }

    /// An interpreter told to run more than its script is not its script:
    /// `python3 -i ALLOWED.py` ran code typed on its standard input as the
    /// allowed script, unasked; `node -r`, `perl -d` and `-M` load code too.
    @Test func anInterpreterThatRunsMoreThanItsScriptIsNotIt() throws {
        let python = try #require(Interpreters.kind(of: "/usr/bin/python3.11"))
        let node = try #require(Interpreters.kind(of: "/usr/bin/node"))
        let perl = try #require(Interpreters.kind(of: "/usr/bin/perl"))
        #expect(Interpreters.runsMore(["python3", "-i", "/home/u/rd.py"], kind: python) == "-i")
        #expect(Interpreters.runsMore(["python3", "-Bi", "/home/u/rd.py"], kind: python) == "-i")
        #expect(Interpreters.runsMore(["python3", "-Wignore", "/home/u/rd.py"], kind: python) == nil)
        #expect(Interpreters.runsMore(["python3", "-W", "ignore", "/home/u/rd.py"], kind: python) == nil)
        #expect(Interpreters.runsMore(["python3", "/home/u/rd.py", "-i"], kind: python) == nil, "its own argument")
        #expect(Interpreters.runsMore(["node", "--require=./x.js", "/home/u/a.js"], kind: node) == "--require")
        #expect(Interpreters.runsMore(["perl", "-d", "/home/u/a.pl"], kind: perl) == "-d")
        #expect(Interpreters.runsMore(["perl", "-Mstrict", "/home/u/a.pl"], kind: perl) == "-M")
    }

    /// `python3 -m MODULE` is its module's file where that is knowable: with
    /// `-P` (or `-I`), the file Python finds in the system's paths. Without,
    /// Python searched the working directory it started in first, which the
    /// process can have left (a script of the user's that moved to
    /// `/usr/lib/python3.11` passed for Debian's module of the same name):
    /// unidentifiable, and the question says how to be identified. A script
    /// named by a relative path likewise; a name found nowhere says so.
    @Test func aModuleRunByNameIsItsFile() throws {
        let directory = try makeTemporaryDirectory("kcfs-module", in: "/tmp/")
        defer { _ = Spawn.run(["/bin/rm", "-rf", directory]) }
        try FileManager.default.createDirectory(atPath: directory + "/kcfspkg", withIntermediateDirectories: true)
        for file in ["/kcfsmodule.py", "/kcfspkg/__init__.py", "/kcfspkg/__main__.py"] {
            try "import sys\nsys.stdin.readline()\n".write(toFile: directory + file, atomically: true, encoding: .utf8)
            chmod(directory + file, 0o644)
        }
        let version = URL(fileURLWithPath: "/usr/bin/python3").resolvingSymlinksInPath().lastPathComponent
        // Searched from its working directory first (Python's sys.path[0] under -m), which it can
        // leave after it started: no module run so is identified, whatever it names now.
        for module in ["kcfsmodule", "json.tool"] {
            let identity = try Self.identity(
                running: ["/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", directory],
                then: ["/usr/bin/python3", "-m", module])
            #expect(
                identity.script
                    == .unidentifiable(
                        "it runs the module \(module) from a search path that starts with its working directory, "
                            + "which it can change after it started: run it with -P (or -I) to be identified"),
                "\(module)")
        }
        // With -P the working directory is not searched: the module is the file Python finds.
        for (module, expected) in [
            ("json.tool", "/usr/lib/\(version)/json/tool.py"), ("kcfsmodule", nil), ("kcfs_no_such_module", nil)
        ] {
            let identity = try Self.identity(
                running: ["/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", directory],
                then: ["/usr/bin/python3", "-P", "-m", module])
            if let expected {
                guard case .file(let path, let digest)? = identity.script else {
                    Issue.record("\(module): \(String(describing: identity.script))")
                    continue
                }
                #expect(path == expected && digest.count == 32, "\(module)")
            } else {
                #expect(
                    identity.script == .unidentifiable("it runs the module \(module), whose file cannot be found"))
            }
        }
        // A script named by a relative path names whatever the working directory holds now.
        #expect(
            Interpreters.file("kcfsmodule.py", of: getpid(), uid: getuid())
                == .unidentifiable(
                    "its script is named by a relative path (kcfsmodule.py), which names whatever its working "
                        + "directory holds now: run it by its full path to be identified"))
        // A script others may write is never trusted as a program, and the question says why.
        chmod(directory + "/kcfsmodule.py", 0o664)
        let shared = Interpreters.file(directory + "/kcfsmodule.py", of: getpid(), uid: getuid())
        #expect(
            shared
                == .unidentifiable(
                    "its script \(directory)/kcfsmodule.py may be written by others (it is yours, and its group may "
                        + "write it): a program that names it runs whatever is written there next"))
    }

    /// A script run through a link root controls (Debian's
    /// `/usr/bin/pytest-3 -> pytest`) is the file it names: it was "cannot
    /// be read", so keyring's and secretstorage's tests run as `pytest-3`
    /// owned nothing. A link anyone else could point elsewhere (here, under
    /// the world-writable /tmp) is still nobody's.
    @Test func aScriptRunThroughALinkRootControlsIsTheFileItNames() throws {
        let directory = try makeTemporaryDirectory("kcfs-linked", in: "/opt/")
        defer { _ = Spawn.run(["/bin/rm", "-rf", directory]) }
        chmod(directory, 0o755)
        try "print('hi')\n".write(toFile: directory + "/real.py", atomically: true, encoding: .utf8)
        chmod(directory + "/real.py", 0o644)
        try FileManager.default.createSymbolicLink(atPath: directory + "/link.py", withDestinationPath: "real.py")
        guard case .file(let path, let digest) = Interpreters.file(directory + "/link.py", of: getpid(), uid: getuid())
        else {
            Issue.record("\(Interpreters.file(directory + "/link.py", of: getpid(), uid: getuid()))")
            return
        }
        #expect(path == directory + "/real.py" && digest.count == 32)
        let elsewhere = try makeTemporaryDirectory("kcfs-linked", in: "/tmp/")
        defer { _ = Spawn.run(["/bin/rm", "-rf", elsewhere]) }
        try FileManager.default.createSymbolicLink(
            atPath: elsewhere + "/link.py", withDestinationPath: directory + "/real.py")
        #expect(
            Interpreters.file(elsewhere + "/link.py", of: getpid(), uid: getuid())
                == .unidentifiable("its script \(elsewhere)/link.py cannot be read"))
    }

    /// This test's own process is no interpreter; a shell it starts is, with
    /// its script file, and with `-c` it is code nobody can name.
    @Test func aRunningShellIsReadWithItsScript() throws {
        let directory = try makeTemporaryDirectory("kcfs-script", in: "/tmp/")
        defer { _ = Spawn.run(["/bin/rm", "-rf", directory]) }
        try "read line\n".write(toFile: directory + "/wait.sh", atomically: true, encoding: .utf8)
        chmod(directory + "/wait.sh", 0o644)
        for (arguments, expectFile) in [
            (["/bin/sh", directory + "/wait.sh"], true), (["/bin/sh", "-c", "read line"], false)
        ] {
            let identity = try Self.identity(running: [], then: arguments)
            if expectFile {
                guard case .file(let path, let digest)? = identity.script else {
                    Issue.record("\(String(describing: identity.script))")
                    continue
                }
                #expect(path == directory + "/wait.sh" && digest.count == 32)
            } else {
                #expect(identity.script == .unidentifiable("it runs code given on its command line (-c)"))
            }
        }
    }
}
