import Foundation
import Testing
import TestSupport

extension SerialTests {
    /// docs/SECRET-SERVICE.md, "Sandboxed apps": a Flatpak app is its app id,
    /// read from the `/.flatpak-info` of its sandbox, and its items are its
    /// own; the Secret portal's backend gives each app a master secret of its
    /// own. Each sandbox is bubblewrap's, as flatpak makes one: a user
    /// namespace, a `/.flatpak-info`, and no host program in it (only the
    /// app and the libraries it loads).
    @Suite struct SandboxedAppTests {
        let harness: MountHarness
        let judge: JudgePinentry

        init() throws {
            let fixture = try OwnerRuleFixture()
            (harness, judge) = (fixture.harness, fixture.judge)
        }

        /// `sandbox APP-ID PROGRAM ARGS...` runs PROGRAM as /app/bin/app in a
        /// sandbox of the app APP-ID, with the session bus's socket, a data
        /// directory of the app's own (`$R/data-APP-ID`, its
        /// XDG_DATA_HOME), and `SANDBOX_BIND` (more bwrap arguments);
        /// `SANDBOX_RUN` runs another program of the sandbox in its place.
        static let sandbox = """
            sandbox() {
                id=$1 program=$2; shift 2
                mkdir -p "$R/data-$id"
                printf '[Application]\\nname=%s\\nruntime=runtime/org.example.Platform/x86_64/1\\n' "$id" > "$R/info-$id"
                libraries=""
                for library in $(ldd "$program" | awk '$2 == "=>" && $3 ~ /^\\// { print $3 } $1 ~ /^\\// { print $1 }'); do
                    libraries="$libraries --ro-bind $library $library"
                done
                bus=${DBUS_SESSION_BUS_ADDRESS#unix:path=}; bus=${bus%%,*}
                bwrap --unshare-user --unshare-pid --unshare-ipc --die-with-parent --dev /dev --proc /proc \\
                    --tmpfs /tmp --ro-bind "$R/info-$id" /.flatpak-info --ro-bind "$program" /app/bin/app \\
                    --bind "$bus" "$bus" --bind "$R/data-$id" /data --setenv XDG_DATA_HOME /data --setenv HOME /data \\
                    $libraries $SANDBOX_BIND ${SANDBOX_RUN:-/app/bin/app} "$@"
            }

            """

