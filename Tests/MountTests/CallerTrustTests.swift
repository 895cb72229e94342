import Foundation
import KeychainCore
import KeychainProtocol
import Testing
import TestSupport

extension SerialTests {
    /// A granted executable is not enough to be the granted program: each
    /// attack here ran as the keychain's own (ordinary) user, with programs the
    /// test compiles, and read a policed value before the device checked who
    /// the caller really is (docs/SECURITY.md, "Callers the device trusts").
    /// Each must now get EPERM (or a refused request) and leave an audit line
    /// saying why, from the user's own device and from the service (which
    /// reads another user's /proc to tell).
    @Suite struct CallerTrustTests {
        /// An ordinary user's keychain (in a service of its own when `inService`),
        /// mounted and unlocked, with `secure/token` readable only by
        /// `$R/granted-cat` (a copy of cat that the user owns).
        static func policedKeychainOfAnOrdinaryUser(inService: Bool = false) throws -> (MountHarness, String) {
            let harness = try MountHarness(as: try OrdinaryUser(), service: inService ? try ServiceHarness() : nil)
            let mnt = try harness.mount()
            try harness.unlock(mnt)
            let setup = harness.sh(
                """
                mkdir "$1/secure" && printf s3cret > "$1/secure/token" && cp /usr/bin/cat "$R/granted-cat"
                """, arguments: [mnt])
            guard setup.succeeded else { throw HarnessError("setup failed: \(setup)") }
            let granted = harness.grant("secure", exe: harness.root + "/granted-cat")
            guard granted.succeeded else { throw HarnessError("grant failed: \(granted)") }
            // The attacks below differ from this only in what they add.
            let read = harness.run("granted-cat", mnt + "/secure/token")
            guard read.stdout == "s3cret" else { throw HarnessError("the granted program cannot read: \(read)") }
            return (harness, mnt)
        }

        /// C: `field(out, text)` appends one text field of a frame
        /// (docs/PROTOCOL.md: a 4-byte length, then the bytes) and says how long it is.
        static let frameField = """
            static size_t field(unsigned char *out, const char *text) {
                uint32_t length = strlen(text);
                memcpy(out, &length, 4); memcpy(out + 4, text, length);
                return 4 + length;
            }
            """

        /// Compiles `source` (C) with gcc as the keychain's user into `$R/NAME`.
        static func compile(_ harness: MountHarness, _ name: String, _ source: String, options: String = "") throws {
            let built = harness.sh(
                "cat > \"$R/\(name).c\" && gcc -O1 -Wall \(options) -o \"$R/\(name)\" \"$R/\(name).c\"",
                stdin: source)
            guard built.succeeded else { throw HarnessError("gcc \(name) failed: \(built)") }
        }

