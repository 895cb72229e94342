import Foundation
import KeychainCore
import Testing
import TestSupport

extension SerialTests {
    /// The Secret Service on the session bus, through real clients under
    /// `dbus-run-session` (docs/SECRET-SERVICE.md, "Clients tested"):
    /// libsecret's `secret-tool`, Python's `secretstorage` (Debian's, so
    /// /usr/bin/python3), `busctl`. The device runs inside the test's bus
    /// session and stops with it.
    @Suite struct SecretServiceTests {
        let harness: MountHarness

        init() throws {
            harness = try MountHarness()
        }

        /// Unlocks the keychain, stores `value` at `item` and stops the device
        /// again: the test's bus starts its own.
        func store(_ value: String, at item: String) {
            let stored = harness.sh(
                """
                printf '%s\\n' "$3" | "$K" unlock --keychain "$KC" && printf %s "$1" | "$K" set "$2" --keychain "$KC" &&
                "$K" stop --keychain "$KC"
                """, arguments: [value, item, MountHarness.passcode])
            #expect(stored.succeeded, "\(stored)")
        }

        /// Runs `script` on a private session bus with the keychain's device
        /// serving org.freedesktop.secrets, unlocked unless `locked`.
        func onBus(_ script: String, locked: Bool = false, environment: String = "") -> ShellResult {
            harness.onBus(script, locked: locked, environment: environment)
        }

        @Test func secretToolFindsAndReadsItemsWrittenByTheCommandLineOrAMount() throws {
            let mnt = try harness.prepareMountpoint("mnt")
            let found = onBus(
                """
                printf s3cret | "$K" set default/api-token
                "$K" mount "$R/mnt" && printf 'from a mount' > "$R/mnt/default/mounted" && "$K" unmount "$R/mnt"
                secret-tool lookup keychainfs:identifier api-token; echo " rc $?"
                secret-tool lookup keychainfs:group default keychainfs:identifier mounted; echo " rc $?"
                secret-tool lookup keychainfs:identifier absent; echo "absent rc $?"
                secret-tool search --all keychainfs:group default 2>&1 | grep -E '^(\\[|label|attribute)' | sort
                """)
            #expect(
                found.stdout == """
                    s3cret rc 0
                    from a mount rc 0
                    absent rc 1
                    [/api_2dtoken]
                    [/mounted]
                    attribute.keychainfs:accessible = whenUnlocked
                    attribute.keychainfs:accessible = whenUnlocked
                    attribute.keychainfs:group = default
                    attribute.keychainfs:group = default
                    attribute.keychainfs:identifier = api-token
                    attribute.keychainfs:identifier = mounted
                    label = api-token
                    label = mounted

                    """, "\(found)")
            _ = mnt
        }

