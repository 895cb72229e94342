import Foundation
import KeychainCore
import Testing
import TestSupport

extension SerialTests {
    /// The login password unlocks the keychain, through PAM as a login, a
    /// screen locker and passwd drive it: docs/DESKTOP.md, "Unlocked at login".
    /// `pamtester` runs a PAM service the test writes (Debian's common-auth
    /// and common-password shapes: pam_unix, then pam_keychainfs) as root
    /// would (login, gdm) and, setuid, as the user would (passwd); the user
    /// is an ordinary account with a login password and a keychain in its
    /// home.
    @Suite struct LoginPAMTests {
        let harness: MountHarness
        let user: OrdinaryUser
        let service = "kcfs-test-\(UInt32.random(in: 100_000...999_999_999))"
        /// The command as the package installs it: the password goes only to a device running it.
        let installed: RootControlledInstall

        init() throws {
            user = try OrdinaryUser()
            harness = try MountHarness(as: user, creating: false)
            installed = try RootControlledInstall()
        }

        /// The PAM module, built as the package builds it.
        static func module() throws -> String {
            let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
                .deletingLastPathComponent().deletingLastPathComponent().path
            guard Spawn.run([repository + "/scripts/build-pam", repository]) == 0 else {
                throw HarnessError("scripts/build-pam failed")
            }
            return repository + "/.build/pam/pam_keychainfs.so"
        }

        /// Runs `script` as root with `$S` the PAM service (written here,
        /// removed after), `$U` the user, `$RUN` their runtime directory
        /// (absent at the start: made by the session stack, as pam_systemd
        /// makes it), `$K` and `K_` the keychainfs command as the package
        /// installs it and as the user runs it in their session,
        /// `passwd_as_user` a setuid pamtester run by the user,
        /// `foreground_device [VAR=VALUE...] [WRAPPER...]` the user's device
        /// started in the foreground (under WRAPPER, with those variables)
        /// in the background of the script, its pid in `$device` once it listens.
        func withPAM(_ script: String, moduleOptions: String = "") throws -> ShellResult {
            let module = try Self.module()
            let file = "/etc/pam.d/" + service
            let ours = "\(module) keychainfs=\(installed.binary) \(moduleOptions)"
            try """
            auth [success=1 default=ignore] pam_unix.so
            auth requisite pam_deny.so
            auth required pam_permit.so
            auth optional \(ours)
            account required pam_permit.so
            session optional pam_exec.so \(harness.root)/make-runtime-directory
            session optional \(ours)
            password [success=1 default=ignore] pam_unix.so
            password requisite pam_deny.so
            password required pam_permit.so
            password optional \(ours)

            """.write(toFile: file, atomically: true, encoding: .utf8)
            defer { unlink(file) }
            let runtime = "/run/user/\(user.uid)"
            try """
            #!/bin/sh
            # What pam_systemd does at a session's start: the user's runtime directory.
            install -d -m 0700 -o "$PAM_USER" -g "$PAM_USER" \(runtime)

            """.write(toFile: harness.root + "/make-runtime-directory", atomically: true, encoding: .utf8)
            chmod(harness.root + "/make-runtime-directory", 0o755)
            defer {
                _ = harness.sh("XDG_RUNTIME_DIR=\(runtime) \"$K\" stop 2> /dev/null")
                _ = Spawn.run(["/bin/rm", "-rf", runtime])
            }
            return harness.sh(
                """
                S=\(service) U=\(user.name) RUN=\(runtime) K=\(installed.binary)
                # No TPM named: pam_keychainfs gives nothing to a device told of a TPM that is not the machine's
                # (the harness names one that never answers); KEYCHAINFS_TPM=none keeps the keys in a file.
                unset TPM2TOOLS_TCTI
                K_() { runuser -u "$U" -- env XDG_RUNTIME_DIR="$RUN" KEYCHAINFS_TPM=none "$K" "$@"; }
                cp /usr/bin/pamtester "$R/pamtester-setuid" && chmod 4755 "$R/pamtester-setuid"
                passwd_as_user() { runuser -u "$U" -- "$R/pamtester-setuid" "$S" "$U" chauthtok; }
                foreground_device() {
                    runuser -u "$U" -- env XDG_RUNTIME_DIR="$RUN" KEYCHAINFS_TPM=none "$@" "$K" start --foreground \\
                        > /dev/null 2>&1 &
                    for n in $(seq 100); do ls "$RUN"/keychainfs/*.sock > /dev/null 2>&1 && break; sleep 0.1; done
                    device=$(K_ status | sed -n 's/^pid: //p')
                }
                state() { K_ status | grep -E '^(state|failed-attempts):' | tr '\\n' ' '; echo; }
                echo "$U:Login-1" | chpasswd
                runuser -u "$U" -- env KEYCHAINFS_TPM=none XDG_RUNTIME_DIR="$R/run" "$K" init > /dev/null 2>&1 <<EOF
                Login-1
                Login-1
                EOF
                \(script)
                """, asRoot: true)
        }

        /// A login (auth, then the session, whose stack makes the runtime
        /// directory) unlocks the keychain once the user chose it, and only
        /// with the right password; the screen's unlock (auth alone, the
        /// session up) does too. Without the choice nothing is tried.
        @Test func theLoginPasswordUnlocksTheKeychain() throws {
            let used = try withPAM(
                """
                printf 'Login-1\\n' | pamtester "$S" "$U" authenticate open_session > /dev/null 2>&1
                echo "not chosen: $(state)"; K_ login status | head -1
                K_ login enable > /dev/null; K_ stop; rm -rf "$RUN"
                printf 'Login-2\\n' | pamtester "$S" "$U" authenticate 2>&1 | sed 's/^Password: //'
                printf 'Login-1\\n' | pamtester "$S" "$U" authenticate 2>&1 | sed 's/^Password: //'
                # At a login the session does not exist yet: nothing runs until it does.
                pgrep -u "$U" -x keychainfs && echo "started before the session"
                printf 'Login-1\\n' | pamtester "$S" "$U" authenticate open_session > /dev/null 2>&1
                echo "login: $(state)"
                K_ lock
                printf 'Login-2\\n' | pamtester "$S" "$U" authenticate > /dev/null 2>&1
                echo "wrong password at the screen: $(state)"
                # The caller's environment (a user running `su`) names no other keychain or device.
                mkdir -m 0700 "$R/elsewhere"
                # Every program the unlock runs, traced: the password is in no argv and no environment.
                printf 'Login-1\\n' | KEYCHAINFS_KEYCHAIN="$R/elsewhere" XDG_RUNTIME_DIR="$R/elsewhere" \\
                    strace -f -qq -s 4096 -v -e trace=execve -o "$R/trace" pamtester "$S" "$U" authenticate > /dev/null 2>&1
                echo "screen unlock: $(state)"; ls "$R/elsewhere"
                echo "hook runs: $(grep -c '"pam-hook", "unlock"' "$R/trace"), with the password: $(grep -c Login-1 "$R/trace")"
                pgrep -u "$U" -x keychainfs > /dev/null && echo "the device is the user's"
                """)
            #expect(
                used.stdout == """
                    not chosen: state: stopped\(" ")
                    login-unlock: off
                    pamtester: Authentication failure
                    pamtester: successfully authenticated
                    login: state: unlocked failed-attempts: 0\(" ")
                    wrong password at the screen: state: locked failed-attempts: 0\(" ")
                    screen unlock: state: unlocked failed-attempts: 0\(" ")
                    hook runs: 1, with the password: 0
                    the device is the user's

                    """, "\(used)")
        }

