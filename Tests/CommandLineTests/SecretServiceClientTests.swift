import Foundation
import Testing
import TestSupport

/// The clients that store their own items (docs/SECRET-SERVICE.md,
/// "Clients tested"): secret-tool, Python's keyring, git's libsecret
/// credential helper, each finding its items again by the attributes it
/// gave them, through the bus, a mount and the command line alike.
extension SerialTests.SecretServiceTests {
    @Test func secretToolStoresReplacesLooksUpAndClearsItsOwnItems() throws {
        _ = try harness.prepareMountpoint("mnt")
        // The items are secret-tool's: cat and printf through the mount are asked about, and allowed.
        try writeConsentPinentry(answers: ["once", "once"])
        let used = onBus(
            """
            printf pw1 | secret-tool store --label='GitHub token' service github.com username ada; echo "store $?"
            printf pw2 | secret-tool store --label='GitHub token' service github.com username ada; echo "replace $?"
            printf pw3 | secret-tool store --label='GitHub token' service github.com username bob; echo "another $?"
            secret-tool lookup service github.com username ada; echo " lookup $?"
            "$K" ls default
            secret-tool search --all service github.com 2>&1 | grep -E '^(\\[|label|attribute)' | sort
            # Written over the bus, read with cat; written with printf, found over the bus with its attributes.
            "$K" mount "$R/mnt" && cat "$R/mnt/default/GitHub token" && echo &&
                printf 'from a mount' > "$R/mnt/default/GitHub token" && "$K" unmount "$R/mnt"
            secret-tool lookup service github.com username ada; echo " lookup $?"
            secret-tool clear service github.com username bob; echo "clear $?"
            "$K" ls default
            """, environment: Self.pinentryEnvironment)
        #expect(
            used.stdout == """
                store 0
                replace 0
                another 0
                pw2 lookup 0
                GitHub token
                GitHub token (2)
                [/GitHub_20token]
                [/GitHub_20token_20_282_29]
                attribute.service = github.com
                attribute.service = github.com
                attribute.username = ada
                attribute.username = bob
                label = GitHub token
                label = GitHub token
                pw2
                from a mount lookup 0
                clear 0
                GitHub token

                """, "\(used)")
    }

    /// `keychainfs:accessible` chooses the class: an `always` item reads
    /// while locked, a `whenUnlocked` one is found locked; a class that
    /// does not exist is refused and nothing is stored.
    @Test func anAttributeChoosesTheProtectionClass() throws {
        let stored = onBus(
            """
            printf wifi | secret-tool store --label=Wi-Fi keychainfs:accessible always ssid home; echo "store $?"
            printf x | secret-tool store --label=bad keychainfs:accessible sometimes ssid bad 2>&1; echo "bad $?"
            "$K" ls default
            "$K" lock
            secret-tool lookup ssid home; echo " locked lookup $?"
            secret-tool lookup keychainfs:accessible always ssid home; echo " $?"
            """)
        #expect(stored.stdout.hasPrefix("store 0\n"), "\(stored)")
        #expect(stored.stdout.contains("keychainfs:accessible names no protection class: sometimes"), "\(stored)")
        #expect(stored.stdout.hasSuffix("bad 1\nWi-Fi\nwifi locked lookup 0\nwifi 0\n"), "\(stored)")
    }

    /// libsecret answers IsLocked by unlocking (a prompt, through pinentry)
    /// and storing again: the item lands once the passcode is given, after
    /// a wrong one that counts and is logged with secret-tool as the program.
    @Test func storingIntoALockedKeychainAsksForThePasscodeFirst() throws {
        try writeScriptedPinentry(answers: "wrong-one\n" + MountHarness.passcode + "\n")
        let stored = onBus(
            """
            printf s3cret | secret-tool store --label=token service example; echo "store $?"
            "$K" status | grep '^state'
            secret-tool lookup service example; echo
            cat "$R/pinentry.log"
            """, locked: true, environment: Self.pinentryEnvironment)
        #expect(
            stored.stdout == """
                store 0
                state: unlocked
                s3cret
                secret-tool asks to unlock your keychain.
                secret-tool asks to unlock your keychain.
                Wrong passcode

                """, "\(stored)")
        let log = harness.sh("\"$K\" log --keychain \"$KC\" | grep ' unlock ' | grep 'exe=/usr/bin/secret-tool'")
        #expect(
            log.stdout.split(separator: "\n").count == 2 && log.stdout.contains(" unlock refused ")
                && log.stdout.contains(" unlock ok "), "\(log)")
    }

    /// What the client libraries' own suites found, run against the device
    /// as they run against gnome-keyring (docs/SECRET-SERVICE.md, "The
    /// clients' own tests"): secretstorage's and keyring's tests run as
    /// `python3 -m pytest`, a program that cannot be identified, whose items
    /// belonged to nobody, so the very process that made one was asked about
    /// it a moment later, and with nobody to ask was refused it; an item's
    /// attributes held `keychainfs:` ones that libsecret refuses when handed
    /// back (keyring's libsecret backend deleted nothing); a path outside
    /// ours answered UnknownObject, which secretstorage 3.3 (Debian 12's)
    /// does not take for "no such item"; and each item named after a taken
    /// label tried every taken name first, a failed write in the log each.
    @Test func whatTheClientLibrariesOwnTestsExpectHolds() {
        let used = onBus(
            """
            /usr/bin/python3 -c '
            import secretstorage
            from secretstorage.exceptions import ItemNotFoundException
            connection = secretstorage.dbus_init()
            collection = secretstorage.get_default_collection(connection)
            item = collection.create_item("My item", {"service": "mail", "user": "ada"}, b"pw")
            print("its own item:", item.get_secret().decode(), sorted(item.get_attributes().items()))
            for n in range(4):
                collection.create_item("My item", {"n": str(n)}, b"x")
            item.delete()
            print("deleted:", [i.get_label() for i in collection.search_items({"service": "mail"})])
            try:
                secretstorage.Item(connection, "/not/existing/path")
            except ItemNotFoundException:
                print("a path outside ours: ItemNotFoundException")
            '
            # Another process of the same unidentified kind is another program: asked (nobody can be), refused.
            /usr/bin/python3 -c '
            import secretstorage
            collection = secretstorage.get_default_collection(secretstorage.dbus_init())
            item = next(collection.search_items({"n": "0"}))
            try:
                item.get_secret(); print("another process read it")
            except Exception as error:
                print("another process:", type(error).__name__)
            '
            # Found by the keychainfs attributes all the same.
            secret-tool search --all keychainfs:group default n 3 2>&1 | grep -c '^label = My item'
            "$K" log | grep -c ' set error ' || true
            """, environment: "KEYCHAINFS_PINENTRY=/nonexistent/pinentry")
        #expect(
            used.stdout == """
                its own item: pw [('service', 'mail'), ('user', 'ada')]
                deleted: []
                a path outside ours: ItemNotFoundException
                another process: DBusErrorResponse
                1
                0

                """, "\(used)")
    }

    /// With no display, a lookup in a locked keychain asked for the
    /// passcode nowhere and failed without a word: the unlock prompt now
    /// goes to the terminal of the program that asks, when it runs in its
    /// foreground at a login's terminal, as the owner rule's questions do.
    @Test func aLockedKeychainAsksForThePasscodeAtTheAskersTerminal() throws {
        let logins = try LoginRecords(uid: harness.user?.uid ?? getuid(), in: harness.root)
        defer { withExtendedLifetime(logins) {} }
        try """
        import os, pty, re, select, sys, time
        \(LoginRecords.pythonRecordLogin)
        pid, terminal = pty.fork()
        if pid == 0:
            record_login(True)  # a login's terminal, as logind recorded it
            os.execv(sys.argv[1], sys.argv[1:])
        screen, answered, deadline = b"", False, time.monotonic() + 60
        while time.monotonic() < deadline:
            if not select.select([terminal], [], [], 1)[0]:
                continue
            try:
                screen += os.read(terminal, 4096)
            except OSError:
                break
            if not answered and b"asks to unlock your keychain" in screen:
                answered = True
                os.write(terminal, os.environ["PASSCODE"].encode() + b"\\r")
        os.waitpid(pid, 0)
        print("asked at the terminal:", "yes" if answered else "no")
        print("the value:", "pw1" if b"pw1" in screen.split(b"keychain")[-1] else "none")
        """.write(toFile: harness.root + "/unlock.py", atomically: true, encoding: .utf8)
        let used = onBus(
            """
            printf pw1 | secret-tool store --label=token service example.org
            "$K" lock
            PASSCODE="$PASSCODE" /usr/bin/python3 "$R/unlock.py" /usr/bin/secret-tool lookup service example.org
            "$K" status | head -1
            """, environment: "KEYCHAINFS_PINENTRY=/usr/bin/pinentry-curses")
        #expect(used.stdout == "asked at the terminal: yes\nthe value: pw1\nstate: unlocked\n", "\(used)")
    }

    /// A script file (code from standard input or `-c` is nobody's to own,
    /// and every use of it would be asked about: docs/SECRET-SERVICE.md,
    /// "Whose an item is").
    @Test func pythonsKeyringKeepsItsPasswords() {
        let kept = onBus(
            """
            cat > "$R/mail.py" <<'PY'
            import keyring
            from keyring.backends import SecretService
            keyring.set_keyring(SecretService.Keyring())
            keyring.set_password('imap.example.org', 'ada', 'first')
            keyring.set_password('imap.example.org', 'ada', 'second')
            keyring.set_password('imap.example.org', 'bob', 'other')
            print(keyring.get_password('imap.example.org', 'ada'), keyring.get_password('imap.example.org', 'bob'))
            keyring.delete_password('imap.example.org', 'bob')
            print(keyring.get_password('imap.example.org', 'bob'))
            PY
            /usr/bin/python3 "$R/mail.py"
            "$K" ls default | wc -l
            """)
        #expect(kept.stdout == "second other\nNone\n1\n", "\(kept)")
    }

    /// git's own libsecret helper, built from the contrib sources Debian's
    /// git ships, stores, fills (through git itself) and erases a credential.
    @Test func gitsLibsecretHelperStoresFillsAndErases() throws {
        let contrib = "/usr/share/doc/git/contrib/credential/libsecret/git-credential-libsecret.c"
        let built = harness.sh(
            """
            gcc -O2 -o "$R/git-credential-libsecret" "\(contrib)" $(pkg-config --cflags --libs libsecret-1 glib-2.0)
            """)
        try #require(built.succeeded, "\(built)")
        let credential = onBus(
            """
            helper="$R/git-credential-libsecret"
            printf 'protocol=https\\nhost=git.example.com\\nusername=ada\\npassword=hunter2\\n\\n' | "$helper" store >/dev/null
            printf 'protocol=https\\nhost=git.example.com\\n\\n' | git -c credential.helper="$helper" credential fill
            secret-tool search server git.example.com 2>&1 | grep -E '^(label|attribute.(user|protocol))' | sort
            printf 'protocol=https\\nhost=git.example.com\\nusername=ada\\n\\n' | "$helper" erase >/dev/null
            secret-tool lookup server git.example.com; echo "after erase $?"
            """)
        #expect(
            credential.stdout == """
                protocol=https
                host=git.example.com
                username=ada
                password=hunter2
                attribute.protocol = https
                attribute.user = ada
                label = Git: https://git.example.com/
                after erase 1

                """, "\(credential)")
    }

    /// An item's Label and Attributes can be set (Seahorse renames items
    /// so); its value stays. Locked, the change is refused and nothing
    /// changes. The item is secret-tool's: the person allows Python once
    /// for each change and read (ItemOwnershipTests has the questions).
    @Test func anItemsLabelAndAttributesCanBeSet() throws {
        try writeScriptedPinentry(answers: "")
        let set = onBus(
            """
            printf v | secret-tool store --label=old app mail
            /usr/bin/python3 - <<'PY'
            import secretstorage
            conn = secretstorage.dbus_init()
            item = next(secretstorage.get_default_collection(conn).search_items({'app': 'mail'}))
            item.set_label('new label')
            item.set_attributes({'app': 'mail', 'user': 'ada', 'keychainfs:group': 'ignored'})
            print(item.get_label(), sorted(item.get_attributes().items()), item.get_secret())
            PY
            "$K" lock
            busctl --user call org.freedesktop.secrets /org/freedesktop/secrets/collection/default/old \\
                org.freedesktop.DBus.Properties Set ssv org.freedesktop.Secret.Item Label s other 2>&1; echo "locked $?"
            secret-tool search app mail 2>&1 | grep '^label'
            """, environment: Self.pinentryEnvironment)
        #expect(
            set.stdout.hasPrefix(
                """
                new label [('app', 'mail'), ('user', 'ada')] b'v'

                """), "\(set)")
        #expect(set.stdout.contains("is locked") && set.stdout.hasSuffix("locked 1\nlabel = new label\n"), "\(set)")
    }

    /// A secret past the device's 1 MiB is an error through the bus and
    /// stores nothing (details past their limits are the handler's:
    /// InProcessProviderTests.badItemsAreRefusedAndChangeNothing).
    @Test func aSecretPastTheLimitIsRefusedAndChangesNothing() {
        let refused = onBus(
            """
            /usr/bin/python3 - <<'PY'
            import secretstorage
            conn = secretstorage.dbus_init()
            collection = secretstorage.get_default_collection(conn)
            def attempt(name, **arguments):
                arguments.setdefault('attributes', {'app': 'test'})
                arguments.setdefault('label', 'item')
                arguments.setdefault('secret', b'x')
                try:
                    collection.create_item(**arguments)
                    print(name, 'stored')
                except Exception as error:
                    print(name, type(error).__name__, str(error).split(':')[0][:60])
            attempt('huge secret', secret=b'x' * (1024 * 1024 + 1))
            attempt('fine')
            PY
            "$K" ls default
            """)
        let lines = refused.stdout.split(separator: "\n").map(String.init)
        #expect(lines.count == 3, "\(refused)")
        #expect(lines.first?.hasPrefix("huge secret DBusErrorResponse") == true, "\(refused)")
        #expect(lines.suffix(2) == ["fine stored", "item"], "\(refused)")
    }
}