        /// app-a made its item in the sandbox of org.example.Mail: the same
        /// app, another build (app-b) in another sandbox of it, reads it
        /// unasked; another app's sandbox, the same app-a outside any
        /// sandbox, and `keychainfs get` are asked (the person denies).
        /// A nested namespace inside another app's sandbox, where that app
        /// mounts a `/.flatpak-info` of its own naming the mail app, is
        /// nobody's (bubblewrap lets a sandbox make namespaces; flatpak's
        /// seccomp filter does not, and this holds without it).
        @Test func aFlatpakAppsItemsAreItsOwnAndEveryOtherProgramIsAsked() throws {
            let nester = harness.sh(
                "cat > \"$R/nest.c\" && gcc -static -O1 -Wall -o \"$R/nest\" \"$R/nest.c\"",
                stdin: """
                    #define _GNU_SOURCE
                    #include <fcntl.h>
                    #include <sched.h>
                    #include <stdio.h>
                    #include <sys/mount.h>
                    #include <unistd.h>
                    /* nest APP-ID PROGRAM ARGS...: PROGRAM in a user and mount namespace made inside the
                       sandbox, where a /.flatpak-info naming APP-ID covers the sandbox's own. */
                    static void put(const char *path, const char *text) {
                        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
                        if (fd >= 0) { dprintf(fd, "%s", text); close(fd); }
                    }
                    int main(int argc, char **argv) {
                        char map[64], info[512];
                        unsigned uid = getuid(), gid = getgid();
                        if (argc < 3 || unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) { perror("unshare"); return 2; }
                        snprintf(map, sizeof map, "%u %u 1", uid, uid); put("/proc/self/uid_map", map);
                        put("/proc/self/setgroups", "deny");
                        snprintf(map, sizeof map, "%u %u 1", gid, gid); put("/proc/self/gid_map", map);
                        mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
                        snprintf(info, sizeof info, "[Application]\\nname=%s\\n", argv[1]);
                        put("/tmp/info", info);
                        if (mount("/tmp/info", "/.flatpak-info", NULL, MS_BIND, NULL) != 0) { perror("mount"); return 3; }
                        execv(argv[2], argv + 2);
                        return 127;
                    }
                    """)
            #expect(nester.succeeded, "\(nester)")
            try JudgePinentry.answer([], in: harness)
            let used = harness.onBus(
                Self.sandbox + """
                    # No Secret portal here (libsecret in a sandbox uses it when there is one): the bus itself.
                    dbus-update-activation-environment XDG_DESKTOP_PORTAL_DIR=/nonexistent
                    sandbox org.example.Mail "$R/app-a" store mail hunter2
                    echo "same app, another build: $(sandbox org.example.Mail "$R/app-b" lookup mail)"
                    echo "another app: $(sandbox org.example.Evil "$R/app-a" lookup mail)"
                    echo "outside any sandbox: $("$R/app-a" lookup mail)"
                    "$K" get "default/App a" > /dev/null 2>&1; echo "keychainfs get: $?"
                    echo "forged inside a sandbox: $(SANDBOX_BIND="--ro-bind $R/nest /app/bin/nest" SANDBOX_RUN=/app/bin/nest \\
                        sandbox org.example.Evil "$R/app-a" org.example.Mail /app/bin/app lookup mail 2>&1)"
                    "$K" acl "default/App a"
                    """, environment: judge.environment)
            #expect(
                used.stdout.hasPrefix(
                    """
                    same app, another build: hunter2
                    another app: none
                    outside any sandbox: none
                    keychainfs get: 4

                    """), "\(used)")
            #expect(used.stdout.contains("forged inside a sandbox: none\n"), "\(used)")
            #expect(used.stdout.contains("owner: the Flatpak app org.example.Mail\n"), "\(used)")
            let questions = try String(contentsOfFile: harness.root + "/pinentry.log", encoding: .utf8)
                .split(separator: "\n")
            #expect(
                questions.first?.hasPrefix("the Flatpak app org.example.Evil wants to read") == true, "\(questions)")
            #expect(
                questions.allSatisfy { $0.contains("which belongs to the Flatpak app org.example.Mail") },
                "\(questions)")
        }

        /// Debian's xdg-desktop-portal, on the session bus, asks the backend
        /// for the master secret of the sandboxed app that called
        /// RetrieveSecret; libsecret in the sandbox keeps the app's
        /// passwords in a file of its own with it. Another app that copies
        /// that file has another secret and reads nothing; the master
        /// secret is an item the app owns (`keychainfs get` is asked); a
        /// program that calls the backend itself, naming the app, is refused.
        @Test func thePortalGivesEachSandboxedAppAMasterSecretOfItsOwn() throws {
            try JudgePinentry.answer([], in: harness)
            let portals = harness.root + "/portals"
            try FileManager.default.createDirectory(atPath: portals, withIntermediateDirectories: true)
            _ = try FileManager.default.copyItem(
                atPath: MachineFixtures.repository + "/scripts/xdg-desktop-portal/keychainfs.portal",
                toPath: portals + "/keychainfs.portal")
            let used = harness.onBus(
                Self.sandbox + """
                    XDG_DESKTOP_PORTAL_DIR="$R/portals" XDG_CURRENT_DESKTOP=keychainfs \\
                        /usr/libexec/xdg-desktop-portal > "$R/portal.log" 2>&1 &
                    portal=$!
                    trap 'kill $portal; "$K" stop' EXIT
                    gdbus wait --session --timeout 20 org.freedesktop.portal.Desktop || echo "no portal"
                    sandbox org.example.Mail "$R/app-a" store mail hunter2
                    echo "the app: $(sandbox org.example.Mail "$R/app-a" lookup mail)"
                    ls "$R/data-org.example.Mail/keyrings"
                    mkdir -p "$R/data-org.example.Evil/keyrings"
                    cp "$R/data-org.example.Mail/keyrings/default.keyring" "$R/data-org.example.Evil/keyrings/"
                    echo "another app with its file: $(sandbox org.example.Evil "$R/app-a" lookup mail 2>&1)"
                    "$K" ls portal
                    "$K" get portal/org.example.Mail > /dev/null 2>&1; echo "keychainfs get: $?"
                    python3 -c '
                    import os
                    from jeepney import DBusAddress, MessageType, new_method_call
                    from jeepney.io.blocking import open_dbus_connection
                    bus = open_dbus_connection("SESSION", enable_fds=True)
                    read, write = os.pipe()
                    backend = DBusAddress("/org/freedesktop/portal/desktop", bus_name="org.freedesktop.secrets",
                                          interface="org.freedesktop.impl.portal.Secret")
                    reply = bus.send_and_get_reply(
                        new_method_call(backend, "RetrieveSecret", "osha{sv}", ("/r", "org.example.Mail", write, {})))
                    os.close(write)
                    print("refused" if reply.header.message_type == MessageType.error else "answered",
                          len(os.read(read, 128)))'
                    """, environment: judge.environment)
            #expect(
                used.stdout.hasPrefix(
                    """
                    the app: hunter2
                    default.keyring

                    """), "\(used)")
            #expect(!used.stdout.contains("another app with its file: hunter2"), "\(used)")
            #expect(used.stdout.contains("\norg.example.Evil\norg.example.Mail\n"), "\(used)")
            #expect(used.stdout.hasSuffix("keychainfs get: 4\nrefused 0\n"), "\(used)")
        }
    }
}