        /// `$R/relay.py LISTEN TARGET COPY [PROGRAM RUNTIME]`: a program of the
        /// user that listens at LISTEN and relays every connection to the
        /// device at TARGET, keeping what it was sent in COPY; with PROGRAM,
        /// the listener execs it (`set`, waiting for its value, with
        /// XDG_RUNTIME_DIR=RUNTIME) after forking the child that relays.
        static func writeRelay(in harness: MountHarness) throws {
            try """
            import os, select, socket, sys, time
            listening, target, copy = sys.argv[1], sys.argv[2], sys.argv[3]
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(listening); server.listen(8)

            def relay(client):
                # Every byte to the real device and back, a copy of what the client sent kept.
                device = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); device.connect(target)
                ends = {client: device, device: client}
                with open(copy, "ab") as kept:
                    while ends:
                        readable, _, _ = select.select(list(ends), [], [], 10)
                        if not readable: break
                        for end in readable:
                            data = end.recv(65536)
                            if not data:
                                ends = {}; break
                            if end is client: kept.write(data); kept.flush()
                            ends[end].sendall(data)
                client.close(); device.close()

            def exec_installed(keeping_listener):
                # The listener execs the installed program (a `set` that waits for its value),
                # which passes every check of a process.
                waiting, kept_open = os.pipe()
                os.set_inheritable(kept_open, True)
                if keeping_listener: os.set_inheritable(server.fileno(), True)
                os.dup2(waiting, 0)
                os.execve(sys.argv[4], ["keychainfs", "set", "default/zz"], dict(os.environ, XDG_RUNTIME_DIR=sys.argv[5]))

            if len(sys.argv) > 6 and sys.argv[6] == "in-flight":
                # The installed program keeps the listening socket, alone in a table; a copy lives in flight
                # (SCM_RIGHTS, in no process's table), which the child takes out only to accept, then puts back.
                a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
                socket.send_fds(a, [b"l"], [server.fileno()])
                if os.fork() != 0:
                    a.close(); b.close(); exec_installed(True)
                server.close()
                open(copy + ".ready", "w").close()
                while True:
                    _, fds, _, _ = socket.recv_fds(b, 1, 1)
                    listener = socket.socket(fileno=fds[0]); listener.setblocking(False)
                    try:
                        client, _ = listener.accept()
                    except BlockingIOError:
                        client = None
                    socket.send_fds(a, [b"l"], [listener.fileno()]); listener.close()
                    if client is None:
                        time.sleep(0.005); continue
                    client.setblocking(True)
                    relay(client)
            if len(sys.argv) > 4 and os.fork() != 0:
                # A child forked first accepts.
                exec_installed(False)
            open(copy + ".ready", "w").close()
            while True:
                client, _ = server.accept()
                relay(client)
            """.write(toFile: harness.root + "/relay.py", atomically: true, encoding: .utf8)
        }

        /// An impostor test's script: the device's socket path taken by
        /// `$R/relay.py` (with `relayArguments`), which relays to a real device
        /// moved to a runtime directory of its own; `probe` runs once the relay
        /// listens; then the screen's unlock, whether the relay's copy holds the
        /// password, and the real device's state. What the impostor started is ended.
        static func impostorScript(relayArguments: String = "", probe: String = "") -> String {
            """
            \(Self.loginUnlockOn)
            K_ start > /dev/null; socket=$(ls "$RUN"/keychainfs/*.sock); K_ stop
            install -d -m 0700 -o "$U" -g "$U" "$R/elsewhere"
            runuser -u "$U" -- env XDG_RUNTIME_DIR="$R/elsewhere" KEYCHAINFS_TPM=none "$K" start > /dev/null
            real=$(ls "$R"/elsewhere/keychainfs/*.sock)
            runuser -u "$U" -- /usr/bin/python3 "$R/relay.py" "$socket" "$real" "$R/copy" \(relayArguments) \\
                > /dev/null 2>&1 &
            for n in $(seq 100); do [ -e "$R/copy.ready" ] && break; sleep 0.05; done
            \(probe)
            printf 'Login-1\\n' | pamtester "$S" "$U" authenticate 2>&1 | sed 's/^Password: //'
            echo "the impostor got the password: $(cat "$R/copy" 2> /dev/null | grep -c Login-1)"
            echo "the real device: $(runuser -u "$U" -- env XDG_RUNTIME_DIR="$R/elsewhere" "$K" status | head -1)"
            pkill -u "$U" -f relay.py; pkill -u "$U" -f 'keychainfs set default/zz'; rm -f "$socket"
            runuser -u "$U" -- env XDG_RUNTIME_DIR="$R/elsewhere" "$K" stop
            """
        }