/// `keychainfs import secret-service` (docs/SECRET-SERVICE.md,
/// "Moving in from gnome-keyring"): gnome-keyring's items move in whole,
/// and once keychainfs serves the bus the programs that stored them find
/// them by their own attributes.
extension SerialTests.SecretServiceTests {
    /// Runs `script` on a private session bus where gnome-keyring, as a
    /// session starts it (its login keyring made with a password on
    /// stdin), serves org.freedesktop.secrets. It runs in the foreground,
    /// so its pid is ours to end, and the bus says when it serves.
    func onGnomeKeyringBus(_ script: String) -> ShellResult {
        let prelude = """
            export HOME="$R/home" KEYCHAINFS_KEYCHAIN="$KC"
            mkdir -p "$HOME"
            printf keyring-password | gnome-keyring-daemon --foreground --unlock --components=secrets >/dev/null &
            keyring=$!
            trap '"$K" stop; kill "$keyring" 2>/dev/null' EXIT
            gdbus wait --session --timeout 10 org.freedesktop.secrets || exit 97

            """
        return harness.sh(
            "PASSCODE=\"$2\" dbus-run-session -- sh -c \"$1\" 2> \"$R/bus.err\"; cat \"$R/bus.err\" >&2",
            arguments: [prelude + script, MountHarness.passcode])
    }

