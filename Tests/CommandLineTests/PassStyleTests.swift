import Foundation
import KeychainCore
import Testing
import TestSupport

extension SerialTests {
    /// What pass and gopass users expect: one-time codes, generated
    /// passwords, finding names, the clipboard (docs/FILESYSTEM.md,
    /// "What pass users find"). Each runs against a device started on
    /// demand, with no mount.
    @Suite struct PassStyleTests {
        let harness: MountHarness

        init() throws {
            harness = try MountHarness()
            #expect(k("unlock", stdin: MountHarness.passcode + "\n").succeeded)
        }

        func k(_ arguments: String, stdin: String? = nil, environment: String = "") -> ShellResult {
            harness.sh("\(environment) \"$K\" \(arguments) --keychain \"$KC\"", stdin: stdin)
        }

        /// A name the command line refuses says which part is wrong and
        /// why: `set nogroup` and a name pass would not take said only
        /// "The value ... is invalid for '<item>'". Exit 64, nothing changed.
        @Test func aRefusedNameSaysWhichPartAndWhy() {
            let cases: [(String, String)] = [
                ("get email/work//imap", "the name: a part of it, \"\": it is empty"),
                ("get email/work/..", "the name: a part of it, \"..\": .. is reserved (. .. .control .events)"),
                ("set nogroup", "an item is named GROUP/NAME, its group first (default/nogroup, for example)"),
                ("rm default/.control", "the name: .control is reserved (. .. .control .events)"),
                ("get \"$(printf 'default/a\\tb')\"", "the name: it holds the control character U+0009"),
                ("get /x", "the group: it is empty"),
                (
                    "get default/" + String(repeating: "é", count: 130),
                    "the name: it is 260 bytes long; a name holds at most 255 bytes of UTF-8"
                ),
                (
                    "get \"$(printf 'default/cafe\\314\\201')\"",
                    "the name: it is not in Unicode's composed form (NFC): type it composed (é as one character, U+00E9)"
                )
            ]
            for (arguments, reason) in cases {
                let refused = k(arguments, stdin: "")
                #expect(
                    refused.status == 64 && refused.stderr.contains("is invalid for '<item>': " + reason), "\(refused)")
            }
            #expect(k("ls").stdout == "default\n")
        }

        /// RFC 6238's SHA-1 vector at T=59, through an item as pass-otp keeps it
        /// (password first, URI on a later line); then now, and the failures.
        @Test func otpPrintsTheCodeOfAnItemsOtpauthUri() {
            #expect(
                k(
                    "set default/site",
                    stdin:
                        "hunter2\notpauth://totp/Example:ada?secret=GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ&digits=8&issuer=Example\n"
                ).succeeded)
            #expect(k("otp default/site --at 59").stdout == "94287082\n")
            #expect(k("otp default/site --at 1111111109").stdout == "07081804\n")
            let now = k("otp default/site")
            #expect(now.succeeded && now.stdout.count == 9 && now.stdout.dropLast().allSatisfy(\.isNumber), "\(now)")

