import Foundation
import Testing
import TestSupport

extension SerialTests {
    /// An item a program made over the bus is its own on every door, not only
    /// the bus (docs/SECURITY.md, "An application's secrets on every door").
    /// Each test is an attack from that section's table, run as an ordinary
    /// user the test makes (the attacker is a program of the keychain's own
    /// user), with app-a owning an item and the pinentry the device takes as
    /// its judge (root's file) answering for the person.
    @Suite struct OwnerRuleTests {
        let harness: MountHarness
        let judge: JudgePinentry

        init() throws {
            let fixture = try OwnerRuleFixture()
            (harness, judge) = (fixture.harness, fixture.judge)
        }

        /// With no display (SSH, a server, a console) the question could not
        /// be shown, so another program's item was never readable, and the
        /// message blamed the person. Now a program run in the foreground of
        /// a terminal is asked about there (pinentry's curses, at that
        /// terminal), and the person answers by typing the code the question
        /// shows: the code for once allows once, the code for always puts
        /// the program on the item's list, anything else denies. A program
        /// in the background of the terminal (its own process group) is not
        /// asked at all, and is told nobody could be asked; nor is one that
        /// joined the foreground group of the command, or of the shell at
        /// its prompt, or made its own group the foreground (tcsetpgrp)
        /// while the shell sat at its prompt; nor one run at a terminal a
        /// program made for itself, not a login's, which read the question
        /// off the terminal and typed its code (an outsider's attack).
        @Test func aPersonAtATerminalAnswersForTheProgramTheyRan() throws {
            let logins = try LoginRecords(uid: harness.user?.uid ?? getuid(), in: harness.root)
            defer { withExtendedLifetime(logins) {} }
            try """
            import fcntl, os, pty, re, select, signal, struct, subprocess, sys, termios, time
            \(LoginRecords.pythonRecordLogin)
            # At a terminal of its own (80 columns would wrap the question): runs argv[2:]; answers by argv[1].
            rule, command = sys.argv[1], sys.argv[2:]
            pid, terminal = pty.fork()
            if pid == 0:
                # The terminal of a login root recorded (a console login's), as a person's is; a program of the
                # user that made one for itself ("own") has none, and answers its own question if asked; one
                # that waited for the person's login terminal to close while the login's record stayed (a
                # connection that carries several terminals), and opened terminals until it had that number
                # ("reused"), has a terminal made after the login began, and answers its own question if asked.
                record_login(rule != "own", 60 if rule == "reused" else 0)
            if pid == 0 and rule == "join":
                # The person's shell (this session's leader) runs a command in the foreground; a background job
                # of the same shell joins the command's process group (no tcsetpgrp) and asks meanwhile.
                command_pid = os.fork()
                if command_pid == 0:
                    os.setpgid(0, 0)
                    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
                    os.tcsetpgrp(0, os.getpgrp())
                    time.sleep(30)
                    os._exit(0)
                while os.tcgetpgrp(0) != command_pid:
                    time.sleep(0.01)
                if os.fork() == 0:
                    os.setpgid(0, 0)
                    os.setpgid(0, os.tcgetpgrp(0))
                    os.execv(command[0], command)
                os.wait()
                os.kill(command_pid, signal.SIGKILL)
                os._exit(0)
            if pid == 0 and rule == "idle":
                # The person's shell (this session's leader) sits at its prompt, reading the terminal; a
                # background job of it joins the shell's own group, the foreground one, and asks.
                job = os.fork()
                if job == 0:
                    os.setpgid(0, 0)
                    os.setpgid(0, os.tcgetpgrp(0))
                    os.execv(command[0], command)
                while os.waitpid(job, os.WNOHANG) == (0, 0):
                    select.select([0], [], [], 0.2)
                os._exit(0)
            if pid == 0 and rule == "seize":
                # The person's shell sits at its prompt; a background job of it, ignoring SIGTTOU, makes its own
                # process group the terminal's foreground (tcsetpgrp) and asks: it leads that group.
                job = os.fork()
                if job == 0:
                    os.setpgid(0, 0)
                    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
                    os.tcsetpgrp(0, os.getpgrp())
                    signal.signal(signal.SIGTTOU, signal.SIG_DFL)
                    os.execv(command[0], command)
                while os.waitpid(job, os.WNOHANG) == (0, 0):
                    select.select([0], [], [], 0.2)
                os._exit(0)
            if pid == 0 and rule == "alias":
                # The person's login shell sits at its prompt; a program of the user mounts a devpts of its own
                # (a user namespace of its making: no privilege), opens terminals there until it has the number
                # of the person's, and makes that one the controlling terminal of a session of its own.
                import ctypes, socket
                index = int(os.ttyname(0).rsplit("/", 1)[1])
                job = os.fork()
                if job == 0:
                    ours, theirs = socket.socketpair()
                    if os.fork() == 0:
                        libc = ctypes.CDLL(None, use_errno=True)
                        uid, gid = os.getuid(), os.getgid()
                        if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
                            os._exit(3)
                        for name, text in (("uid_map", "0 %d 1" % uid), ("setgroups", "deny"), ("gid_map", "0 %d 1" % gid)):
                            with open("/proc/self/" + name, "w") as f:
                                f.write(text)
                        points = os.environ["R"] + "/alias-%d" % os.getpid()  # removed with the test's directory
                        os.mkdir(points)
                        if libc.mount(b"devpts", points.encode(), b"devpts", 0, b"newinstance,ptmxmode=0666") != 0:
                            os._exit(4)
                        masters = []
                        while True:
                            master = os.open(points + "/ptmx", os.O_RDWR | os.O_NOCTTY)
                            masters.append(master)
                            number = struct.unpack("I", fcntl.ioctl(master, 0x80045430, b"\\0" * 4))[0]  # TIOCGPTN
                            if number == index or number > index + 64:
                                break
                        fcntl.ioctl(master, 0x40045431, struct.pack("i", 0))  # TIOCSPTLCK
                        slave = os.open("%s/%d" % (points, number), os.O_RDWR | os.O_NOCTTY)
                        socket.send_fds(theirs, [b"x"], [master, slave])
                        time.sleep(30)
                        os._exit(0)
                    theirs.close()
                    _, received, _, _ = socket.recv_fds(ours, 1, 2)
                    if len(received) != 2:
                        os._exit(5)  # no terminal of that number: nothing to try
                    master, slave = received
                    os.setsid()
                    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
                    for standard in (0, 1, 2):
                        os.dup2(slave, standard)
                    os.execv(command[0], command)
                while os.waitpid(job, os.WNOHANG) == (0, 0):
                    select.select([0], [], [], 0.2)
                os._exit(0)
            if pid == 0 and rule == "script":
                # The session's leader is a shell running a script (as over `ssh -t HOST 'a; b'`): it waits
                # for the command it runs, which is asked.
                os.execv("/bin/bash", ["bash", "-c", '"$0" "$@"; true'] + command)
            if pid == 0:
                # In the background: a process group of its own, which a session's leader cannot make.
                if rule in ("background", "inject") and os.fork() != 0:
                    os._exit(os.waitstatus_to_exitcode(os.wait()[1]))
                if rule in ("background", "inject"):
                    os.setpgid(0, 0)
                if rule == "inject":
                    # A program of the user at the person's terminal takes its foreground, asks, and types
                    # the answer itself (TIOCSTI, where the kernel allows it): it cannot see the code.
                    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
                    os.tcsetpgrp(0, os.getpgrp())
                    if os.fork() == 0:
                        os.execv(command[0], command)
                    while subprocess.run(["pgrep", "-u", str(os.getuid()), "pinentry"], capture_output=True).returncode:
                        time.sleep(0.05)
                    for byte in b"aaaaa\\r":
                        try:
                            fcntl.ioctl(0, termios.TIOCSTI, bytes([byte]))
                        except OSError:
                            break  # dev.tty.legacy_tiocsti 0: the kernel allows no such typing
                    os._exit(os.waitstatus_to_exitcode(os.wait()[1]))
                os.execv(command[0], command)
            fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 220, 0, 0))
            screen, answered = b"", False
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if not select.select([terminal], [], [], 1)[0]:
                    continue
                try:
                    chunk = os.read(terminal, 4096)
                except OSError:
                    break  # EIO: every process of the terminal closed it
                screen += chunk
                shown = re.sub(rb"\\x1b(\\[[0-9;?]*[A-Za-z@]|[()][0-9A-Za-z]|[=>])", b"", screen)
                found = re.search(rb"this once, type ([a-z]{5})(; to allow it every time from now on, type ([a-z]{5}))?", shown)
                if found and not answered:
                    answered = True
                    if rule in ("inject", "join", "idle", "seize", "alias"):
                        continue  # the person types nothing
                    typed = {"once": found.group(1), "script": found.group(1), "always": found.group(3) or b"",
                             "own": found.group(1), "reused": found.group(1), "wrong": b"abcde"}[rule]
                    os.write(terminal, typed + b"\\r")
            os.waitpid(pid, 0)
            shown = re.sub(rb"\\x1b(\\[[0-9;?]*[A-Za-z@]|[()][0-9A-Za-z]|[=>])", b"", screen)
            print(f"{rule}: asked {'yes' if answered else 'no'}, got {'hunter2' if b'hunter2' in shown else 'nothing'}")
            """.write(toFile: harness.root + "/terminal.py", atomically: true, encoding: .utf8)
            let used = harness.onBus(
                """
                "$R/app-a" store mail hunter2
                for rule in wrong background join idle seize own reused alias inject once script always; do
                    /usr/bin/python3 "$R/terminal.py" $rule "$R/app-b" lookup mail
                done
                # Allowed for good: asked no more, with no terminal at all.
                "$R/app-b" lookup mail < /dev/null
                "$K" acl "default/App a" | grep -c app-b
                # The denials (the log folds repeated ones into a count) and the two allowed answers.
                "$K" log | grep -c ' ask denied ' | sed 's/^[1-9][0-9]*$/denied/'
                "$K" log | grep ' ask allowed' | sed 's/.* ask \\([a-z-]*\\) .*/\\1/'
                """, environment: "KEYCHAINFS_PINENTRY=/usr/bin/pinentry-curses")
            #expect(
                used.stdout == """
                    wrong: asked yes, got nothing
                    background: asked no, got nothing
                    join: asked no, got nothing
                    idle: asked no, got nothing
                    seize: asked no, got nothing
                    own: asked no, got nothing
                    reused: asked no, got nothing
                    alias: asked no, got nothing
                    inject: asked yes, got nothing
                    once: asked yes, got hunter2
                    script: asked yes, got hunter2
                    always: asked yes, got hunter2
                    hunter2
                    1
                    denied
                    allowed-once
                    allowed-once
                    allowed-always

                    """, "\(used)")
        }