    @Test func importBringsGnomeKeyringsItemsOverWhole() {
        let moved = onGnomeKeyringBus(
            """
            printf pw1 | secret-tool store --label='GitHub token' service github.com username ada
            printf pw2 | secret-tool store --label=Mail service imap user bob
            printf '%s\\n' "$PASSCODE" | "$K" unlock || exit 98
            "$K" import secret-service --dry-run 2>&1 | sort
            "$K" import secret-service > "$R/first" 2>&1; echo "import $?"; sort "$R/first"
            "$K" import secret-service > "$R/again" 2>&1; echo "again $?"; sort "$R/again"
            "$K" get "default/GitHub token"; echo
            # keychainfs takes the bus over once gnome-keyring (which allows no
            # replacement) has gone and the bus has said so: the programs find
            # their items by their own attributes.
            /usr/bin/python3 - "$keyring" <<'PY'
            import os, signal, sys
            from jeepney import MatchRule, message_bus
            from jeepney.io.blocking import open_dbus_connection
            conn = open_dbus_connection(bus='SESSION')
            rule = MatchRule(type='signal', sender='org.freedesktop.DBus', interface='org.freedesktop.DBus',
                             member='NameOwnerChanged')
            rule.add_arg_condition(0, 'org.freedesktop.secrets')
            conn.send_and_get_reply(message_bus.AddMatch(rule))
            with conn.filter(rule) as queue:
                os.kill(int(sys.argv[1]), signal.SIGTERM)
                while conn.recv_until_filtered(queue).body[2] != '':
                    pass
            PY
            "$K" stop && "$K" start --secret-service || exit 96
            printf '%s\\n' "$PASSCODE" | "$K" unlock
            secret-tool lookup service github.com username ada; echo " lookup $?"
            secret-tool search service imap 2>&1 | grep -E '^(label|attribute.user)'
            "$K" import secret-service 2>&1; echo "from itself $?"
            # Claimed for secret-tool, it stays secret-tool's to read.
            printf '%s\\n' "$PASSCODE" | "$K" acl "default/GitHub token" --claim /usr/bin/secret-tool | cut -d' ' -f1-5
            secret-tool lookup service github.com username ada; echo " claimed lookup $?"
            "$K" acl "default/GitHub token"
            """)
        #expect(
            moved.stdout == """
                import   Login/GitHub token -> default/GitHub token
                import   Login/Mail -> default/Mail
                would import 2, keep 0 (a dry run: nothing was stored)
                import 0
                2 imported, 0 kept, 0 failed
                imported Login/GitHub token -> default/GitHub token
                imported Login/Mail -> default/Mail
                imported items belong to no program: every program of yours reads them over the bus; `keychainfs acl GROUP/ID --claim PROGRAM` makes one a program's, as if it had made it
                again 0
                0 imported, 2 kept, 0 failed
                kept     Login/GitHub token -> default/GitHub token (imported before; --force replaces it)
                kept     Login/Mail -> default/Mail (imported before; --force replaces it)
                pw1
                pw1 lookup 0
                label = Mail
                attribute.user = bob
                keychainfs: the Secret Service on this bus is keychainfs itself: nothing to import
                from itself 1
                default/GitHub token belongs to /usr/bin/secret-tool
                pw1 claimed lookup 0
                owner: /usr/bin/secret-tool (package libsecret-tools)

                """, "\(moved)")
    }

    /// A locked collection is reported, not read, and the import says it failed.
    @Test func importSkipsALockedCollection() {
        let skipped = onGnomeKeyringBus(
            """
            printf pw1 | secret-tool store --label=token service example
            busctl --user call org.freedesktop.secrets /org/freedesktop/secrets org.freedesktop.Secret.Service \\
                Lock ao 1 /org/freedesktop/secrets/collection/login >/dev/null
            printf '%s\\n' "$PASSCODE" | "$K" unlock || exit 98
            "$K" import secret-service 2>&1; echo "import $?"
            "$K" ls default | wc -l
            """)
        #expect(
            skipped.stdout.hasSuffix(
                """
                failed   Login: locked (unlock it in its provider first)
                0 imported, 0 kept, 1 failed
                import 1
                0

                """), "\(skipped)")
    }
}

