import Foundation
import KeychainCore
import Testing
import TestSupport

extension SerialTests {
    /// `keychainfs import pass` (docs/FILESYSTEM.md, "What pass users find"):
    /// a password store made in the test by pass itself, encrypted to a
    /// throwaway GnuPG key, moves in with one command; names mapped and
    /// reported, nothing overwritten unless asked.
    @Suite final class ImportPassTests {
        let harness: MountHarness
        /// GNUPGHOME and PASSWORD_STORE_DIR for every command of the test.
        let environment = "export GNUPGHOME=\"$R/gnupg\" PASSWORD_STORE_DIR=\"$R/store\";"

        init() throws {
            harness = try MountHarness()
            let made = harness.sh(
                environment + """
                    mkdir -m 700 "$GNUPGHOME"
                    gpg --batch --passphrase '' --quick-gen-key 'KeychainFS test <test@example.org>' default default never 2> /dev/null
                    pass init test@example.org > /dev/null
                    printf 'hunter2\\n' | pass insert -e web/github.com > /dev/null
                    printf 'top-secret\\n' | pass insert -e toplevel > /dev/null
                    printf 'pw\\nuser: ada\\notpauth://totp/x?secret=GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ&digits=8\\n' | pass insert -m email/work/imap > /dev/null
                    """)
            guard made.succeeded else { throw HarnessError("could not make the store: \(made)") }
        }

        deinit {
            // gpg started an agent for this GNUPGHOME: no process outlives the test.
            _ = harness.sh(environment + "gpgconf --kill gpg-agent")
        }

        func k(_ arguments: String, stdin: String? = nil) -> ShellResult {
            harness.sh(environment + "\"$K\" \(arguments) --keychain \"$KC\"", stdin: stdin)
        }

        func unlock() { #expect(k("unlock", stdin: MountHarness.passcode + "\n").succeeded) }

        @Test func everyEntryBecomesAnItemNamedAsInPassAndReported() {
            unlock()
            let imported = k("import pass")
            #expect(imported.succeeded, "\(imported)")
            #expect(
                imported.stdout == """
                    imported email/work/imap -> email/work/imap
                    imported toplevel -> default/toplevel
                    imported web/github.com -> web/github.com

                    """, "\(imported)")
            #expect(imported.stderr == "3 imported, 0 kept, 0 failed\n")
            // A one-line entry is the password, as pass -c copies it; a longer one whole.
            #expect(k("get web/github.com").stdout == "hunter2")
            #expect(k("get default/toplevel").stdout == "top-secret")
            #expect(k("get email/work/imap").stdout.hasPrefix("pw\nuser: ada\notpauth://"))
            #expect(k("otp email/work/imap --at 59").stdout == "94287082\n")
            #expect(!imported.stdout.contains("hunter2") && !imported.stderr.contains("hunter2"))
        }

        @Test func nothingIsOverwrittenUnlessAsked() {
            unlock()
            #expect(k("set web/github.com", stdin: "mine").succeeded)
            let again = k("import pass")
            #expect(
                again.succeeded
                    && again.stdout.contains(
                        "kept     web/github.com -> web/github.com (it exists; --force replaces it)"),
                "\(again)")
            #expect(again.stderr == "2 imported, 1 kept, 0 failed\n")
            #expect(k("get web/github.com").stdout == "mine")
            #expect(k("import pass --force").stderr == "3 imported, 0 kept, 0 failed\n")
            #expect(k("get web/github.com").stdout == "hunter2")
        }

        @Test func oneGroupForEverythingWithTheWholePathAsTheName() {
            unlock()
            #expect(k("import pass --group pass").succeeded)
            #expect(k("ls pass").stdout.hasPrefix("email/work/imap"))
            #expect(k("get pass/web/github.com").stdout == "hunter2")
            #expect(k("get pass/toplevel").stdout == "top-secret")
        }

        @Test func lockedDryRunAndBrokenEntriesChangeNothingElse() {
            let locked = k("import pass")
            #expect(
                locked.status == 3 && locked.stderr == "keychainfs: the keychain is locked; unlock it first\n",
                "\(locked)")
            unlock()
            #expect(
                k("import pass --dry-run").stdout == """
                    email/work/imap -> email/work/imap
                    toplevel -> default/toplevel
                    web/github.com -> web/github.com

                    """)
            #expect(k("get web/github.com").status == 2)
            // An entry gpg cannot decrypt is reported; the others are imported.
            #expect(harness.sh(environment + "printf 'not openpgp' > \"$PASSWORD_STORE_DIR/web/broken.gpg\"").succeeded)
            let broken = harness.sh(
                environment + "\"$K\" import pass --keychain \"$KC\" 2> /dev/null; echo \"status $?\"")
            #expect(broken.stdout.contains("failed   web/broken: gpg could not decrypt it (status 2)\n"), "\(broken)")
            #expect(broken.stdout.hasSuffix("status 1\n"))
            #expect(k("get web/github.com").stdout == "hunter2")
            // An entry whose file name holds a terminal escape sequence is
            // reported with it escaped: a store cannot write to the screen.
            #expect(
                harness.sh(
                    environment + """
                        cp "$PASSWORD_STORE_DIR/web/github.com.gpg" "$PASSWORD_STORE_DIR/web/evil$(printf '\\033')[2J.gpg"
                        """
                ).succeeded)
            let escaped = k("import pass --dry-run")
            #expect(escaped.stdout.contains("web/evil\\x1b[2J") && !escaped.stdout.contains("\u{1b}"), "\(escaped)")
            let missing = k("import pass \"$R/nowhere\"")
            #expect(missing.status == 2 && missing.stderr.contains("no entries"), "\(missing)")
        }
    }
}
