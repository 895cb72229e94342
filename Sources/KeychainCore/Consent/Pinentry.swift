import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A passcode asked for through pinentry, the program GnuPG uses (its
/// Assuan protocol: SETDESC, SETPROMPT, SETERROR, GETPIN). It is the
/// device's judge (it answers "Allow" for the person), so no caller
/// chooses it: the program is ``program()``, a file only root can change.
/// It runs with the device's environment (the session's DISPLAY,
/// WAYLAND_DISPLAY or tty). The passcode goes from its pipe into secret
/// memory; it never becomes a string. Every pinentry the process runs is
/// ended by ``endAll()`` when the device stops, and none is waited on past
/// its deadline, whether or not it honours SETTIMEOUT (docs/SECRET-SERVICE.md,
/// "Whose an item is").
package final class Pinentry {
    package let pid: pid_t
    /// Our ends of its standard input and output; nil once it is ended.
    private var input: FileDescriptor?
    private var output: FileDescriptor?
    private var buffer: [UInt8] = []
    private var ended = false
    /// When the program is ended whatever it does (nil: never).
    private var deadline: Int64?
    /// Whether whoever the question is for has left: then the program is
    /// ended (looked at every ``abandonCheck`` ms while it is waited on).
    private let abandoned: @Sendable () -> Bool
    private static let abandonCheck: Int64 = 250

    package enum Answer {
        case passcode(SecureBytes)
        case cancelled
    }

    package struct Failure: Error, CustomStringConvertible {
        package let description: String
    }

    /// Debian's pinentry (the alternative `pinentry` points to, curses,
    /// GNOME or Qt as installed): the default judge.
    package static let defaultProgram = "/usr/bin/pinentry"

    /// The program to run, or nil when none is usable: `$KEYCHAINFS_PINENTRY`
    /// only when it is an absolute path that root controls (the file and
    /// every directory above it root's and writable by nobody else, a
    /// sticky directory such as /tmp allowed), else ``defaultProgram``. A
    /// program of the user that set the variable (or `dbus-update-activation-environment`)
    /// before the device started cannot make its own program the judge.
    package static func program() -> String? {
        if let chosen = getenv("KEYCHAINFS_PINENTRY").map({ String(cString: $0) }), !chosen.isEmpty,
            RootControlledFile.isExecutable(chosen)
        {
            return chosen
        }
        return RootControlledFile.isExecutable(defaultProgram) ? defaultProgram : nil
    }

    /// Whether this process's environment names a display a pinentry can
    /// show a window on (X11's `DISPLAY`, Wayland's `WAYLAND_DISPLAY`).
    package static var hasDisplay: Bool {
        let names: [String] = ["DISPLAY", "WAYLAND_DISPLAY"]
        return names.contains { getenv($0).map { $0.pointee != 0 } ?? false }
    }

    /// The pids of every pinentry running now, for ``endAll()``.
    private static let running = Mutex<Set<pid_t>>([])

    /// Ends every pinentry this process started (`keychainfs stop`): a
    /// question nobody will read the answer to must not stay on the screen.
    package static func endAll() {
        for pid in running.withLock({ $0 }) { kill(pid, SIGTERM) }
    }

    /// Starts `program`; it is ended `seconds` after it starts at the
    /// latest, or once `abandoned` says that nobody waits for it. With
    /// `terminal`, it asks there (`OPTION ttyname`, as gpg-agent passes
    /// `GPG_TTY`; pinentry-gnome3 with no display falls back to curses).
    package init(
        program: String, endingAfter seconds: Int? = nil, at terminal: AskerTerminal? = nil,
        unless abandoned: @escaping @Sendable () -> Bool = { false }
    ) throws(Failure) {
        self.abandoned = abandoned
        var toChild: [Int32] = [0, 0], fromChild: [Int32] = [0, 0]
        guard pipe(&toChild) == 0, let childReads = FileDescriptor(toChild[0]), let weWrite = FileDescriptor(toChild[1])
        else { throw Failure(description: "no pipe for pinentry") }
        guard pipe(&fromChild) == 0, let weRead = FileDescriptor(fromChild[0]),
            let childWrites = FileDescriptor(fromChild[1])
        else { throw Failure(description: "no pipe for pinentry") }
        // Close-on-exec: Spawn dup2s the child's ends into place and closes the rest.
        for fd in toChild + fromChild { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        var options = Spawn.Options()
        options.descriptors = [(0, childReads.raw), (1, childWrites.raw)]
        let started = Spawn.start([program], options: options)
        // The child's copies alone: its exit ends our reads.
        _ = childReads.close()
        _ = childWrites.close()
        guard let started else { throw Failure(description: "cannot run \(program)") }
        pid = started
        Self.running.withLock { _ = $0.insert(started) }
        input = .some(consume weWrite)
        output = .some(consume weRead)
        deadline = seconds.map { MonotonicClock.milliseconds() + Int64($0) * 1000 }
        guard let greeting = try? line(), greeting.starts(with: Array("OK".utf8)) else {
            end()
            throw Failure(description: "\(program) does not speak the pinentry protocol")
        }
        if let terminal {
            do throws(Failure) {
                try command("OPTION ttyname=" + terminal.path)
                try command("OPTION ttytype=" + terminal.type)
                // curses draws the question's text (arrows, quotes) as UTF-8; C.UTF-8 is glibc's own, always
                // there (a LANG of the device's that names a locale not generated failed GETPIN).
                try command("OPTION lc-ctype=C.UTF-8")
            } catch {
                end()
                throw error
            }
        }
    }

    deinit { end() }

    /// Asks once; `error` is shown above the field (a wrong passcode before).
    package func ask(description: String, error: String?, prompt: String = "Passcode:") throws(Failure) -> Answer {
        try command("SETTITLE KeychainFS")
        try command("SETDESC " + Self.escaped(description))
        try command("SETPROMPT " + Self.escaped(prompt))
        if let error { try command("SETERROR " + Self.escaped(error)) }
        try send("GETPIN")
        let passcode = SecureBuffer()
        while true {
            var reply = try line()
            if reply.starts(with: Array("D ".utf8)) {
                try Self.unescape(reply.dropFirst(2), into: passcode)
                reply.withUnsafeMutableBufferPointer { wipeMemory(UnsafeMutableRawBufferPointer($0)) }
            } else if reply.starts(with: Array("OK".utf8)) {
                do { return .passcode(try passcode.snapshot()) } catch {
                    throw Failure(description: "no memory for the passcode")
                }
            } else if reply.starts(with: Array("ERR 83886179".utf8)) {
                // GPG_ERR_CANCELED: the person's Cancel, or Escape.
                return .cancelled
            } else if reply.starts(with: Array("ERR".utf8)) {
                // Any other error is the pinentry's own (no terminal, no display): said, not taken for a Cancel.
                let said = String(
                    decoding: reply.dropFirst(4).drop { $0 != UInt8(ascii: " ") }.dropFirst(), as: UTF8.self)
                throw Failure(description: "pinentry: " + said)
            }
        }
    }

    /// The person's answer to a question of three buttons.
    package enum Choice: Equatable {
        case ok, notOK, cancel
    }

    /// Asks a question with three buttons (CONFIRM after SETOK, SETNOTOK
    /// and SETCANCEL; `notOK` nil: two), which curses, GTK and Qt show; no
    /// answer within `timeout` seconds, or any failure, is `cancel`.
    package func confirm(description: String, ok: String, notOK: String?, cancel: String, timeout: Int) -> Choice {
        do throws(Failure) {
            try command("SETTITLE KeychainFS")
            try command("SETDESC " + Self.escaped(description))
            try command("SETOK " + Self.escaped(ok))
            if let notOK { try command("SETNOTOK " + Self.escaped(notOK)) }
            try command("SETCANCEL " + Self.escaped(cancel))
            try command("SETTIMEOUT \(timeout)")
            try send("CONFIRM")
            while true {
                let reply = try line()
                if reply.starts(with: Array("OK".utf8)) { return .ok }
                // GPG_ERR_NOT_CONFIRMED (114, in the pinentry source's
                // 83886194): the "not OK" button; any other error, a
                // cancel, a timeout or a closed window, is cancel.
                if reply.starts(with: Array("ERR 83886194".utf8)) { return .notOK }
                if reply.starts(with: Array("ERR".utf8)) { return .cancel }
            }
        } catch {
            return .cancel
        }
    }

    /// What the program says it is (`GETINFO flavor`: `curses`, `gtk2`,
    /// `qt`, `gnome3`, and `gnome3:curses` when GNOME's falls back to the
    /// terminal); nil when it does not say.
    package func flavor() -> String? {
        guard (try? send("GETINFO flavor")) != nil else { return nil }
        var flavor: String?
        while let reply = try? line() {
            if reply.starts(with: Array("D ".utf8)) {
                flavor = String(decoding: reply.dropFirst(2), as: UTF8.self)
            } else {
                return reply.starts(with: Array("OK".utf8)) ? flavor : nil
            }
        }
        return nil
    }

    /// Whether CONFIRM shows a third button (SETNOTOK). pinentry-gnome3
    /// does not: its gcr prompt has two, and its source leaves the third
    /// option out ("XXX: Add support for the third option"); curses, GTK 2
    /// and Qt draw it. GNOME's falling back to curses draws it too.
    package func drawsThirdButton() -> Bool {
        guard let flavor = flavor() else { return true }
        let parts = flavor.split(separator: ":")
        return parts.first != "gnome3" || parts.dropFirst().contains("curses")
    }

    /// Stops the program from another thread while `ask` waits for the
    /// user (a dismissed prompt, a client gone): `ask` then fails.
    package func cancel() { kill(pid, SIGTERM) }

    /// Ends the program.
    package func end() {
        guard !ended else { return }
        ended = true
        _ = try? send("BYE")
        input = nil
        output = nil
        kill(pid, SIGTERM)
        _ = Spawn.wait(pid)
        Self.running.withLock { _ = $0.remove(pid) }
    }

    private func command(_ text: String) throws(Failure) {
        try send(text)
        guard try line().starts(with: Array("OK".utf8)) else {
            throw Failure(description: "pinentry refused \(text.prefix(8))")
        }
    }

    private func send(_ text: String) throws(Failure) {
        guard let input = input.borrowed, (try? input.writeAll(Array((text + "\n").utf8))) != nil else {
            throw Failure(description: "pinentry went away")
        }
    }

    /// One line of the program's output, without its newline. Lines are
    /// read whole from a buffer that is wiped as it is consumed.
    private func line() throws(Failure) -> [UInt8] {
        while true {
            if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = Array(buffer[..<newline])
                buffer.withUnsafeMutableBytes { wipeMemory(UnsafeMutableRawBufferPointer(rebasing: $0[...newline])) }
                buffer.removeFirst(newline + 1)
                return line
            }
            while true {
                // A pinentry that ignores SETTIMEOUT is not waited on past
                // it, nor once nobody waits for its answer.
                let left = deadline.map { $0 - MonotonicClock.milliseconds() } ?? Int64.max
                guard left > 0 else {
                    kill(pid, SIGTERM)
                    throw Failure(description: "pinentry gave no answer in time")
                }
                var entry = pollfd(fd: output?.raw ?? -1, events: Int16(POLLIN), revents: 0)
                let ready = (try? valueOrErrno({ poll(&entry, 1, Int32(min(left, Self.abandonCheck))) })) ?? 0
                if ready > 0 { break }
                if abandoned() {
                    kill(pid, SIGTERM)
                    throw Failure(description: "nobody waits for the answer any more")
                }
            }
            var chunk = [UInt8](repeating: 0, count: 1024)
            defer { chunk.withUnsafeMutableBytes { wipeMemory($0) } }
            let count =
                (try? valueOrErrno {
                    chunk.withUnsafeMutableBytes { read(output?.raw ?? -1, $0.baseAddress, $0.count) }
                }) ?? -1
            guard count > 0, buffer.count + count <= 64 << 10 else { throw Failure(description: "pinentry went away") }
            buffer += chunk[..<count]
        }
    }

    /// Assuan escapes %, CR and LF in data lines as %XX.
    private static func escaped(_ text: String) -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "%": out += "%25"
            case "\n": out += "%0A"
            case "\r": out += "%0D"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    private static func unescape(_ data: ArraySlice<UInt8>, into passcode: SecureBuffer) throws(Failure) {
        var index = data.startIndex
        while index < data.endIndex {
            var byte = data[index]
            // Decoded by hand: no String may hold a digit of the passcode.
            if byte == UInt8(ascii: "%"), data.endIndex - index >= 3,
                let high = hexValue(data[index + 1]), let low = hexValue(data[index + 2])
            {
                byte = high << 4 | low
                index += 2
            }
            do {
                try withUnsafeBytes(of: byte) { (raw) throws(KeychainError) in try passcode.append(raw) }
            } catch {
                throw Failure(description: "the passcode is too long")
            }
            index += 1
        }
    }

    private static func hexValue(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): digit - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