extension SerialTests.SecretServiceTests {
    /// libsecret's `session` collection (`SECRET_COLLECTION_SESSION`), which
    /// gnome-keyring always has: clients that stored there got NoSuchObject
    /// ('no collection session'). It is there under its alias and path, its
    /// items are found, read, replaced and deleted as any collection's,
    /// while the keychain is locked too, and none of it reaches the disk:
    /// no file of the keychain holds the secret, and once the device stops
    /// the collection is empty.
    @Test func theSessionCollectionKeepsItemsInMemoryForTheDevicesLife() throws {
        // A script file, as a client is: its items are its own (an interpreter reading stdin is nobody).
        try """
        import sys, secretstorage
        connection = secretstorage.dbus_init()
        session = secretstorage.get_collection_by_alias(connection, 'session')
        found = lambda: list(session.search_items({'app': 'kcfs-session-test'}))
        if sys.argv[1] == 'store':
            print(session.collection_path)
            session.create_item('Temporary', {'app': 'kcfs-session-test'}, b'session-s3cret')
            session.create_item('Temporary', {'app': 'kcfs-session-test'}, b'replaced-s3cret', replace=True)
            print(len(found()), found()[0].get_label(), found()[0].get_secret().decode())
            everywhere = list(secretstorage.search_items(connection, {'app': 'kcfs-session-test'}))
            print('searched across collections:', len(everywhere))
        elif sys.argv[1] == 'read':
            print(sys.argv[2] + ':', found()[0].get_secret().decode(), found()[0].is_locked())
        elif sys.argv[1] == 'delete':
            found()[0].delete()
            print('deleted:', len(found()))
        elif sys.argv[1] == 'keep':
            session.create_item('Kept', {'app': 'kcfs-session-test'}, b'kept-s3cret')
        else:
            print(sys.argv[2] + ':', len(found()))

        """.write(toFile: harness.root + "/session.py", atomically: true, encoding: .utf8)
        let used = onBus(
            """
            /usr/bin/python3 "$R/session.py" store
            "$K" lock
            /usr/bin/python3 "$R/session.py" read 'while locked'
            /usr/bin/python3 "$R/session.py" delete
            /usr/bin/python3 "$R/session.py" keep
            /usr/bin/python3 "$R/session.py" count 'kept'
            grep -rlE 'replaced-s3cret|kept-s3cret' "$KC" || echo "no file holds it"
            "$K" stop && "$K" start --secret-service > /dev/null
            /usr/bin/python3 "$R/session.py" count 'after a restart'
            """)
        #expect(
            used.stdout == """
                /org/freedesktop/secrets/collection/session
                1 Temporary replaced-s3cret
                searched across collections: 1
                while locked: replaced-s3cret False
                deleted: 0
                kept: 1
                no file holds it
                after a restart: 0

                """, "\(used)")
    }
}

