#if canImport(Glibc)
import Glibc
#endif

/// Whose an item's secret is (docs/SECRET-SERVICE.md, "Whose an item is"): an
/// item a program made over the bus belongs to it. Its owner, and the programs
/// the person allowed for good, use it without a question; any other program,
/// at any door (the bus, the socket's commands, the mount), waits while
/// pinentry asks the person: Deny, Allow once, Always allow. No way to ask (no
/// pinentry, a timeout, a closed window, too many questions at once) is
/// Deny. Listings still show the item; only its secret and its changes are
/// the owner's. Items made through a mount or the command line belong to
/// no program (docs/SECRET-SERVICE.md, "Whose an item is").
public enum ItemConsent {
    /// Seconds the person has to answer; the pinentry is ended after them.
    package static let timeout = 60

    /// The three buttons, in pinentry's order: OK is the default (Enter),
    /// as macOS's "Allow"; Escape is Deny.
    package static let allowOnce = "Allow once"
    package static let alwaysAllow = "Always allow"
    package static let deny = "Deny"

    /// What the person said, as the audit log writes it.
    public enum Answer: String, Sendable {
        case allowedOnce = "allowed-once"
        case allowedAlways = "allowed-always"
        case denied
    }

    /// An item another program's request touches, and its owner.
    package struct Asked: Sendable, Hashable {
        package let group: String
        package let identifier: String
        package let label: String
        package let owner: ProgramClaim

        package init(group: String, identifier: String, label: String, owner: ProgramClaim) {
            self.group = group
            self.identifier = identifier
            self.label = label
            self.owner = owner
        }

        package static func == (a: Asked, b: Asked) -> Bool { a.group == b.group && a.identifier == b.identifier }
        package func hash(into hasher: inout Hasher) {
            hasher.combine(group)
            hasher.combine(identifier)
        }
    }

    /// Whether `program` uses the item of `details` without a question:
    /// an item without an owner, its owner, or a program on its list.
    package static func isFree(_ details: ItemDetails?, for program: ProgramIdentity?) -> Bool {
        guard let owner = details?.owner else { return true }
        guard let program else { return false }
        return owner.admits(program) || details?.allowed.contains { $0.admits(program) } == true
    }

    /// The items among `candidates` that the caller must be asked about
    /// (it is neither their owner nor on their list), and the caller as
    /// read: `program` is called once, and only when an item has an owner
    /// (most have none, and reading a caller costs a scan of its processes).
    /// Every door's list of questions is made here.
    package static func asked(
        among candidates: [(group: String, identifier: String, details: ItemDetails?)],
        program read: () -> ProgramIdentity?
    ) -> (asked: [Asked], program: ProgramIdentity?) {
        var program: ProgramIdentity??
        let asked = candidates.compactMap { item -> Asked? in
            guard let details = item.details, let owner = details.owner else { return nil }
            if program == nil { program = .some(read()) }
            guard !isFree(details, for: program ?? nil) else { return nil }
            return Asked(group: item.group, identifier: item.identifier, label: details.label, owner: owner)
        }
        return (asked, program ?? nil)
    }

    /// The longest question, in characters: the true sentence comes first
    /// and whole, and nothing a program chose can push it off the screen.
    package static let maximumQuestion = 900

