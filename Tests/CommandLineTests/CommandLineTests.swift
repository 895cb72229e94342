import KeychainCore
import KeychainProtocol
import Foundation
import KeychainFS
import Testing
import TestSupport

extension SerialTests {
    /// What the command line tells a user who got something wrong.
    @Suite struct CommandLineTests {
        @Test func shellCompletionsKnowEveryCommand() throws {
            let harness = try MountHarness()
            for shell in ["bash", "zsh", "fish"] {
                let script = harness.sh("\"$K\" --generate-completion-script \(shell)")
                #expect(script.succeeded)
                for word in ["init", "mount", "unmount", "unlock", "status", "keychain", "foreground"] {
                    #expect(script.stdout.contains(word), "\(shell) completion lacks \(word)")
                }
            }
        }

        /// Bash completes group and item names from the running device (as a
        /// user's shell does, through the generated script), never a value, and
        /// never starts a device for it.
        @Test func bashCompletesGroupAndItemNamesFromTheRunningDevice() throws {
            let harness = try MountHarness()
            let complete = { (words: String) in
                // The generated script is bash's; the harness runs sh.
                harness.sh(
                    "bash -c \"$1\"",
                    arguments: [
                        """
                        source <("$K" --generate-completion-script bash)
                        PATH="$(dirname "$K"):$PATH"
                        COMP_WORDS=(\(words)); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
                        COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
                        _keychainfs keychainfs "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
                        printf '%s\\n' "${COMPREPLY[@]}"
                        """
                    ]
                ).stdout
            }
            #expect(complete("keychainfs get --keychain \"$KC\" d") == "\n")
            #expect(harness.sh("\"$K\" status --keychain \"$KC\"").stdout.hasPrefix("state: stopped"))
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: MountHarness.passcode + "\n").succeeded)
            for (item, value) in [("default/token", "v-token"), ("default/tea", "v-tea"), ("web/site", "v-site")] {
                #expect(harness.sh("\"$K\" set \(item) --keychain \"$KC\"", stdin: value).succeeded)
            }
            #expect(complete("keychainfs get --keychain \"$KC\" d") == "default/\n")
            #expect(complete("keychainfs get --keychain \"$KC\" default/t") == "default/tea\ndefault/token\n")
            #expect(complete("keychainfs rm --keychain \"$KC\" default/to") == "default/token\n")
            #expect(complete("keychainfs exec --keychain \"$KC\" --env DB=w") == "DB=web/\n")
            #expect(complete("keychainfs ls --keychain \"$KC\" w") == "web\n")
            let all = complete("keychainfs set --keychain \"$KC\" default/")
            #expect(all == "default/tea\ndefault/token\n" && !all.contains("v-"), "\(all)")
        }

        /// The man page ./scripts/setup installs has what --help lacks, and its
        /// exit statuses are the ones the command says.
        @Test func theManPageHasExitStatusEnvironmentFilesAndExamples() throws {
            let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .deletingLastPathComponent().path
            let page = repository + "/.build/release/share/man/man1/keychainfs.1"
            // As a reader sees it: formatted (mdoc), the generic "exits 0 on success" gone.
            let harness = try MountHarness(passcode: nil)
            let formatted = harness.sh("groff -mandoc -Tutf8 -P-cbou \"$1\"", arguments: [page])
            #expect(formatted.succeeded && formatted.stderr.isEmpty, "\(formatted)")
            let shown = formatted.stdout
            for section in ["EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES", "SEE ALSO"] {
                #expect(shown.contains("\n" + section + "\n"), "\(section)")
            }
            #expect(shown.components(separatedBy: "EXIT STATUS").count == 2)
            for name in [
                ".control", ".events", "KEYCHAINFS_KEYCHAIN", "KEYCHAINFS_SERVICE", "autolock DURATION",
                "keychainfs unlock"
            ] {
                #expect(shown.contains(name), "\(name)")
            }
            for (status, meaning) in [
                ("2", "absent"), ("3", "locked"), ("4", "denied"), ("5", "no device"), ("64", "a command line"),
                ("127", "exec:")
            ] {
                #expect(
                    shown.split(separator: "\n").contains { $0.hasPrefix("     \(status) ") && $0.contains(meaning) },
                    "\(status)")
            }
        }

        /// A fresh account has no ~/.local/share: init creates what is missing
        /// (0700, only what it creates), and a failure names the path and the cause.
        @Test func initOnAFreshAccountCreatesTheMissingDirectories() throws {
            let harness = try MountHarness()
            let home = harness.root + "/home"
            #expect(mkdir(home, 0o755) == 0)
            let created = harness.sh(
                "env -u XDG_DATA_HOME HOME=\"$1\" \"$K\" init", arguments: [home], stdin: "1234\n1234\n")
            #expect(created.succeeded, "\(created)")
            var info = stat()
            for (path, mode) in [(".local", 0o700), (".local/share", 0o700), (".local/share/keychainfs", 0o700)] {
                #expect(stat(home + "/" + path, &info) == 0 && info.st_mode & 0o777 == mode, "\(path)")
            }
            #expect(stat(home, &info) == 0 && info.st_mode & 0o777 == 0o755)  // not ours to change
            #expect(access(home + "/.local/share/keychainfs/keychain.db", F_OK) == 0)
            // A file where a directory must go: the message says which and why.
            #expect(harness.sh("printf x > \"$1/blocker\"", arguments: [home]).succeeded)
            let blocked = harness.sh(
                "\"$K\" init --keychain \"$1/blocker/kc\"", arguments: [home], stdin: "1234\n1234\n")
            #expect(!blocked.succeeded)
            #expect(
                blocked.stderr.contains("cannot create the directory \(home)/blocker/kc: Not a directory"), "\(blocked)"
            )
            #expect(!blocked.stderr.contains("could not be read or written"), "a generic sentence: \(blocked)")
        }

        @Test func helpfulErrors() throws {
            let harness = try MountHarness()
            let mountpoint = try harness.prepareMountpoint("mnt")
            let noKeychain = harness.sh("\"$K\" mount \"$1\" --keychain \"$R/missing\"", arguments: [mountpoint])
            #expect(noKeychain.status == 1)
            #expect(noKeychain.stderr.contains("keychainfs init"))
            let notMounted = harness.sh("\"$K\" unmount \"$1\"", arguments: [mountpoint])
            #expect(notMounted.status == 1)
            #expect(notMounted.stderr.contains("not mounted"))
            #expect(harness.sh("touch \"$1/file\"", arguments: [mountpoint]).succeeded)
            let notEmpty = harness.sh("\"$K\" mount \"$1\" --keychain \"$KC\"", arguments: [mountpoint])
            #expect(notEmpty.stderr.contains("not empty"))
            let missingDirectory = harness.sh("\"$K\" mount \"$R/nowhere\" --keychain \"$KC\"")
            #expect(missingDirectory.stderr.contains("does not exist"))
            let again = harness.sh("\"$K\" init --keychain \"$KC\"", stdin: "x\n")
            #expect(again.stderr.contains("already exists"))
            let noGroup = harness.sh("mkdir \"$R/g\" && \"$K\" mount \"$R/g\" --group nope --keychain \"$KC\"")
            #expect(noGroup.stderr.contains("no access group nope"))
            #expect(harness.sh("\"$K\" mount \"$R/g\" --group a/b --keychain \"$KC\"").status == 64)
            // No command at all is a usage error too, the help on standard error.
            let bare = harness.sh("\"$K\"")
            #expect(bare.status == 64 && bare.stdout.isEmpty && bare.stderr.contains("SUBCOMMANDS"), "\(bare)")
        }

        @Test func aMissingDevFuseIsReportedClearly() throws {
            let harness = try MountHarness()
            let mountpoint = try harness.prepareMountpoint("mnt")
            // A private mount namespace whose /dev lacks fuse.
            let result = harness.sh(
                "unshare -m sh -c 'mount -t tmpfs none /dev && exec \"$K\" mount \"$1\" --foreground --keychain \"$KC\"' sh \"$1\"",
                arguments: [mountpoint])
            #expect(result.status == 1)
            #expect(result.stderr.contains("/dev/fuse is missing"))
            #expect(!harness.isMounted(mountpoint))
        }

        @Test func wrongPasscodeSaysSoAndStatusPrintsTheControlFile() throws {
            let harness = try MountHarness()
            let mnt = try harness.mount()
            let wrong = harness.sh("\"$K\" unlock \"$1\"", arguments: [mnt], stdin: "nope\n")
            #expect(wrong.status == 4)
            #expect(wrong.stderr.contains("wrong passcode"))
            // A wrong passcode or password is "denied" (4) in every command that reads one.
            let passcode = harness.sh("\"$K\" passcode --keychain \"$KC\"", stdin: "nope\n5678\n5678\n")
            #expect(passcode.status == 4 && passcode.stderr.contains("wrong"), "\(passcode)")
            let empty = harness.sh("\"$K\" unlock \"$1\"", arguments: [mnt], stdin: "\n")
            #expect(empty.status == 1 && empty.stderr.contains("no passcode given"), "\(empty)")
            // Mounting it again where it is mounted says so.
            let again = harness.sh("\"$K\" mount \"$1\" --keychain \"$KC\"", arguments: [mnt])
            #expect(again.status == 1 && again.stderr.contains("already mounted"), "\(again)")
            try harness.unlock(mnt)
            let status = harness.sh("\"$K\" status \"$1\"", arguments: [mnt])
            #expect(status.stdout.hasPrefix("state: unlocked\nfirst-unlock: yes\n"))
            // One report (docs/FILESYSTEM.md, "`.control`"): what the command
            // prints, which it asks the device over the socket, is the mount's
            // .control, line for line.
            #expect(status.stdout == readFile(mnt + "/.control"), "\(status)")
            #expect(
                harness.sh("\"$K\" lock \"$1\" && \"$K\" status \"$1\"", arguments: [mnt]).stdout.hasPrefix(
                    "state: locked\n"))
        }

        /// A group mount's status names its group, through the command as in
        /// `.control`, and --json holds the same keys and values.
        @Test func aGroupMountsStatusIsTheSameReportAsItsControlFile() throws {
            let harness = try MountHarness()
            let whole = try harness.mount()
            try harness.unlock(whole)
            #expect(mkdir(whole + "/team.app", 0o700) == 0)
            let mnt = try harness.mount("team", group: "team.app")
            let text = harness.sh("\"$K\" status \"$1\"", arguments: [mnt]).stdout
            #expect(text == readFile(mnt + "/.control") && text.contains("\ngroup: team.app\n"), "\(text)")
            let json = harness.sh("\"$K\" status --json \"$1\"", arguments: [mnt]).stdout
            let object = try #require(
                try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any], "\(json)")
            #expect(object["group"] as? String == "team.app" && object["state"] as? String == "unlocked")
            #expect(object["pid"] as? Int != nil && object["failed-attempts"] as? Int == 0, "\(json)")
            #expect(Set(object.keys) == Set(text.split(separator: "\n").map { String($0.split(separator: ":")[0]) }))
            // Locked through the group mount's device: every mount of the keychain is locked.
            #expect(harness.sh("\"$K\" lock \"$1\"", arguments: [mnt]).succeeded)
            #expect(readFile(whole + "/.control")?.hasPrefix("state: locked\n") == true)
            #expect(harness.sh("\"$K\" unmount \"$1\"", arguments: [mnt]).succeeded)
        }

        @Test func passcodesNeverAppearInArgv() throws {
            // There is no option that takes one: argument parsing refuses it.
            let harness = try MountHarness()
            let mnt = try harness.mount()
            #expect(harness.sh("\"$K\" unlock \"$1\" 1234", arguments: [mnt]).status == 64)
            #expect(harness.status(mnt)["state"] == "locked")
        }

        @Test func aMistypedCommandGetsASuggestionAndVersionAnswers() throws {
            let harness = try MountHarness()
            let typo = harness.sh("\"$K\" mout \"$R/mnt\"")
            #expect(typo.status == 64 && typo.stderr.contains("did you mean 'mount'?"), "\(typo)")
            // The beginning of one command is that command: `gen` was taken for `get`, one edit away.
            let begun = harness.sh("\"$K\" gen default/x")
            #expect(begun.status == 64 && begun.stderr.contains("did you mean 'generate'?"), "\(begun)")
            let unknown = harness.sh("\"$K\" frobnicate")
            #expect(unknown.status == 64 && !unknown.stderr.contains("did you mean"), "\(unknown)")
            // No typo is taken for a command that removes, stops or replaces: `mv` once suggested `rm`,
            // `shop` `stop`; and `show` is `get`, as pass users type it.
            for word in ["rmv", "shop", "rn", "lck", "restor"] {
                let dangerous = harness.sh("\"$K\" \(word) default/x")
                #expect(dangerous.status == 64, "\(dangerous)")
                for destructive in ["rm", "stop", "lock", "unmount", "revoke", "restore", "recover", "passcode", "init"]
                {
                    #expect(!dangerous.stderr.contains("did you mean '\(destructive)'"), "\(word): \(dangerous)")
                }
            }
            let shown = harness.sh(
                """
                printf '1234\\n' | "$K" unlock --keychain "$KC" && printf v | "$K" set default/x --keychain "$KC" &&
                    "$K" show default/x --keychain "$KC" && "$K" stop --keychain "$KC"
                """)
            #expect(shown.stdout == "v", "\(shown)")
            let version = harness.sh("\"$K\" --version")
            #expect(
                version.succeeded && version.stdout.hasPrefix("keychainfs ")
                    && version.stdout.contains("device protocol \(DeviceProtocol.version)"), "\(version)")
        }

        /// A new passcode is typed twice, at a terminal or on a pipe alike, and
        /// is four characters at least; otherwise nothing is created.
        @Test func aNewPasscodeIsConfirmedAndLongEnoughOnAPipeToo() throws {
            let harness = try MountHarness()
            for (stdin, says) in [
                ("1234\n4321\n", "the two differ"), ("1234\n", "not confirmed"), ("12\n12\n", "at least 4")
            ] {
                let result = harness.sh("\"$K\" init --keychain \"$R/new\"", stdin: stdin)
                #expect(result.status == 1 && result.stderr.contains(says), "\(stdin.debugDescription): \(result)")
                #expect(access(harness.root + "/new/keychain.db", F_OK) != 0)
            }
            #expect(harness.sh("\"$K\" init --keychain \"$R/new\"", stdin: "1234\n1234\n").succeeded)
            // The keychain may come first, before the command, as `git -C` does.
            let first = harness.sh("\"$K\" --keychain \"$R/first\" init", stdin: "1234\n1234\n")
            #expect(first.succeeded && FileManager.default.fileExists(atPath: harness.root + "/first/keychain.db"))
            let status = harness.sh(
                "\"$K\" --keychain=\"$R/first\" status | head -1; \"$K\" --keychain \"$R/first\" stop")
            #expect(status.stdout == "state: stopped\n", "\(status)")
            let backup = harness.sh(
                "\"$K\" backup \"$R/b.kcbak\" --keychain \"$R/new\"", stdin: "1234\nbackup-pw\nbackup-pq\n")
            #expect(backup.status == 1 && backup.stderr.contains("the two differ"), "\(backup)")
            #expect(access(harness.root + "/b.kcbak", F_OK) != 0)
        }

        /// The command names a help line starts with: `get, show  Print…` is `get` and its alias `show`.
        static func names(inHelpLine line: String) -> [String] {
            var names: [String] = []
            for word in line.split(separator: " ") {
                names.append(String(word.hasSuffix(",") ? word.dropLast() : word))
                if !word.hasSuffix(",") { break }
            }
            return names
        }

        /// Every subcommand the top-level help lists answers `--help`, `exec`
        /// too, whose other words are the command it runs.
        @Test func everyCommandHasHelp() throws {
            let harness = try MountHarness()
            let top = harness.sh("\"$K\" --help").stdout
            let listed = top.split(separator: "\n").drop { !$0.hasPrefix("SUBCOMMANDS:") }.dropFirst()
                .filter { $0.hasPrefix("  ") && !$0.hasPrefix("   ") && !$0.hasPrefix("  See ") }
                .flatMap { Self.names(inHelpLine: String($0)) }
            #expect(listed.contains("exec") && listed.contains("service") && listed.count >= 20, "\(listed)")
            for command in listed where command != "help" {
                let help = harness.sh("\"$K\" \"$1\" --help", arguments: [command])
                #expect(help.succeeded && help.stdout.contains("USAGE"), "\(command): \(help)")
            }
            // After `--`, `--help` is the command's own argument.
            let passed = harness.sh("\"$K\" exec --keychain \"$KC\" -- --help")
            #expect(passed.status == 127 && !passed.stdout.contains("USAGE"), "\(passed)")
        }
    }
}

