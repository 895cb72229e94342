internal import CLinux
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// The device's own bare repository beside the keychain, and the remote
/// reached through the `git` program (docs/SYNC.md, "The remote"): the
/// person's ssh agent, credential helpers and `insteadOf` rules apply as
/// for their other repositories. Only plumbing is used, so no merge,
/// conflict or working tree of git's ever reaches anyone: the device reads
/// the remote's tree, merges record by record itself, and pushes a commit
/// whose parent is what it read (a moved branch: read again).
struct GitRepository: Sendable {
    /// The branch the circle lives on, in the remote.
    static let branch = "refs/heads/keychainfs"
    /// Where a fetch puts the remote's branch, and where a new commit is built.
    static let fetched = "refs/circle/remote"
    static let outgoing = "refs/circle/outgoing"

    let path: String
    let remote: String
    /// The longest one git command may take, in seconds.
    static let deadline = 600
    /// The largest file one git command may write (RLIMIT_FSIZE): a pack it
    /// fetches, or its answer to the device (a memory file). A remote that
    /// serves more is refused, not stored (the repository after 10,000
    /// items changed ten times each is about 100 MiB, docs/BENCHMARKS.md).
    static let largestFile = 512 << 20
    /// The largest object the device reads from the remote: no file of a
    /// circle comes near it (a record of the largest value, 1 MiB, is
    /// padded to 2 MiB). Checked before the object is read.
    static let largestObject = 4 << 20
    /// The most bytes of objects read in one `git cat-file`.
    static let batchBytes = 64 << 20

    /// `git` from PATH's usual places (Debian's is /usr/bin/git).
    static var program: String? {
        for candidate in ["/usr/bin/git", "/bin/git", "/usr/local/bin/git"] where access(candidate, X_OK) == 0 {
            return candidate
        }
        return nil
    }

    struct Output {
        let status: Int32
        let out: [UInt8]
        let err: String
    }

    /// Creates the local repository if it is not there yet.
    static func prepare(at path: String, remote: String) throws(SyncFailure) -> GitRepository {
        let repository = GitRepository(path: path, remote: remote)
        if access(path + "/HEAD", F_OK) != 0 {
            let made = try repository.run(["init", "--bare", "--quiet", path], inRepository: false)
            guard made.status == 0 else { throw SyncFailure(.remote, "git could not create \(path): \(made.err)") }
        }
        return repository
    }

    /// Runs git with `input` on its standard input. Output and errors go
    /// to memory files (memfd), never to the disk.
    func run(_ arguments: [String], input: [UInt8] = [], inRepository: Bool = true) throws(SyncFailure) -> Output {
        guard let git = Self.program else {
            throw SyncFailure(.remote, "git is not installed (apt install git)")
        }
        guard let stdin = FileDescriptor(CLinux_memfd("git-in")), let stdout = FileDescriptor(CLinux_memfd("git-out")),
            let stderr = FileDescriptor(CLinux_memfd("git-err"))
        else { throw SyncFailure(.remote, "git could not be started (memfd_create failed)") }
        do throws(Errno) {
            try stdin.borrowed.writeAll(input)
        } catch {
            throw SyncFailure(.remote, "git could not be started (\(error))")
        }
        lseek(stdin.raw, 0, SEEK_SET)
        var options = Spawn.Options()
        options.descriptors = [(0, stdin.raw), (1, stdout.raw), (2, stderr.raw)]
        options.environment = Self.environment
        // No hook, no background maintenance left running after the device's request.
        let settings = [
            "-c", "core.hooksPath=/dev/null", "-c", "gc.autoDetach=false", "-c", "maintenance.autoDetach=false",
            "-c", "protocol.file.allow=always"
        ]
        let place = inRepository ? ["--git-dir=" + path] : []
        // A remote that stalls does not hold the device's sync for ever: git is ended after
        // `deadline` seconds (coreutils' timeout), and a transfer below 1 KB/s for a minute fails.
        let limits = ["-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=60"]
        // Background work: git runs only on a core nobody else wants (SCHED_IDLE,
        // sched(7); any process may take it) and does its I/O when no one else does
        // (ionice's idle class, ioprio_set(2)), so a read of the keychain never waits for
        // it; a remote cannot make it write past `largestFile` (prlimit(1), SIGXFSZ).
        let bounded = [
            "/usr/bin/chrt", "--idle", "0", "/usr/bin/ionice", "-c", "3", "/usr/bin/timeout", "-k", "5",
            String(Self.deadline), "/usr/bin/prlimit", "--fsize=\(Self.largestFile)", git
        ]
        let status = Spawn.run(bounded + settings + limits + place + arguments, options: options)
        lseek(stdout.raw, 0, SEEK_SET)
        lseek(stderr.raw, 0, SEEK_SET)
        let out = (try? stdout.borrowed.readAll(limit: Self.largestFile)) ?? []
        let err = (try? stderr.borrowed.readAll(limit: 64 << 10)) ?? []
        let message = String(decoding: err, as: UTF8.self).split(separator: "\n").filter { !$0.isEmpty }
            .joined(separator: "; ")
        return Output(status: status, out: out, err: message)
    }