    /// The question, naming the program (its path, and its package where
    /// dpkg knows it), who ran it, the items (label, collection) and their
    /// owner. Every part a program or a person chose is escaped and cut
    /// (``ConsentText``), so that none can forge the sentence.
    package static func question(
        asker: ProgramClaim?, unidentified reason: String?, chain: [ChainLink], deputy: Bool, items: [Asked],
        asking verb: String
    ) -> String {
        let who =
            asker.map { ConsentText.shown($0.described, limit: 200) }
            ?? "a program that cannot be identified"
        let what =
            items.prefix(3).map {
                "\"\(ConsentText.shown($0.label, limit: 60))\" in \(ConsentText.shown($0.group, limit: 60))"
            }
            .joined(separator: ", ") + (items.count > 3 ? " and \(items.count - 3) more" : "")
        let owners = Set(items.map { ConsentText.shown($0.owner.described, limit: 200) }).sorted()
        var text =
            "\(who) wants to \(verb) \(what), which belongs to "
            + owners.prefix(2).joined(separator: ", ") + (owners.count > 2 ? " and others" : "") + "."
        if let reason { text += " It is not trusted as its program: \(ConsentText.shown(reason, limit: 120))." }
        let acting = deputy ? " It acts for whatever ran it, so it can be allowed only once." : ""
        if chain.count > 1 {
            // Whole links only: a cut never takes a link's "who could have written it" and leaves its path.
            var links = ""
            for link in chain.dropFirst() {
                let next = (links.isEmpty ? "" : " ← ") + link.shown
                guard
                    text.count + " It was started by ".count + links.count + next.count + 2 + acting.count
                        <= maximumQuestion
                else {
                    links += " ← …"
                    break
                }
                links += next
            }
            text += " It was started by " + links + "."
        }
        return String((text + acting).prefix(maximumQuestion))
    }

    /// What a caller that was not allowed is told (never a value): whose
    /// the item is, and how the person can allow a program for good.
    package static func deniedSentence(item: String, owner: ProgramClaim) -> String {
        "\(item) belongs to \(ConsentText.shown(owner.described, limit: 200)): the person denied this program, "
            + "or nobody could be asked (no display to show the question on and the program not run in the "
            + "foreground of a terminal, no pinentry that root installed, or no answer within \(timeout) s); "
            + "`keychainfs acl \(item.shellWord) --add PROGRAM` allows a program ahead of time, with the passcode"
    }

    /// The second question, where a pinentry draws two buttons.
    package static let alwaysQuestion = "Allow it every time from now on, without asking?"
    package static let onlyThisTime = "Only this time"

    /// Asks through pinentry on the calling thread (which it blocks for
    /// ``timeout`` seconds at most); `always` says whether "Always allow"
    /// is offered. A pinentry that draws no third button (pinentry-gnome3)
    /// is asked twice: Allow or Deny, then, once allowed, always or only
    /// this time, so that "Always allow" can be chosen with every flavour.
    /// With no display to show it on, the question goes to `terminal`
    /// (the asker's, in its foreground: ``AskerTerminal``), where the
    /// person answers by typing a code the question shows.
    package static func ask(
        _ description: String, always: Bool, at terminal: AskerTerminal? = nil,
        abandoned: @escaping @Sendable () -> Bool = { false }
    ) -> Answer {
        guard let program = Pinentry.program() else { return .denied }
        if !Pinentry.hasDisplay, let terminal {
            return askAtTerminal(
                description, always: always, program: program, terminal: terminal, abandoned: abandoned)
        }
        guard let pinentry = try? Pinentry(program: program, endingAfter: timeout, unless: abandoned)
        else { return .denied }
        defer { pinentry.end() }
        guard always, !pinentry.drawsThirdButton() else {
            let choice = pinentry.confirm(
                description: description, ok: allowOnce, notOK: always ? alwaysAllow : nil, cancel: deny,
                timeout: timeout)
            switch choice {
            case .ok: return .allowedOnce
            case .notOK: return always ? .allowedAlways : .denied
            case .cancel: return .denied
            }
        }
        guard pinentry.confirm(description: description, ok: "Allow", notOK: nil, cancel: deny, timeout: timeout) == .ok
        else { return .denied }
        let again = pinentry.confirm(
            description: description + " " + alwaysQuestion, ok: alwaysAllow, notOK: nil, cancel: onlyThisTime,
            timeout: timeout)
        return again == .ok ? .allowedAlways : .allowedOnce
    }

