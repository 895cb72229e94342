import Foundation
import KeychainCore

/// What the tests of whose an item is share (issues 31 and 37): two
/// programs built against libsecret, a session bus with the keychain's
/// device serving it, and a pinentry that answers the person's questions
/// from a file.
extension MountHarness {
    /// app-a and app-b in `$R`: `app store NAME VALUE` stores a password
    /// under the attribute name=NAME (replacing its own), `app lookup NAME`
    /// prints it, or `none`; `app jit ...` does the same with executable
    /// anonymous memory mapped, as a JIT has. The same source built twice:
    /// two executables, two digests.
    package func buildLibsecretApps() throws -> ShellResult {
        try """
        #include <libsecret/secret.h>
        #include <stdio.h>
        #include <string.h>
        #include <sys/mman.h>
        static const SecretSchema schema = {
            "org.example.App", SECRET_SCHEMA_NONE,
            { { "name", SECRET_SCHEMA_ATTRIBUTE_STRING }, { NULL, 0 } } };
        int main(int argc, char **argv) {
            GError *error = NULL;
            if (argc > 1 && strcmp(argv[1], "jit") == 0) {
                /* Code in anonymous memory, as a JIT (or a library hiding its file) has it. */
                if (mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                    == MAP_FAILED) return 3;
                argv++;
                argc--;
            }
            if (argc == 4 && strcmp(argv[1], "store") == 0) {
                secret_password_store_sync(&schema, SECRET_COLLECTION_DEFAULT, "App " APP, argv[3], NULL, &error,
                                           "name", argv[2], NULL);
            } else if (argc == 2 && strcmp(argv[1], "wait") == 0) {
                g_usleep(3 * G_USEC_PER_SEC);
            } else if (argc == 3 && strcmp(argv[1], "lookup") == 0) {
                gchar *password = secret_password_lookup_sync(&schema, NULL, &error, "name", argv[2], NULL);
                printf("%s\\n", password ? password : "none");
                secret_password_free(password);
            } else {
                return 2;
            }
            if (error) { printf("error: %s\\n", error->message); return 1; }
            return 0;
        }
        """.write(toFile: root + "/app.c", atomically: true, encoding: .utf8)
        try user?.own(root + "/app.c")
        return sh(
            """
            for app in a b; do
                gcc -O1 -DAPP="\\"$app\\"" -o "$R/app-$app" "$R/app.c" $(pkg-config --cflags --libs libsecret-1) || exit 1
            done
            """)
    }

    /// Runs `script` on a private session bus with the keychain's device
    /// serving org.freedesktop.secrets, unlocked unless `locked`.
    package func onBus(_ script: String, locked: Bool = false, environment: String = "") -> ShellResult {
        let prelude = """
            export KEYCHAINFS_KEYCHAIN="$KC" \(environment)
            "$K" start --secret-service || exit 99
            trap '"$K" stop' EXIT
            \(locked ? "" : "printf '%s\\n' \"$PASSCODE\" | \"$K\" unlock || exit 98")

            """
        return sh(
            "PASSCODE=\"$2\" dbus-run-session -- sh -c \"$1\" 2> \"$R/bus.err\"; cat \"$R/bus.err\" >&2",
            arguments: [prelude + script, MountHarness.passcode])
    }
}

/// What the tests of whose an item is start from (docs/SECURITY.md,
/// "An application's secrets on every door"): an ordinary user's keychain,
/// the judge that answers for the person, and app-a and app-b built.
package struct OwnerRuleFixture {
    package let harness: MountHarness
    package let judge: JudgePinentry

    package init() throws {
        harness = try MountHarness(as: try OrdinaryUser())
        judge = try JudgePinentry()
        let built = try harness.buildLibsecretApps()
        guard built.succeeded else { throw HarnessError("cannot build the libsecret apps: \(built)") }
    }
}

/// A pinentry that the device takes as its judge: a file root controls
/// (docs/SECRET-SERVICE.md, "The device's judge"), in a directory of its
/// own that goes with this value. Its CONFIRM answers come from the lines
/// of `$R/answers` in turn (`once`: OK, `always`: the not-OK button,
/// anything else or none: cancel); it logs each question to
/// `$R/pinentry.log` and each button it was given to `$R/buttons.log`. It
/// runs as the keychain's user, whose `$R` it writes.
package final class JudgePinentry: @unchecked Sendable {
    package let directory: String
    package var path: String { directory + "/pinentry" }
    /// `KEYCHAINFS_PINENTRY=...`, for a test's environment.
    package var environment: String { "KEYCHAINFS_PINENTRY=\(path)" }

    package init() throws {
        directory = try makeTemporaryDirectory("kcfs-judge", in: "/tmp/")
        chmod(directory, 0o755)
        try Self.script.write(toFile: path, atomically: true, encoding: .utf8)
        chmod(path, 0o755)
    }

    /// The program: CONFIRM answers from `$R/answers`, questions to `$R/pinentry.log`.
    package static let script = """
        #!/bin/sh
        echo "OK Pleased to meet you"
        while read -r command rest; do
            case "$command" in
            SETDESC) echo "$rest" >> "$R/pinentry.log"; echo OK ;;
            SETOK|SETNOTOK|SETCANCEL) echo "$command $rest" >> "$R/buttons.log"; echo OK ;;
            # The flavour a test gives it in $R/flavor (pinentry's GETINFO flavor), none otherwise.
            GETINFO) [ "$rest" = flavor ] && [ -e "$R/flavor" ] && echo "D $(cat "$R/flavor")"; echo OK ;;
            CONFIRM) n=$(( $(cat "$R/confirmed" 2>/dev/null || echo 0) + 1 )); echo $n > "$R/confirmed"
                     case "$(sed -n "${n}p" "$R/answers" 2>/dev/null)" in
                     once) echo OK ;;
                     always) echo "ERR 83886194 Not confirmed <Pinentry>" ;;
                     # A person who never answers, and a pinentry that ignores SETTIMEOUT.
                     hang) echo $$ > "$R/asked"; exec sleep 600 ;;
                     *) echo "ERR 83886179 Operation cancelled <Pinentry>" ;;
                     esac ;;
            BYE) echo OK; exit 0 ;;
            *) echo OK ;;
            esac
        done
        """

    deinit { _ = Spawn.run(["/bin/rm", "-rf", directory]) }

    /// Writes the answers the person will give, in `harness`'s `$R`.
    package static func answer(_ answers: [String], in harness: MountHarness) throws {
        let file = harness.root + "/answers"
        try (answers.joined(separator: "\n") + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        try harness.user?.own(file)
        unlink(harness.root + "/confirmed")
    }
}