        static func expectRefused(
            _ result: ShellResult, _ attack: String, sourceLocation: SourceLocation = #_sourceLocation
        ) {
            #expect(
                !result.stdout.contains("s3cret"), "\(attack) read the value: \(result)", sourceLocation: sourceLocation
            )
            #expect(
                result.stderr.contains("Operation not permitted"), "\(attack): \(result)",
                sourceLocation: sourceLocation)
        }

        /// The audit log's denials, as text.
        static func denials(_ harness: MountHarness) -> [Substring] {
            harness.sh("\"$K\" log" + harness.keychainOption).stdout.split(separator: "\n").filter {
                $0.contains("denied")
            }
        }

        @Test(arguments: [false, true]) func codeLoadedIntoTheGrantedProgramIsRefused(inService: Bool) throws {
            let (harness, mnt) = try Self.policedKeychainOfAnOrdinaryUser(inService: inService)
            try Self.compile(harness, "evil.so", "void kcfs_evil(void) {}\n", options: "-shared -fPIC")
            Self.expectRefused(
                harness.sh("LD_PRELOAD=\"$R/evil.so\" \"$R/granted-cat\" \"$1/secure/token\"", arguments: [mnt]),
                "LD_PRELOAD")
            // A system library swapped for a copy the user could have edited.
            let swapped = harness.sh(
                """
                mkdir "$R/lib" && cp "$(ldd "$R/granted-cat" | awk '/libc.so/ {print $3}')" "$R/lib/" &&
                LD_LIBRARY_PATH="$R/lib" "$R/granted-cat" "$1/secure/token"
                """, arguments: [mnt])
            Self.expectRefused(swapped, "LD_LIBRARY_PATH")
            let denials = Self.denials(harness)
            #expect(denials.contains { $0.contains("evil.so") && $0.contains("granted-cat") }, "\(denials)")
            #expect(denials.contains { $0.contains(harness.root + "/lib/libc.so") }, "\(denials)")
            // Nothing else changed: the granted program alone still reads.
            #expect(harness.run("granted-cat", mnt + "/secure/token").stdout == "s3cret")
        }

        /// In a user namespace of its own a process may point its
        /// `/proc/PID/exe` anywhere (PR_SET_MM): its executable proves nothing there.
        @Test(arguments: [false, true]) func theGrantedProgramInAnotherUserNamespaceIsRefused(inService: Bool) throws {
            let (harness, mnt) = try Self.policedKeychainOfAnOrdinaryUser(inService: inService)
            Self.expectRefused(
                harness.sh(
                    "unshare --user --map-root-user \"$R/granted-cat\" \"$1/secure/token\"",
                    arguments: [mnt]), "user namespace")
            #expect(Self.denials(harness).contains { $0.contains("another user namespace") })
        }

        /// A tracer can make the granted program do anything.
        @Test(arguments: [false, true]) func aTracedGrantedProgramIsRefused(inService: Bool) throws {
            let (harness, mnt) = try Self.policedKeychainOfAnOrdinaryUser(inService: inService)
            try Self.compile(
                harness, "tracer",
                """
                #include <signal.h>
                #include <sys/ptrace.h>
                #include <sys/wait.h>
                #include <unistd.h>
                /* Runs argv[1...] traced from its first instruction, to its end. */
                int main(int argc, char **argv) {
                    pid_t child = fork();
                    if (child == 0) { ptrace(PTRACE_TRACEME, 0, 0, 0); execv(argv[1], argv + 1); _exit(127); }
                    int status;
                    while (waitpid(child, &status, 0) == child && WIFSTOPPED(status)) {
                        int signal = WSTOPSIG(status) == SIGTRAP ? 0 : WSTOPSIG(status);
                        ptrace(PTRACE_CONT, child, 0, (void *)(long)signal);
                    }
                    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
                }
                """)
            Self.expectRefused(
                harness.sh("\"$R/tracer\" \"$R/granted-cat\" \"$1/secure/token\"", arguments: [mnt]), "ptrace")
            #expect(Self.denials(harness).contains { $0.contains("being traced") })
        }

        /// Code written into anonymous memory is no executable's: refused unless
        /// the rule was granted with `--allow-jit` (a JavaScript engine, a JVM).
        @Test(arguments: [false, true]) func aProgramRunningAnonymousCodeNeedsARuleThatAllowsJIT(inService: Bool) throws
        {
            let (harness, mnt) = try Self.policedKeychainOfAnOrdinaryUser(inService: inService)
            try Self.compile(
                harness, "jit",
                """
                #include <fcntl.h>
                #include <stdio.h>
                #include <string.h>
                #include <sys/mman.h>
                #include <unistd.h>
                /* jit FILE: runs one generated instruction, then prints FILE. */
                int main(int argc, char **argv) {
                    unsigned char *code = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                    if (code == MAP_FAILED) { perror("mmap"); return 2; }
                    code[0] = 0xc3;                              /* ret */
                    ((void (*)(void))code)();
                    int fd = open(argv[1], O_RDONLY);
                    if (fd < 0) { perror(argv[1]); return 1; }
                    char buffer[256]; ssize_t count = read(fd, buffer, sizeof buffer);
                    if (count < 0) { perror(argv[1]); return 1; }
                    fwrite(buffer, 1, count, stdout);
                    return 0;
                }
                """)
            #expect(harness.grant("secure", exe: harness.root + "/jit").succeeded)
            Self.expectRefused(harness.run("jit", mnt + "/secure/token"), "anonymous code")
            #expect(Self.denials(harness).contains { $0.contains("anonymous memory") })
            let allowed = harness.grant("secure", exe: harness.root + "/jit", options: "--allow-jit")
            #expect(allowed.succeeded && allowed.stdout.hasSuffix("JIT code allowed\n"), "\(allowed)")
            #expect(harness.sh("\"$K\" policy secure" + harness.keychainOption).stdout.contains("/jit sha256="))
            #expect(harness.sh("\"$K\" policy secure" + harness.keychainOption).stdout.contains(" allow-jit\n"))
            #expect(harness.run("jit", mnt + "/secure/token").stdout == "s3cret")
            // The rule of the granted cat still admits no anonymous code.
            #expect(harness.run("granted-cat", mnt + "/secure/token").stdout == "s3cret")
        }

        /// Connect, fork a child that reads the reply, and become the
        /// granted program, which writes the request (the granted `cat`
        /// copies it from a pipe into the connection it inherits): the "exec
        /// relay" (docs/SECURITY.md, "An application's secrets on every door").
        /// The device reads who connected when it accepts; a device of the
        /// user's own that the attacker stopped meanwhile (SIGSTOP) read the
        /// granted program, and answered it, every time; the service (which
        /// the user cannot stop) once in three, as the race went. Now a
        /// connection that outlives an exec, or that another process holds
        /// too, is nobody's. The same for a relayed `watch`: nothing of the
        /// policed group reaches it, while another group's events do.
        @Test(arguments: [false, true]) func aGrantedProgramThatInheritsTheConnectionRelaysNothing(inService: Bool)
            throws
        {
            let (harness, mnt) = try Self.policedKeychainOfAnOrdinaryUser(inService: inService)
            #expect(harness.grant("secure", exe: harness.binary).succeeded)  // keychainfs itself may change it
            try Self.compile(
                harness, "relay",
                """
                #include <limits.h>
                #include <signal.h>
                #include <stdint.h>
                #include <stdio.h>
                #include <stdlib.h>
                #include <string.h>
                #include <sys/socket.h>
                #include <sys/un.h>
                #include <unistd.h>
                /* relay SOCKET PROGRAM DEVICE-PID KIND [FIELD...]: PROGRAM writes the frame (docs/PROTOCOL.md) into
                   the connection it inherits; a child reads the reply. A device pid (0: none) is stopped meanwhile. */
                \(Self.frameField)
                int main(int argc, char **argv) {
                    unsigned char frame[256]; size_t body = 0;
                    unsigned char *b = frame + 4;
                    pid_t device = atoi(argv[3]);
                    b[body++] = VERSION; b[body++] = atoi(argv[4]);
                    memset(b + body, 0, 4); body += 4;          /* code 0 */
                    for (int n = 5; n < argc; n++) body += field(b + body, argv[n]);
                    uint32_t length = body; memcpy(frame, &length, 4);
                    int request[2];
                    if (pipe(request) != 0 || write(request[1], frame, 4 + body) != (ssize_t)(4 + body)) return 3;
                    if (device > 0) kill(device, SIGSTOP);
                    int fd = socket(AF_UNIX, SOCK_STREAM, 0);   /* no SOCK_CLOEXEC: PROGRAM inherits it */
                    struct sockaddr_un address = { .sun_family = AF_UNIX };
                    strncpy(address.sun_path, argv[1], sizeof address.sun_path - 1);
                    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) return 2;
                    pid_t parent = getpid();
                    if (fork() == 0) {
                        /* The write end stays open here, so PROGRAM (cat) lives while the reply is read. */
                        close(request[0]);
                        char link[64], target[PATH_MAX];
                        snprintf(link, sizeof link, "/proc/%d/exe", parent);
                        for (int tries = 0; tries < 5000; tries++) {
                            ssize_t n = readlink(link, target, sizeof target - 1);
                            if (n > 0) { target[n] = 0; if (strcmp(target, argv[2]) == 0) break; }
                            usleep(1000);
                        }
                        if (device > 0) kill(device, SIGCONT);
                        unsigned char reply[4096]; ssize_t count;
                        while ((count = read(fd, reply, sizeof reply)) > 0) write(1, reply, count);
                        return 0;
                    }
                    dup2(request[0], 0); dup2(fd, 1); close(fd); close(request[0]); close(request[1]);
                    char *program[] = { argv[2], NULL };
                    execv(argv[2], program);
                    return 127;
                }
                """, options: "-DVERSION=\(DeviceProtocol.version)")
            let device = harness.service == nil ? MountHarness.devicePid(mnt) ?? 0 : 0
            let socket = harness.service?.socket ?? "$(ls \"$XDG_RUNTIME_DIR\"/keychainfs/*.sock)"
            // Kinds 7 and 28 are get and watch (docs/PROTOCOL.md). Five
            // tries: each was a race the attacker won once in three.
            for _ in 1...5 {
                let get = harness.sh(
                    """
                    "$R/relay" "\(socket)" "$R/granted-cat" \(device) 7 secure token | tr -c '[:print:]' .
                    """)
                #expect(!get.stdout.contains("s3cret"), "\(get)")
            }
            #expect(
                Self.denials(harness).contains {
                    $0.contains("secure/token")
                        && ($0.contains("no close-on-exec") || $0.contains("is shared with pid"))
                }, "\(harness.sh("\"$K\" log" + harness.keychainOption).stdout)")
            let watch = harness.sh(
                """
                mkdir "$1/open"
                mkfifo "$R/relayed"
                "$R/relay" "\(socket)" "$R/granted-cat" \(device) 28 > "$R/relayed" &
                trap 'pkill -x relay; pkill -x granted-cat' EXIT
                exec 3< "$R/relayed"
                # The stream's first event is the device's state: the watch is on.
                head -c 1 <&3 > /dev/null
                printf new | "$K" set secure/other\(harness.keychainOption)
                printf y > "$1/open/marker"
                sed '/marker/q' <&3 > "$R/seen"
                tr -c '[:print:]' . < "$R/seen"
                """, arguments: [mnt])
            #expect(watch.stdout.contains("marker"), "\(watch)")
            #expect(!watch.stdout.contains("other"), "\(watch)")
            // A client that keeps its connection to itself is answered.
            #expect(harness.sh("\"$K\" get secure/token" + harness.keychainOption).stdout == "s3cret")
        }

        /// Connect, send a request but its last byte, fork; the parent becomes
        /// the granted program (execv), the child sends the last byte and reads
        /// the reply. The process that connected is the granted one by then;
        /// the request was not all its own.
        @Test(arguments: [false, true]) func aSocketRequestFinishedByAnotherProcessIsRefused(inService: Bool) throws {
            let (harness, _) = try Self.policedKeychainOfAnOrdinaryUser(inService: inService)
            #expect(harness.grant("secure", exe: harness.binary).succeeded)  // keychainfs itself may ask too
            try Self.compile(
                harness, "race",
                """
                #include <stdint.h>
                #include <stdio.h>
                #include <string.h>
                #include <sys/socket.h>
                #include <sys/un.h>
                #include <unistd.h>
                /* race SOCKET PROGRAM: a `get secure/token` frame (docs/PROTOCOL.md). */
                \(Self.frameField)
                int main(int argc, char **argv) {
                    unsigned char frame[256]; size_t body = 0;
                    unsigned char *b = frame + 4;
                    b[body++] = VERSION; b[body++] = 7;         /* kind get */
                    memset(b + body, 0, 4); body += 4;          /* code 0 */
                    body += field(b + body, "secure"); body += field(b + body, "token");
                    uint32_t length = body; memcpy(frame, &length, 4);
                    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
                    struct sockaddr_un address = { .sun_family = AF_UNIX };
                    strncpy(address.sun_path, argv[1], sizeof address.sun_path - 1);
                    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) { perror("connect"); return 2; }
                    write(fd, frame, 4 + body - 1);
                    int hold[2]; pipe(hold);
                    if (fork() == 0) {
                        close(hold[0]);
                        usleep(300000);                             /* the parent is the granted program now */
                        write(fd, frame + 4 + body - 1, 1);
                        unsigned char reply[4096]; ssize_t count, total = 0;
                        while ((count = read(fd, reply + total, sizeof reply - total)) > 0) total += count;
                        fwrite(reply, 1, total, stdout);
                        return 0;
                    }
                    close(hold[1]); dup2(hold[0], 0);               /* it waits on stdin until the child ends */
                    char *program[] = { argv[2], NULL };
                    execv(argv[2], program);
                    return 127;
                }
                """, options: "-DVERSION=\(DeviceProtocol.version)")
            let socket = harness.service?.socket ?? "$(ls \"$XDG_RUNTIME_DIR\"/keychainfs/*.sock)"
            let attack = harness.sh(
                """
                "$R/race" "\(socket)" "$R/granted-cat" | tr -c '[:print:]' .
                """)
            #expect(!attack.stdout.contains("s3cret"), "\(attack)")
            #expect(attack.stdout.contains("from the process that connected"), "\(attack)")
            // The same request sent whole by one process is answered.
            let whole = harness.sh("\"$K\" get secure/token" + harness.keychainOption)
            #expect(whole.stdout == "s3cret", "\(whole) \(Self.denials(harness))")
        }
    }
}
