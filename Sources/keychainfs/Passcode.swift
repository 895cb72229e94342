import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// Reads passcodes from the terminal without echo, or one line of standard
/// input when it is not a terminal; never from argv (docs/SECURITY.md, "Plaintext hygiene"). The bytes go
/// straight into secret memory.
enum Passcode {
    static let maximumLength = 1024
    /// iOS asks for four digits at least; a shorter passcode falls to the
    /// first guesses of anyone who tries.
    static let minimumLength = 4

    /// A new passcode (or backup password): read, then read again to
    /// confirm, from a terminal or as the next line of standard input alike,
    /// so that a typo never locks the user out of their own keychain.
    /// Throws with `missing` when none is given, when it is shorter than
    /// ``minimumLength``, and when the two differ.
    static func readNew(prompt: String, missing: String) throws -> SecureBytes {
        guard let first = read(prompt: prompt), first.count > 0 else { throw fail(missing) }
        guard first.count >= minimumLength else {
            throw fail("a passcode or password has at least \(minimumLength) characters; nothing was changed")
        }
        let noun = prompt.lowercased().contains("password") ? "password" : "passcode"
        guard let again = read(prompt: "Repeat the \(noun): ") else {
            throw fail("it was not confirmed: give it twice (a second line on standard input); nothing was changed")
        }
        guard again == first else { throw fail("the two differ; nothing was changed") }
        return first
    }

    /// Reads one passcode; nil at end of input with nothing read.
    static func read(prompt: String) -> SecureBytes? {
        let terminal = isatty(0) == 1
        var saved = termios()
        if terminal {
            // Echo off first, then the prompt (as readpassphrase(3)): the
            // flush drops only what was typed before the prompt appeared.
            // Prompting first lost an answer typed at once (a test's pty
            // driver, a fast typist) and the read then waited forever.
            tcgetattr(0, &saved)
            // Ctrl-C (or a hang-up, a kill) at the prompt ends the command:
            // the terminal gets its echo back first (as readpassphrase(3) does).
            terminalToRestore = saved
            for signal in Self.endingSignals { Glibc.signal(signal, restoreTerminalAndEnd) }
            var quiet = saved
            quiet.c_lflag &= ~tcflag_t(ECHO)
            tcsetattr(0, TCSAFLUSH, &quiet)
            printError(prompt)
        }
        defer {
            if terminal {
                // Without a flush: the next answer may already be typed.
                tcsetattr(0, TCSANOW, &saved)
                for signal in Self.endingSignals { Glibc.signal(signal, SIG_DFL) }
                printError("")
            }
        }
        let buffer = SecureBuffer()
        var byte: UInt8 = 0
        var sawAnything = false
        while buffer.count < maximumLength {
            guard
                let count = try? withUnsafeMutableBytes(
                    of: &byte, { (raw) throws(Errno) in try BorrowedDescriptor.standardInput.read(into: raw) }),
                count > 0
            else { break }
            sawAnything = true
            if byte == UInt8(ascii: "\n") { break }
            try? withUnsafeBytes(of: &byte) { try buffer.append($0) }
        }
        byte = 0
        guard sawAnything else { return nil }
        if buffer.count > 0 {
            // A line ending in CR LF (pasted from elsewhere): drop the CR.
            let last = buffer.withBytes(from: buffer.count - 1, length: 1) { $0.first }
            if last == UInt8(ascii: "\r") { try? buffer.resize(to: buffer.count - 1) }
        }
        return try? buffer.snapshot()
    }

    /// The signals that end a command at its prompt.
    static let endingSignals = [SIGINT, SIGTERM, SIGHUP, SIGQUIT]
}

/// The terminal's settings from before a passcode prompt turned its echo off.
nonisolated(unsafe) private var terminalToRestore = termios()

/// Puts the terminal's echo back, then ends the command by the signal that
/// came, as it would have ended: tcsetattr(3) and raise(3) are
/// async-signal-safe (signal-safety(7)).
private func restoreTerminalAndEnd(_ signal: Int32) {
    tcsetattr(0, TCSANOW, &terminalToRestore)
    Glibc.signal(signal, SIG_DFL)
    raise(signal)
}
