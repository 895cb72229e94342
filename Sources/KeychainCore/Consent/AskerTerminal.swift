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
            !isASessionsShellAtItsPrompt(control.group, asker: pid)
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

    /// Whether the foreground group's leader, not the asker itself, is the
    /// session's leader and runs no command: the shell the terminal
    /// started, at its prompt. A background job of that shell joined the
    /// shell's own group while the shell sat at its prompt (it then
    /// descends from the group's leader) and was asked at the terminal,
    /// the person having typed nothing; stopping the shell meanwhile gave
    /// the pinentry the person's typing (an outsider's attack). A shell
    /// that runs a command waits for it (wait4(2): `do_wait` in
    /// /proc/PID/wchan, proc(5)); at its prompt it reads the terminal
    /// (poll, read) or is stopped. An interactive shell that is not the
    /// session's leader (one started from another) is not told apart
    /// (docs/SECURITY.md, "Asked at a terminal").
    static func isASessionsShellAtItsPrompt(_ leader: pid_t, asker: pid_t) -> Bool {
        guard leader != asker, ProcessChain.session(of: leader) == leader else { return false }
        return ProgramIdentities.readProcFile(leader, "wchan", limit: 64) != Array("do_wait".utf8)
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