extension SerialTests.SecretServiceTests {
    /// A collection's `Label` is read-write in the Secret Service API, and
    /// seahorse and client libraries set it; it answered NotSupported. Now
    /// the label is the collection's own, kept beside its group's name
    /// across restarts of the device, while the mount and the command line
    /// go on calling the group by its name (a booted device is locked: the
    /// label is read all the same); an empty label gives the name back.
    @Test func aCollectionsLabelCanBeSetAndIsKept() throws {
        try """
        import sys, secretstorage
        connection = secretstorage.dbus_init()
        collection = secretstorage.get_default_collection(connection)
        session = secretstorage.get_collection_by_alias(connection, 'session')
        if sys.argv[1] == 'set':
            collection.set_label('Work passwords')
            session.set_label('Scratch')
        elif sys.argv[1] == 'clear':
            collection.set_label('')
        print(collection.get_label(), '/', session.get_label())

        """.write(toFile: harness.root + "/label.py", atomically: true, encoding: .utf8)
        let used = onBus(
            """
            /usr/bin/python3 "$R/label.py" show
            /usr/bin/python3 "$R/label.py" set
            "$K" stop && "$K" start --secret-service > /dev/null
            /usr/bin/python3 "$R/label.py" show
            "$K" ls
            printf '%s\\n' "$PASSCODE" | "$K" unlock
            /usr/bin/python3 "$R/label.py" clear
            """)
        #expect(
            used.stdout == """
                default / session
                Work passwords / Scratch
                Work passwords / session
                default
                default / session

                """, "\(used)")
    }
}
