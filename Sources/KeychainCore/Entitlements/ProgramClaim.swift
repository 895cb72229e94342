import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A program that an item belongs to, or that its owner's person allowed
/// (docs/SECRET-SERVICE.md, "Whose an item is"): as the Secret Service met it,
/// by the executable the kernel named, its SHA-256, and, for an executable a
/// Debian package installed (root's, writable by root alone), that package, so
/// that an update of the package keeps the program's items. A program the user
/// built or copied (a file the user can write) is its digest: another build is
/// another program. Sealed with the item's details (``ItemDetails``).
public struct ProgramClaim: Sendable, Equatable {
    public var program: ProgramName
    public var digest: [UInt8]
    /// The Debian package the executable belongs to, when root installed it.
    public var package: String?
    /// The systemd unit (or flatpak/snap scope) it ran in, for people to
    /// read; not compared (a scope's name changes with every start).
    public var unit: String?
    /// The script an interpreter ran (docs/SECRET-SERVICE.md, "Whose an item
    /// is"): `python3 x.py` is x.py as much as python3. Nil for a program that
    /// is no interpreter.
    public var script: ProgramScript?
    /// Whether the program ran code from anonymous executable memory (a
    /// JIT: a browser, node) when it was recorded; nil for a claim recorded
    /// in details version 2 (docs/FORMAT.md, "Item details"), which did not say
    /// (and then admits either).
    public var jit: Bool?

    public init(
        program: ProgramName, digest: [UInt8], package: String? = nil, unit: String? = nil,
        script: ProgramScript? = nil, jit: Bool? = nil
    ) {
        self.program = program
        self.digest = digest
        self.package = package
        self.unit = unit
        self.script = script
        self.jit = jit
    }

    /// The claim of `program` as it runs now (its package looked up).
    public init(_ program: ProgramIdentity) {
        var script: ProgramScript?
        if case .file(let path, let digest)? = program.script { script = ProgramScript(path: path, digest: digest) }
        self.init(
            program: program.program, digest: program.digest,
            package: program.program.path.flatMap(PackageOwnership.package(of:)), unit: program.unit, script: script,
            jit: program.runsAnonymousCode)
    }

    /// Whether `program` is this program: the same executable path and the
    /// same content, or, for a packaged one, the same path still installed
    /// by the same package (an update); for an interpreter, running the
    /// same script (path and content). A process that cannot be taken for
    /// its executable (``ProgramIdentity/distrust``: a tracer, another user
    /// namespace, a bus connection shared with another process) is no
    /// one's; nor is one running code from anonymous memory, unless the
    /// program did when it was recorded (a browser's JIT): a library that
    /// copies itself into anonymous memory to hide its file is not the
    /// program (docs/SECRET-SERVICE.md, "Whose an item is").
    public func admits(_ program: ProgramIdentity) -> Bool {
        guard program.distrust == nil, program.program.sameBytes(self.program) else { return false }
        guard !program.runsAnonymousCode || jit != false else { return false }
        switch program.script {
        case nil:
            guard script == nil else { return false }
        case .file(let path, let digest)?:
            guard let script, EntitlementRule.sameBytes(path, script.path),
                Crypto.constantTimeEqual(digest, script.digest)
            else { return false }
        case .unidentifiable?:
            return false
        }
        if Crypto.constantTimeEqual(program.digest, digest) { return true }
        guard let package else { return false }
        return program.program.path.flatMap(PackageOwnership.package(of:)) == package
    }

    /// The SHA-256 in lowercase hex.
    public var digestHex: String { Hex.string(digest) }

    /// How a person reads it: the path, and the package or the digest's start.
    public var described: String {
        if self == .unidentified { return "a program that could not be identified" }
        if case .app(let app) = program { return app.described }
        return program.encoded
            + (package.map { " (package \($0))" } ?? " (sha256 \(Hex.string(Array(digest.prefix(6))))…)")
            + (script.map { " running \($0.path) (sha256 \(Hex.string(Array($0.digest.prefix(6))))…)" } ?? "")
    }

    /// The owner of an item whose creator could not be taken for its
    /// executable (traced, in another namespace, on a shared connection;
    /// docs/SECRET-SERVICE.md, "Whose an item is"): no program matches it (no
    /// file's SHA-256 is zero), so every program is asked about the item. Such
    /// an item never has no owner, which would make it every program's.
    public static let unidentified = ProgramClaim(
        program: .executable("/(unidentified)"), digest: [UInt8](repeating: 0, count: 32))
}

/// The script an interpreter ran: its path and SHA-256.
public struct ProgramScript: Sendable, Equatable {
    public var path: String
    public var digest: [UInt8]

    public init(path: String, digest: [UInt8]) {
        self.path = path
        self.digest = digest
    }
}

/// Which Debian package installed a file, as `dpkg-query -S` says, for
/// files that are root's and writable by root alone (in directories that
/// are too); nil for any other file, which a user could replace. Cached by
/// path, inode and change time: a lookup runs dpkg-query (tens of ms).
public enum PackageOwnership {
    private static let cache = Mutex<[String: (ino: UInt64, ctime: Int, package: String?)]>([:])

    public static func package(of path: String) -> String? {
        guard path.hasPrefix("/"), let info = rootOwned(path) else { return nil }
        if let cached = cache.withLock({ $0[path] }), cached.ino == UInt64(info.st_ino),
            cached.ctime == info.st_ctim.tv_sec
        {
            return cached.package
        }
        // Debian's merged /usr: dpkg knows /bin/cat, the kernel names /usr/bin/cat.
        let package = query(path) ?? mergedAlias(of: path).flatMap(query)
        cache.withLock { $0[path] = (UInt64(info.st_ino), info.st_ctim.tv_sec, package) }
        return package
    }

    private static func rootOwned(_ path: String) -> stat? { RootControlledFile.status(of: path) }

    /// `/bin/X` for `/usr/bin/X` (and sbin, lib) where `/bin` is a link
    /// into `/usr`, as on every Debian since 12.
    private static func mergedAlias(of path: String) -> String? {
        for top in ["bin", "sbin", "lib", "lib64"] where path.hasPrefix("/usr/\(top)/") {
            var info = stat()
            guard lstat("/" + top, &info) == 0, info.st_mode & S_IFMT == S_IFLNK else { return nil }
            return String(path.dropFirst(4))
        }
        return nil
    }

    private static func query(_ path: String) -> String? {
        guard access("/usr/bin/dpkg-query", X_OK) == 0 else { return nil }
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0, let reading = FileDescriptor(ends[0]), let writing = FileDescriptor(ends[1])
        else { return nil }
        var options = Spawn.Options()
        options.descriptors = [(1, writing.raw)]
        let started = Spawn.start(["/usr/bin/dpkg-query", "-S", path], options: options)
        _ = writing.close()  // the child's copy alone: its exit ends the output
        guard let started else { return nil }
        let output = (try? reading.borrowed.readAll(limit: 1 << 16)) ?? []
        guard Spawn.wait(started) == 0 else { return nil }
        // "package[:arch]: /path" for the file itself (not a diversion line).
        let suffix = ": " + path
        for line in String(decoding: output, as: UTF8.self).split(separator: "\n").map(String.init)
        where line.hasSuffix(suffix) {
            let names = line.dropLast(suffix.count)
            guard !names.contains(","), !names.hasPrefix("diversion") else { return nil }
            return String(names.split(separator: ":").first ?? names)
        }
        return nil
    }
}