    /// The device's environment (the person's `SSH_AUTH_SOCK`, `HOME`,
    /// `GIT_SSH_COMMAND`...), with prompts off: no one is at the device to answer.
    private static let environment: [String] = {
        var entries: [String] = []
        var index = 0
        while let entry = environ[index] {
            let text = String(cString: entry)
            index += 1
            // Another repository's settings must not steer ours.
            if text.hasPrefix("GIT_DIR=") || text.hasPrefix("GIT_WORK_TREE=") || text.hasPrefix("GIT_INDEX_FILE=")
                || text.hasPrefix("GIT_TERMINAL_PROMPT=") || text.hasPrefix("LC_ALL=")
            {
                continue
            }
            entries.append(text)
        }
        return entries + ["GIT_TERMINAL_PROMPT=0", "LC_ALL=C", "SSH_ASKPASS_REQUIRE=never"]
    }()

    // MARK: The remote

    /// Fetches the remote's branch; its commit, or nil when the remote has none.
    func fetch() throws(SyncFailure) -> String? {
        let fetched = try run([
            "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", remote, "+\(Self.branch):\(Self.fetched)"
        ])
        if fetched.status != 0 {
            if fetched.err.contains("couldn't find remote ref") {
                _ = try run(["update-ref", "-d", Self.fetched])
                return nil
            }
            throw SyncFailure(.remote, "git could not fetch from \(remote): \(fetched.err)")
        }
        return try commit(of: Self.fetched)
    }

    func commit(of reference: String) throws(SyncFailure) -> String? {
        let parsed = try run(["rev-parse", "--quiet", "--verify", reference + "^{commit}"])
        guard parsed.status == 0 else { return nil }
        return String(decoding: parsed.out, as: UTF8.self).split(separator: "\n").first.map(String.init)
    }

    enum PushResult { case pushed, moved }

    /// Pushes `commit` as the remote's branch, never forced: `.moved` when
    /// the branch moved since it was read (read and merge again).
    func push(_ commit: String) throws(SyncFailure) -> PushResult {
        let pushed = try run(["push", "--quiet", "--porcelain", remote, "\(commit):\(Self.branch)"])
        if pushed.status == 0 { return .pushed }
        let report = String(decoding: pushed.out, as: UTF8.self)
        if report.contains("[rejected]") || report.contains("fetch first") || report.contains("non-fast-forward")
            || pushed.err.contains("fetch first") || report.contains("stale info")
        {
            return .moved
        }
        throw SyncFailure(.remote, "git could not push to \(remote): \(pushed.err)")
    }

    // MARK: Reading a commit

    /// One object's contents (``contents(_:)``); nil when it is not there.
    func contents(of name: String) throws(SyncFailure) -> [UInt8]? { try contents([name])[0] }

    /// Every file of `commit`: path and blob id.
    func files(of commit: String) throws(SyncFailure) -> [String: String] {
        let listed = try run(["ls-tree", "-r", "-z", "--full-tree", commit])
        guard listed.status == 0 else { throw SyncFailure(.remote, "git could not read \(commit): \(listed.err)") }
        var files: [String: String] = [:]
        for entry in listed.out.split(separator: 0) {
            // "<mode> blob <id>\t<path>"
            guard let tab = entry.firstIndex(of: 9) else { continue }
            let fields = entry[..<tab].split(separator: 32)
            guard fields.count == 3, fields[1].elementsEqual("blob".utf8) else { continue }
            files[String(decoding: entry[(tab + 1)...], as: UTF8.self)] = String(decoding: fields[2], as: UTF8.self)
        }
        return files
    }

    /// The contents of objects named as git names them (an id, or
    /// `COMMIT:PATH`), in order, in one `git cat-file --batch`; nil for one
    /// that is not there.
    /// An object past ``largestObject`` is refused before it is read; the
    /// rest is read in batches of at most ``batchBytes``.
    func contents(_ names: [String]) throws(SyncFailure) -> [[UInt8]?] {
        guard !names.isEmpty else { return [] }
        let sizes = try objectSizes(names)
        if let index = sizes.firstIndex(where: { ($0 ?? 0) > Self.largestObject }), let size = sizes[index] {
            throw SyncFailure.refused(
                "it holds an object of \(size) bytes (\(names[index])), larger than any file of a circle "
                    + "(\(Self.largestObject >> 20) MiB at most)")
        }
        var contents: [[UInt8]?] = []
        contents.reserveCapacity(names.count)
        var start = 0
        while start < names.count {
            var end = start, bytes = 0
            while end < names.count, end == start || bytes + (sizes[end] ?? 0) <= Self.batchBytes {
                bytes += sizes[end] ?? 0
                end += 1
            }
            contents += try batch(Array(names[start..<end]))
            start = end
        }
        return contents
    }

