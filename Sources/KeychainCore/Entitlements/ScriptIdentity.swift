#if canImport(Glibc)
import Glibc
#endif

/// What an interpreter runs (docs/SECRET-SERVICE.md, "Whose an item is"): its
/// executable says nothing of the script, so `python3 x.py` and `python3 y.py`
/// would be one program. For an interpreter the owner rule reads the script
/// too, from the process's command line: a file is its path and SHA-256, and so
/// is a module run by name (`python3 -m NAME`, the file Python finds for it);
/// code given on the command line, read from standard input, a file others may
/// write, or an environment that loads code into the interpreter
/// (`PYTHONPATH`, `NODE_OPTIONS`...) is an identity no owner matches, so
/// such a process is asked about every time, and allowed once at most.
public enum ScriptIdentity: Sendable, Equatable {
    /// A script file: its path (as the kernel resolves it) and its SHA-256.
    case file(path: String, digest: [UInt8])
    /// No file a person could name, or one that cannot be trusted: why.
    case unidentifiable(String)
}

/// The interpreters the owner rule knows, and how each takes its script.
package enum Interpreters {
    /// How an interpreter's command line names its code: the options that
    /// give code inline, those that take a value, and the variables that
    /// load code into it from elsewhere.
    struct Kind {
        let name: String
        let inline: Set<String>
        let takesValue: Set<String>
        let injecting: [String]
        /// Options that make it run code besides its script: code typed on
        /// its standard input after it (`python3 -i`), modules it loads
        /// first (`node -r`), a debugger (`perl -d`).
        var runsMore: Set<String> = []
    }

    static let python = Kind(
        name: "python", inline: ["-c"], takesValue: ["-W", "-X", "-Q"],
        injecting: ["PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONINSPECT", "PYTHONUSERBASE"],
        runsMore: ["-i"])
    static let perl = Kind(
        name: "perl", inline: ["-e", "-E"], takesValue: ["-I", "-M", "-m", "-x"],
        injecting: ["PERL5LIB", "PERL5OPT", "PERLLIB", "PERL5DB"], runsMore: ["-d", "-M", "-m"])
    static let ruby = Kind(
        name: "ruby", inline: ["-e"], takesValue: ["-I", "-r", "-C", "-E"], injecting: ["RUBYOPT", "RUBYLIB"],
        runsMore: ["-r"])
    static let node = Kind(
        name: "node", inline: ["-e", "--eval", "-p", "--print"], takesValue: ["-r", "--require", "--import"],
        injecting: ["NODE_OPTIONS", "NODE_PATH"], runsMore: ["-i", "--interactive", "-r", "--require", "--import"])
    static let shell = Kind(
        name: "sh", inline: ["-c"], takesValue: ["-o", "+o"], injecting: ["BASH_ENV", "ENV", "SHELLOPTS"])
    static let lua = Kind(name: "lua", inline: ["-e"], takesValue: ["-l"], injecting: ["LUA_INIT", "LUA_PATH"])
    static let php = Kind(name: "php", inline: ["-r"], takesValue: ["-c", "-d"], injecting: ["PHP_INI_SCAN_DIR"])

    /// The kind of the interpreter at `executable`, by its name without a
    /// version (`python3.11`, `perl5.36`); nil for any other program.
    static func kind(of executable: String) -> Kind? {
        let name = commandName(of: executable)
        // The longest name below has six letters.
        guard !name.isEmpty, name.utf8.count <= 6 else { return nil }
        switch name {
        case "python", "pypy": return python
        case "perl": return perl
        case "ruby": return ruby
        case "node", "nodejs": return node
        case "sh", "dash", "bash", "zsh", "ksh", "mksh", "fish": return shell
        case "lua", "luajit": return lua
        case "php": return php
        default: return nil
        }
    }

    /// The name of the program at `executable` without a version
    /// (`python3.11` is `python`, `perl5.36` is `perl`). Bytes, no
    /// allocation: this runs for every identified caller.
    static func commandName(of executable: String) -> Substring {
        let bytes = executable.utf8
        let start = bytes.lastIndex(of: UInt8(ascii: "/")).map { bytes.index(after: $0) } ?? bytes.startIndex
        var end = bytes.endIndex
        while end > start, let last = bytes[bytes.index(before: end)...].first,
            (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(last) || last == UInt8(ascii: ".")
        {
            end = bytes.index(before: end)
        }
        return Substring(executable[start..<end])
    }

    /// Whether `executable` is an interpreter the rule knows.
    package static func isInterpreter(_ executable: String) -> Bool { kind(of: executable) != nil }

    /// The script of `thread`, an interpreter of `kind` running as `uid`.
    static func script(of thread: pid_t, kind: Kind, uid: uid_t) -> ScriptIdentity {
        guard let cmdline = ProgramIdentities.readProcFile(thread, "cmdline", limit: 64 << 10) else {
            return .unidentifiable("its command line cannot be read")
        }
        let arguments = cmdline.split(separator: 0, omittingEmptySubsequences: false).dropLast().map {
            String(decoding: $0, as: UTF8.self)
        }
        let environment = ProgramIdentities.readProcFile(thread, "environ", limit: 1 << 20)?.split(separator: 0) ?? []
        for entry in environment {
            let name = String(decoding: entry.prefix { $0 != UInt8(ascii: "=") }, as: UTF8.self)
            if kind.injecting.contains(name) && entry.count > name.utf8.count + 1 {
                return .unidentifiable("\(name) is set, which loads code into \(kind.name)")
            }
        }
        if let option = runsMore(arguments, kind: kind) {
            return .unidentifiable("it runs code besides its script (\(option))")
        }
        switch scriptArgument(arguments, kind: kind) {
        case .inline(let option):
            return .unidentifiable("it runs code given on its command line (\(option))")
        case .none:
            return .unidentifiable("it runs code from its standard input")
        case .path(let path):
            return file(path, of: thread, uid: uid)
        case .module(let name):
            // `sys.path[0]` is the working directory it started in, which it can have left since.
            if Interpreters.searchesWorkingDirectory(arguments) {
                return .unidentifiable(
                    "it runs the module \(name) from a search path that starts with its working directory, which "
                        + "it can change after it started: run it with -P (or -I) to be identified")
            }
            let home = environment.first { $0.starts(with: Array("HOME=".utf8)) }.map {
                String(decoding: $0.dropFirst(5), as: UTF8.self)
            }
            guard let path = moduleFile(name, of: thread, arguments: arguments, home: home) else {
                return .unidentifiable("it runs the module \(name), whose file cannot be found")
            }
            return file(path, of: thread, uid: uid)
        }
    }

    enum ScriptArgument: Equatable {
        case path(String)
        case inline(String)
        /// `python3 -m NAME`: a module run by name.
        case module(String)
        case none
    }

    /// The file `python3 -m NAME` runs, found in the order Python's
    /// `sys.path` has: the working directory (`sys.path[0]` under `-m`,
    /// unless `-I` or `-P`), the standard library of that version, the
    /// user's site-packages (unless `-s` or `-I`), then the system's
    /// packages (PYTHONPATH is refused before this, as code it loads); `home`
    /// is the process's `$HOME`, read with its environment. In
    /// each, a package (a directory with `__init__.py`) comes before a
    /// module of the same name, as Python's finder takes it; a package runs
    /// its `__main__.py`. Nil when none holds it (a zip, an extension module,
    /// a path from a `.pth` file): that is no file a person could name.
    static func moduleFile(_ name: String, of thread: pid_t, arguments: [String], home: String?) -> String? {
        let parts = name.split(separator: ".", omittingEmptySubsequences: false)
        guard !parts.isEmpty, parts.allSatisfy({ !$0.isEmpty && !$0.contains("/") }) else { return nil }
        let relative = parts.joined(separator: "/")
        let flagLetters = Self.flagLetters(arguments)
        let isolated = flagLetters.contains("I")
        var directories: [String] = []
        if !isolated, !flagLetters.contains("P"),
            let cwd = ProgramIdentities.withProcPath(thread, "cwd", { ProgramIdentities.linkTarget($0) })
        {
            directories.append(cwd == "/" ? "" : cwd)
        }
        let program = ProgramIdentities.withProcPath(thread, "exe", { ProgramIdentities.linkTarget($0) }) ?? ""
        let version = String(program.split(separator: "/").last ?? "")
        guard version.hasPrefix("python3.") else { return nil }
        directories.append("/usr/lib/\(version)")
        if !isolated, !flagLetters.contains("s"), let home {
            directories.append(home + "/.local/lib/\(version)/site-packages")
        }
        directories += ["/usr/local/lib/\(version)/dist-packages", "/usr/lib/python3/dist-packages"]
        func isFile(_ path: String) -> Bool {
            var info = stat()
            return stat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFREG
        }
        for directory in directories {
            let base = directory + "/" + relative
            if isFile(base + "/__init__.py") { return isFile(base + "/__main__.py") ? base + "/__main__.py" : nil }
            if isFile(base + ".py") { return base + ".py" }
        }
        return nil
    }

    /// The option among those before the script that makes the interpreter
    /// run more than its script (``Kind/runsMore``; a bundle of single
    /// letters, `-Bi`, counts too), nil when none does.
    static func runsMore(_ arguments: [String], kind: Kind) -> String? {
        var index = 1
        while index < arguments.count, arguments[index].hasPrefix("-"), arguments[index] != "-",
            arguments[index] != "--"
        {
            let argument = arguments[index]
            let option = argument.hasPrefix("--") ? String(argument.prefix { $0 != "=" }) : String(argument.prefix(2))
            if kind.runsMore.contains(option) { return option }
            // A bundle of letters (`-Bi`), not an option with its value attached (`-Wignore`).
            if !argument.hasPrefix("--"), argument.count > 2, !kind.takesValue.contains(option),
                let letter = argument.dropFirst().first(where: { kind.runsMore.contains("-\($0)") })
            {
                return "-\(letter)"
            }
            if kind.inline.contains(option) { return nil }
            if kind.takesValue.contains(argument) { index += 1 }
            index += 1
        }
        return nil
    }

    /// The single-letter options before `-m` (`-I`, `-P`, `-s`, bundled as `-sP`).
    static func flagLetters(_ arguments: [String]) -> Set<Character> {
        Set(
            arguments.dropFirst().prefix { $0.hasPrefix("-") && !$0.hasPrefix("-m") }
                .filter { !$0.hasPrefix("--") }.flatMap { $0.dropFirst() })
    }

    /// Whether `python3 -m` searches its working directory first (no `-I`, no `-P`).
    static func searchesWorkingDirectory(_ arguments: [String]) -> Bool {
        let letters = flagLetters(arguments)
        return !letters.contains("I") && !letters.contains("P")
    }

    /// The script an interpreter's arguments name: the first argument
    /// that is not an option (or not a value of one), or the one after `--`.
    static func scriptArgument(_ arguments: [String], kind: Kind) -> ScriptArgument {
        var index = 1
        while index < arguments.count {
            let argument = arguments[index]
            if argument == "--" { return index + 1 < arguments.count ? .path(arguments[index + 1]) : .none }
            guard argument.hasPrefix("-") || (kind.name == "sh" && argument.hasPrefix("+")), argument != "-" else {
                return argument == "-" ? .none : .path(argument)
            }
            // `python3 -m NAME` (or `-mNAME`): a module run by name, found as Python finds it.
            if kind.name == "python", argument.hasPrefix("-m"), !argument.hasPrefix("--") {
                let name =
                    argument == "-m"
                    ? (index + 1 < arguments.count ? arguments[index + 1] : "") : String(argument.dropFirst(2))
                return name.isEmpty ? .none : .module(name)
            }
            // `-c`, and a bundle holding it (`sh -ec`, `python3 -Bc`), gives code inline.
            let option = String(argument.prefix(2))
            if kind.inline.contains(argument) || kind.inline.contains(option)
                || (!argument.hasPrefix("--") && argument.dropFirst().contains { kind.inline.contains("-\($0)") })
            {
                return .inline(argument)
            }
            if kind.takesValue.contains(argument) { index += 1 }
            index += 1
        }
        return .none
    }

    /// A script file named by its absolute path: its path and digest when
    /// only its owner (or root) may write it. A relative path is no name:
    /// it was resolved against the working directory the process had when
    /// it started, which it can change since (`os.chdir`), and the kernel
    /// keeps no record of the one it had; resolved now, a script of the
    /// user's that moved to `/usr/lib/python3.11` passed for Debian's
    /// `pydoc.py`, and kept the person's "Always allow" of it
    /// (docs/SECURITY.md, "A chain a person can trust").
    static func file(_ named: String, of thread: pid_t, uid: uid_t) -> ScriptIdentity {
        // A link root controls is its target (the one hop it makes, resolved whole); any other link could
        // be pointed elsewhere since the interpreter followed it.
        let path = RootControlledFile.linkTarget(ofRootsLink: named) ?? named
        guard path.hasPrefix("/") else {
            return .unidentifiable(
                "its script is named by a relative path (\(named)), which names whatever its working directory "
                    + "holds now: run it by its full path to be identified")
        }
        guard let fd = FileDescriptor(open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)) else {
            return .unidentifiable("its script \(path) cannot be read")
        }
        var info = stat()
        guard fstat(fd.raw, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
            return .unidentifiable("its script \(path) is not a file")
        }
        guard info.st_uid == uid || info.st_uid == 0, info.st_mode & 0o022 == 0 else {
            let owner = info.st_uid == uid ? "yours" : info.st_uid == 0 ? "root's" : "another user's"
            return .unidentifiable(
                "its script \(path) may be written by others (it is \(owner), and "
                    + (info.st_mode & 0o002 != 0 ? "every user may write it" : "its group may write it")
                    + "): a program that names it runs whatever is written there next")
        }
        guard let digest = ProgramIdentities.digest(of: fd.borrowed, info: info) else {
            return .unidentifiable("its script \(path) cannot be read")
        }
        return .file(path: path, digest: digest)
    }
}