            #expect(k("set default/plain", stdin: "hunter2").succeeded)
            let plain = k("otp default/plain")
            #expect(
                plain.status == 1 && plain.stderr == "keychainfs: default/plain holds no otpauth:// URI\n", "\(plain)")
            #expect(k("set default/hotp", stdin: "otpauth://hotp/x?secret=GEZDGNBV&counter=3").succeeded)
            #expect(k("otp default/hotp").stderr.contains("only time-based codes"))
            #expect(k("otp default/absent").status == 2)
            #expect(k("lock").succeeded)
            let locked = k("otp default/site")
            #expect(locked.status == 3 && locked.stderr.contains("locked"), "\(locked)")
        }

        @Test func generateStoresAPasswordAndPrintsNothingUnlessAsked() throws {
            let made = k("generate default/new")
            #expect(made.succeeded && made.stdout.isEmpty && made.stderr.isEmpty, "\(made)")
            let stored = k("get default/new").stdout
            #expect(stored.count == 25)
            for characters in ["abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789"] {
                #expect(stored.contains(where: characters.contains), "\(characters)")
            }
            #expect(stored.contains { $0.isPunctuation || $0.isSymbol })

            // An existing item is kept: generate is not a way to lose a password.
            let again = k("generate default/new 30")
            #expect(
                again.status == 1 && again.stderr.contains("already exists and was kept (--force replaces it)"),
                "\(again)")
            #expect(k("get default/new").stdout == stored)

            let printed = k("generate default/new 12 --force --print --no-symbols")
            #expect(printed.succeeded && printed.stdout.count == 13, "\(printed)")
            #expect(printed.stdout.dropLast().allSatisfy { $0.isLetter || $0.isNumber })
            #expect(k("get default/new").stdout + "\n" == printed.stdout)

            let digits = k("generate default/pin 6 --classes digits --print")
            #expect(digits.stdout.dropLast().allSatisfy(\.isNumber) && digits.stdout.count == 7, "\(digits)")
        }

        @Test func generateWordsMakesAPassphraseFromTheWordList() throws {
            let list = harness.root + "/words"
            try (0..<2000).map {
                "word" + String($0, radix: 5).map { ["a", "b", "c", "d", "e"][$0.wholeNumberValue!] }.joined()
            }
            .joined(separator: "\n").write(toFile: list, atomically: true, encoding: .utf8)
            let phrase = k("generate default/phrase 5 --words --wordlist \(list) --separator . --print")
            let words = phrase.stdout.dropLast().split(separator: ".", omittingEmptySubsequences: false)
            #expect(phrase.succeeded && words.count == 5 && words.allSatisfy { $0.hasPrefix("word") }, "\(phrase)")
            #expect(k("get default/phrase").stdout + "\n" == phrase.stdout)
            // The system's list, which ./scripts/setup installs.
            #expect(k("generate default/system --words --print").stdout.split(separator: "-").count == 6)
        }

        @Test(arguments: [
            ("default/x 3", "the length must be from 4 to 4096 characters"),
            ("default/x 3 --classes digits lower upper symbols", "the length must be from 4"),
            ("default/x --words 2", "the number of words must be from 3 to 64"),
            ("default/x --words --wordlist /nonexistent", "cannot read the word list /nonexistent"),
            ("default/x --words --no-symbols", "--words makes a passphrase"),
            ("default/x --classes vowels", "vowels")
        ])
        func generateRefusesWhatItCannotMakeAndStoresNothing(arguments: String, message: String) {
            let result = k("generate \(arguments)")
            #expect(result.status != 0 && result.stderr.contains(message), "\(result)")
            #expect(k("get default/x").status == 2)
        }

        @Test func findListsMatchingNamesWhileLocked() {
            for item in ["default/github.com", "default/GitLab", "work/github-token", "work/db"] {
                #expect(k("set \(item)", stdin: "v").succeeded)
            }
            #expect(k("lock").succeeded)
            #expect(k("find git").stdout == "default/GitLab\ndefault/github.com\nwork/github-token\n")
            #expect(k("find 'work/*'").stdout == "work/db\nwork/github-token\n")
            #expect(k("find '*.com' db").stdout == "default/github.com\nwork/db\n")
            let none = k("find nothing")
            #expect(none.status == 2 && none.stdout.isEmpty, "\(none)")
        }

        /// A group whose policy does not admit `keychainfs` is a note on
        /// stderr; the matches printed are the answer, exit status 0 (it was 4).
        @Test func findSucceedsWithMatchesBesideAPolicedGroup() throws {
            let (harness, _) = try MountHarness.withPolicedGroup()
            #expect(harness.grant("secure", exe: harness.root + "/granted-cat").succeeded)
            let found = harness.sh("\"$K\" find open --keychain \"$KC\"")
            #expect(found.status == 0 && found.stdout == "default/open\n", "\(found)")
            #expect(found.stderr.contains("secure: not searched"), "\(found)")
            let none = harness.sh("\"$K\" find token --keychain \"$KC\"")
            #expect(none.status == 2 && none.stdout.isEmpty && none.stderr.contains("secure: not searched"), "\(none)")
        }

        /// `--clip` under a real X server: the value reaches the clipboard, not
        /// stdout; the clearer empties it after the time, and leaves alone a
        /// clipboard the user changed meanwhile.
        @Test func clipCopiesAndClearsTheClipboardUnlessItChanged() throws {
            let display = try VirtualDisplay()
            #expect(k("set default/token", stdin: "s3cret").succeeded)
            func xclip(_ arguments: String, stdin: String? = nil) -> ShellResult {
                harness.sh("DISPLAY=\(display.display) xclip -selection clipboard \(arguments)", stdin: stdin)
            }
            func clip(_ command: String, seconds: Int) -> (ShellResult, [pid_t]) {
                let tag = "KCFS_TEST_CLIP=\(UUID().uuidString)"
                let result = k(
                    command, environment: "\(tag) DISPLAY=\(display.display) KEYCHAINFS_CLIP_TIME=\(seconds)")
                return (
                    result,
                    processes(withEnvironment: tag).filter {
                        (try? String(contentsOfFile: "/proc/\($0)/cmdline", encoding: .utf8))?.contains(
                            "clipboard-clear") == true
                    }
                )
            }

            let (copied, clearers) = clip("get default/token --clip", seconds: 1)
            #expect(
                copied.succeeded && copied.stdout.isEmpty && copied.stderr.contains("cleared in 1 seconds"), "\(copied)"
            )
            #expect(xclip("-out").stdout == "s3cret")
            #expect(clearers.count == 1)
            for clearer in clearers { #expect(waitForExit(clearer, seconds: 20)) }
            #expect(xclip("-out").stdout == "")

            // Changed by the user before the clearer's time: theirs, kept.
            let (generated, laterClearers) = clip("generate default/fresh --clip", seconds: 5)
            #expect(generated.succeeded && generated.stdout.isEmpty, "\(generated)")
            #expect(xclip("-out").stdout == k("get default/fresh").stdout)
            #expect(xclip("-in", stdin: "mine").succeeded)
            for clearer in laterClearers { #expect(waitForExit(clearer, seconds: 20)) }
            #expect(xclip("-out").stdout == "mine")

            // A pass-style entry (the password, then notes): `-c` copies the first line, as `pass -c` does.
            #expect(k("set default/entry", stdin: "hunter2\nuser: me\nurl: example.org\n").succeeded)
            let (first, firstClearers) = clip("show -c default/entry", seconds: 5)
            #expect(first.succeeded && first.stdout.isEmpty, "\(first)")
            #expect(xclip("-out").stdout == "hunter2")
            #expect(xclip("-in", stdin: "mine").succeeded)
            for clearer in firstClearers { #expect(waitForExit(clearer, seconds: 20)) }

            let code = k("otp default/token --clip", environment: "DISPLAY=\(display.display)")
            #expect(code.status == 1, "an item without a URI copies nothing: \(code)")
            #expect(xclip("-out").stdout == "mine")
            let noDisplay = k("get default/token --clip", environment: "DISPLAY= WAYLAND_DISPLAY=")
            #expect(
                noDisplay.status == 1 && noDisplay.stderr.contains("needs a desktop session")
                    && noDisplay.stdout.isEmpty, "\(noDisplay)")
        }
    }
}