    /// Each object's size as git says it (`git cat-file --batch-check`), nil for one that is not there.
    private func objectSizes(_ names: [String]) throws(SyncFailure) -> [Int?] {
        let checked = try run(["cat-file", "--batch-check"], input: Array(names.joined(separator: "\n").utf8) + [10])
        guard checked.status == 0 else { throw SyncFailure(.remote, "git could not read objects: \(checked.err)") }
        let lines = checked.out.split(separator: 10, omittingEmptySubsequences: false).prefix(names.count)
        guard lines.count == names.count else { throw SyncFailure(.remote, "git's answer was cut short") }
        // "<id> <type> <size>", or "<name> missing" (or "ambiguous").
        return lines.map { line in
            let fields = line.split(separator: 32)
            return fields.count == 3 ? Int(String(decoding: fields[2], as: UTF8.self)) : nil
        }
    }

    /// ``contents(_:)`` of one batch, in one `git cat-file --batch`.
    private func batch(_ names: [String]) throws(SyncFailure) -> [[UInt8]?] {
        let read = try run(["cat-file", "--batch"], input: Array(names.joined(separator: "\n").utf8) + [10])
        guard read.status == 0 else { throw SyncFailure(.remote, "git could not read objects: \(read.err)") }
        var contents: [[UInt8]?] = []
        var index = 0
        let out = read.out
        while index < out.count, contents.count < names.count {
            guard let end = out[index...].firstIndex(of: 10) else { break }
            let header = out[index..<end].split(separator: 32)
            index = end + 1
            // "<name> missing" (or "ambiguous"): no such object.
            guard header.count == 3, let size = Int(String(decoding: header[2], as: UTF8.self)),
                index + size <= out.count
            else {
                contents.append(nil)
                continue
            }
            contents.append(Array(out[index..<index + size]))
            index += size + 1
        }
        guard contents.count == names.count else { throw SyncFailure(.remote, "git's answer was cut short") }
        return contents
    }

    /// The files that differ between two commits: path to new blob id, nil
    /// for a file removed. Nil when `old` is not in the repository any more.
    func changes(from old: String, to new: String) throws(SyncFailure) -> [String: String?]? {
        let diff = try run(["diff-tree", "-r", "-z", "--no-renames", "--no-commit-id", old, new])
        guard diff.status == 0 else { return nil }
        var changes: [String: String?] = [:]
        // ":<old mode> <new mode> <old id> <new id> <status>" NUL "<path>" NUL, for each file.
        let fields = diff.out.split(separator: 0, omittingEmptySubsequences: false)
        var index = 0
        while index + 1 < fields.count {
            let header = fields[index].split(separator: 32)
            let path = String(decoding: fields[index + 1], as: UTF8.self)
            index += 2
            guard header.count == 5 else { continue }
            let status = header[4].first
            changes[path] = status == UInt8(ascii: "D") ? .some(nil) : String(decoding: header[3], as: UTF8.self)
        }
        return changes
    }

    // MARK: Writing a commit

    /// A file to add or replace (nil contents: remove it).
    struct Change {
        let path: String
        let contents: [UInt8]?
    }

    /// Builds a commit on `parent` (nil: the first) with `changes`, in one
    /// `git fast-import`; its id. Names no person or host: the remote
    /// learns when, not who.
    func commit(_ changes: [Change], on parent: String?, message: String) throws(SyncFailure) -> String {
        var stream: [UInt8] = []
        stream.reserveCapacity(changes.reduce(256) { $0 + ($1.contents?.count ?? 0) + 100 })
        func line(_ text: String) { stream += Array(text.utf8) + [10] }
        let now = Int(time(nil))
        line("commit \(Self.outgoing)")
        line("mark :1")
        line("committer keychainfs <keychainfs> \(now) +0000")
        line("data \(message.utf8.count)")
        line(message)
        if let parent { line("from \(parent)") } else { line("deleteall") }
        for change in changes {
            if let contents = change.contents {
                line("M 100644 inline \(change.path)")
                line("data \(contents.count)")
                stream += contents
                stream.append(10)
            } else {
                line("D \(change.path)")
            }
        }
        // The commit's id, on standard output (fast-import's cat-blob-fd): no rev-parse after.
        line("get-mark :1")
        line("done")
        let imported = try run(["fast-import", "--quiet", "--done", "--force"], input: stream)
        let commit = String(decoding: imported.out, as: UTF8.self).split(separator: "\n").first.map(String.init)
        guard imported.status == 0, let commit, commit.utf8.count >= 40 else {
            throw SyncFailure(.remote, "git could not write a commit: \(imported.err)")
        }
        return commit
    }
}
