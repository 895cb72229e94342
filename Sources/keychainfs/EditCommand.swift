import ArgumentParser
import KeychainCore
import KeychainProtocol
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

struct EditCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "edit",
        abstract: "Edit an item's value in $VISUAL or $EDITOR (vi), on a private file in locked memory.",
        discussion: """
            The value is put in a directory only you can open, held in this command's locked \
            memory (a FUSE mount of its own in your runtime directory: never on a disk, in swap or \
            in the page cache), as a file named after the identifier. The editor must wait until \
            you are done (gvim -f, code --wait). When it exits 0 with changed contents the value \
            is replaced (created if absent and not left empty); then everything is wiped and unmounted. One final \
            newline that the editor added is dropped, unless the value ended with one before. If \
            the item changed while you edited, it is kept, and your edit is saved beside it as \
            IDENTIFIER~edit.
            """)

    @Argument(help: "The item, as GROUP/IDENTIFIER.", completion: NameCompletion.items, transform: ItemAddress.parsed)
    var item: ItemAddress

    @OptionGroup var options: KeychainOptions

    func run() throws {
        let device = try RunningDevice(options.place)
        let original = try device.valueIfPresent(of: item)
        let directory = try Self.scratchPath()
        defer { rmdir(directory) }
        let scratch: ScratchDirectory
        let start = try original ?? SecureBytes([])
        // The scratch directory is flat: an item in a folder (`work/imap`) is edited as its last part.
        let file = item.identifier.split(separator: "/").last.map(String.init) ?? item.identifier
        do {
            scratch = try ScratchDirectory(at: directory, file: file, value: start)
        } catch {
            throw fail(error.description)
        }
        let (status, edited) = Self.whileSignalsWait {
            defer { scratch.close() }
            let status = Self.runEditor(on: directory + "/" + file)
            return (status, status == 0 ? try? scratch.value(of: file) : nil)
        }
        guard status == 0 else {
            throw fail(
                status < 0
                    ? "the editor could not run or was killed; \(item) is unchanged"
                    : "the editor exited with status \(status); \(item) is unchanged")
        }
        guard var value = edited else { throw fail("the editor left no file \(file); \(item) is unchanged") }
        value = try Self.droppingAddedNewline(value, original: original)
        // Nothing to save: unchanged, or a new item left empty (as `git commit` with an empty message).
        if let original, original == value { return }
        if original == nil && value.count == 0 {
            throw fail("the file was left empty; \(item) was not created")
        }
        // Replace only what was read: a change made meanwhile is kept.
        guard try device.valueIfPresent(of: item) == original else {
            let aside = ItemAddress(group: item.group, identifier: item.identifier + "~edit")
            try device.store(value, at: aside, condition: .ifAbsent)
            throw fail("\(item) changed while you edited it and was kept; your edit is in \(aside)")
        }
        try device.store(value, at: item, condition: original == nil ? .ifAbsent : .ifPresent)
    }

    /// A new private directory in the runtime directory; scratch
    /// directories that a killed edit left behind are cleared first.
    private static func scratchPath() throws -> String {
        let runtime: String
        do { runtime = try RuntimePaths.runtimeDirectory() } catch { throw fail(error.description) }
        if let entries = opendir(runtime) {
            defer { closedir(entries) }
            while let entry = readdir(entries) {
                let name = entry.name
                guard name.hasPrefix("edit.") else { continue }
                let path = runtime + "/" + name
                if MountTable.isDeadMount(path) { _ = MountTable.unmount(path, lazy: true) }
                rmdir(path)  // fails (EBUSY) for the live mount of another edit
            }
        }
        var template = Array((runtime + "/edit.XXXXXX").utf8CString)
        guard template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) != nil else {
            throw fail("cannot create a directory in \(runtime): \(Errno.current.description)")
        }
        return String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// `$VISUAL`, `$EDITOR` or vi, through the shell as git runs it (the
    /// variable may hold arguments); its exit status, -1 if it could not run.
    private static func runEditor(on path: String) -> Int32 {
        var editor = "vi"
        for name in ["EDITOR", "VISUAL"] {
            if let value = getenv(name), value.pointee != 0 { editor = String(cString: value) }
        }
        return Spawn.run(["/bin/sh", "-c", editor + " \"$1\"", editor, path])
    }

    /// Runs `body` with the signals that end a terminal program blocked
    /// (they reach the editor, not us), so that the scratch directory is
    /// always unmounted and wiped; one that came meanwhile acts afterwards.
    private static func whileSignalsWait<R>(_ body: () -> R) -> R {
        var ending = sigset_t(), previous = sigset_t()
        sigemptyset(&ending)
        for signal in [SIGINT, SIGQUIT, SIGTERM, SIGHUP] { sigaddset(&ending, signal) }
        pthread_sigmask(SIG_BLOCK, &ending, &previous)
        defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
        return body()
    }

    /// Editors end a file with a newline: one they added to a value that
    /// had none is not part of the secret.
    private static func droppingAddedNewline(_ value: SecureBytes, original: SecureBytes?) throws -> SecureBytes {
        let endsWithNewline = { (bytes: SecureBytes) in bytes.withUnsafeBytes { $0.last == UInt8(ascii: "\n") } }
        guard endsWithNewline(value), !(original.map(endsWithNewline) ?? false) else { return value }
        return try value.withUnsafeBytes { try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0.dropLast())) }
    }
}
