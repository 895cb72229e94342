import ArgumentParser
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// `keychainfs desktop enable|disable|status` (docs/SECRET-SERVICE.md, "Running
/// it"): this user's desktop session takes KeychainFS as its Secret Service,
/// and gives it back. Everything it writes is the user's own, marked as ours,
/// and undone by `disable` (which the package runs for each user before it is
/// removed, so that the desktop's own provider answers again).
struct DesktopCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "desktop",
        abstract: "Make KeychainFS this user's desktop Secret Service, or give it back.",
        subcommands: [Enable.self, Disable.self, Status.self])

    struct Enable: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "From the next login, the session bus starts KeychainFS for org.freedesktop.secrets.",
            discussion: """
                Writes the D-Bus activation file (~/.local/share/dbus-1/services), hides gnome-keyring's \
                secrets autostart (~/.config/autostart) and masks its user units; a file of another program \
                found in their place is kept aside and put back by `disable`.
                """)

        func run() throws {
            let files = DesktopFiles()
            for line in try files.enable() { print(line) }
            print(
                "done: from the next login, KeychainFS answers for org.freedesktop.secrets. "
                    + "gnome-keyring's items: `keychainfs import secret-service` while it still runs.")
        }
    }

    struct Disable: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Undo `desktop enable`: the desktop's own Secret Service answers again from the next login.")

        @Flag(help: "Print nothing when there was nothing to undo.")
        var quiet = false

        func run() throws {
            let done = try DesktopFiles().disable()
            if !(quiet && done.isEmpty) {
                for line in done { print(line) }
                print(done.isEmpty ? "nothing to undo: `desktop enable` was not run" : "done")
            }
        }
    }

    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Whether this user's desktop takes KeychainFS.")

        func run() throws {
            for line in DesktopFiles().status() { print(line) }
        }
    }
}

/// The user's files that make a desktop session take a Secret Service,
/// as the XDG base directories name them.
struct DesktopFiles {
    static let marker = "# Written by `keychainfs desktop enable`; `keychainfs desktop disable` removes it."
    static let maskedUnits = ["gnome-keyring-daemon.service", "gnome-keyring-daemon.socket"]
    /// What a file of another program is moved to, for `disable` to put back.
    static let keptSuffix = ".before-keychainfs"

    let activation: String
    let autostart: String
    let units: String
    /// The units `enable` masked (and only those: a mask the user made stays).
    let maskRecord: String

    init() {
        let home = getenv("HOME").map { String(cString: $0) } ?? "/"
        func base(_ variable: String, _ fallback: String) -> String {
            guard let value = getenv(variable).map({ String(cString: $0) }), value.hasPrefix("/") else {
                return home + "/" + fallback
            }
            return value
        }
        let data = base("XDG_DATA_HOME", ".local/share"), config = base("XDG_CONFIG_HOME", ".config")
        activation = data + "/dbus-1/services/org.freedesktop.secrets.service"
        autostart = config + "/autostart/gnome-keyring-secrets.desktop"
        units = config + "/systemd/user"
        maskRecord = config + "/keychainfs/desktop-masked"
    }

    /// The activation file: as the package installs it, marked, running
    /// /usr/bin/keychainfs directly (no shell, no $HOME:
    /// docs/SECRET-SERVICE.md, "The device's judge").
    static let activationText = """
        \(marker)
        [D-BUS Service]
        Name=org.freedesktop.secrets
        Exec=/usr/bin/keychainfs start --foreground --secret-service
        SystemdService=keychainfs-secrets.service

        """

    /// The XDG autostart spec: a user's entry of the same name with
    /// `Hidden=true` keeps the system's from starting.
    static let autostartText = """
        [Desktop Entry]
        \(marker)
        Type=Application
        Name=gnome-keyring's secrets (hidden: KeychainFS is this desktop's Secret Service)
        Hidden=true

        """