extension SerialTests.CommandLineTests {
    /// At a terminal the passcode is asked for without echo (twice for init).
    @Test func passcodesAtATerminalAreNotEchoedAndInitAsksTwice() throws {
        let harness = try MountHarness()
        let typed = harness.sh(
            """
            ANSWERS=tty-secret,tty-secret python3 -c "$1" "$K" init --keychain "$R/tty-keychain"
            ANSWERS=one,two python3 -c "$1" "$K" init --keychain "$R/tty-keychain-2"
            # At a terminal, the new keychain is left unlocked, as a new keyring is.
            "$K" status --keychain "$R/tty-keychain" | head -1 >&2
            "$K" stop --keychain "$R/tty-keychain"
            """, arguments: [Self.terminalDriver])
        let lines = typed.stdout.split(separator: "\n").map(String.init)
        #expect(lines.count == 2, "\(typed)")
        #expect(
            lines.first?.hasPrefix("0 ") == true && lines.first?.contains("tty-secret") == false
                && lines.first?.components(separatedBy: "passcode: ").count == 3, "\(typed)")
        #expect(lines.last?.hasPrefix("1 ") == true, "\(typed)")
        #expect(lines.first?.contains("unlocked: its device holds the keys") == true, "\(typed)")
        #expect(typed.stderr == "state: unlocked\n", "\(typed)")
        #expect(!FileManager.default.fileExists(atPath: harness.root + "/tty-keychain-2/keychain.db"))
    }

    /// Ctrl-C at a passcode prompt ended the command with the terminal's
    /// echo still off: what the person typed next was invisible. Now the
    /// echo comes back before the command ends by the signal.
    @Test func ctrlCAtAPasscodePromptLeavesTheTerminalEchoing() throws {
        let harness = try MountHarness()
        let interrupted = harness.sh(
            """
            python3 - "$K" unlock --keychain "$KC" <<'PY'
            import os, pty, sys, termios
            pid, fd = pty.fork()
            if pid == 0:
                os.execv(sys.argv[1], sys.argv[1:])
            shown = b""
            while not shown.rstrip().endswith(b":"):
                shown += os.read(fd, 1024)
            # The prompt is up, the echo off: Ctrl-C, as a person types it.
            print("echo at the prompt:", bool(termios.tcgetattr(fd)[3] & termios.ECHO))
            os.write(fd, b"\\x03")
            _, status = os.waitpid(pid, 0)
            print("ended by signal", os.WTERMSIG(status) if os.WIFSIGNALED(status) else None)
            print("echo after:", bool(termios.tcgetattr(fd)[3] & termios.ECHO))
            PY
            """)
        #expect(
            interrupted.stdout == """
                echo at the prompt: False
                ended by signal 2
                echo after: True

                """, "\(interrupted)")
    }

    /// Python's pty module plays the terminal: runs its arguments, types
    /// `$ANSWERS` (comma-separated) at each prompt (a line ending in `:`),
    /// and prints the exit code and what the terminal showed. It types once
    /// the prompt's line has ended: the terminal turns its `\n` into
    /// `\r\n` apart from the text before it (n_tty's output processing),
    /// so one read may return the prompt without its line end, and the
    /// answer would be shown in another place of the transcript.
    static let terminalDriver = """
        import os, pty, sys
        pid, fd = pty.fork()
        if pid == 0:
            os.execv(sys.argv[1], sys.argv[1:])
        shown, pending = b"", [a.encode() for a in os.environ.get("ANSWERS", "").split(",") if a]
        while True:
            try:
                chunk = os.read(fd, 1024)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
            if pending and shown.endswith(b"\\n") and shown.rstrip().endswith(b":"):
                os.write(fd, pending.pop(0) + b"\\n")
                shown += b"<typed>"
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), repr(shown.decode(errors="replace")))
        """
}