    /// At a terminal, the answer is a code the question shows, typed: a
    /// program of the user that can put keystrokes into the terminal
    /// (TIOCSTI, where the kernel allows it) cannot see the screen, so
    /// cannot answer for the person; Enter alone, anything else, Escape or
    /// no answer within ``timeout`` is Deny (docs/SECURITY.md, "Asked at a
    /// terminal").
    static func askAtTerminal(
        _ description: String, always: Bool, program: String, terminal: AskerTerminal,
        abandoned: @escaping @Sendable () -> Bool
    ) -> Answer {
        guard let pinentry = try? Pinentry(program: program, endingAfter: timeout, at: terminal, unless: abandoned)
        else { return .denied }
        defer { pinentry.end() }
        let once = answerCode(), every = always ? answerCode() : nil
        let how =
            "To allow it this once, type \(once)"
            + (every.map { "; to allow it every time from now on, type \($0)" } ?? "")
            + ". Anything else denies it."
        let typed: SecureBytes
        do throws(Pinentry.Failure) {
            guard
                case .passcode(let answer) = try pinentry.ask(
                    description: description + "\n\n" + how, error: nil, prompt: "Answer:")
            else { return .denied }
            typed = answer
        } catch {
            // Said where the device logs: the person saw no question (no such terminal, a pinentry that failed).
            Diagnostics.log("could not ask at \(terminal.path): \(error)")
            return .denied
        }
        let answer = typed.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }.filter { $0 != " " }.lowercased()
        if answer == once { return .allowedOnce }
        if let every, answer == every { return .allowedAlways }
        return .denied
    }

    /// Five letters, chosen at random for each question (23 letters: no
    /// i, l or o, which pass for digits).
    static func answerCode() -> String {
        let letters = Array("abcdefghjkmnpqrstuvwxyz")
        return String(Crypto.randomBytes(5).map { letters[Int($0) % letters.count] })
    }
}