    func enable() throws -> [String] {
        var done: [String] = []
        for (path, text) in [(activation, Self.activationText), (autostart, Self.autostartText)] {
            if let existing = TextFile.read(path), !existing.contains(Self.marker) {
                guard rename(path, path + Self.keptSuffix) == 0 else {
                    throw fail("cannot keep \(path) aside: \(Errno.current)")
                }
                done.append("kept aside: \(path) (another program's) as \(path + Self.keptSuffix)")
            }
            if TextFile.read(path) != text {
                try TextFile.write(text, to: path)
                done.append("wrote \(path)")
            }
        }
        var masked = Set(TextFile.read(maskRecord).map { $0.split(separator: "\n").map(String.init) } ?? [])
        try TextFile.makeDirectories(units)
        for unit in Self.maskedUnits {
            let path = units + "/" + unit
            if ProgramIdentities.linkTarget(path) == "/dev/null" { continue }
            var info = stat()
            if lstat(path, &info) == 0 {
                done.append("left as it is: \(path) (a unit of your own; gnome-keyring's \(unit) is not masked)")
                continue
            }
            guard symlink("/dev/null", path) == 0 else { throw fail("cannot mask \(unit): \(Errno.current)") }
            masked.insert(unit)
            done.append("masked \(unit) (\(path) -> /dev/null)")
        }
        try TextFile.write(masked.sorted().map { $0 + "\n" }.joined(), to: maskRecord)
        Self.reloadUserManager()
        return done
    }

    func disable() throws -> [String] {
        var done: [String] = []
        for path in [activation, autostart] {
            if let existing = TextFile.read(path), existing.contains(Self.marker) {
                guard unlink(path) == 0 else { throw fail("cannot remove \(path): \(Errno.current)") }
                done.append("removed \(path)")
            }
            var info = stat()
            if lstat(path, &info) != 0, lstat(path + Self.keptSuffix, &info) == 0 {
                guard rename(path + Self.keptSuffix, path) == 0 else {
                    throw fail("cannot put \(path) back: \(Errno.current)")
                }
                done.append("put back \(path)")
            }
        }
        for unit in (TextFile.read(maskRecord) ?? "").split(separator: "\n").map(String.init)
        where Self.maskedUnits.contains(unit) {
            let path = units + "/" + unit
            if ProgramIdentities.linkTarget(path) == "/dev/null", unlink(path) == 0 { done.append("unmasked \(unit)") }
        }
        unlink(maskRecord)
        if !done.isEmpty { Self.reloadUserManager() }
        return done
    }

    func status() -> [String] {
        let activationState: String
        switch TextFile.read(activation) {
        case let text? where text.contains(Self.marker): activationState = "keychainfs (\(activation))"
        case _?: activationState = "another program's (\(activation))"
        case nil: activationState = "none of yours: the bus starts the system's provider (gnome-keyring, if installed)"
        }
        let hidden = TextFile.read(autostart)?.contains(Self.marker) == true
        let masked = Self.maskedUnits.filter { ProgramIdentities.linkTarget(units + "/" + $0) == "/dev/null" }
        return [
            "activation: " + activationState,
            "gnome-keyring-autostart: " + (hidden ? "hidden (\(autostart))" : "as the system has it"),
            "gnome-keyring-units: "
                + (masked.isEmpty ? "as the system has them" : "masked: " + masked.joined(separator: ", ")),
            "desktop: " + (hidden && TextFile.read(activation)?.contains(Self.marker) == true ? "enabled" : "disabled")
        ]
    }

    /// Tells the user's systemd of the masks, where one runs (nothing otherwise: they apply at its start).
    private static func reloadUserManager() {
        guard access("/usr/bin/systemctl", X_OK) == 0, getenv("XDG_RUNTIME_DIR") != nil else { return }
        var options = Spawn.Options()
        let null = FileDescriptor(open("/dev/null", O_RDWR | O_CLOEXEC))
        if let raw = null.raw { options.descriptors = [(1, raw), (2, raw)] }
        _ = Spawn.run(["/usr/bin/systemctl", "--user", "daemon-reload"], options: options)
        extendLifetime(null)
    }
}
