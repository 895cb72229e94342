import ArgumentParser
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// The desktop session's clipboard, through the tool its display server
/// offers: `wl-copy`/`wl-paste` on Wayland, `xclip` on X11 (as pass does).
/// The value reaches the tool on a pipe, never in its arguments.
struct Clipboard {
    let copyCommand: [String]
    let pasteCommand: [String]

    /// Seconds before a copied value is cleared: `$KEYCHAINFS_CLIP_TIME`, else 45 (pass's default).
    static var clearSeconds: Int {
        getenv("KEYCHAINFS_CLIP_TIME").flatMap { Int(String(cString: $0)) }.flatMap { $0 > 0 ? $0 : nil } ?? 45
    }

    /// The session's clipboard; fails saying what is missing.
    static func current() throws -> Clipboard {
        if let display = getenv("WAYLAND_DISPLAY"), display.pointee != 0 {
            guard let copy = findOnPath("wl-copy"), let paste = findOnPath("wl-paste") else {
                throw fail("--clip on Wayland needs wl-copy and wl-paste (Debian's wl-clipboard)")
            }
            return Clipboard(copyCommand: [copy], pasteCommand: [paste, "--no-newline"])
        }
        if let display = getenv("DISPLAY"), display.pointee != 0 {
            guard let xclip = findOnPath("xclip") else { throw fail("--clip on X11 needs xclip (Debian's xclip)") }
            return Clipboard(
                copyCommand: [xclip, "-selection", "clipboard", "-in"],
                pasteCommand: [xclip, "-selection", "clipboard", "-out"])
        }
        throw fail("--clip needs a desktop session: neither $WAYLAND_DISPLAY nor $DISPLAY is set")
    }

    /// Puts `value` on the clipboard. The tool stays behind (xclip and wl-copy
    /// fork to serve the selection) with its streams on /dev/null, so that it
    /// holds no pipe of whoever ran us.
    func copy(_ value: UnsafeRawBufferPointer) -> Bool {
        guard let piped = startWithPipe(copyCommand, on: 0) else { return false }
        let written = (try? piped.end.borrowed.writeAll(value)) != nil
        let child = piped.pid
        _ = piped.end.close()  // the tool reads to the end before it serves the selection
        return Spawn.wait(child) == 0 && written
    }

    /// What the clipboard holds now (at most 1 MiB), in secret memory; nil if it cannot be read.
    func paste() -> SecureBytes? {
        guard let piped = startWithPipe(pasteCommand, on: 1) else { return nil }
        let pasted = try? readSecret(from: piped.end.borrowed)
        let child = piped.pid
        // Closed before the wait: a tool with more than 1 MiB left to write
        // gets EPIPE and ends, rather than blocking on a pipe nobody reads.
        _ = piped.end.close()
        return Spawn.wait(child) == 0 ? pasted : nil
    }

    /// Copies `value` and leaves a process that clears the clipboard after
    /// ``clearSeconds`` unless it changed meanwhile (`keychainfs
    /// clipboard-clear`, detached: it outlives us, as pass's does).
    func copyAndClearLater(_ value: SecureBytes, what: String) throws {
        guard value.withUnsafeBytes({ copy($0) }) else {
            throw fail("could not copy \(what) to the clipboard (\(copyCommand[0]) failed)")
        }
        // The clearer compares what the clipboard holds with the value it gets on
        // this pipe; in a session of its own, a closing terminal does not end it.
        var handed = false
        if let clearer = startWithPipe(
            [selfExecutable(), "clipboard-clear", "--after", String(Self.clearSeconds)], on: 0, newSession: true)
        {
            handed = value.withUnsafeBytes { (try? clearer.end.borrowed.writeAll($0)) != nil }
        }
        guard handed else {
            throw fail("copied \(what), but could not start the clearer: clear the clipboard yourself")
        }
        printError("Copied \(what) to the clipboard. It will be cleared in \(Self.clearSeconds) seconds.")
    }
}

/// Starts `command` with its descriptor `childFD` (0 or 1) on a pipe and the
/// other standard streams on /dev/null (stderr ours with `keepingStandardError`);
/// returns it and our end of the pipe.
func startWithPipe(
    _ command: [String], on childFD: Int32, newSession: Bool = false,
    keepingStandardError: Bool = false
) -> PipedChild? {
    var ends: [Int32] = [0, 0]
    guard pipe(&ends) == 0, let reading = FileDescriptor(ends[0]), let writing = FileDescriptor(ends[1]) else {
        return nil
    }
    var options = Spawn.Options()
    options.nullStandardStreams = true
    options.newSession = newSession
    options.descriptors = [(childFD, childFD == 0 ? reading.raw : writing.raw)] + (keepingStandardError ? [(2, 2)] : [])
    guard let child = Spawn.start(command, options: options) else { return nil }
    // The child's end is closed here (it has its copy), ours handed back.
    if childFD == 0 {
        _ = reading.close()
        return PipedChild(pid: child, end: writing)
    }
    _ = writing.close()
    return PipedChild(pid: child, end: reading)
}

/// A child started by ``startWithPipe(_:on:newSession:keepingStandardError:)``
/// and our end of its pipe (closed with this value).
struct PipedChild: ~Copyable {
    let pid: pid_t
    let end: FileDescriptor
}

/// `keychainfs clipboard-clear --after N`, started by `--clip`: reads the
/// copied value from standard input, waits, and empties the clipboard if it
/// still holds that value (another copy since then is the user's, and stays).
struct ClipboardClearCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "clipboard-clear", abstract: "Clear the clipboard later (started by --clip).", shouldDisplay: false
    )

    @Option(help: "Seconds to wait.")
    var after: Int

    func run() throws {
        let clipboard = try Clipboard.current()
        guard let copied = try? readSecret(from: .standardInput) else { return }
        // The deadline on the monotonic clock, absolute: a signal that
        // interrupts the wait resumes it without drifting.
        var deadline = timespec()
        clock_gettime(CLOCK_MONOTONIC, &deadline)
        deadline.tv_sec += after
        while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, nil) == EINTR {}
        guard let now = clipboard.paste(), now.withUnsafeBytes({ copied.constantTimeEquals($0) }) else { return }
        _ = clipboard.copy(UnsafeRawBufferPointer(start: nil, count: 0))
    }
}

/// The absolute path of `program` on $PATH, as a shell would find it.
func findOnPath(_ program: String) -> String? {
    let path = getenv("PATH").map { String(cString: $0) } ?? "/usr/local/bin:/usr/bin:/bin"
    return path.split(separator: ":").map { "\($0)/\(program)" }.first { access($0, X_OK) == 0 }
}