extension SerialTests.CommandLineTests {
    @Test func aTamperedKeychainIsRefusedWithAClearMessageAndLeftAsItWas() throws {
        let harness = try MountHarness()
        let mnt = try harness.mount()
        try harness.unlock(mnt)
        #expect(harness.sh("printf v > \"$1/default/item\" && \"$K\" unmount \"$1\"", arguments: [mnt]).succeeded)
        let tamper = """
            import sqlite3, sys
            db = sqlite3.connect(sys.argv[1])
            db.execute("UPDATE items SET generation = generation - 1")
            db.commit()
            """
        #expect(
            harness.sh(
                "python3 -c \"$1\" \"$KC/keychain.db\" && sha256sum \"$KC/keychain.db\" > \"$R/before\"",
                arguments: [tamper]
            ).succeeded)
        let refused = harness.sh("\"$K\" mount \"$1\" --keychain \"$KC\"", arguments: [mnt])
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("integrity check"))
        #expect(!harness.isMounted(mnt))
        #expect(harness.sh("sha256sum -c \"$R/before\"").succeeded)
    }
}

extension SerialTests.CommandLineTests {
    /// A value typed at a terminal is not echoed, is one line (the Enter that
    /// ends it is not stored) and is asked twice; `get` to a terminal ends
    /// with a newline, and to a pipe gives the bytes alone.
    @Test func aValueTypedAtATerminalIsUnseenOneLineAndGetEndsItsLine() throws {
        let harness = try MountHarness()
        let mnt = try harness.mount()
        try harness.unlock(mnt)
        let typed = harness.sh(
            """
            ANSWERS=tty-value,tty-value python3 -c "$1" "$K" set default/typed --keychain "$KC"
            ANSWERS=one,two python3 -c "$1" "$K" set default/other --keychain "$KC"
            python3 -c "$1" "$K" get default/typed --keychain "$KC"
            "$K" get default/typed --keychain "$KC" | od -c | head -1
            "$K" get default/other --keychain "$KC" 2>&1
            """, arguments: [Self.terminalDriver])
        let lines = typed.stdout.split(separator: "\n").map(String.init)
        #expect(lines.count == 5, "\(typed)")
        #expect(
            lines.first == "0 'Value of default/typed: \\r\\n<typed>\\r\\nRepeat the value: \\r\\n<typed>\\r\\n'",
            "\(typed)")
        #expect(lines.dropFirst().first?.hasPrefix("1 ") == true && lines[1].contains("the two values differ"))
        #expect(lines.dropFirst(2).first == "0 'tty-value\\r\\n'", "\(typed)")
        #expect(lines.dropFirst(3).first == "0000000   t   t   y   -   v   a   l   u   e", "\(typed)")
        #expect(lines.last?.contains("does not exist") == true, "\(typed)")
    }
}
