import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Who makes a request, as the kernel tells it through `/proc`: the
/// executable a thread runs (hashed, with the hash cached per file version),
/// its systemd unit and its uid.
///
/// For a FUSE request the answer cannot go stale: once the daemon has read
/// a request, the calling thread waits for the reply uninterruptibly (only
/// a request not yet read can be abandoned, fs/fuse/dev.c
/// `request_wait_answer`), so its id cannot be reused, and an `execve` by
/// another thread of its process waits for it to exit (`de_thread`).
package enum ProgramIdentities {
    /// The identity of `thread`, running as `uid`; nil when `/proc` does not
    /// tell (the thread is gone or outside our pid namespace, or its
    /// executable is unreadable or not the file its path names now).
    package static func of(thread: pid_t, uid: uid_t) -> ProgramIdentity? {
        guard thread > 0 else { return nil }
        // A sandboxed app is its app id (docs/SECRET-SERVICE.md, "Sandboxed
        // apps"): its executable names a file of its sandbox, which an update
        // replaces.
        if let sandboxed = SandboxApps.app(of: thread) {
            return ProgramIdentity(
                program: .app(sandboxed.app), digest: ExecutableDigest.of(bytes: Array(sandboxed.app.claimName.utf8)),
                unit: unit(of: thread),
                uid: uid,
                distrust: sandboxed.problem)
        }
        return withProcPath(thread, "exe") { exe -> ProgramIdentity? in
            guard let fd = FileDescriptor(open(exe, O_RDONLY | O_CLOEXEC)) else { return nil }
            var opened = stat()
            guard fstat(fd.raw, &opened) == 0, let path = linkTarget(exe) else { return nil }
            // The path must name the very file that was opened: a binary deleted
            // or replaced since it started is not the one at its path.
            guard names(path, opened), let digest = digest(of: fd.borrowed, info: opened) else { return nil }
            let trust = CallerTrust.assess(thread: thread, executable: opened)
            var identity = ProgramIdentity(
                program: .executable(path), digest: digest, unit: unit(of: thread), uid: uid,
                distrust: trust.problem, runsAnonymousCode: trust.runsAnonymousCode)
            // An interpreter is its script too (docs/SECRET-SERVICE.md, "Whose
            // an item is").
            identity.script = Interpreters.kind(of: path).map { Interpreters.script(of: thread, kind: $0, uid: uid) }
            return identity
        }
    }

    /// Whether `path` names the file `opened` (a running executable). The
    /// service cannot look into its users' private directories: there the
    /// kernel's own word stands, which marks an executable deleted or
    /// replaced since it started (proc(5): " (deleted)"); an edit in place
    /// changes the digest instead.
    private static func names(_ path: String, _ opened: stat) -> Bool {
        var named = stat()
        if stat(path, &named) == 0 { return named.st_dev == opened.st_dev && named.st_ino == opened.st_ino }
        return Errno.current.rawValue == EACCES && !path.hasSuffix(" (deleted)")
    }

    /// Who `thread` is, for the audit log: its process, uid, executable
    /// path and unit (no hash: that is for decisions, not for the record).
    /// The executable is read every time (an `execve` changes it); the
    /// process and unit of a thread are kept for a second (a thread never
    /// changes process, and moving a process to another unit is rare),
    /// since reading them from /proc costs more than the rest of a read.
    package static func subject(thread: pid_t, uid: uid_t) -> AuditSubject {
        subject(of: thread, uid: uid) { ProcessIdentity(thread: thread, uid: uid).process }
    }

    /// Who `process` is, for the audit log, where the kernel named the
    /// process itself (its thread group): a socket peer's `SO_PEERCRED`
    /// pid, a bus sender's, this process's own. Its `Tgid:` is then not
    /// read from `/proc/PID/status`, which the kernel writes out whole on
    /// each read (a sixth of the device's time in a `keychainfs get`,
    /// docs/BENCHMARKS.md).
    package static func subject(process: pid_t, uid: uid_t) -> AuditSubject {
        subject(of: process, uid: uid) { process }
    }

    private static func subject(of thread: pid_t, uid: uid_t, process: () -> pid_t) -> AuditSubject {
        guard thread > 0 else { return AuditSubject(pid: thread, uid: uid, executable: nil, unit: nil) }
        let now = MonotonicClock.seconds()
        let known = threads.withLock { cache -> ThreadFacts? in
            guard let facts = cache[thread], now - facts.readAt < 1 else { return nil }
            return facts
        }
        let facts =
            known
            ?? ThreadFacts(process: process(), unit: unit(of: thread), readAt: now, executable: nil)
        if known == nil {
            threads.withLock { cache in
                if cache.count >= 4096 { cache.removeAll() }
                cache[thread] = facts
            }
        }
        let executable = withProcPath(thread, "exe") { linkTarget($0, reusing: facts.executable) }
        if executable != facts.executable {
            threads.withLock { $0[thread]?.executable = executable }
        }
        return AuditSubject(pid: facts.process, uid: uid, executable: executable, unit: facts.unit)
    }

    private struct ThreadFacts {
        let process: pid_t
        let unit: String?
        let readAt: Double
        /// The executable it ran when last asked (re-read every time: only
        /// kept so that an unchanged one costs no new String).
        var executable: String?
    }
    private static let threads = Mutex<[pid_t: ThreadFacts]>([:])

    /// Who the peer of a socket is, for the audit log.
    package static func subject(ofPeer socket: BorrowedDescriptor) -> AuditSubject? {
        peerCredentials(socket).map { subject(process: $0.pid, uid: $0.uid) }
    }

    /// The identity of a socket peer; nil unless the process that connected
    /// still runs once it was read (so its pid was not reused meanwhile).
    /// Distrusted unless that process holds its connection alone and
    /// close-on-exec (``SocketHolders/relayProblem(of:connection:)``);
    /// without `checkingRelays`, what program it runs, and nothing of who
    /// else holds the connection: for the record of who connected, which
    /// the identity read when a request is answered, relays checked, must
    /// match (that check walks every descriptor of every process of the
    /// user: 1.1 ms of a `get`, docs/BENCHMARKS.md).
    package static func ofPeer(_ socket: BorrowedDescriptor, checkingRelays: Bool = true) -> ProgramIdentity? {
        guard let credentials = peerCredentials(socket) else { return nil }
        var pidfd: Int32 = -1
        var pidfdLength = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(socket.raw, SOL_SOCKET, soPeerPidfd, &pidfd, &pidfdLength) == 0,
            let owned = FileDescriptor(pidfd)
        else { return nil }
        // The pidfd stays open until the identity is checked against it.
        guard var identity = of(thread: credentials.pid, uid: credentials.uid), Pidfd.isAlive(owned.borrowed) else {
            return nil
        }
        // What the process that connected runs now is not who wrote the
        // request when its connection outlives an exec or is shared
        // (docs/SECURITY.md, "An application's secrets on every door").
        if checkingRelays, identity.distrust == nil {
            identity.distrust = SocketHolders.relayProblem(of: credentials.pid, connection: socket)
        }
        return identity
    }

    /// SO_PEERPIDFD (Linux 6.5, asm-generic/socket.h): a pidfd of the process that connected.
    private static let soPeerPidfd: Int32 = 77

    /// The credentials of a socket peer.
    package static func peerCredentials(_ socket: BorrowedDescriptor) -> PeerCredentials? {
        var credentials = PeerCredentials()
        var length = socklen_t(MemoryLayout<PeerCredentials>.size)
        guard getsockopt(socket.raw, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0 else { return nil }
        return credentials
    }

    /// The digest of an executable at `path` now, for a rule granted to it:
    /// its resolved path and SHA-256. Nil when it is not a regular file we can read.
    package static func executable(at path: String) -> (path: String, digest: [UInt8])? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
        // writer (a grant naming one wedged the device); a regular file's
        // reads ignore it. Anything but a regular file is then refused.
        guard let fd = FileDescriptor(open(resolved, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)) else { return nil }
        return executable(from: fd.borrowed, path: String(cString: resolved))
    }

    /// ``executable(at:)`` of a file already open: one the client opened
    /// and passed (the service cannot open paths in its users' private
    /// directories); `path` is the resolved path the client names.
    package static func executable(from fd: BorrowedDescriptor, path: String) -> (path: String, digest: [UInt8])? {
        var info = stat()
        guard path.hasPrefix("/"), fstat(fd.raw, &info) == 0, info.st_mode & S_IFMT == S_IFREG,
            let digest = digest(of: fd, info: info)
        else {
            return nil
        }
        return (path, digest)
    }

    // MARK: Digests

    /// A version of a file: any write changes its size, mtime or ctime (and
    /// ctime cannot be set back by its owner), a replacement its inode.
    private struct FileVersion: Hashable {
        let device: UInt64, inode: UInt64, size: Int64
        let modified: Int64, modifiedNanoseconds: Int64, changed: Int64, changedNanoseconds: Int64

        init(_ info: stat) {
            device = UInt64(info.st_dev)
            inode = UInt64(info.st_ino)
            size = Int64(info.st_size)
            modified = Int64(info.st_mtim.tv_sec)
            modifiedNanoseconds = Int64(info.st_mtim.tv_nsec)
            changed = Int64(info.st_ctim.tv_sec)
            changedNanoseconds = Int64(info.st_ctim.tv_nsec)
        }
    }

    private static let digests = Mutex<[FileVersion: [UInt8]]>([:])
    /// Distinct executables are few; a full cache is simply emptied.
    private static let digestCacheLimit = 256

    static func digest(of fd: BorrowedDescriptor, info: stat) -> [UInt8]? {
        let version = FileVersion(info)
        if let known = digests.withLock({ $0[version] }) { return known }
        guard let digest = ExecutableDigest.of(fd) else { return nil }
        // A write while hashing would change the version: keep only a digest of a file that held still.
        var after = stat()
        guard fstat(fd.raw, &after) == 0, FileVersion(after) == version else { return nil }
        digests.withLock { cache in
            if cache.count >= digestCacheLimit { cache.removeAll() }
            cache[version] = digest
        }
        return digest
    }

    // MARK: /proc

    /// Where the symbolic link at `path` points. `reusing` is returned
    /// instead of a new String when the target is the same (the common case
    /// of an audited thread asking again): no allocation per request.
    package static func linkTarget(_ path: UnsafePointer<CChar>, reusing known: String? = nil) -> String? {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: Int(PATH_MAX) + 1) { buffer -> String? in
            let count = readlink(path, buffer.baseAddress!, buffer.count)
            guard count > 0, count < buffer.count else { return nil }
            let target = UnsafeRawBufferPointer(start: buffer.baseAddress, count: count)
            let same = known?.utf8.withContiguousStorageIfAvailable { utf8 in
                utf8.count == count && memcmp(utf8.baseAddress!, target.baseAddress!, count) == 0
            }
            if same == true, let known { return known }
            return String(decoding: target, as: UTF8.self)
        }
    }

    /// Calls `body` with `/proc/THREAD/LEAF` as a C string built on the
    /// stack: this runs for every audited request, where an interpolated
    /// String cost more than the `readlink` it names (callgrind).
    package static func withProcPath<R>(_ thread: pid_t, _ leaf: StaticString, _ body: (UnsafePointer<CChar>) -> R) -> R
    {
        let prefix: StaticString = "/proc/"
        // "/proc/" + at most 10 digits + "/" + leaf + NUL.
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 18 + leaf.utf8CodeUnitCount) { path in
            var end = prefix.utf8CodeUnitCount
            path.baseAddress!.update(from: prefix.utf8Start, count: end)
            var digits = 1
            var rest = UInt32(bitPattern: thread) / 10
            while rest > 0 { digits += 1; rest /= 10 }
            var value = UInt32(bitPattern: thread)
            for index in stride(from: end + digits - 1, through: end, by: -1) {
                path[index] = UInt8(ascii: "0") + UInt8(value % 10)
                value /= 10
            }
            end += digits
            path[end] = UInt8(ascii: "/")
            (path.baseAddress! + end + 1).update(from: leaf.utf8Start, count: leaf.utf8CodeUnitCount)
            end += 1 + leaf.utf8CodeUnitCount
            path[end] = 0
            return path.baseAddress!.withMemoryRebound(to: CChar.self, capacity: end + 1) { body($0) }
        }
    }

    /// The systemd unit of a thread: the innermost `.service` or `.scope`
    /// of its cgroup path, e.g. `/user.slice/user-1000.slice/
    /// user@1000.service/app.slice/backup.service` is `backup.service`.
    package static func unit(of thread: pid_t) -> String? {
        readProcFile(thread, "cgroup", limit: 64 << 10).flatMap(unit(ofCgroupFile:))
    }

    /// The bytes of `/proc/THREAD/LEAF`, up to `limit`; nil when it cannot be read.
    static func readProcFile(_ thread: pid_t, _ leaf: StaticString, limit: Int) -> [UInt8]? {
        withProcPath(thread, leaf) { path -> [UInt8]? in
            guard let fd = FileDescriptor(open(path, O_RDONLY | O_CLOEXEC)) else { return nil }
            return try? fd.borrowed.readAll(limit: limit)
        }
    }

    /// The unit a `/proc/PID/cgroup` file names: the unified (v2) hierarchy
    /// first; on a hybrid host systemd keeps its units in the `name=systemd`
    /// one. Parsed as bytes: this runs for the first request of every
    /// process, and splitting Strings cost 137k instructions (callgrind).
    package static func unit(ofCgroupFile file: [UInt8]) -> String? {
        var systemdUnit: String?
        var lineStart = 0
        while lineStart < file.count {
            let lineEnd = file[lineStart...].firstIndex(of: UInt8(ascii: "\n")) ?? file.count
            defer { lineStart = lineEnd + 1 }
            // cgroups(7): `hierarchy-ID:controller-list:cgroup-path`.
            guard let first = file[lineStart..<lineEnd].firstIndex(of: UInt8(ascii: ":")),
                let second = file[(first + 1)..<lineEnd].firstIndex(of: UInt8(ascii: ":"))
            else { continue }
            let controllers = file[(first + 1)..<second]
            if controllers.isEmpty {
                if let unit = unit(inCgroupPath: file[(second + 1)..<lineEnd]) { return unit }
            } else if systemdUnit == nil, controllers.elementsEqual("name=systemd".utf8) {
                systemdUnit = unit(inCgroupPath: file[(second + 1)..<lineEnd])
            }
        }
        return systemdUnit
    }

    /// The last component of a cgroup path that names a service or a scope.
    private static func unit(inCgroupPath path: ArraySlice<UInt8>) -> String? {
        var end = path.endIndex
        while end > path.startIndex {
            let start = path[..<end].lastIndex(of: UInt8(ascii: "/")).map { $0 + 1 } ?? path.startIndex
            let component = path[start..<end]
            if component.hasByteSuffix(".service") || component.hasByteSuffix(".scope") {
                return String(decoding: component, as: UTF8.self)
            }
            end = start - 1
        }
        return nil
    }
}

private extension ArraySlice<UInt8> {
    func hasByteSuffix(_ suffix: StaticString) -> Bool {
        count >= suffix.utf8CodeUnitCount
            && self.suffix(suffix.utf8CodeUnitCount).elementsEqual(
                UnsafeBufferPointer(start: suffix.utf8Start, count: suffix.utf8CodeUnitCount))
    }
}

/// Linux's `struct ucred` (socket(7)), which glibc declares only with _GNU_SOURCE.
package struct PeerCredentials {
    package var pid: Int32 = 0
    package var uid: UInt32 = 0
    package var gid: UInt32 = 0
    package init() {}
}
