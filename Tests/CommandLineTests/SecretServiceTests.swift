import Foundation
import KeychainCore
import Testing
import TestSupport

/// The Secret Service on the session bus (issue 23), through real clients
/// under `dbus-run-session`: libsecret's `secret-tool`, Python's
/// `secretstorage` (Debian's, so /usr/bin/python3), `busctl`. The device
/// runs inside the test's bus session and stops with it.
@Suite struct SecretServiceTests {
    let harness: MountHarness

    init() throws {
        harness = try MountHarness()
    }

    /// Runs `script` on a private session bus with the keychain's device
    /// serving org.freedesktop.secrets, unlocked unless `locked`.
    func onBus(_ script: String, locked: Bool = false) -> ShellResult {
        let prelude = """
            export KEYCHAINFS_KEYCHAIN="$KC"
            "$K" start --secret-service || exit 99
            trap '"$K" stop' EXIT
            \(locked ? "" : "printf '%s\\n' \"$PASSCODE\" | \"$K\" unlock || exit 98")

            """
        return harness.sh("PASSCODE=\"$2\" dbus-run-session -- sh -c \"$1\" 2> \"$R/bus.err\"",
                          arguments: [prelude + script, MountHarness.passcode])
    }

    @Test func secretToolFindsAndReadsItemsWrittenByTheCommandLineOrAMount() throws {
        let mnt = try harness.prepareMountpoint("mnt")
        let found = onBus("""
            printf s3cret | "$K" set default/api-token
            "$K" mount "$R/mnt" && printf 'from a mount' > "$R/mnt/default/mounted" && "$K" unmount "$R/mnt"
            secret-tool lookup keychainfs:identifier api-token; echo " rc $?"
            secret-tool lookup keychainfs:group default keychainfs:identifier mounted; echo " rc $?"
            secret-tool lookup keychainfs:identifier absent; echo "absent rc $?"
            secret-tool search --all keychainfs:group default 2>&1 | grep -E '^(\\[|label|attribute)' | sort
            """)
        #expect(found.stdout == """
            s3cret rc 0
            from a mount rc 0
            absent rc 1
            [/api_2dtoken]
            [/mounted]
            attribute.keychainfs:group = default
            attribute.keychainfs:group = default
            attribute.keychainfs:identifier = api-token
            attribute.keychainfs:identifier = mounted
            label = api-token
            label = mounted

            """, "\(found)")
        _ = mnt
    }

    /// Locked is never absent: a search finds the item in its locked list,
    /// a read fails with IsLocked.
    @Test func whileLockedItemsAreFoundLockedAndTheirSecretsRefused() {
        #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: MountHarness.passcode + "\n").succeeded)
        #expect(harness.sh("printf s3cret | \"$K\" set default/token --keychain \"$KC\" && \"$K\" stop --keychain \"$KC\"").succeeded)
        let locked = onBus("""
            /usr/bin/python3 - <<'PY'
            import secretstorage
            from secretstorage.exceptions import LockedException
            from jeepney import DBusAddress, new_method_call
            conn = secretstorage.dbus_init()
            service = DBusAddress('/org/freedesktop/secrets', 'org.freedesktop.secrets', 'org.freedesktop.Secret.Service')
            unlocked, locked = conn.send_and_get_reply(new_method_call(service, 'SearchItems', 'a{ss}',
                ({'keychainfs:identifier': 'token'},))).body
            print('unlocked', unlocked, 'locked', locked)
            item = secretstorage.Item(conn, locked[0])
            print('is locked', item.is_locked())
            try:
                item.get_secret()
            except LockedException as error:
                print('LockedException')
            PY
            """, locked: true)
        #expect(locked.stdout == """
            unlocked [] locked ['/org/freedesktop/secrets/collection/default/token']
            is locked True
            LockedException

            """, "\(locked)")
    }

    @Test func secretstorageReadsAndWritesSecretsInAPlainSession() {
        #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: MountHarness.passcode + "\n").succeeded)
        #expect(harness.sh("printf v1 | \"$K\" set default/db --keychain \"$KC\" && \"$K\" stop --keychain \"$KC\"").succeeded)
        let used = onBus("""
            /usr/bin/python3 - <<'PY'
            import secretstorage
            conn = secretstorage.dbus_init()
            collection = secretstorage.get_default_collection(conn)
            print('default', collection.collection_path, collection.get_label())
            item = next(collection.search_items({'keychainfs:identifier': 'db'}))
            print(item.get_label(), item.get_secret())
            item.set_secret(b'v2')
            PY
            "$K" get default/db; echo
            """)
        #expect(used.stdout == "default /org/freedesktop/secrets/aliases/default default\ndb b'v1'\nv2\n", "\(used)")
    }

    /// A program the group's policy does not name gets an error, and the
    /// audit log says which program was refused.
    @Test func aProgramNotEntitledToAPolicedCollectionIsRefusedAndAudited() throws {
        #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: MountHarness.passcode + "\n").succeeded)
        #expect(harness.sh("printf s3cret | \"$K\" set secure/token --keychain \"$KC\"").succeeded)
        #expect(harness.sh("cp /usr/bin/cat \"$R/granted-cat\"").succeeded)
        #expect(harness.grant("secure", exe: harness.root + "/granted-cat").succeeded)
        #expect(harness.sh("\"$K\" stop --keychain \"$KC\"").succeeded)
        let refused = onBus("""
            secret-tool lookup keychainfs:group secure; echo "lookup rc $?"
            /usr/bin/python3 - <<'PY'
            import secretstorage
            conn = secretstorage.dbus_init()
            try:
                secretstorage.Item(conn, '/org/freedesktop/secrets/collection/secure/token').get_secret()
            except Exception as error:
                print(type(error).__name__, 'AccessDenied' in str(error))
            PY
            """)
        #expect(refused.stdout == "lookup rc 1\nDBusErrorResponse True\n", "\(refused)")  // AccessDenied, not "absent"
        let log = harness.sh("\"$K\" log --keychain \"$KC\" --group secure")
        // secret-tool's search was refused the group's listing; Python's read of the item.
        #expect(log.stdout.contains("list denied secure pid=") && log.stdout.contains("exe=/usr/bin/secret-tool"), "\(log)")
        #expect(log.stdout.contains("denied secure/token pid=") && log.stdout.contains("exe=/usr/bin/python3"), "\(log)")
    }

    /// Bad input is an error and changes nothing.
    @Test func unknownObjectsWrongSignaturesAndForeignSessionsAreErrors() {
        let bad = onBus("""
            call() { out=$(busctl --user call org.freedesktop.secrets "$@" 2>&1); rc=$?; echo "$out rc $rc"; }
            call /org/freedesktop/secrets/collection/default/no_5fsuch org.freedesktop.DBus.Properties Get ss org.freedesktop.Secret.Item Label
            call /org/freedesktop/secrets/nowhere org.freedesktop.Secret.Service SearchItems 'a{ss}' 0
            call /org/freedesktop/secrets org.freedesktop.Secret.Service SearchItems s x
            call /org/freedesktop/secrets org.freedesktop.Secret.Service OpenSession sv no-such-algorithm s ''
            call /org/freedesktop/secrets org.freedesktop.Secret.Service GetSecrets aoo 0 /org/freedesktop/secrets/session/7
            call /org/freedesktop/secrets org.freedesktop.Secret.Service ReadAlias s nothing
            """)
        let lines = bad.stdout.split(separator: "\n").map(String.init)
        #expect(lines.count == 6, "\(bad)")
        if lines.count == 6 {
            #expect(lines[0].contains("no item at /org/freedesktop/secrets/collection/default/no_5fsuch"), "\(lines[0])")
            #expect(lines[1].contains("no object at"), "\(lines[1])")
            #expect(lines[2].contains("SearchItems takes (a{ss}), not (s)"), "\(lines[2])")
            #expect(lines[3].contains("not supported"), "\(lines[3])")
            #expect(lines[4].contains("no open session"), "\(lines[4])")
            #expect(lines[5] == "o \"/\" rc 0", "\(lines[5])")  // an unknown alias is no object, not an error
            #expect(lines[0...4].allSatisfy { $0.hasSuffix(" rc 1") })
        }
    }
}