        /// `keychainfs get`, `set`, `rm` and `backup`, and `cat`, a write,
        /// `rm`, `mv` and `setfattr` (the class, the label) through a mount:
        /// each is asked about,
        /// and a denial leaves the owner's item as it was (EACCES through
        /// the mount, exit 4 and a sentence saying whose it is from the
        /// command line). Before the owner rule held on every door, every one
        /// of them went through without a question.
        @Test func everyDoorAsksAboutAnItemAnotherProgramOwns() throws {
            _ = try harness.prepareMountpoint("mnt")
            try JudgePinentry.answer([], in: harness)
            let used = harness.onBus(
                """
                "$R/app-a" store mail hunter2
                "$K" get "default/App a" 2> "$R/get.err"; echo "get $?"
                printf stolen | "$K" set "default/App a"; echo "set $?"
                "$K" rm "default/App a"; echo "rm $?"
                printf 'pw-1234\\npw-1234\\n' | "$K" backup "$R/copy.kcb"; echo "backup $? $(ls "$R" | grep -c kcb)"
                "$K" mount "$R/mnt" || exit 97
                cat "$R/mnt/default/App a"; echo "cat $?"
                (printf stolen > "$R/mnt/default/App a") 2>/dev/null; echo "write $?"
                rm "$R/mnt/default/App a"; echo "rm $?"
                mv "$R/mnt/default/App a" "$R/mnt/default/mine"; echo "mv $?"
                setfattr -n user.keychain.accessible -v always "$R/mnt/default/App a"; echo "setfattr $?"
                setfattr -n user.keychain.label -v stolen "$R/mnt/default/App a"; echo "label $?"
                getfattr --only-values -n user.keychain.label "$R/mnt/default/App a"; echo
                ls "$R/mnt/default"
                "$K" unmount "$R/mnt"
                "$R/app-a" lookup mail
                sed "s|$R/||g" "$R/get.err"
                """, environment: judge.environment)
            #expect(
                used.stderr.contains("keychainfs: cannot back up: the keychain holds items other programs own"),
                "\(used)")
            #expect(
                used.stdout.contains(
                    "\nkeychainfs: default/App a belongs to app-a (sha256 ")
                    && used.stdout.contains(
                        "the person denied this program, or nobody could be asked (no display to show the question "
                            + "on and the program not run in the foreground of a terminal, no pinentry that root "
                            + "installed, or no answer within 60 s); `keychainfs acl 'default/App a' --add PROGRAM` "
                            + "allows a program ahead of time"),
                "\(used)")
            #expect(
                used.stdout.hasPrefix(
                    """
                    get 4
                    set 4
                    rm 4
                    backup 4 0
                    cat 1
                    write 2
                    rm 1
                    mv 1
                    setfattr 1
                    label 1
                    App a
                    App a
                    hunter2

                    """), "\(used)")
            for refused in ["cat: ", "rm: cannot remove", "mv: cannot move", "setfattr: "] {
                #expect(
                    used.stderr.split(separator: "\n").contains {
                        $0.hasPrefix(refused) && $0.hasSuffix("Permission denied")
                    }, "\(refused) \(used.stderr)")
            }
            // Ten questions, each denied and in the log with the program asked about.
            let log = harness.sh(
                "\"$K\" log --keychain \"$KC\" | grep ' ask denied ' | sed 's/.*exe=\\([^ ]*\\).*/\\1/' | xargs -n1 basename"
            )
            #expect(
                log.stdout == "keychainfs\nkeychainfs\nkeychainfs\nkeychainfs\ncat\ndash\nrm\nmv\nsetfattr\nsetfattr\n",
                "\(log)")
        }

        /// Allowed once, the person's own `keychainfs get` prints the key.
        /// The question names who ran it, and a deputy (keychainfs itself,
        /// which acts for whatever runs it) is never offered "Always allow";
        /// `cat` is.
        @Test func theQuestionNamesWhoRanTheProgramAndDeputiesAreAllowedOnceAtMost() throws {
            _ = try harness.prepareMountpoint("mnt")
            try JudgePinentry.answer(["once", "always", "once"], in: harness)
            let used = harness.onBus(
                """
                "$R/app-a" store mail hunter2
                "$K" get "default/App a"; echo " get $?"
                "$K" mount "$R/mnt" || exit 97
                cat "$R/mnt/default/App a"; echo " cat $?"
                cat "$R/mnt/default/App a"; echo " cat $?"
                "$K" unmount "$R/mnt"
                "$K" get "default/App a"; echo " get $?"
                "$K" acl "default/App a" | sed "s|sha256 [0-9a-f]*|sha256|"
                # Taken off the list, cat is asked again (no answer left: denied), whatever the mount remembered.
                "$K" mount "$R/mnt" && cat "$R/mnt/default/App a" >/dev/null && echo "cat still reads"
                printf '%s\\n' "$PASSCODE" | "$K" acl "default/App a" --remove /usr/bin/cat >/dev/null
                cat "$R/mnt/default/App a" 2>/dev/null; echo "cat $?"
                "$K" unmount "$R/mnt"
                """, environment: judge.environment)
            #expect(
                used.stdout == """
                    hunter2 get 0
                    hunter2 cat 0
                    hunter2 cat 0
                    hunter2 get 0
                    owner: \(harness.root)/app-a (sha256…)
                    allowed: /usr/bin/cat (package coreutils)
                    cat still reads
                    cat 1

                    """, "\(used)")
            let questions = try String(contentsOfFile: harness.root + "/pinentry.log", encoding: .utf8)
                .split(separator: "\n")
            #expect(questions.count == 4, "\(questions)")
            #expect(
                questions.first?.hasPrefix(harness.root + "/bin/keychainfs (sha256 ") == true
                    && questions.first?.contains(" wants to read the secret of \"App a\" in default, which belongs to ")
                        == true
                    && questions.first?.contains(
                        ". It was started by \"/usr/bin/dash\" (package dash) ← \"/usr/bin/dbus-run-session\" "
                            + "(package dbus-daemon)."
                    ) == true
                    && questions.first?.hasSuffix("It acts for whatever ran it, so it can be allowed only once.")
                        == true,
                "\(questions)")
            #expect(questions[1].hasPrefix("/usr/bin/cat (package coreutils) wants to read"), "\(questions)")
            // "Always allow" offered to cat (twice), never to keychainfs (twice asked).
            let buttons = try String(contentsOfFile: harness.root + "/buttons.log", encoding: .utf8)
            #expect(buttons.components(separatedBy: "SETNOTOK Always allow").count - 1 == 2, "\(buttons)")
        }

        /// The judge is nobody's to choose: `KEYCHAINFS_PINENTRY` naming a
        /// program the user could write (the attacker's relay that answers
        /// "Always allow") is not run; with no pinentry that root controls
        /// answering, the answer is Deny. `status` names the pinentry, who
        /// started the device, that its program is one the user could
        /// replace, and what a program of the user can still do.
        @Test func aPinentryFromTheCallersEnvironmentIsNeverTheJudge() throws {
            try """
            #!/bin/sh
            echo OK; touch "$R/evil-ran"
            while read -r command rest; do
                case "$command" in CONFIRM) echo "ERR 83886194 Not confirmed" ;; BYE) exit 0 ;; *) echo OK ;; esac
            done
            """.write(toFile: harness.root + "/evil", atomically: true, encoding: .utf8)
            chmod(harness.root + "/evil", 0o755)
            try harness.user?.own(harness.root + "/evil")
            let used = harness.onBus(
                """
                "$R/app-a" store mail hunter2
                "$R/app-b" lookup mail
                [ -e "$R/evil-ran" ] && echo "evil ran" || echo "evil never ran"
                "$K" status | grep -E '^(pinentry|started-by|device-program|per-user-limit):' | sed "s|$R/||g"
                """, environment: "KEYCHAINFS_PINENTRY=\"$R/evil\" PATH=/nonexistent:$PATH")
            let lines = used.stdout.split(separator: "\n").map(String.init)
            #expect(Array(lines.prefix(2)) == ["none", "evil never ran"], "\(used)")
            #expect(lines.contains { $0.hasPrefix("pinentry: ") && !$0.contains("evil") }, "\(used)")
            #expect(lines.contains("started-by: keychainfs ← keychainfs ← dash"), "\(used)")
            #expect(
                lines.contains(
                    "device-program: bin/keychainfs (any program of yours can replace it; "
                        + "install the package for /usr/bin/keychainfs)"), "\(used)")
            #expect(lines.contains { $0.hasPrefix("per-user-limit: ") }, "\(used)")
            // The start and the question are in the log, with the pinentry the device used.
            let log = harness.sh(
                "\"$K\" log --keychain \"$KC\" | grep -E ' (device-start|device-stop|ask) ' | cut -d' ' -f2,3")
            #expect(log.stdout == "device-start ok\nask denied\ndevice-stop ok\n", "\(log)")
            // Gaining and giving up the bus name are in the log too.
            let bus = harness.sh("\"$K\" log --keychain \"$KC\" | grep ' bus-name ' | cut -d' ' -f2-5")
            #expect(
                bus.stdout
                    == "bus-name ok (serving org.freedesktop.secrets)\nbus-name ok (released org.freedesktop.secrets)\n",
                "\(bus)")
            #expect(
                harness.sh("\"$K\" log --keychain \"$KC\" | grep ' device-start '").stdout.contains(
                    "started by keychainfs ← keychainfs ← dash; pinentry "))
        }

        /// A device started with a library preloaded (the attacker's
        /// `LD_PRELOAD=evil.so keychainfs ls`, which the person's later
        /// `start --secret-service` would have joined) does not start.
        @Test func aDeviceRefusesToStartWithALibraryPreloaded() {
            let started = harness.sh(
                """
                export KEYCHAINFS_KEYCHAIN="$KC"
                printf 'void f(void) {}' | gcc -shared -fPIC -x c -o "$R/evil.so" - || exit 97
                LD_PRELOAD="$R/evil.so" "$K" ls default; echo "ls $?"
                LD_LIBRARY_PATH="$R" "$K" start; echo "start $?"
                "$K" status | head -1
                "$K" start && "$K" status | head -1 && "$K" stop
                """)
            #expect(
                started.stdout == "ls 5\nstart 1\nstate: stopped\nstate: locked\n", "\(started)")
            #expect(
                started.stderr.contains(
                    "the device does not start with LD_PRELOAD set: the loader would run the caller's code inside it"),
                "\(started)")
            #expect(started.stderr.contains("the device does not start with LD_LIBRARY_PATH set"), "\(started)")
        }

        /// A restore never carries an owner: a backup that holds app-a's
        /// item (the person allowed the backup) restores it as nobody's;
        /// and a restore that would replace app-a's item is asked about, and
        /// denied changes nothing.
        @Test func aRestorePlantsNoOwnerAndReplacesNoOwnedItemUnasked() throws {
            try JudgePinentry.answer(["once"], in: harness)
            let used = harness.onBus(
                """
                "$R/app-a" store mail hunter2
                printf 'pw-1234\\npw-1234\\n' | "$K" backup "$R/copy.kcb" >/dev/null; echo "backup $?"
                printf '%s\\n%s\\n' "$PASSCODE" "$PASSCODE" | "$K" init --keychain "$R/kc2" >/dev/null 2>&1
                printf '%s\\n' "$PASSCODE" | "$K" unlock --keychain "$R/kc2"
                printf 'pw-1234\\n' | "$K" restore "$R/copy.kcb" --keychain "$R/kc2"
                "$K" acl "default/App a" --keychain "$R/kc2"
                "$K" stop --keychain "$R/kc2"
                "$R/app-a" store mail newer
                printf 'pw-1234\\n' | "$K" restore "$R/copy.kcb" --overwrite; echo "overwrite $?"
                "$R/app-a" lookup mail
                """, environment: judge.environment)
            let lines = used.stdout.split(separator: "\n").map(String.init)
            #expect(lines.first == "backup 0", "\(used)")
            #expect(
                lines.contains(
                    "owner: none (made through a mount or the command line: any program of yours may use it over the bus)"
                ),
                "\(used)")
            #expect(Array(lines.suffix(2)) == ["overwrite 4", "newer"], "\(used)")
        }

        /// One restore at a time per keychain (docs/SECURITY.md, "Costs are
        /// ours to choose"): while a restore runs (here held at the person's
        /// question about app-a's item), a second is refused at once with a
        /// sentence and changes nothing; once the first has ended, the next
        /// runs.
        @Test func aSecondRestoreWhileOneRunsIsRefusedAtOnce() throws {
            try JudgePinentry.answer(["once", "hang"], in: harness)
            let used = harness.onBus(
                """
                "$R/app-a" store mail hunter2
                printf 'pw-1234\\npw-1234\\n' | "$K" backup "$R/copy.kcb" >/dev/null
                "$R/app-a" store mail newer
                (printf 'pw-1234\\n' | "$K" restore "$R/copy.kcb" --overwrite 2>/dev/null; echo "first $?" > "$R/first") &
                tries=0; while [ ! -s "$R/asked" ] && [ $tries -lt 600 ]; do sleep 0.05; tries=$((tries + 1)); done
                printf 'pw-1234\\n' | "$K" restore "$R/copy.kcb"; echo "second $?"
                kill "$(cat "$R/asked")"; wait
                cat "$R/first"
                printf 'pw-1234\\n' | "$K" restore "$R/copy.kcb" 2>&1 | grep -c 'differ from the backup'
                "$R/app-a" lookup mail
                """, environment: judge.environment)
            #expect(
                used.stderr.contains("another restore into this keychain is running; run this one when it has ended"),
                "\(used)")
            #expect(used.stdout == "second 1\nfirst 4\n1\nnewer\n", "\(used)")
        }

        /// Shadow items: an item of no program, given app-a's attributes
        /// (made with `keychainfs set`, its attributes set over the bus)
        /// and named to come first, answered app-a's own lookup with the
        /// attacker's value (libsecret reads the first match). The caller's
        /// own items now come first. An item a traced creator makes belongs
        /// to "a program that could not be identified", never to no
        /// program, so everyone is asked about it, the creator too.
        @Test func aPlantedItemNeverAnswersTheOwnersLookupAndAnUnidentifiedCreatorOwnsNothingFree() throws {
            try JudgePinentry.answer([], in: harness)
            let used = harness.onBus(
                """
                "$R/app-a" store mail hunter2
                printf evil | "$K" set default/0-shadow
                /usr/bin/python3 - <<'PY'
                import secretstorage
                conn = secretstorage.dbus_init()
                item = next(secretstorage.get_default_collection(conn).search_items({'keychainfs:identifier': '0-shadow'}))
                item.set_attributes({'name': 'mail', 'xdg:schema': 'org.example.App'})
                PY
                "$R/app-a" lookup mail
                strace -f -o /dev/null "$R/app-a" store traced v1; echo "traced store $?"
                "$K" acl "default/App a (2)"
                "$R/app-a" lookup traced
                """, environment: judge.environment)
            #expect(
                used.stdout == """
                    hunter2
                    traced store 0
                    owner: a program that could not be identified
                    none

                    """, "\(used)")
            let asked = try String(contentsOfFile: harness.root + "/pinentry.log", encoding: .utf8)
            #expect(asked.contains("which belongs to a program that could not be identified."), "\(asked)")
        }

        /// pinentry-gnome3 draws no third button (its source: "XXX: Add
        /// support for the third option"), so "Always allow" could not be
        /// chosen there. A pinentry that says it is gnome3 is asked twice:
        /// Allow or Deny, then always or only this time. With a flavour that
        /// draws three buttons, one question.
        @Test func alwaysAllowCanBeChosenWithAPinentryOfTwoButtons() throws {
            for (flavor, answers, questions) in [("gnome3", ["once", "once"], 2), ("gnome3:curses", ["always"], 1)] {
                try flavor.write(toFile: harness.root + "/flavor", atomically: true, encoding: .utf8)
                try harness.user?.own(harness.root + "/flavor")
                try JudgePinentry.answer(answers, in: harness)
                unlink(harness.root + "/buttons.log")
                let used = harness.onBus(
                    """
                    "$R/app-a" store \(flavor) hunter2
                    "$R/app-b" lookup \(flavor)
                    "$R/app-b" lookup \(flavor)
                    cat "$R/confirmed"
                    grep -c NOTOK "$R/buttons.log"
                    """, environment: judge.environment)
                #expect(
                    used.stdout == "hunter2\nhunter2\n\(questions)\n\(flavor == "gnome3" ? 0 : 1)\n",
                    "\(flavor): \(used)")
            }
            let asked = try String(contentsOfFile: harness.root + "/pinentry.log", encoding: .utf8)
            #expect(asked.contains(" Allow it every time from now on, without asking?"), "\(asked)")
        }

        /// An interpreter is its script: items made through Python's
        /// secretstorage belonged to python3, so every Python script read
        /// them silently. Now they are the script's; another script, code
        /// from standard input and a script run with PYTHONPATH set (code
        /// loaded into the interpreter) are each asked about.
        @Test func anInterpretersItemIsItsScripts() throws {
            try """
            import sys, secretstorage
            collection = secretstorage.get_default_collection(secretstorage.dbus_init())
            if sys.argv[1] == 'store':
                collection.create_item('py', {'app': 'py'}, b'snake', replace=True)
            else:
                try:
                    print(next(collection.search_items({'app': 'py'})).get_secret().decode())
                except Exception as error:
                    print('refused')
            """.write(toFile: harness.root + "/mine.py", atomically: true, encoding: .utf8)
            try harness.user?.own(harness.root + "/mine.py")
            try JudgePinentry.answer([], in: harness)
            let used = harness.onBus(
                """
                cp "$R/mine.py" "$R/other.py"
                /usr/bin/python3 "$R/mine.py" store
                /usr/bin/python3 "$R/mine.py" read
                /usr/bin/python3 "$R/other.py" read
                /usr/bin/python3 - read < "$R/mine.py"
                PYTHONPATH="$R" /usr/bin/python3 "$R/mine.py" read
                "$K" acl default/py | sed "s|$R/||; s|sha256 [0-9a-f]*…|sha256…|g"
                """, environment: judge.environment)
            #expect(
                used.stdout == """
                    snake
                    refused
                    refused
                    refused
                    owner: /usr/bin/python3.11 (package python3.11-minimal) running mine.py (sha256…)

                    """, "\(used)")
            let asked = try String(contentsOfFile: harness.root + "/pinentry.log", encoding: .utf8)
                .split(separator: "\n")
            #expect(asked.count == 3, "\(asked)")
            #expect(asked.first?.contains("running \(harness.root)/other.py (sha256 ") == true, "\(asked)")
            #expect(asked.dropFirst().first?.contains("it runs code from its standard input") == true, "\(asked)")
            #expect(asked.last?.contains("PYTHONPATH is set, which loads code into python") == true, "\(asked)")
        }

        /// A library that copies itself into anonymous memory to hide its
        /// file passed for its host program: anonymous executable memory
        /// was allowed for owners, as a JIT. Now only a program that ran a
        /// JIT when it made the item matches with one.
        @Test func codeInAnonymousMemoryIsNotTheOwnerUnlessTheOwnerWasAJit() throws {
            try JudgePinentry.answer([], in: harness)
            let used = harness.onBus(
                """
                "$R/app-a" store mail hunter2
                "$R/app-a" jit lookup mail
                "$R/app-a" jit store jitted v
                "$R/app-a" jit lookup jitted
                "$R/app-a" lookup jitted
                wc -l < "$R/pinentry.log"
                """, environment: judge.environment)
            #expect(used.stdout == "none\nv\nv\n1\n", "\(used)")
        }

        /// `keychainfs stop` ends the pinentry it started for a question,
        /// even one that ignores SETTIMEOUT: no question stays on screen
        /// after the device that would read its answer.
        /// A question is for the client that asked: once it leaves (killed
        /// or stopped by its person: `keychainfs get`, a `cat` that waits in
        /// the mount, a libsecret program that waits on the bus), the device ends the
        /// pinentry at once instead of leaving it on the screen for 60 s,
        /// and the answer is Deny.
        @Test func thePinentryEndsWhenItsClientLeaves() throws {
            _ = try harness.prepareMountpoint("mnt")
            try JudgePinentry.answer(["hang", "hang", "hang"], in: harness)
            let used = harness.onBus(
                """
                "$R/app-a" store mail hunter2
                "$K" mount "$R/mnt" || exit 97
                mkfifo "$R/asked"
                for door in socket mount bus; do
                    case $door in
                    socket) "$K" get "default/App a" > /dev/null 2>&1 & ;;
                    mount) cat "$R/mnt/default/App a" > /dev/null 2>&1 & ;;
                    bus) "$R/app-b" lookup mail > /dev/null 2>&1 & ;;
                    esac
                    client=$!
                    pinentry=$(cat "$R/asked")
                    started=$(date +%s)
                    # TERM: a shell's background job ignores SIGINT (POSIX), as Ctrl-C would reach it.
                    kill $client
                    if timeout 8 tail --pid="$pinentry" -f /dev/null; then
                        echo "$door: ended after $(( $(date +%s) - started )) s"
                    else
                        echo "$door: the pinentry is still there"; kill "$pinentry"
                    fi
                    wait $client
                done
                "$K" unmount "$R/mnt"
                "$K" log --keychain "$KC" | grep -c ' ask denied '
                """, environment: judge.environment)
            let lines = used.stdout.split(separator: "\n").map(String.init)
            #expect(lines.count == 4 && lines.last == "3", "\(used)")
            for (door, line) in zip(["socket", "mount", "bus"], lines) {
                let seconds = line.hasPrefix(door + ": ended after ") ? Int(line.split(separator: " ")[3]) : nil
                #expect(seconds.map { $0 < 10 } == true, "\(door): \(used)")
            }
        }

        @Test func stopEndsThePinentryOfAQuestion() throws {
            try JudgePinentry.answer(["hang"], in: harness)
            let used = harness.onBus(
                """
                "$R/app-a" store mail hunter2
                mkfifo "$R/asked"
                "$K" get "default/App a" > "$R/get.out" 2>&1 &
                pinentry=$(cat "$R/asked")
                kill -0 "$pinentry" && echo asking
                "$K" stop; echo "stop $?"
                wait $!; echo "get $?"
                kill -0 "$pinentry" 2>/dev/null && echo "pinentry left" || echo "pinentry ended"
                """, environment: judge.environment)
            #expect(used.stdout.hasPrefix("asking\nstop 0\nget "), "\(used)")
            #expect(used.stdout.hasSuffix("pinentry ended\n"), "\(used)")
        }
    }
}