        /// The impostor at the screen's unlock: a program of the user listens
        /// on the device's socket (the device stopped, its path taken) and
        /// relays every byte to a real device elsewhere, keeping a copy.
        /// Before, the hook gave it the login password, which is also the
        /// user's password for sudo; the login unlock was on, as any program
        /// of the user can turn it on. Now the hook checks its peer first: the
        /// relay is no device pam_keychainfs checked nor one the hook started,
        /// so nothing is sent, and the relay's copy holds no password. A real
        /// device, started by the installed program, still gets it.
        @Test func theLoginPasswordGoesToNoImpostorOnTheDevicesSocket() throws {
            try Self.writeRelay(in: harness)
            let used = try withPAM(
                Self.impostorScript() + """

                    K_ login status | head -1
                    # The same unlock with no impostor: the hook starts the installed device, which gets it.
                    printf 'Login-1\\n' | pamtester "$S" "$U" authenticate > /dev/null 2>&1
                    echo "no impostor: $(state)"
                    """)
            #expect(
                used.stdout == """
                    pamtester: successfully authenticated
                    the impostor got the password: 0
                    the real device: state: locked
                    login-unlock: on
                    no impostor: state: unlocked failed-attempts: 0\(" ")

                    """, "\(used)")
        }

        /// The same impostor, cleverer: it listens, forks a child that
        /// accepts and relays, then execs the installed program (a `set`
        /// waiting for its value). SO_PEERCRED names the process that called
        /// `listen`, which now runs the installed program, untraced, nothing
        /// preloaded: it passed every check, and the hook gave the relay the
        /// login password. Now a checked device must also hold the listening
        /// socket the hook reaches, and hold it alone.
        @Test func theLoginPasswordGoesToNoImpostorThatExecsTheInstalledProgram() throws {
            try Self.writeRelay(in: harness)
            let used = try withPAM(
                Self.impostorScript(
                    relayArguments: "\"$K\" \"$R/elsewhere\"",
                    probe: """
                        echo "the listener runs: $(ps -o args= -p "$(pgrep -u "$U" -f 'keychainfs set default/zz' | head -1)")"
                        """))
            #expect(
                used.stdout == """
                    the listener runs: keychainfs set default/zz
                    pamtester: successfully authenticated
                    the impostor got the password: 0
                    the real device: state: locked

                    """, "\(used)")
        }

        /// The listening descriptor kept in flight: the impostor sends it
        /// to itself over a socket pair (SCM_RIGHTS), so that it is in no
        /// process's descriptor table, and execs the installed program; a
        /// helper takes it out only to accept, then puts it back. Every
        /// check of the listener passed, and the helper got the password.
        /// Now root (pam_keychainfs) checks who holds the accepted end of
        /// the hook's connection: a checked device, alone, or nothing is sent.
        @Test func theLoginPasswordGoesToNoImpostorThatKeepsItsListenerInFlight() throws {
            try Self.writeRelay(in: harness)
            let used = try withPAM(Self.impostorScript(relayArguments: "\"$K\" \"$R/elsewhere\" in-flight"))
            #expect(
                used.stdout == """
                    pamtester: successfully authenticated
                    the impostor got the password: 0
                    the real device: state: locked

                    """, "\(used)")
        }

        /// `$R/take.py hook DEVICE` and `$R/take.py started`: a program of the
        /// user that tries every way the kernel gives a process of the same
        /// user into another: a descriptor copied with pidfd_getfd(2), ptrace,
        /// /proc/PID/mem. `hook`: it stops the running device (so that the
        /// hook waits on it), finds the user's `keychainfs pam-hook` and
        /// copies its standard input, where pam_keychainfs wrote the
        /// password. `started`: the first device started with `--ready-fd`
        /// (the one the hook starts when none runs, and gives the password).
        static func writeTaker(in harness: MountHarness) throws {
            try """
            import ctypes, errno, os, signal, socket, sys, time
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            libc.ptrace.restype = ctypes.c_long
            PIDFD_OPEN, PIDFD_GETFD, PTRACE_SEIZE, PTRACE_DETACH = 434, 438, 0x4206, 17

            def ours(pid, command):
                # /proc/PID/status and cmdline, readable by anyone: the real uid, and what runs.
                try:
                    status = open(f"/proc/{pid}/status").read()
                    line = open(f"/proc/{pid}/cmdline", "rb").read()
                except OSError:
                    return False
                return f"\\nUid:\\t{os.getuid()}\\t" in status and command in line

            def first(command):
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    found = next((int(p) for p in os.listdir("/proc") if p.isdigit() and ours(p, command)), None)
                    if found: return found
                return None

            def failure():
                return errno.errorcode.get(ctypes.get_errno(), "?")

            def attack(pid, what):
                taken = ""
                pidfd = libc.syscall(PIDFD_OPEN, pid, 0)
                fd = libc.syscall(PIDFD_GETFD, pidfd, 0, 0) if pidfd >= 0 else -1
                print(f"{what}: pidfd_getfd: {'copied' if fd >= 0 else failure()}")
                if fd >= 0:
                    try:
                        copy = socket.socket(fileno=fd)
                        copy.settimeout(2)
                        taken = copy.recv(4096, socket.MSG_PEEK).decode(errors="replace")
                    except OSError as error:
                        taken = str(error)
                if libc.ptrace(PTRACE_SEIZE, pid, 0, 0) == 0:
                    print(f"{what}: ptrace: attached"); libc.ptrace(PTRACE_DETACH, pid, 0, 0)
                else:
                    print(f"{what}: ptrace: {failure()}")
                try:
                    open(f"/proc/{pid}/mem", "rb").close(); print(f"{what}: /proc/PID/mem: opened")
                except OSError as error:
                    print(f"{what}: /proc/PID/mem: {errno.errorcode[error.errno]}")
                return taken

            if sys.argv[1] == "stop-hook":
                # The hook stopped for good: a program of the user may signal a process of its uid.
                device = int(sys.argv[2])
                os.kill(device, signal.SIGSTOP)
                found = first(b"pam-hook\\0unlock")
                if found:
                    os.kill(found, signal.SIGSTOP)
                    print("stopped the hook")
                os.kill(device, signal.SIGCONT)
            elif sys.argv[1] == "hook":
                device = int(sys.argv[2])
                os.kill(device, signal.SIGSTOP)
                found = first(b"pam-hook\\0unlock")
                taken = attack(found, "the hook") if found else "no hook found"
                print("the password taken from the hook:", "yes" if "Login-1" in taken else "no")
                os.kill(device, signal.SIGCONT)
            else:
                found = first(b"--ready-fd")
                if found: attack(found, "the device it started")
                else: print("no device started")
            """.write(toFile: harness.root + "/take.py", atomically: true, encoding: .utf8)
        }

        /// The login unlock chosen by the user, and their session's runtime
        /// directory made (as pam_systemd makes it at a login).
        static let loginUnlockOn = """
            K_ login enable > /dev/null
            install -d -m 0700 -o "$U" -g "$U" "$RUN"
            """

        /// The login unlock on, a device running, and `$R/take.py MODE DEVICE`
        /// started as the user (its pid in `$taker`, what it says in `$R/taken`).
        static func takerStarted(mode: String) -> String {
            """
            \(Self.loginUnlockOn)
            K_ start > /dev/null
            device=$(K_ status | sed -n 's/^pid: //p')
            runuser -u "$U" -- /usr/bin/python3 "$R/take.py" \(mode) "$device" > "$R/taken" 2>&1 &
            taker=$!
            """
        }

        /// The hook itself, at the screen's unlock: pam_keychainfs writes the
        /// login password into its standard input, and any program of the
        /// user could copy that descriptor (pidfd_getfd: same user, the hook
        /// dumpable, Yama off) and read it first; every check of the device's
        /// socket came after. The device the hook starts when none runs was
        /// open the same way until it made itself undumpable. Now both run,
        /// from their first instruction, with a real group that is not the
        /// user's: the kernel keeps them undumpable and a process of the user
        /// is not of their credentials, so no way in works. The unlock still does.
        @Test func theLoginPasswordCannotBeTakenFromTheHook() throws {
            try Self.writeTaker(in: harness)
            let used = try withPAM(
                """
                \(Self.takerStarted(mode: "hook"))
                printf 'Login-1\\n' | pamtester "$S" "$U" authenticate 2>&1 | sed 's/^Password: //'
                wait $taker; cat "$R/taken"
                # Unlocked by that unlock once the device went on, or else by this one.
                printf 'Login-1\\n' | pamtester "$S" "$U" authenticate > /dev/null 2>&1
                echo "the device: $(state)"
                K_ stop
                runuser -u "$U" -- /usr/bin/python3 "$R/take.py" started > "$R/taken" 2>&1 &
                taker=$!
                printf 'Login-1\\n' | pamtester "$S" "$U" authenticate > /dev/null 2>&1
                wait $taker; cat "$R/taken"
                echo "the device it started: $(state)"
                # Its real group the user's again (files it makes, the mount's owner), its saved one the
                # device build's (it ran setgid: undumpable from its first instruction).
                group=$(id -g "$U")
                grep ^Gid: "/proc/$(pgrep -u "$U" -f -- --ready-fd | head -1)/status" | cut -f2-5 \\
                    | grep -qx "$group.$group.\(installed.deviceGID).$group" && echo "the device it started: the user's group"
                """)
            #expect(
                used.stdout == """
                    pamtester: successfully authenticated
                    the hook: pidfd_getfd: EPERM
                    the hook: ptrace: EPERM
                    the hook: /proc/PID/mem: EACCES
                    the password taken from the hook: no
                    the device: state: unlocked failed-attempts: 0\(" ")
                    the device it started: pidfd_getfd: EPERM
                    the device it started: ptrace: EPERM
                    the device it started: /proc/PID/mem: EACCES
                    the device it started: state: unlocked failed-attempts: 0\(" ")
                    the device it started: the user's group

                    """, "\(used)")
        }

        /// The installed device, started by a program of the user inside a
        /// user namespace it made (`unshare --user`, no privilege needed),
        /// where that program holds CAP_SYS_PTRACE over the device whatever
        /// its dumpability: it passed every check, was given the login
        /// password, and the program took the accepted connection out of it
        /// with pidfd_getfd. A device outside this process's user namespace
        /// is now given nothing: it stays locked. (A build that links
        /// libraries sees root's files as nobody's in that namespace, and
        /// refuses to start there at all.)
        @Test func aDeviceInAUserNamespaceOfTheUsersMakingIsGivenNothing() throws {
            let used = try withPAM(
                """
                \(Self.loginUnlockOn)
                home=$(getent passwd "$U" | cut -d: -f6)
                runuser -u "$U" -- env XDG_RUNTIME_DIR="$RUN" KEYCHAINFS_TPM=none unshare --user --map-root-user \\
                    "$K" start --foreground --keychain "$home/.local/share/keychainfs" > "$R/userns.log" 2>&1 &
                started=$!
                for n in $(seq 100); do
                    ls "$RUN"/keychainfs/*.sock > /dev/null 2>&1 && break
                    kill -0 $started 2> /dev/null || break
                    sleep 0.1
                done
                if kill -0 $started 2> /dev/null; then
                    # A build whose only code is its own file (the release's static link) starts there:
                    # pam_keychainfs gives it nothing.
                    printf 'Login-1\\n' | pamtester "$S" "$U" authenticate > /dev/null 2>&1
                    K_ status | grep -q '^state: locked' && echo "the device in a namespace of the user's: given nothing"
                    K_ stop; wait
                else
                    # A build that links libraries sees root's files as nobody's there, and does not start.
                    grep -q 'the device does not start: it runs code from /.*, a file not owned by root' "$R/userns.log" \\
                        && echo "the device in a namespace of the user's: given nothing"
                fi
                """)
            #expect(
                used.stdout == """
                    the device in a namespace of the user's: given nothing

                    """, "\(used)")
        }

        /// The installed device started with a preloaded library whose
        /// constructor renamed `LD_PRELOAD=` in the environment: the device's
        /// own refusal and pam_keychainfs's check read the environment, both
        /// passed, and the library logged the login password the device was
        /// given. Now both read what is mapped: with a library of the user's
        /// a device of a build that is not setgid does not start. The device
        /// build, setgid, runs in glibc's secure mode, which loads no
        /// preloaded path: the library runs only in the command the user
        /// started, which holds nothing and is replaced by the device build
        /// (so it renamed the variable of a device it never entered), and
        /// that device, clean, is given the password.
        @Test func aPreloadThatHidesItsVariableIsNoDevice() throws {
            let used = try withPAM(
                """
                \(Self.loginUnlockOn)
                cat > "$R/hide.c" <<'EOF'
                #include <string.h>
                extern char **environ;
                __attribute__((constructor)) static void hide(void) {
                    for (char **e = environ; *e != 0; e++) if (strncmp(*e, "LD_", 3) == 0) (*e)[0] = 'X';
                }
                EOF
                mkdir -m 755 "$R/lib" && gcc -shared -fPIC -o "$R/lib/hide.so" "$R/hide.c" && chmod 755 "$R/lib/hide.so"
                install -d -o "$U" "$R/mine" && install -o "$U" -m 755 "$R/lib/hide.so" "$R/mine/hide.so"
                # In the foreground: the process preloaded is the device (a device it started would not be).
                runuser -u "$U" -- env XDG_RUNTIME_DIR="$RUN" KEYCHAINFS_TPM=none LD_PRELOAD="$R/mine/hide.so" \\
                    "\(try MountHarness.builtBinary())" start --foreground 2>&1 \\
                    | grep -o 'the device does not start: it runs code from [^,]*, a file not owned by root' \\
                    | sed "s|$R/||"
                foreground_device LD_PRELOAD="$R/lib/hide.so"
                echo "its environment names the library: $(tr '\\0' '\\n' < /proc/$device/environ | grep -c '^LD_PRELOAD=')"
                echo "its memory maps it: $(grep -c "$R/lib/hide.so" /proc/$device/maps)"
                printf 'Login-1\\n' | pamtester "$S" "$U" authenticate 2>&1 | sed 's/^Password: //'
                echo "the device with the library: $(state)"
                K_ stop; wait
                """)
            #expect(
                used.stdout == """
                    the device does not start: it runs code from mine/hide.so, a file not owned by root
                    its environment names the library: 0
                    its memory maps it: 0
                    pamtester: successfully authenticated
                    the device with the library: state: unlocked failed-attempts: 0\(" ")

                    """, "\(used)")
        }

        /// The installed device started under a seccomp filter the user
        /// installed (no privilege needed with no_new_privs) that makes its
        /// `prctl(PR_SET_DUMPABLE, 0)` a no-op: it stayed dumpable, the
        /// module gave it the password, and the user read it out of its
        /// memory. The module now gives nothing to a device under a filter,
        /// or whose /proc entries are not root's (it is not undumpable).
        @Test func aDeviceKeptDumpableByASeccompFilterIsGivenNothing() throws {
            let used = try withPAM(
                """
                \(Self.loginUnlockOn)
                cat > "$R/sc.c" <<'EOF'
                #include <linux/filter.h>
                #include <linux/seccomp.h>
                #include <stddef.h>
                #include <sys/prctl.h>
                #include <sys/syscall.h>
                #include <unistd.h>
                int main(int argc, char **argv) {
                    struct sock_filter code[] = {
                        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
                        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_prctl, 0, 3),
                        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
                        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PR_SET_DUMPABLE, 0, 1),
                        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 0),
                        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
                    };
                    struct sock_fprog program = {sizeof code / sizeof code[0], code};
                    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program)) return 1;
                    execv(argv[1], argv + 1);
                    return 1;
                }
                EOF
                gcc -o "$R/sc" "$R/sc.c" && chmod 755 "$R/sc"
                foreground_device "$R/sc"
                [ "$(stat -c %U /proc/$device/mem)" = "$U" ] && echo "the device stayed dumpable"
                printf 'Login-1\\n' | pamtester "$S" "$U" authenticate 2>&1 | sed 's/^Password: //'
                echo "the device under the filter: $(state)"
                K_ stop; wait
                """)
            #expect(
                used.stdout == """
                    the device stayed dumpable
                    pamtester: successfully authenticated
                    the device under the filter: state: locked failed-attempts: 0\(" ")

                    """, "\(used)")
        }

        /// A program of the user starts the device itself and keeps a
        /// `/proc/PID/mem` descriptor of it: opened at its exec, stopped
        /// there under `PTRACE_TRACEME` and then let go, it went on reading
        /// the device's memory after the device made itself undumpable, and
        /// the module, which saw an untraced, undumpable device, gave it the
        /// login password (docs/SECURITY.md, "A device undumpable from its
        /// first instruction"). Now a device runs from the device build,
        /// setgid: traced at the exec of the command, the device build's own
        /// exec after it is not, and makes a new memory undumpable from its
        /// first instruction, which the descriptor does not read; traced at
        /// the device build's exec, the kernel ignores the setgid bit, and
        /// the module gives that device nothing. A descriptor opened before
        /// the exec reads nothing after it, and none opens after.
        @Test func aDescriptorOfTheDevicesMemoryOpenedBeforeItWasUndumpableReadsNothing() throws {
            let used = try withPAM(
                """
                \(Self.loginUnlockOn)
                cat > "$R/keep.c" <<'EOF'
                #include <fcntl.h>
                #include <stdio.h>
                #include <string.h>
                #include <sys/ptrace.h>
                #include <sys/wait.h>
                #include <unistd.h>
                /* keep traced|untraced PROGRAM ARGS...: starts PROGRAM as its child and
                 * keeps /proc/CHILD/mem, opened before its exec and (traced) at its exec
                 * stop; on each line of standard input, says what each reads at the
                 * start of the exec's first mapping, and whether it opens now. */
                static void probe(const char *name, int fd, unsigned long at) {
                    unsigned char bytes[4] = {0};
                    ssize_t count = fd < 0 ? -1 : pread(fd, bytes, 4, (off_t)at);
                    printf("%s: %s\\n", name, count == 4 && memcmp(bytes, "\\177ELF", 4) == 0 ? "reads the program" : "reads nothing");
                }
                int main(int argc, char **argv) {
                    int traced = strcmp(argv[1], "traced") == 0, go[2];
                    if (pipe(go) != 0) return 1;
                    pid_t child = fork();
                    if (child == 0) {
                        char byte;
                        close(go[1]);
                        if (read(go[0], &byte, 1) != 1) _exit(1);
                        if (traced) ptrace(PTRACE_TRACEME, 0, 0, 0);
                        execv(argv[2], argv + 2);
                        _exit(127);
                    }
                    char path[64], maps[64];
                    snprintf(path, sizeof path, "/proc/%d/mem", child);
                    snprintf(maps, sizeof maps, "/proc/%d/maps", child);
                    int early = open(path, O_RDONLY), stopped = -1;
                    unsigned long start = 0;
                    if (write(go[1], "x", 1) != 1) return 1;
                    if (traced) {
                        int status;
                        waitpid(child, &status, 0);
                        stopped = open(path, O_RDONLY);
                        FILE *map = fopen(maps, "r");
                        if (map == NULL || fscanf(map, "%lx", &start) != 1) return 1;
                        fclose(map);
                        ptrace(PTRACE_DETACH, child, 0, 0);
                    }
                    printf("started\\n");
                    fflush(stdout);
                    char line[16];
                    while (fgets(line, sizeof line, stdin) != NULL) {
                        if (start == 0) {
                            FILE *map = fopen(maps, "r");
                            if (map != NULL && fscanf(map, "%lx", &start) != 1) start = 0;
                            if (map != NULL) fclose(map);
                        }
                        probe("opened before the exec", early, start);
                        if (traced) probe("opened at the exec stop", stopped, start);
                        printf("opened now: %s\\n", open(path, O_RDONLY) < 0 ? "refused" : "yes");
                        fflush(stdout);
                    }
                    return 0;
                }
                EOF
                gcc -o "$R/keep" "$R/keep.c" && chmod 755 "$R/keep"
                # mode, program: the device started by `keep`, asked once it listens, then a screen unlock.
                attack() {
                    rm -f "$R/ask"; mkfifo -m 666 "$R/ask"
                    runuser -u "$U" -- env XDG_RUNTIME_DIR="$RUN" KEYCHAINFS_TPM=none \
                        "$R/keep" "$1" "$2" start --foreground < "$R/ask" > "$R/kept" 2> /dev/null &
                    exec 9> "$R/ask"
                    for n in $(seq 100); do ls "$RUN"/keychainfs/*.sock > /dev/null 2>&1 && break; sleep 0.1; done
                    device=$(K_ status | sed -n 's/^pid: //p')
                    echo "runs setgid: $(awk '/^Gid:/ { print ($4 == \(installed.deviceGID) ? "yes" : "no") }' /proc/$device/status)"
                    echo probe >&9
                    for n in $(seq 100); do [ "$(grep -c . "$R/kept")" -ge 3 ] && break; sleep 0.1; done
                    grep -v '^started' "$R/kept"
                    printf 'Login-1\\n' | pamtester "$S" "$U" authenticate > /dev/null 2>&1
                    echo "screen unlock: $(state)"
                    K_ stop; exec 9>&-; wait
                }
                echo "-- the command traced at its exec"; attack traced "$K"
                echo "-- the device build traced at its exec"; attack traced "\(installed.deviceBuild)"
                echo "-- the device build, untraced"; attack untraced "\(installed.deviceBuild)"
                """)
            #expect(
                used.stdout == """
                    -- the command traced at its exec
                    runs setgid: yes
                    opened before the exec: reads nothing
                    opened at the exec stop: reads nothing
                    opened now: refused
                    screen unlock: state: unlocked failed-attempts: 0\(" ")
                    -- the device build traced at its exec
                    runs setgid: no
                    opened before the exec: reads nothing
                    opened at the exec stop: reads the program
                    opened now: refused
                    screen unlock: state: locked failed-attempts: 0\(" ")
                    -- the device build, untraced
                    runs setgid: yes
                    opened before the exec: reads nothing
                    opened now: refused
                    screen unlock: state: unlocked failed-attempts: 0\(" ")

                    """, "\(used)")
        }

        /// A device started with `DBUS_SYSTEM_BUS_ADDRESS` naming a bus that
        /// is not the machine's (none here; a bus of the user's with a logind
        /// of its own would do the same) follows no session and never locks
        /// with it: the login unlocked it all the same. pam_keychainfs now
        /// gives it nothing.
        @Test func aDeviceToldAnotherSystemBusIsGivenNothing() throws {
            let used = try withPAM(
                """
                \(Self.loginUnlockOn)
                runuser -u "$U" -- env XDG_RUNTIME_DIR="$RUN" KEYCHAINFS_TPM=none \\
                    DBUS_SYSTEM_BUS_ADDRESS=unix:path=/nonexistent "$K" start > /dev/null
                printf 'Login-1\\n' | pamtester "$S" "$U" authenticate 2>&1 | sed 's/^Password: //'
                echo "the device on another bus: $(state)"
                """)
            #expect(
                used.stdout == """
                    pamtester: successfully authenticated
                    the device on another bus: state: locked failed-attempts: 0\(" ")

                    """, "\(used)")
        }

        /// A device told of a TPM other than the machine's was given the
        /// login password: `$TPM2TOOLS_TCTI` naming a library of the user's
        /// (loaded into the device when it first reached the TPM, after
        /// pam_keychainfs looked at its memory: the library read the
        /// password), or swtpm at a port of the user's (the user's own swtpm
        /// holds the session key that checks the passcode's HMAC: the login
        /// password was guessed offline), or `$KEYCHAINFS_SERVICE` naming a
        /// broker of the user's (which is given the passcode's auth): three
        /// outsiders' attacks. pam_keychainfs now gives such a device
        /// nothing; told of the machine's own TPM by name, a device is given
        /// the password.
        @Test func aDeviceToldOfATPMOtherThanTheMachinesIsGivenNothing() throws {
            let used = try withPAM(
                """
                \(Self.loginUnlockOn)
                # The keychain named, as a per-user device is that reaches a broker (a service's socket) for its TPM.
                home=$(getent passwd "$U" | cut -d: -f6)
                for told in TPM2TOOLS_TCTI="$R/evil.so:host=127.0.0.1" TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=24321 \\
                    KEYCHAINFS_SERVICE="$R/broker" TPM2TOOLS_TCTI=device:/dev/tpmrm0; do
                    runuser -u "$U" -- env XDG_RUNTIME_DIR="$RUN" KEYCHAINFS_TPM=none \\
                        KEYCHAINFS_KEYCHAIN="$home/.local/share/keychainfs" "$told" "$K" start > /dev/null
                    printf 'Login-1\\n' | pamtester "$S" "$U" authenticate > /dev/null 2>&1
                    echo "${told%%=*}=${told#*=}: $(state)" | sed "s|$R/||"
                    K_ stop
                done
                """)
            #expect(
                used.stdout == """
                    TPM2TOOLS_TCTI=evil.so:host=127.0.0.1: state: locked failed-attempts: 0\(" ")
                    TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=24321: state: locked failed-attempts: 0\(" ")
                    KEYCHAINFS_SERVICE=broker: state: locked failed-attempts: 0\(" ")
                    TPM2TOOLS_TCTI=device:/dev/tpmrm0: state: unlocked failed-attempts: 0\(" ")

                    """, "\(used)")
        }

        /// A program of the user holds the memory-map lock of a process that
        /// pam_keychainfs looks at: the installed device, started with a
        /// library of the user's, reads through /proc/self/mem a page of a
        /// FUSE file that never answers (holding the lock for reading) and
        /// queues a write of clear_refs behind it (for writing), having
        /// made itself undumpable as a device does. The module's read of
        /// its /proc/PID/smaps, as root, then waited for good: one read,
        /// which no deadline checked between reads cuts (an outsider held
        /// every screen unlock this way). Now the module looks at the
        /// devices in a child of its own, ended at the deadline, and the
        /// login goes on.
        @Test func aProcessWhoseMemoryMapIsHeldHoldsTheLoginNoLongerThanItsTimeout() throws {
            try """
            #define FUSE_USE_VERSION 31
            #include <errno.h>
            #include <fuse.h>
            #include <stdlib.h>
            #include <string.h>
            #include <unistd.h>
            /* One file, blk, whose reads are answered only once the file $HANGFS_RELEASE exists. */
            static const char *release;
            static int attributes(const char *path, struct stat *info, struct fuse_file_info *file) {
                (void)file;
                memset(info, 0, sizeof *info);
                if (strcmp(path, "/") == 0) { info->st_mode = S_IFDIR | 0755; info->st_nlink = 2; return 0; }
                if (strcmp(path, "/blk") != 0) return -ENOENT;
                info->st_mode = S_IFREG | 0644; info->st_nlink = 1; info->st_size = 4096;
                return 0;
            }
            static int opened(const char *path, struct fuse_file_info *file) {
                (void)file;
                return strcmp(path, "/blk") == 0 ? 0 : -ENOENT;
            }
            static int held(const char *path, char *buffer, size_t size, off_t offset, struct fuse_file_info *file) {
                (void)path; (void)offset; (void)file;
                while (access(release, F_OK) != 0) usleep(10000);
                memset(buffer, 0, size);
                return (int)size;
            }
            static const struct fuse_operations operations = {.getattr = attributes, .open = opened, .read = held};
            int main(int argc, char **argv) {
                release = getenv("HANGFS_RELEASE");
                return release == NULL ? 2 : fuse_main(argc, argv, &operations, NULL);
            }
            """.write(toFile: harness.root + "/hangfs.c", atomically: true, encoding: .utf8)
            try """
            #define _GNU_SOURCE
            #include <fcntl.h>
            #include <pthread.h>
            #include <stdio.h>
            #include <stdlib.h>
            #include <sys/mman.h>
            #include <sys/prctl.h>
            #include <unistd.h>
            static char *page;
            static int mem, refs;
            /* Both threads are made first: a thread's stack is a mapping, which waits for the lock too. */
            static void *reader(void *unused) {
                char byte;
                (void)unused;
                usleep(200000);
                (void)pread(mem, &byte, 1, (off_t)(unsigned long)page);
                return NULL;
            }
            static void *writer(void *unused) {
                (void)unused;
                sleep(1);
                (void)write(refs, "4", 1);
                return NULL;
            }
            __attribute__((constructor)) static void hold(void) {
                const char *file = getenv("HOLD_FILE"), *ready = getenv("HOLD_READY");
                if (file == NULL || ready == NULL) return;
                int fd = open(file, O_RDONLY);
                page = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
                /* Opened while still dumpable: an undumpable process's entries are root's. */
                mem = open("/proc/self/mem", O_RDONLY);
                refs = open("/proc/self/clear_refs", O_WRONLY);
                prctl(PR_SET_DUMPABLE, 0);
                pthread_t first, second;
                pthread_create(&first, NULL, reader, NULL);
                pthread_create(&second, NULL, writer, NULL);
                sleep(2);
                /* No allocation from here: it could need the lock. */
                char pid[16];
                int length = snprintf(pid, sizeof pid, "%d", getpid());
                int said = open(ready, O_WRONLY | O_CREAT | O_TRUNC, 0644);
                (void)write(said, pid, (size_t)length);
                close(said);
                for (;;) pause();
            }
            """.write(toFile: harness.root + "/hold.c", atomically: true, encoding: .utf8)
            // Unmounted whatever happens: a login held past the test's limit ends the script before its last line.
            defer { _ = Spawn.run(["/bin/fusermount3", "-u", "-z", harness.root + "/fz"]) }
            let used = try withPAM(
                """
                gcc -O1 -Wall -o "$R/hangfs" "$R/hangfs.c" $(pkg-config --cflags --libs fuse3) || exit 1
                gcc -O1 -Wall -shared -fPIC -pthread -o "$R/hold.so" "$R/hold.c" || exit 1
                \(Self.loginUnlockOn)
                install -d -m 0700 -o "$U" "$R/fz"; install -d -m 0777 "$R/said"
                # Run directly (setpriv execs, runuser forks): their pids are ours to end. Nothing here
                # reads the held process's command line (pkill, ps): that waits for its map's lock too.
                as_user() { setpriv --reuid="$U" --regid="$U" --init-groups -- "$@"; }
                as_user env HANGFS_RELEASE="$R/said/release" "$R/hangfs" "$R/fz" -f > /dev/null 2>&1 &
                fs=$!
                for n in $(seq 100); do grep -q " $R/fz " /proc/mounts && break; sleep 0.05; done
                # The installed program that a loader runs (the fixed build has none): its other half, if any.
                serving="${K%/bin/keychainfs}/libexec/keychainfs/keychainfs"; [ -x "$serving" ] || serving="$K"
                as_user env HOLD_FILE="$R/fz/blk" HOLD_READY="$R/said/held" LD_PRELOAD="$R/hold.so" "$serving" status \\
                    > /dev/null 2>&1 &
                holder=$!
                for n in $(seq 200); do [ -s "$R/said/held" ] && break; sleep 0.05; done
                held=$(cat "$R/said/held")
                echo "undumpable, as a device makes itself: $(stat -c %U "/proc/$held/mem")"
                started=$(date +%s)
                printf 'Login-1\\n' | timeout 30 pamtester "$S" "$U" authenticate 2>&1 | sed 's/^Password: //'
                echo "returned within the timeout and a second: $([ $(( $(date +%s) - started )) -le 4 ] && echo yes)"
                # The page answered, the lock let go: every process ends as processes do.
                touch "$R/said/release"; kill -9 "$held" "$holder" "$fs"; fusermount3 -u -z "$R/fz"; wait
                """, moduleOptions: "timeout=2")
            #expect(
                used.stdout == """
                    undumpable, as a device makes itself: root
                    pamtester: successfully authenticated
                    returned within the timeout and a second: yes

                    """, "\(used)")
        }

        /// A program of the user holds 20,000 descriptors in each of 100
        /// processes: pam_keychainfs's scans of every process's descriptors,
        /// as root and outside the hook's timeout, held the login for many
        /// seconds (78 s with 400 processes). Now every scan stops at the
        /// module's deadline (`timeout=`, 1 s here), a process not looked
        /// at is no device, and the login goes on.
        @Test func descriptorsByTheHundredThousandHoldTheLoginNoLongerThanItsTimeout() throws {
            let used = try withPAM(
                """
                \(Self.loginUnlockOn)
                K_ start > /dev/null
                cat > "$R/hold.py" <<'EOF'
                import os, resource, signal, sys, time
                limit = min(20000, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
                null = os.open("/dev/null", os.O_RDONLY)
                for fd in range(3, limit - 16):
                    if fd != null: os.dup2(null, fd, inheritable=False)
                for n in range(99):
                    if os.fork() == 0: break
                open(sys.argv[1] + "/held." + str(os.getpid()), "w").close()
                time.sleep(60)
                EOF
                install -d -m 0777 "$R/held"
                runuser -u "$U" -- /usr/bin/python3 "$R/hold.py" "$R/held" > /dev/null 2>&1 &
                for n in $(seq 300); do [ "$(ls "$R/held" | wc -l)" -ge 100 ] && break; sleep 0.1; done
                echo "processes holding descriptors: $(ls "$R/held" | wc -l)"
                printf 'Login-1\\n' | timeout 10 pamtester "$S" "$U" authenticate > /dev/null 2>&1
                echo "the login returned: $([ $? -ne 124 ] && echo yes || echo no)"
                pkill -u "$U" -f hold.py; K_ stop
                """, moduleOptions: "timeout=1")
            #expect(
                used.stdout == """
                    processes holding descriptors: 100
                    the login returned: yes

                    """, "\(used)")
        }

        /// A program of the user stops the hook (SIGSTOP: same uid) while it
        /// holds the password: the module waited for it with no deadline,
        /// and the login never returned. Now the hook is ended after the
        /// module's `timeout=` (30 s unless set; 2 here) and the login goes
        /// on as it would have without it.
        @Test func aStoppedHookHoldsTheLoginNoLongerThanItsTimeout() throws {
            try Self.writeTaker(in: harness)
            let used = try withPAM(
                """
                \(Self.takerStarted(mode: "stop-hook"))
                printf 'Login-1\\n' | timeout 20 pamtester "$S" "$U" authenticate 2>&1 | sed 's/^Password: //'
                wait $taker; cat "$R/taken"
                pgrep -u "$U" -f 'keychainfs pam-hook' > /dev/null || echo "no hook is left"
                """, moduleOptions: "timeout=2")
            #expect(
                used.stdout == """
                    pamtester: successfully authenticated
                    stopped the hook
                    no hook is left

                    """, "\(used)")
        }

        /// A hook that cannot be run (the package's binary gone, a wrong
        /// path in the configuration) leaves the login as it was: the
        /// password is refused or taken by PAM alone, and the caller lives on.
        @Test func aHookThatCannotRunLeavesTheLoginAsItWas() throws {
            let module = try Self.module()
            let file = "/etc/pam.d/" + service
            try """
            auth [success=1 default=ignore] pam_unix.so
            auth requisite pam_deny.so
            auth required pam_permit.so
            auth optional \(module) keychainfs=/nonexistent/keychainfs

            """.write(toFile: file, atomically: true, encoding: .utf8)
            defer { unlink(file) }
            let runtime = "/run/user/\(user.uid)"
            defer { _ = Spawn.run(["/bin/rm", "-rf", runtime]) }
            let used = harness.sh(
                """
                echo "$2:Login-1" | chpasswd
                install -d -m 0700 -o "$2" -g "$2" \(runtime)
                for password in Login-1 Login-2 Login-1; do
                    printf '%s\\n' "$password" | pamtester "$1" "$2" authenticate 2>&1 | sed 's/^Password: //'
                done
                """, arguments: [service, user.name], asRoot: true)
            #expect(
                used.stdout == """
                    pamtester: successfully authenticated
                    pamtester: Authentication failure
                    pamtester: successfully authenticated

                    """, "\(used)")
        }

        /// passwd as the user (old and new password) changes the passcode
        /// with it; root setting the password (no old one) cannot, and says
        /// so by turning the login unlock off. A login password that is not
        /// the passcode is tried once: it turns the login unlock off, and
        /// the next login tries nothing (one failed attempt, not two).
        @Test func aPasswordChangeCarriesThePasscodeWithIt() throws {
            let used = try withPAM(
                """
                \(Self.loginUnlockOn)
                printf 'Login-1\\nLogin-2\\nLogin-2\\n' | passwd_as_user > /dev/null 2>&1; echo "passwd: $?"
                K_ lock
                printf 'Login-1\\n' | K_ unlock 2>&1
                printf 'Login-2\\n' | K_ unlock && echo "the new password unlocks"
                K_ login status | head -1
                printf 'Login-3\\nLogin-3\\n' | pamtester "$S" "$U" chauthtok > /dev/null 2>&1; echo "root's passwd: $?"
                K_ login status | sed 's/: [0-9-]*T[0-9:]*Z: /: DATE: /'
                K_ lock; K_ login enable > /dev/null
                printf 'Login-3\\n' | pamtester "$S" "$U" authenticate > /dev/null 2>&1
                echo "$(state)"; K_ login status | sed -n 2p | sed 's/: [0-9-]*T[0-9:]*Z: /: DATE: /'
                printf 'Login-3\\n' | pamtester "$S" "$U" authenticate > /dev/null 2>&1
                echo "$(state)"
                """)
            #expect(
                used.stdout == """
                    passwd: 0
                    keychainfs: not unlocked: wrong passcode
                    the new password unlocks
                    login-unlock: on
                    root's passwd: 0
                    login-unlock: off
                    turned-off: DATE: the login password was set without the old one (by root?): the keychain's \
                    passcode is still the old password; `keychainfs passcode`, then `keychainfs login enable`
                    pam-module: not in common-auth
                    state: locked failed-attempts: 1\(" ")
                    turned-off: DATE: the login password did not unlock the keychain (its passcode is another); \
                    `keychainfs login enable` once they are the same
                    state: locked failed-attempts: 1\(" ")

                    """, "\(used)")
        }
    }
}
