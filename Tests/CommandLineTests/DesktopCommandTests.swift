import Foundation
import Testing
import TestSupport

extension SerialTests {
    /// `keychainfs desktop enable|disable|status`, as an ordinary user in a
    /// home of the test's own (docs/INSTALL.md, "What the package holds").
    /// What `enable` writes is the user's, marked as KeychainFS's; a file of
    /// another program found in its place is kept aside and put back;
    /// `disable` leaves the home as it was. (PackageTests runs it with the
    /// installed package, and the session bus starting the provider.)
    @Suite struct DesktopCommandTests {
        @Test func enableWritesTheUsersFilesAndDisablePutsTheHomeBack() throws {
            let harness = try MountHarness(as: try OrdinaryUser())
            let used = harness.sh(
                """
                export HOME="$R/home"; unset XDG_DATA_HOME XDG_CONFIG_HOME
                services="$HOME/.local/share/dbus-1/services"
                mkdir -p "$services" && printf '[D-BUS Service]\\nName=org.freedesktop.secrets\\nExec=/usr/bin/other\\n' > "$services/org.freedesktop.secrets.service"
                (cd "$HOME" && find . | sort | xargs -I{} sh -c 'printf "%s " {}; [ -f {} ] && sha256sum < {} | cut -c1-8 || echo') > "$R/before"
                "$K" desktop status
                echo "-- enable"; "$K" desktop enable | sed "s|$HOME|~|g"; echo "status $?"
                "$K" desktop enable > /dev/null; echo "again $?"
                "$K" desktop status | sed "s|$HOME|~|g"
                grep -c 'Exec=/usr/bin/keychainfs start --foreground --secret-service' "$services/org.freedesktop.secrets.service"
                grep -c '^Hidden=true' "$HOME/.config/autostart/gnome-keyring-secrets.desktop"
                echo "-- disable"; "$K" desktop disable | sed "s|$HOME|~|g"
                "$K" desktop disable --quiet; echo "quiet again $?"
                (cd "$HOME" && find . | sort | xargs -I{} sh -c 'printf "%s " {}; [ -f {} ] && sha256sum < {} | cut -c1-8 || echo') > "$R/after"
                diff "$R/before" "$R/after" && echo "the home is as it was"
                """)
            let lines = used.stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
            #expect(
                Array(lines.prefix(4)) == [
                    "activation: another program's (\(harness.root)/home/.local/share/dbus-1/services/org.freedesktop.secrets.service)",
                    "gnome-keyring-autostart: as the system has it", "gnome-keyring-units: as the system has them",
                    "desktop: disabled"
                ], "\(used)")
            for expected in [
                "kept aside: ~/.local/share/dbus-1/services/org.freedesktop.secrets.service (another program's) as ~/.local/share/dbus-1/services/org.freedesktop.secrets.service.before-keychainfs",
                "wrote ~/.local/share/dbus-1/services/org.freedesktop.secrets.service",
                "wrote ~/.config/autostart/gnome-keyring-secrets.desktop",
                "masked gnome-keyring-daemon.service (~/.config/systemd/user/gnome-keyring-daemon.service -> /dev/null)",
                "masked gnome-keyring-daemon.socket (~/.config/systemd/user/gnome-keyring-daemon.socket -> /dev/null)",
                "status 0", "again 0",
                "activation: keychainfs (~/.local/share/dbus-1/services/org.freedesktop.secrets.service)",
                "gnome-keyring-autostart: hidden (~/.config/autostart/gnome-keyring-secrets.desktop)",
                "gnome-keyring-units: masked: gnome-keyring-daemon.service, gnome-keyring-daemon.socket",
                "desktop: enabled",
                "removed ~/.local/share/dbus-1/services/org.freedesktop.secrets.service",
                "put back ~/.local/share/dbus-1/services/org.freedesktop.secrets.service",
                "removed ~/.config/autostart/gnome-keyring-secrets.desktop",
                "unmasked gnome-keyring-daemon.service", "unmasked gnome-keyring-daemon.socket", "done",
                "quiet again 0"
            ] {
                #expect(lines.contains(expected), "\(expected)\n\(used)")
            }
            #expect(lines.filter { $0 == "1" }.count == 2, "\(used)")
            // Empty directories `enable` made may stay; every file is as it was.
            let kept = try String(contentsOfFile: harness.root + "/before", encoding: .utf8).split(separator: "\n")
            let now = try String(contentsOfFile: harness.root + "/after", encoding: .utf8).split(separator: "\n")
            #expect(
                kept.filter { $0.contains(" ") && !$0.hasSuffix(" ") }
                    == now.filter { $0.contains(" ") && !$0.hasSuffix(" ") })
        }
    }
}
