import ArgumentParser
import KeychainCore
import KeychainProtocol
#if canImport(Glibc)
import Glibc
#endif

/// `--keychain DIR`, shared by the commands that open a keychain.
struct KeychainOptions: ParsableArguments {
    @Option(
        name: .long,
        help: "Use the keychain in this directory (default: $KEYCHAINFS_KEYCHAIN, else $XDG_DATA_HOME/keychainfs).")
    var keychain: String?

    /// The keychain directory, made absolute so a detached device finds it
    /// too. `KEYCHAINFS_KEYCHAIN` is for the helpers git and docker run,
    /// which cannot pass options (docker), and for services.
    var directory: KeychainDirectory { Self.directory(named: keychain) }

    static func directory(named keychain: String?) -> KeychainDirectory {
        guard let path = keychain ?? getenv("KEYCHAINFS_KEYCHAIN").map({ String(cString: $0) }), !path.isEmpty else {
            return .defaultLocation()
        }
        return KeychainDirectory(path: absolutePath(path))
    }
}

extension KeychainOptions {
    /// The service, when one is installed and no keychain directory was
    /// named (`--keychain`, `$KEYCHAINFS_KEYCHAIN`); this user's own
    /// keychain directory otherwise.
    var place: KeychainPlace { Self.place(named: keychain) }

    static func place(named keychain: String?) -> KeychainPlace {
        let named = keychain ?? getenv("KEYCHAINFS_KEYCHAIN").map { String(cString: $0) }
        if named?.isEmpty ?? true, let socketPath = ServicePaths.socket() { return .service(socketPath: socketPath) }
        return .directory(directory(named: keychain))
    }
}

/// The command line's view of a keychain directory: failures become the
/// command's message and exit status.
extension KeychainDirectory {
    /// Fails the command unless a keychain exists here.
    func requireExisting() throws {
        guard exists else { throw fail("no keychain at \(path); create one with `keychainfs init`") }
    }

    /// The socket of this keychain's device (``RuntimePaths``); fails the
    /// command when the runtime directory cannot hold it.
    func deviceSocketPath() throws -> String {
        try keychainSocketPath(path)
    }
}

/// The device socket of the keychain at `path`, or the command's failure.
func keychainSocketPath(_ path: String) throws -> String {
    do {
        return try RuntimePaths.socketPath(for: path)
    } catch {
        throw fail(error.description)
    }
}

/// `path` made absolute against the working directory, without resolving
/// its last component (which may be a dead mount that cannot be entered).
func absolutePath(_ path: String) -> String {
    // Already absolute and normal, as scripts and the environment name it:
    // as it is, without the generic splitting below, which `get`'s start
    // pays for.
    if isNormalAbsolute(path) { return path }
    var components = path.hasPrefix("/") ? [] : currentDirectory().split(separator: "/").map(String.init)
    for part in path.split(separator: "/").map(String.init) {
        switch part {
        case ".": continue
        case "..": if !components.isEmpty { components.removeLast() }
        default: components.append(part)
        }
    }
    return "/" + components.joined(separator: "/")
}

/// Whether `path` starts with a slash and every component after it is a
/// name: none empty (no `//`, no trailing slash), `.` or `..`. Read byte by
/// byte: String's `contains` of a string is generic (a searcher whose types
/// the runtime instantiates and checks conformances for at first use), and
/// was a third of a `get`'s instructions (docs/BENCHMARKS.md).
func isNormalAbsolute(_ path: String) -> Bool {
    var bytes = path.utf8.makeIterator()
    guard bytes.next() == UInt8(ascii: "/") else { return false }
    var length = 0, dots = 0
    while true {
        let byte = bytes.next()
        if byte == nil || byte == UInt8(ascii: "/") {
            // A component ends: empty, `.` and `..` are not names.
            if length == 0 || dots == length && length <= 2 { return false }
            if byte == nil { return true }
            length = 0
            dots = 0
        } else {
            length += 1
            if byte == UInt8(ascii: ".") { dots += 1 }
        }
    }
}

private func currentDirectory() -> String {
    var buffer = [CChar](repeating: 0, count: Int(PATH_MAX))
    guard getcwd(&buffer, buffer.count) != nil else { return "/" }
    return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// The canonical path of a mount point (symlinks resolved in its parent),
/// as the kernel's mount table and the device process name it.
func canonicalMountPoint(_ path: String) -> String {
    let absolute = absolutePath(path)
    let slash = absolute.lastIndex(of: "/")!
    let parent = slash == absolute.startIndex ? "/" : String(absolute[..<slash])
    let name = String(absolute[absolute.index(after: slash)...])
    guard let resolved = realpath(parent, nil) else { return absolute }
    defer { free(resolved) }
    let base = String(cString: resolved)
    return name.isEmpty ? base : (base == "/" ? "/" : base + "/") + name
}

/// A `--group` value that is no valid access group name is refused before
/// anything runs.
func validateGroupName(_ group: String?) throws {
    if let group, (try? ItemLimits.validate(name: group)) == nil {
        throw ValidationError("'\(group)' is not a valid access group name.")
    }
}
