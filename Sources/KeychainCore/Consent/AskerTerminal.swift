#if canImport(Glibc)
import Glibc
#endif

/// The terminal a question is asked at when no display can show it (SSH,
/// a server, a text console): the terminal of the process that asks, and
/// only while that process runs in its foreground, so that the question
/// answers a command the person typed there and waits for, as gpg-agent
/// asks at `GPG_TTY` (docs/SECURITY.md, "Asked at a terminal"). A process
/// in the background, or one with no terminal, gets none: nobody can be
/// asked for it.
package struct AskerTerminal: Sendable, Equatable {
    /// The terminal's device file, `/dev/pts/N` or `/dev/ttyN`.
    package let path: String
    /// The terminal's type as the asker's `TERM` names it (letters, digits,
    /// `.`, `+`, `-`), for pinentry's curses; `xterm` when it names none.
    package let type: String

    /// The terminal `pid` runs in the foreground of, when this process
    /// may open it: a character device of this process's user, the same
    /// device the kernel names as the process's controlling terminal.
    package static func foreground(of pid: pid_t) -> AskerTerminal? {
        guard let control = ProcessChain.controllingTerminal(of: pid), control.inForeground, control.device != 0,
            let path = devicePath(control.device), isStartedByItsGroupsLeader(pid, group: control.group),
            isWaitedForByTheSessionsShell(control.group, asker: pid), let user = ProcessChain.realUser(of: pid),
            isALoginsTerminal(path, user: user), let session = ProcessChain.session(of: pid),
            isTheOnlySession(of: control.device, session: session, user: user)
        else { return nil }
        var info = stat()
        guard stat(path, &info) == 0, info.st_mode & S_IFMT == S_IFCHR, UInt64(info.st_rdev) == control.device,
            info.st_uid == getuid()
        else { return nil }
        return AskerTerminal(path: path, type: terminalType(of: pid))
    }

    /// Whether `pid` leads its process group or descends from the process
    /// that does: the command the shell started in the foreground, and
    /// what that runs. A background job of the same shell can join the
    /// foreground group (setpgid(2) to the group `tcgetpgrp` names, no
    /// tcsetpgrp needed) and ask while the person's command runs; it is the
    /// shell's child, not the command's, and is not asked.
    static func isStartedByItsGroupsLeader(_ pid: pid_t, group: pid_t) -> Bool {
        var process = pid
        for _ in 0..<32 {
            if process == group { return true }
            guard let parent = ProcessChain.parent(of: process), parent > 1 else { return false }
            process = parent
        }
        return false
    }

    /// Whether the foreground group is one the session's shell put there
    /// and waits for: every process from the group's leader's parent up
    /// to the session's leader (the shell the terminal started) waits for
    /// a child (wait4(2): `do_wait` in /proc/PID/wchan, proc(5)), as a shell
    /// does while it runs a command in the foreground; the leader itself
    /// too when it is the session's leader and not the asker (a shell that
    /// runs a script, as over `ssh -t HOST 'a; b'`). At its prompt a shell
    /// reads the terminal (poll, read) or is stopped. Two attacks of a
    /// background job while the shell sat at its prompt, the person having
    /// typed nothing, were asked at the terminal: joining the shell's own
    /// group (it then descends from the group's leader), and, ignoring
    /// SIGTTOU, making its own group the foreground with tcsetpgrp(3) (it
    /// then leads that group). A process of another user on the way (su,
    /// sudo's monitor, which waits in its own event loop) is passed over:
    /// no program of the asker's user can be one. The chain must reach the
    /// session's leader: a group whose leader left it (reparented to init
    /// or a subreaper) was started by nobody the terminal shows
    /// (docs/SECURITY.md, "Asked at a terminal").
    static func isWaitedForByTheSessionsShell(_ leader: pid_t, asker: pid_t) -> Bool {
        guard let session = ProcessChain.session(of: leader), let user = ProcessChain.realUser(of: asker) else {
            return false
        }
        if leader == session { return leader == asker || waitsForAChild(leader) }
        var process = leader
        for _ in 0..<32 {
            guard let parent = ProcessChain.parent(of: process), parent > 1,
                ProcessChain.session(of: parent) == session,
                let owner = ProcessChain.realUser(of: parent)
            else { return false }
            if owner == user && !waitsForAChild(parent) { return false }
            if parent == session { return true }
            process = parent
        }
        return false
    }

    /// Where logind records the sessions it opened, one file each, root's
    /// (`TTY=` names a session's terminal; sd-login reads the same files).
    static let sessionRecords = "/run/systemd/sessions"

    /// Whether `path` is the terminal of a login of `user` that root
    /// recorded: a session of logind's (a virtual console's login, `login`
    /// on a terminal; logind records none for an SSH login, whose PAM
    /// session sshd opens before it has a pseudo-terminal) whose `TTY=` it
    /// is, and, for a pseudo-terminal, no newer than the login. Any program
    /// of the user can make a pseudo-terminal of its own, run a command in
    /// its foreground, read the question off the other side and type its
    /// code (an outsider did, for another program's item); only root opens
    /// a login, and records it. A terminal nested in a login (tmux, screen,
    /// `script`) is none: a program of the user makes those too
    /// (docs/SECURITY.md, "Asked at a terminal").
    static func isALoginsTerminal(_ path: String, user: uid_t, records: String = sessionRecords) -> Bool {
        guard path.hasPrefix("/dev/"), let directory = opendir(records) else { return false }
        defer { closedir(directory) }
        let terminal = "TTY=" + path.dropFirst("/dev/".count), owner = "UID=\(user)"
        while let entry = readdir(directory) {
            let name = entry.name
            guard !name.hasPrefix("."), !name.contains("."), RootControlledFile.status(of: records + "/" + name) != nil,
                let fd = FileDescriptor(open(records + "/" + name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)),
                let bytes = try? fd.borrowed.readAll(limit: 1 << 16)
            else { continue }
            let lines = Set(String(decoding: bytes, as: UTF8.self).split(separator: "\n").map(String.init))
            guard lines.contains(terminal) && lines.contains(owner) && !lines.contains("STATE=closing") else {
                continue
            }
            if !path.hasPrefix("/dev/pts/") || isNoNewerThanItsLogin(path, lines: lines) { return true }
        }
        return false
    }

    /// How long after its login began a login's pseudo-terminal may have
    /// been made (or had its mode changed, as `mesg n` in a profile does).
    static let loginTerminalSlack: Int64 = 5_000_000

    /// Whether the pseudo-terminal at `path` was made no later than its
    /// login began (logind's `REALTIME=`, microseconds), within
    /// ``loginTerminalSlack``: its inode's change time is when devpts made
    /// it (or last changed its mode or owner), which no program can set
    /// back. A record may outlive its login's first terminal (a connection
    /// that carries several): a program of the user waited for that
    /// terminal to close, opened terminals until it had its number, and
    /// answered its own question there (an outsider's attack). Its
    /// terminal is newer than the login, and is no login's.
    static func isNoNewerThanItsLogin(_ path: String, lines: Set<String>) -> Bool {
        guard let began = lines.first(where: { $0.hasPrefix("REALTIME=") }).flatMap({ Int64($0.dropFirst(9)) }) else {
            return false
        }
        var info = stat()
        guard stat(path, &info) == 0 else { return false }
        let changed = Int64(info.st_ctim.tv_sec) * 1_000_000 + Int64(info.st_ctim.tv_nsec) / 1000
        return changed <= began + loginTerminalSlack
    }

    /// Whether no other session of `user` than `session` has a terminal
    /// numbered `device` as its controlling one. A terminal's number does
    /// not say which devpts it is: a program of the user mounted a devpts
    /// of its own (`unshare --user --mount`, `mount -t devpts -o
    /// newinstance`, no privilege needed), opened terminals there until it
    /// had the number of the person's login terminal, and made it the
    /// controlling terminal of a session of its own: the device took it for
    /// the login's, and asked at the person's terminal while the person
    /// sat at the prompt, for the program's own command (an outsider's
    /// attack). The person's own shell keeps the real one for as long as the
    /// login lasts, so two sessions show the number: nobody is asked then.
    /// A rootless container of the user's with a terminal of that number
    /// makes the question go unasked too.
    static func isTheOnlySession(of device: UInt64, session: pid_t, user: uid_t) -> Bool {
        guard let processes = opendir("/proc") else { return false }
        defer { closedir(processes) }
        while let entry = readdir(processes) {
            let name = entry.name
            guard let pid = pid_t(name), let other = ProcessChain.terminalAndSession(of: pid),
                other.device == device, other.session != session, ProcessChain.realUser(of: pid) == user
            else { continue }
            return false
        }
        return true
    }

    /// Whether `pid` sleeps in wait4(2) (`do_wait` in /proc/PID/wchan).
    static func waitsForAChild(_ pid: pid_t) -> Bool {
        ProgramIdentities.readProcFile(pid, "wchan", limit: 64) == Array("do_wait".utf8)
    }

    /// proc(5)'s `tty_nr`: the major number in bits 8 to 15, the minor in
    /// bits 0 to 7 and 20 to 31. Pseudo-terminals are majors 136 to 143
    /// (devices.txt: "Unix98 PTY slaves", 256 minors each); the virtual
    /// consoles major 4, minors 1 to 63. Any other terminal (a serial line)
    /// is none of the person's to be asked at.
    static func devicePath(_ number: UInt64) -> String? {
        let major = (number >> 8) & 0xfff, minor = (number & 0xff) | ((number >> 12) & 0xfff00)
        switch major {
        case 136...143: return "/dev/pts/\((major - 136) * 256 + minor)"
        case 4 where (1...63).contains(minor): return "/dev/tty\(minor)"
        default: return nil
        }
    }

    /// The asker's `TERM`, when it is a plain terminfo name.
    private static func terminalType(of pid: pid_t) -> String {
        let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.+-".utf8)
        guard let environment = ProgramIdentities.readProcFile(pid, "environ", limit: 1 << 20),
            let entry = environment.split(separator: 0).first(where: { $0.starts(with: Array("TERM=".utf8)) })
        else { return "xterm" }
        let name = entry.dropFirst(5)
        guard (1...32).contains(name.count), name.allSatisfy(allowed.contains) else { return "xterm" }
        return String(decoding: name, as: UTF8.self)
    }
}