        /// A program of the session asks for the name with REPLACE_EXISTING (as
        /// a thief of what clients store would): the device allows no
        /// replacement, so the thief is only queued, and what secret-tool
        /// stores meanwhile reaches the keychain (docs/SECURITY.md, "Service
        /// mode under attack").
        @Test func noProgramOfTheSessionTakesTheNameFromTheDevice() throws {
            try """
            import sys, time
            from jeepney import DBusAddress, new_method_call
            from jeepney.io.blocking import open_dbus_connection
            conn = open_dbus_connection(bus='SESSION')
            bus = DBusAddress('/org/freedesktop/DBus', bus_name='org.freedesktop.DBus', interface='org.freedesktop.DBus')
            # DBUS_NAME_FLAG_REPLACE_EXISTING; 1 would be "primary owner", 2 "in queue".
            reply = conn.send_and_get_reply(new_method_call(bus, 'RequestName', 'su', ('org.freedesktop.secrets', 2)))
            print('request-name', reply.body[0], flush=True)
            open(sys.argv[1], 'w').close()
            time.sleep(3)
            """.write(toFile: harness.root + "/thief.py", atomically: true, encoding: .utf8)
            _ = try harness.prepareMountpoint("mnt")
            let result = onBus(
                """
                /usr/bin/python3 "$R/thief.py" "$R/thief-ready" > "$R/thief.out" &
                until [ -e "$R/thief-ready" ]; do sleep 0.05; done
                printf 'to the keychain' | secret-tool store --label=stolen service mail && secret-tool lookup service mail
                echo
                wait
                cat "$R/thief.out"
                "$K" mount "$R/mnt" && grep '^secret-service:' "$R/mnt/.control"; "$K" unmount "$R/mnt"
                """)
            #expect(
                result.stdout == "to the keychain\nrequest-name 2\nsecret-service: serving org.freedesktop.secrets\n",
                "\(result)")
        }

        /// The spec's signals come from the device's events, so a change made
        /// by the command line (or a mount) is announced on the bus. The
        /// watcher's match rule is in place before it says "ready".
        @Test func changesMadeAnywhereAreSignalledOnTheBus() throws {
            try """
            import sys
            from jeepney import MatchRule, message_bus
            from jeepney.low_level import HeaderFields
            from jeepney.io.blocking import open_dbus_connection
            conn = open_dbus_connection(bus='SESSION')
            # jeepney filters its queue by the rule too, and a signal's sender
            # is the provider's unique name: match on the path, not the name.
            rule = MatchRule(type='signal', path_namespace='/org/freedesktop/secrets')
            with conn.filter(rule, bufsize=64) as signals:
                conn.send_and_get_reply(message_bus.AddMatch(rule))
                print('ready', flush=True)
                for _ in range(int(sys.argv[1])):
                    signal = conn.recv_until_filtered(signals, timeout=10)
                    fields = signal.header.fields
                    print(fields[HeaderFields.member], fields[HeaderFields.path], signal.body[0], flush=True)
            """.write(toFile: harness.root + "/watch.py", atomically: true, encoding: .utf8)
            let signalled = onBus(
                """
                mkfifo "$R/signals"
                /usr/bin/python3 "$R/watch.py" 8 > "$R/signals" & watcher=$!
                exec 3< "$R/signals"
                read -r ready <&3
                printf v | "$K" set default/new && printf w | "$K" set default/new && "$K" rm default/new
                printf x | "$K" set fresh/one
                cat <&3
                wait $watcher
                """)
            let collection = "/org/freedesktop/secrets/collection/"
            #expect(
                signalled.stdout == """
                    ItemCreated \(collection)default \(collection)default/new
                    CollectionChanged /org/freedesktop/secrets \(collection)default
                    ItemChanged \(collection)default \(collection)default/new
                    ItemDeleted \(collection)default \(collection)default/new
                    CollectionChanged /org/freedesktop/secrets \(collection)default
                    CollectionCreated /org/freedesktop/secrets \(collection)fresh
                    ItemCreated \(collection)fresh \(collection)fresh/one
                    CollectionChanged /org/freedesktop/secrets \(collection)fresh

                    """, "\(signalled)")
        }

        /// Unlock of a locked keychain returns a prompt; its Prompt runs
        /// pinentry (here a script speaking its protocol, answering from a
        /// file): a wrong passcode is shown as such and counts, the right one
        /// unlocks and Completed says so; a cancelled one is dismissed.
        /// A pinentry that answers GETPIN with the lines of `$R/answers` in
        /// turn (an empty line: cancel) and logs what it was told to show in
        /// `$R/pinentry.log`; to be named by `pinentryEnvironment`.
        func writeScriptedPinentry(answers: String) throws {
            try """
            #!/bin/sh
            echo "OK Pleased to meet you"
            n=0
            while read -r command rest; do
                case "$command" in
                GETPIN) n=$((n + 1)); pin=$(sed -n "${n}p" "$R/answers")
                        if [ "$pin" = FAIL ]; then echo "ERR 83918950 Inappropriate ioctl for device <Pinentry>"
                        elif [ -n "$pin" ]; then echo "D $pin"; echo OK; else echo "ERR 83886179 Operation cancelled"; fi ;;
                SETERROR) echo "$rest" >> "$R/pinentry.log"; echo OK ;;
                SETDESC) echo "$rest" | sed 's|/.*/||' >> "$R/pinentry.log"; echo OK ;;
                BYE) echo OK; exit 0 ;;
                *) echo OK ;;
                esac
            done
            """.write(toFile: harness.root + "/pinentry", atomically: true, encoding: .utf8)
            chmod(harness.root + "/pinentry", 0o755)
            try answers.write(toFile: harness.root + "/answers", atomically: true, encoding: .utf8)
        }

        static let pinentryEnvironment = "KEYCHAINFS_PINENTRY=\"$R/pinentry\""

        @Test func unlockAsksForThePasscodeThroughPinentry() throws {
            try writeScriptedPinentry(answers: "\n")
            let prompted = onBus(
                """
                /usr/bin/python3 - "$R/answers" "$PASSCODE" <<'PY'
                import sys, secretstorage
                conn = secretstorage.dbus_init()
                collection = secretstorage.get_default_collection(conn)
                print('cancelled, dismissed:', collection.unlock(), 'locked:', collection.is_locked())
                open(sys.argv[1], 'w').write('wrong-one\\n' + sys.argv[2] + '\\n')
                print('answered, dismissed:', collection.unlock(), 'locked:', collection.is_locked())
                PY
                "$K" status | grep -E '^(state|failed)'
                cat "$R/pinentry.log"
                # A pinentry that cannot ask (no terminal, no display): dismissed, and the log says why.
                "$K" lock && echo FAIL > "$R/answers"
                /usr/bin/python3 -c 'import secretstorage; c = secretstorage.dbus_init(); print("failed, dismissed:", secretstorage.get_default_collection(c).unlock())'
                "$K" log --keychain "$KC" | grep ' unlock-prompt failed ' | sed 's/^[^ ]* //; s/ pid=.*//' 
                """, locked: true, environment: Self.pinentryEnvironment)
            #expect(
                prompted.stdout == """
                    cancelled, dismissed: True locked: True
                    answered, dismissed: False locked: False
                    state: unlocked
                    failed-attempts: 0
                    python3.11 asks to unlock your keychain.
                    python3.11 asks to unlock your keychain.
                    python3.11 asks to unlock your keychain.
                    Wrong passcode
                    failed, dismissed: True
                    unlock-prompt failed (the person cancelled)
                    unlock-prompt failed (the pinentry could not ask: pinentry: Inappropriate ioctl for device <Pinentry>; no display or terminal?)

                    """, "\(prompted)")
            // The wrong passcode and the right one, each with the program that asked.
            let log = harness.sh("\"$K\" log --keychain \"$KC\" | grep ' unlock ' | grep -c 'exe=/usr/bin/python3'")
            #expect(log.stdout == "2\n", "\(log)")
        }

        /// A client that leaves while its prompt shows takes the prompt with
        /// it: pinentry is ended, nothing is unlocked. Also when the client
        /// leaves before its pinentry has even said hello (greetsLate: the
        /// pinentry greets only once the client's process is gone).
        @Test(arguments: [false, true])
        func aClientGoneDuringItsPromptEndsThePinentry(greetsLate: Bool) throws {
            try """
            #!/bin/sh
            echo $$ > "$R/pinentry.pid"
            \(greetsLate ? "read client < \"$R/client.pid\"; tail --pid=\"$client\" -f /dev/null" : "")
            echo "OK Pleased to meet you"
            while read -r command rest; do
                case "$command" in
                GETPIN) read -r never < "$R/never" ;;
                *) echo OK ;;
                esac
            done
            """.write(toFile: harness.root + "/pinentry", atomically: true, encoding: .utf8)
            chmod(harness.root + "/pinentry", 0o755)
            let gone = onBus(
                """
                mkfifo "$R/never" "$R/pinentry.pid" "$R/client.pid"
                pid=$(/usr/bin/python3 - "$R/pinentry.pid" \(greetsLate ? "\"$R/client.pid\"" : "") <<'PY'
                import os, sys
                from jeepney import DBusAddress, new_method_call
                from jeepney.io.blocking import open_dbus_connection
                conn = open_dbus_connection(bus='SESSION')
                service = DBusAddress('/org/freedesktop/secrets', 'org.freedesktop.secrets', 'org.freedesktop.Secret.Service')
                unlocked, prompt = conn.send_and_get_reply(new_method_call(service, 'Unlock', 'ao',
                    (['/org/freedesktop/secrets/collection/default'],))).body
                conn.send_and_get_reply(new_method_call(DBusAddress(prompt, 'org.freedesktop.secrets',
                    'org.freedesktop.Secret.Prompt'), 'Prompt', 's', ('',)))
                # The pinentry writes its pid into the FIFO as it starts: then it shows.
                print(open(sys.argv[1]).read().strip())
                if len(sys.argv) > 2:
                    open(sys.argv[2], 'w').write(str(os.getpid()))
                PY
                )
                tail --pid="$pid" -f /dev/null
                echo "pinentry ended"
                "$K" status | grep '^state'
                """, locked: true, environment: Self.pinentryEnvironment)
            #expect(gone.stdout == "pinentry ended\nstate: locked\n", "\(gone)")
        }

        /// A mount's device serves the bus too (until its last mount goes); a
        /// device that runs already cannot join a bus afterwards, and says so.
        @Test func aMountsDeviceCanServeTheBus() throws {
            _ = try harness.prepareMountpoint("mnt")
            let served = harness.sh(
                """
                dbus-run-session -- sh -c '
                    export KEYCHAINFS_KEYCHAIN="$KC"
                    "$K" mount "$R/mnt" --secret-service || exit 99
                    printf "unlock %s\\n" "$1" > "$R/mnt/.control"
                    printf from-cat > "$R/mnt/default/cat-item"
                    secret-tool lookup keychainfs:identifier cat-item; echo
                    "$K" start --secret-service; echo "start $?"
                    "$K" unmount "$R/mnt"' sh "$1" 2> "$R/bus.err"; grep keychainfs: "$R/bus.err"
                """, arguments: [MountHarness.passcode])
            // Asking again on the bus it serves is done.
            #expect(served.stdout == "from-cat\nstart 0\n", "\(served)")
        }

        /// A device a client started (no bus then) serves a session's bus when
        /// asked, as D-Bus activation asks; another session's bus is refused
        /// while it serves one, and taken once that one has gone.
        @Test func aDeviceAClientStartedServesTheBusWhenAsked() throws {
            try """
            "$K" start --secret-service; echo "join $?"
            secret-tool lookup keychainfs:identifier item; echo
            "$K" start --secret-service; echo "again $?"
            dbus-run-session -- sh -c '"$K" start --secret-service 2>&1; echo "other $?"' 2>/dev/null
            """.write(toFile: harness.root + "/join.sh", atomically: true, encoding: .utf8)
            let joined = harness.sh(
                """
                export KEYCHAINFS_KEYCHAIN="$KC"
                printf '%s\\n' "$1" | "$K" unlock && printf v | "$K" set default/item || exit 99
                dbus-run-session -- sh "$R/join.sh" 2>/dev/null
                dbus-run-session -- sh -c '"$K" start --secret-service; echo "next session $?"; secret-tool lookup keychainfs:identifier item' 2>/dev/null
                echo; "$K" stop
                """, arguments: [MountHarness.passcode])
            #expect(
                joined.stdout == """
                    join 0
                    v
                    again 0
                    keychainfs: the device serves the Secret Service on another session's bus: stop it first (keychainfs stop)
                    other 1
                    next session 0
                    v

                    """, "\(joined)")
        }

        /// A collection is an access group: CreateCollection makes one named by
        /// its label (the default alias answers with the default group), Delete
        /// removes an empty one and refuses one that holds items.
        @Test func collectionsAreAccessGroups() {
            let made = onBus(
                """
                printf kept | "$K" set full/item
                /usr/bin/python3 - <<'PY'
                import secretstorage
                conn = secretstorage.dbus_init()
                made = secretstorage.create_collection(conn, 'team.app')
                print(made.collection_path, made.get_label())
                print(secretstorage.create_collection(conn, 'ignored', alias='default').collection_path)
                made.delete()
                try:
                    secretstorage.Collection(conn, '/org/freedesktop/secrets/collection/full').delete()
                except Exception as error:
                    print(type(error).__name__, 'still holds items' in str(error))
                try:
                    secretstorage.create_collection(conn, 'a/b')
                except Exception as error:
                    print(type(error).__name__, 'InvalidArgs' in str(error))
                PY
                "$K" ls; "$K" get full/item; echo
                """)
            #expect(
                made.stdout == """
                    /org/freedesktop/secrets/collection/team_2eapp team.app
                    /org/freedesktop/secrets/collection/default
                    DBusErrorResponse True
                    DBusErrorResponse True
                    default
                    full
                    kept

                    """, "\(made)")
        }

        /// The shipped activation file: the bus starts the device when a
        /// program first asks for org.freedesktop.secrets. It runs the
        /// installed binary itself, with no shell and nothing of `$HOME` (the
        /// activation environment must not choose the provider:
        /// docs/SECRET-SERVICE.md, "The device's judge"); the test's copy
        /// names the built binary instead, its only change.
        @Test func theBusStartsTheDeviceWhenAProgramFirstAsks() throws {
            let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .deletingLastPathComponent().path
            let shipped = try String(
                contentsOfFile: repository + "/scripts/dbus/org.freedesktop.secrets.service", encoding: .utf8)
            #expect(
                shipped.split(separator: "\n").filter { $0.hasPrefix("Exec=") } == [
                    "Exec=/usr/bin/keychainfs start --foreground --secret-service"
                ], "\(shipped)")
            let activated = harness.sh(
                """
                export HOME="$R/home" KEYCHAINFS_KEYCHAIN="$KC"
                mkdir -p "$R/services"
                sed "s|^Exec=/usr/bin/keychainfs |Exec=$K |" "$1/scripts/dbus/org.freedesktop.secrets.service" \\
                    > "$R/services/org.freedesktop.secrets.service"
                # Debian's session bus, with our directory instead of the standard
                # ones (where gnome-keyring's activation file for the name may be).
                sed "s|<standard_session_servicedirs */>|<servicedir>$R/services</servicedir>|" /usr/share/dbus-1/session.conf \\
                    > "$R/session.conf"
                "$K" status | grep '^state'
                dbus-run-session --config-file="$R/session.conf" -- sh -c '
                    secret-tool lookup keychainfs:identifier anything; echo "lookup $?"
                    "$K" status | grep "^state"
                    "$K" stop' 2> /dev/null
                # A device a client started before the bus asks: activation has it serve the bus.
                printf '%s\\n' "$2" | "$K" unlock && printf v | "$K" set default/item
                dbus-run-session --config-file="$R/session.conf" -- sh -c '
                    secret-tool lookup keychainfs:identifier item; echo " lookup $?"
                    "$K" stop' 2> /dev/null
                """, arguments: [repository, MountHarness.passcode])
            // Booted by the bus, locked as a device boots: the lookup finds nothing it may read.
            #expect(activated.stdout == "state: stopped\nlookup 1\nstate: locked\nv lookup 0\n", "\(activated)")
        }

        /// secretstorage opens the DH session libsecret also asks for first
        /// (an implementation independent of ours: Python's integers and
        /// pyca/cryptography's AES); a plain session is asked for by hand.
        @Test func secretstorageReadsAndWritesSecretsInDhAndPlainSessions() {
            store("v1", at: "default/db")
            let used = onBus(
                """
                /usr/bin/python3 - <<'PY'
                import secretstorage
                from secretstorage.util import open_session
                from jeepney import DBusAddress, new_method_call
                conn = secretstorage.dbus_init()
                session = open_session(conn)
                print('encrypted', session.encrypted)
                collection = secretstorage.get_default_collection(conn, session=session)
                print('default', collection.collection_path, collection.get_label())
                item = next(collection.search_items({'keychainfs:identifier': 'db'}))
                print(item.get_label(), item.get_secret())
                item.set_secret(b'v2' * 5000)
                service = DBusAddress('/org/freedesktop/secrets', 'org.freedesktop.secrets', 'org.freedesktop.Secret.Service')
                output, plain = conn.send_and_get_reply(new_method_call(service, 'OpenSession', 'sv', ('plain', ('s', '')))).body
                secret = conn.send_and_get_reply(new_method_call(DBusAddress(item.item_path, 'org.freedesktop.secrets',
                    'org.freedesktop.Secret.Item'), 'GetSecret', 'o', (plain,))).body[0]
                print('plain', secret[1], len(secret[2]), secret[3])
                PY
                "$K" get default/db | wc -c
                """)
            #expect(
                used.stdout == """
                    encrypted True
                    default /org/freedesktop/secrets/aliases/default default
                    db b'v1'
                    plain b'' 10000 text/plain
                    10000

                    """, "\(used)")
        }

        /// A DH public key outside the group, a wrong IV, a tampered secret:
        /// each refused, the item unchanged. (The IV's last bit flipped turns
        /// the padding of a 3-byte secret, thirteen 0x0d bytes, into a wrong
        /// one every time; a flipped ciphertext byte would pass 1 time in 256.)
        @Test func badSessionInputIsRefusedAndChangesNothing() {
            store("kept", at: "default/db")
            let refused = onBus(
                """
                /usr/bin/python3 - <<'PY'
                import secretstorage
                from secretstorage.util import open_session, format_secret
                from jeepney import DBusAddress, new_method_call
                conn = secretstorage.dbus_init()
                service = DBusAddress('/org/freedesktop/secrets', 'org.freedesktop.secrets', 'org.freedesktop.Secret.Service')
                def call(address, method, signature, body):
                    reply = conn.send_and_get_reply(new_method_call(address, method, signature, body))
                    return reply.header.fields.get(4, 'ok')  # the error name, if any
                prime = int('FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD'
                            'EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED'
                            'EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE65381FFFFFFFFFFFFFFFF', 16)
                for key in [b'\\x01', (prime - 1).to_bytes(128, 'big'), b'\\x02' * 129]:
                    print(call(service, 'OpenSession', 'sv', ('dh-ietf1024-sha256-aes128-cbc-pkcs7', ('ay', key))))
                session = open_session(conn)
                item = DBusAddress('/org/freedesktop/secrets/collection/default/db', 'org.freedesktop.secrets', 'org.freedesktop.Secret.Item')
                path, iv, sealed, _ = format_secret(session, b'new', 'text/plain')
                print(call(item, 'SetSecret', '(oayays)', ((path, iv[:8], sealed, 'text/plain'),)))
                print(call(item, 'SetSecret', '(oayays)', ((path, iv[:-1] + bytes([iv[-1] ^ 1]), sealed, 'text/plain'),)))
                print(call(item, 'SetSecret', '(oayays)', (('/org/freedesktop/secrets/session/99', iv, sealed, 'text/plain'),)))
                # A session closed mid-use: its secrets are refused from then on, stored or sent.
                print(call(DBusAddress(session.object_path, 'org.freedesktop.secrets', 'org.freedesktop.Secret.Session'), 'Close', '', ()))
                print(call(item, 'SetSecret', '(oayays)', ((path, iv, sealed, 'text/plain'),)))
                collection = DBusAddress('/org/freedesktop/secrets/collection/default', 'org.freedesktop.secrets',
                                         'org.freedesktop.Secret.Collection')
                print(call(collection, 'CreateItem', 'a{sv}(oayays)b',
                           ({'org.freedesktop.Secret.Item.Label': ('s', 'late')}, (path, iv, sealed, 'text/plain'), False)))
                print(call(item, 'GetSecret', 'o', (path,)))
                PY
                "$K" get default/db; echo
                "$K" ls default
                """)
            #expect(
                refused.stdout == """
                    org.freedesktop.DBus.Error.InvalidArgs
                    org.freedesktop.DBus.Error.InvalidArgs
                    org.freedesktop.DBus.Error.InvalidArgs
                    org.freedesktop.DBus.Error.InvalidArgs
                    org.freedesktop.DBus.Error.InvalidArgs
                    org.freedesktop.Secret.Error.NoSession
                    ok
                    org.freedesktop.Secret.Error.NoSession
                    org.freedesktop.Secret.Error.NoSession
                    org.freedesktop.Secret.Error.NoSession
                    kept
                    db

                    """, "\(refused)")
        }

        /// A program the group's policy does not name gets an error, and the
        /// audit log says which program was refused.
        @Test func aProgramNotEntitledToAPolicedCollectionIsRefusedAndAudited() throws {
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: MountHarness.passcode + "\n").succeeded)
            #expect(harness.sh("printf s3cret | \"$K\" set secure/token --keychain \"$KC\"").succeeded)
            #expect(harness.sh("cp /usr/bin/cat \"$R/granted-cat\"").succeeded)
            #expect(harness.grant("secure", exe: harness.root + "/granted-cat").succeeded)
            #expect(harness.sh("\"$K\" stop --keychain \"$KC\"").succeeded)
            let refused = onBus(
                """
                secret-tool lookup keychainfs:group secure; echo "lookup rc $?"
                /usr/bin/python3 - <<'PY'
                import secretstorage
                conn = secretstorage.dbus_init()
                try:
                    secretstorage.Item(conn, '/org/freedesktop/secrets/collection/secure/token').get_secret()
                except Exception as error:
                    print(type(error).__name__, 'AccessDenied' in str(error))
                try:
                    secretstorage.Collection(conn, '/org/freedesktop/secrets/collection/secure').create_item(
                        'planted', {'app': 'x'}, b'planted', replace=True)
                except Exception as error:
                    print(type(error).__name__, 'AccessDenied' in str(error))
                PY
                """)
            // AccessDenied, not "absent".
            #expect(refused.stdout == "lookup rc 1\nDBusErrorResponse True\nDBusErrorResponse True\n", "\(refused)")
            let log = harness.sh("\"$K\" log --keychain \"$KC\" --group secure")
            // secret-tool's search was refused the group's listing; Python's read of the item.
            #expect(
                log.stdout.contains("list denied secure pid=") && log.stdout.contains("exe=/usr/bin/secret-tool"),
                "\(log)")
            #expect(
                log.stdout.contains("denied secure/token pid=") && log.stdout.contains("exe=/usr/bin/python3"), "\(log)"
            )
            // CreateItem was refused at the group's listing: no write was tried.
            #expect(!log.stdout.contains("planted"), "\(log)")
        }

        /// A lookup across collections by a granted program: an ungranted
        /// one planted an item of no program (made with `keychainfs set`,
        /// which every program reads unasked) with the same attributes in
        /// the open collection `default`, which came first, so the granted
        /// program's lookup read the planted value; and one with
        /// attributes the granted program has no item for answered it too.
        /// Now its search of every collection looks in the policed groups
        /// that admit it only; naming `default` reaches that one, and the
        /// ungranted program still finds its own items. A program granted a
        /// group that holds nothing yet (not even made) searched `default`
        /// too: the groups are the policies', not those listed. (The
        /// handler's part is `InProcessProviderTests`'; here it is the
        /// device's policy that names the groups, for real programs.)
        @Test func aGrantedProgramsLookupIsNeverAnsweredFromAnotherCollection() throws {
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: MountHarness.passcode + "\n").succeeded)
            #expect(harness.sh("printf s3cret | \"$K\" set secure/token --keychain \"$KC\"").succeeded)
            #expect(harness.sh("cp /usr/bin/secret-tool \"$R/granted-tool\"").succeeded)
            #expect(harness.grant("secure", exe: harness.root + "/granted-tool").succeeded)
            // Granted a group that holds nothing yet, and is not even made.
            #expect(harness.sh("cp /usr/bin/secret-tool \"$R/granted-new\"").succeeded)
            #expect(harness.grant("mail-app", exe: harness.root + "/granted-new").succeeded)
            #expect(harness.sh("\"$K\" stop --keychain \"$KC\"").succeeded)
            let looked = onBus(
                """
                printf planted | "$K" set default/token
                printf planted-url | "$K" set default/server
                /usr/bin/python3 - <<'PY'
                import secretstorage
                conn = secretstorage.dbus_init()
                item = next(secretstorage.get_default_collection(conn).search_items({'keychainfs:identifier': 'server'}))
                item.set_attributes({'app': 'mail'})
                PY
                "$R/granted-tool" lookup keychainfs:identifier token; echo " rc $?"
                "$R/granted-tool" lookup app mail; echo " rc $?"
                "$R/granted-tool" lookup keychainfs:group default app mail; echo " rc $?"
                secret-tool lookup app mail; echo " rc $?"
                "$R/granted-new" lookup app mail; echo " rc $?"
                """)
            #expect(
                looked.stdout == "s3cret rc 0\n rc 1\nplanted-url rc 0\nplanted-url rc 0\n rc 1\n", "\(looked)")
        }

        /// The bus names the process that connected. A program connects,
        /// forks, and execs a granted binary, and its child asks on the shared
        /// connection: the child is refused, and the log says why; the granted
        /// program on a connection of its own is served (docs/SECURITY.md,
        /// "Service mode under attack").
        @Test func aChildAskingOnAGrantedProgramsBusConnectionIsRefused() throws {
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: MountHarness.passcode + "\n").succeeded)
            #expect(harness.sh("printf s3cret | \"$K\" set secure/token --keychain \"$KC\"").succeeded)
            #expect(
                harness.sh("cp /usr/bin/sleep \"$R/granted-sleep\" && cp /usr/bin/secret-tool \"$R/granted-tool\"")
                    .succeeded)
            #expect(harness.grant("secure", exe: harness.root + "/granted-sleep").succeeded)
            #expect(harness.grant("secure", exe: harness.root + "/granted-tool").succeeded)
            #expect(harness.sh("\"$K\" stop --keychain \"$KC\"").succeeded)
            try writeForkExecRace()
            let raced = onBus(
                """
                /usr/bin/python3 "$R/race.py" "$R/granted-sleep" /org/freedesktop/secrets/collection/secure/token s3cret 2
                "$R/granted-tool" lookup keychainfs:group secure keychainfs:identifier token; echo
                """)
            #expect(raced.stdout == "org.freedesktop.DBus.Error.AccessDenied False\ns3cret\n", "\(raced)")
            let log = harness.sh("\"$K\" log --keychain \"$KC\" --group secure").stdout
            #expect(
                log.contains("denied secure/token") && log.contains("its bus connection is shared with pid"), "\(log)")
            #expect(log.contains("exe=\(harness.root)/granted-tool"), "\(log)")
        }

        /// `$R/race.py PROGRAM ITEM SECRET ARGS...`: connects to the bus,
        /// forks, and execs PROGRAM with ARGS; its child waits for the exec,
        /// then asks on the shared connection for the secret of ITEM (an
        /// object path, or `attribute=value` to search) and prints the error's
        /// name (or `no error`) and whether SECRET came back.
        func writeForkExecRace() throws {
            try """
            import os, sys, time
            from jeepney import DBusAddress, new_method_call
            from jeepney.io.blocking import open_dbus_connection
            program, wanted, secret, arguments = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
            conn = open_dbus_connection(bus='SESSION')
            os.set_inheritable(conn.sock.fileno(), True)
            if os.fork() == 0:
                parent = os.getppid()
                while os.readlink('/proc/%d/exe' % parent) != program:
                    time.sleep(0.01)
                service = DBusAddress('/org/freedesktop/secrets', bus_name='org.freedesktop.secrets',
                                      interface='org.freedesktop.Secret.Service')
                session = conn.send_and_get_reply(new_method_call(service, 'OpenSession', 'sv', ('plain', ('s', '')))).body[1]
                if wanted.startswith('/'):
                    path = wanted
                else:
                    name, value = wanted.split('=', 1)
                    path = conn.send_and_get_reply(new_method_call(service, 'SearchItems', 'a{ss}', ({name: value},))).body[0][0]
                item = DBusAddress(path, bus_name='org.freedesktop.secrets', interface='org.freedesktop.Secret.Item')
                reply = conn.send_and_get_reply(new_method_call(item, 'GetSecret', 'o', (session,)))
                print(reply.header.fields.get(4, 'no error'), secret.encode() in repr(reply.body).encode(), flush=True)
                os._exit(0)
            os.execv(program, [program] + arguments)
            """.write(toFile: harness.root + "/race.py", atomically: true, encoding: .utf8)
        }
    }
}