/// Text a program chose (a label, a path), as a question shows it: every
/// character that is not printable text escaped, so that nothing in it
/// can break a line, reorder the text or pass for a quote. Unicode's
/// categories C (controls, formats such as U+202E, surrogates, private
/// use, unassigned) and Z other than the space (U+2028 and U+2029 are
/// line breaks in GTK and Qt), the backslash and the double quote.
package enum ConsentText {
    package static func shown(_ text: String, limit: Int) -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            // Cut by what is shown: an escape counts for every character it takes.
            guard out.unicodeScalars.count < limit else {
                out += "…"
                break
            }
            switch scalar {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case " ": out += " "
            default:
                if LineEscaping.hidesText(scalar) {
                    out += "\\u{" + String(scalar.value, radix: 16) + "}"
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out
    }

}

/// One process behind a caller: its program's path (nil: it cannot be
/// read, and `name` is its command name), who could have written that
/// file, and, for an interpreter, the script it runs.
package struct ChainLink: Sendable, Equatable {
    package var path: String?
    package var name: String
    package var provenance: String
    package var script: (path: String, provenance: String)?

    package init(path: String?, name: String, provenance: String) {
        self.path = path
        self.name = name
        self.provenance = provenance
    }

    package static func == (a: ChainLink, b: ChainLink) -> Bool {
        a.path == b.path && a.name == b.name && a.provenance == b.provenance && a.script?.path == b.script?.path
            && a.script?.provenance == b.script?.provenance
    }

    /// As the question says it: each path in quotes (escaped and cut inside
    /// them, ``ConsentText``), then who could have written it, outside: a
    /// path cannot close its quotes, and however long it is, its own
    /// "(written by a program of yours)" follows it, not one it spelled.
    package var shown: String {
        guard let path else { return "a program named \"\(ConsentText.shown(name, limit: 40))\" that cannot be read" }
        var text = "\"" + ConsentText.shown(path, limit: 80) + "\" (" + provenance + ")"
        if let script {
            text += " running \"" + ConsentText.shown(script.path, limit: 80) + "\" (" + script.provenance + ")"
        }
        return text
    }

    /// As the audit log writes it (the log escapes its lines itself).
    package var logged: String {
        guard let path else { return "a program named \(name) that cannot be read" }
        return path + " (" + provenance + ")"
            + (script.map { " running " + $0.path + " (" + $0.provenance + ")" } ?? "")
    }
}

/// The processes behind a caller, as a person reads them: the program,
/// its parent and its grandparent (`keychainfs ← bash ← sshd`), so that
/// the person can tell their own typing from a script's.
package enum ProcessChain {
    package static func names(from pid: pid_t, depth: Int = 3) -> [String] {
        var names: [String] = []
        var current = pid
        for _ in 0..<depth where current > 0 {
            guard let (name, parent) = nameAndParent(current) else { break }
            names.append(name)
            current = parent
        }
        return names
    }

    /// The processes from `pid` up, each by its program's full path and who
    /// could have written that file: a package (root's, as dpkg knows it),
    /// root, or any program of the user; for an interpreter, the script it
    /// runs too, said the same way. A basename alone let the user's own
    /// `~/.cache/x/gnome-terminal-server` pass for the real terminal, and
    /// `python3 ~/.cache/x/g.py` passed for Debian's python3 alone
    /// (docs/SECURITY.md, "A chain a person can trust"). A process whose
    /// program cannot be read is named by its command name, said as such.
    package static func described(from pid: pid_t, depth: Int = 3) -> [ChainLink] {
        var described: [ChainLink] = []
        var current = pid
        for _ in 0..<depth where current > 0 {
            guard let (name, parent) = nameAndParent(current) else { break }
            if let path = ProgramIdentities.withProcPath(current, "exe", { ProgramIdentities.linkTarget($0) }),
                path.hasPrefix("/")
            {
                var link = ChainLink(path: path, name: name, provenance: provenance(of: path))
                var owner = Glibc.stat()
                if let kind = Interpreters.kind(of: path), fstatat(AT_FDCWD, "/proc/\(current)", &owner, 0) == 0,
                    case .file(let script, _) = Interpreters.script(of: current, kind: kind, uid: owner.st_uid)
                {
                    link.script = (script, provenance(of: script))
                }
                described.append(link)
            } else {
                described.append(ChainLink(path: nil, name: name, provenance: ""))
            }
            current = parent
        }
        return described
    }

    /// Who could have written the program at `path`, in the question's words.
    package static func provenance(of path: String) -> String {
        if let package = PackageOwnership.package(of: path) { return "package " + package }
        if RootControlledFile.status(of: path) != nil { return "root's, from no package" }
        return "written by a program of yours"
    }

    private static func executableName(_ pid: pid_t) -> String? {
        guard let path = ProgramIdentities.withProcPath(pid, "exe", { ProgramIdentities.linkTarget($0) }),
            let name = path.split(separator: "/").last
        else { return nil }
        return String(name)
    }

    /// When the process started, in clock ticks since boot (`/proc/PID/stat`'s
    /// 22nd field, proc(5)): with the pid, names one process for good.
    package static func startTime(of pid: pid_t) -> UInt64? {
        guard let fields = stat(of: pid)?.fields, fields.count > 19 else { return nil }
        return UInt64(String(decoding: fields[19], as: UTF8.self))
    }

    /// The process's controlling terminal (`tty_nr`, 0: none) and whether
    /// it runs in its foreground: its process group (`pgrp`) is the
    /// terminal's foreground group (`tpgid`), proc(5).
    package static func controllingTerminal(of pid: pid_t) -> (device: UInt64, group: pid_t, inForeground: Bool)? {
        guard let fields = stat(of: pid)?.fields, fields.count > 5,
            let group = Int32(String(decoding: fields[2], as: UTF8.self)),
            let device = Int64(String(decoding: fields[4], as: UTF8.self)),
            let foreground = Int32(String(decoding: fields[5], as: UTF8.self))
        else { return nil }
        return (UInt64(UInt32(truncatingIfNeeded: device)), group, foreground > 0 && foreground == group)
    }

    /// The process's controlling terminal (`tty_nr`) and session, from one
    /// read of `/proc/PID/stat`.
    package static func terminalAndSession(of pid: pid_t) -> (device: UInt64, session: pid_t)? {
        guard let fields = stat(of: pid)?.fields, fields.count > 4,
            let session = Int32(String(decoding: fields[3], as: UTF8.self)),
            let device = Int64(String(decoding: fields[4], as: UTF8.self))
        else { return nil }
        return (UInt64(UInt32(truncatingIfNeeded: device)), session)
    }

    /// The session the process is in (`/proc/PID/stat`'s 6th field).
    package static func session(of pid: pid_t) -> pid_t? {
        guard let fields = stat(of: pid)?.fields, fields.count > 3 else { return nil }
        return Int32(String(decoding: fields[3], as: UTF8.self))
    }

    /// The process's real user (`/proc/PID/status`'s `Uid:` line, which
    /// anyone may read, also of an undumpable process, whose /proc entries
    /// the kernel gives to root).
    package static func realUser(of pid: pid_t) -> uid_t? {
        guard let status = ProgramIdentities.readProcFile(pid, "status", limit: 1 << 14) else { return nil }
        for line in status.split(separator: UInt8(ascii: "\n")) where line.starts(with: Array("Uid:".utf8)) {
            let fields = line.dropFirst(4).split(whereSeparator: { $0 == UInt8(ascii: "\t") || $0 == UInt8(ascii: " ") }
            )
            return fields.first.flatMap { UInt32(String(decoding: $0, as: UTF8.self)) }
        }
        return nil
    }

    /// The process's parent (`/proc/PID/stat`'s 4th field).
    package static func parent(of pid: pid_t) -> pid_t? {
        guard let fields = stat(of: pid)?.fields, fields.count > 1 else { return nil }
        return Int32(String(decoding: fields[1], as: UTF8.self))
    }

    /// The process's command name and its parent, from `/proc/PID/stat`.
    private static func nameAndParent(_ pid: pid_t) -> (String, pid_t)? {
        guard let stat = stat(of: pid), stat.fields.count > 1,
            let parent = Int32(String(decoding: stat.fields[1], as: UTF8.self))
        else { return nil }
        // The executable's name where it can be read (the kernel cuts `comm` at 15 bytes).
        return (executableName(pid) ?? String(decoding: stat.command, as: UTF8.self), parent)
    }

    /// `/proc/PID/stat` read: the command name, and the fields after it
    /// (the 3rd on). proc(5): the name is in parentheses and may hold any
    /// byte, so the fields are read after the last one.
    private static func stat(of pid: pid_t) -> (command: ArraySlice<UInt8>, fields: [ArraySlice<UInt8>])? {
        guard let fd = FileDescriptor(ProgramIdentities.withProcPath(pid, "stat") { open($0, O_RDONLY | O_CLOEXEC) }),
            let bytes = try? fd.borrowed.readAll(limit: 4096),
            let open = bytes.firstIndex(of: UInt8(ascii: "(")), let close = bytes.lastIndex(of: UInt8(ascii: ")")),
            open < close
        else { return nil }
        return (bytes[(open + 1)..<close], bytes[(close + 1)...].split(separator: UInt8(ascii: " ")))
    }
}

/// Programs that act for whatever runs them (docs/SECRET-SERVICE.md, "Whose an
/// item is"): a person who allows one for good allows every script that runs
/// it. They are allowed once at most, never always: the command line of
/// KeychainFS itself, libsecret's and D-Bus's own tools, and the interpreters
/// (``Interpreters``), unless they run a script file, which is then the
/// program.
package enum Deputies {
    static let tools: Set<Substring> = [
        "keychainfs", "secret-tool", "busctl", "gdbus", "dbus-send", "qdbus", "env", "tclsh", "wish", "osascript"
    ]

    package static func isDeputy(_ executable: String) -> Bool {
        tools.contains(Interpreters.commandName(of: executable)) || Interpreters.isInterpreter(executable)
            || EntitlementRule.sameBytes(executable, ownExecutable)
    }

    /// This program (the device runs as `keychainfs`, wherever installed).
    private static let ownExecutable: String? = ProgramIdentities.linkTarget("/proc/self/exe")
}
