import KeychainCore
import Foundation
import Testing
import TestSupport

extension SerialTests {
    /// get, set, rm, ls, exec and git's credential helper: clients of the running
    /// device, through real processes.
    @Suite struct ClientCommandTests {
        @Test func getSetRemoveAndListWithDistinctExitStatuses() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let kc = "--keychain \"$KC\""
            #expect(harness.sh("printf 'line one\\nline two' | \"$K\" set default/token \(kc)").succeeded)
            #expect(readFile(mnt + "/default/token") == "line one\nline two")  // the mount sees it at once
            #expect(harness.sh("\"$K\" get default/token \(kc)").stdout == "line one\nline two")
            #expect(
                harness.sh("\"$K\" get default/token --json \(kc)").stdout
                    == "{\"group\": \"default\", \"identifier\": \"token\", \"value\": \"line one\\nline two\"}\n")
            // Not UTF-8: base64 in JSON.
            #expect(
                harness.sh(
                    "printf '\\377\\376' | \"$K\" set default/zeros \(kc) && \"$K\" get default/zeros --json \(kc)"
                ).stdout
                    .contains("\"base64\": \"//4=\""))
            #expect(harness.sh("\"$K\" ls \(kc)").stdout == "default\n")
            #expect(
                harness.sh("\"$K\" ls default --json \(kc)").stdout.contains(
                    "{\"identifier\": \"token\", \"class\": \"whenUnlocked\", \"size\": 17}"))
            // A value over 1 MiB on stdin: refused, the old value stays.
            let big = harness.sh("head -c 1048577 /dev/zero | \"$K\" set default/token \(kc)")
            #expect(big.status == 1 && big.stderr.contains("larger than 1 MiB"))
            #expect(readFile(mnt + "/default/token") == "line one\nline two")
            // The limit is the value's to the byte: values just under 1 MiB, whose request and reply
            // frames pass 1 MiB with their names, once failed as "the device went away" (exit 5).
            for size in [1_048_530, 1_048_576] {
                let whole = harness.sh(
                    """
                    head -c \(size) /dev/urandom > "$R/whole" && "$K" set default/whole \(kc) < "$R/whole" &&
                        "$K" get default/whole \(kc) | cmp - "$R/whole" && echo same
                    """)
                #expect(whole.stdout == "same\n", "\(size) bytes: \(whole)")
            }
            // Bad syntax, absent, locked, no device: each its own status.
            #expect(harness.sh("\"$K\" get not-an-address \(kc)").status == 64)
            #expect(harness.sh("\"$K\" get default/a//b \(kc)").status == 64)
            let absent = harness.sh("\"$K\" get default/missing \(kc)")
            #expect(absent.status == 2 && absent.stderr.contains("does not exist"))
            #expect(harness.control(mnt, "lock").succeeded)
            let locked = harness.sh("\"$K\" get default/token \(kc)")
            #expect(locked.status == 3 && locked.stderr.contains("locked") && locked.stdout.isEmpty)
            #expect(harness.sh("\"$K\" rm default/token \(kc)").succeeded)  // works while locked
            #expect(harness.sh("\"$K\" rm default/token \(kc)").status == 2)
            // No mount left: the client starts the device again, booted and so locked.
            let restarted = harness.sh("\"$K\" unmount \"$1\" && \"$K\" get default/zeros \(kc)", arguments: [mnt])
            #expect(restarted.status == 3 && restarted.stderr.contains("locked"), "\(restarted)")
        }

        /// `mv` and `cp` without a mount, as they are in one: `mv` within a
        /// group renames in one step and keeps the item's class; across
        /// groups it copies and removes; `cp` makes a new item of the value;
        /// `-n` keeps an existing target; a missing source is exit 2. Before,
        /// `keychainfs mv` was "not a command; did you mean 'rm'?".
        @Test func mvAndCpWorkWithoutAMountAsInOne() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let used = harness.sh(
                """
                k() { "$K" "$@" --keychain "$KC"; }
                printf one | k set default/a && mkdir "$1/work"
                setfattr -n user.keychain.accessible -v afterFirstUnlock "$1/default/a"
                k mv default/a default/b && k get default/b; echo
                k get default/a 2> /dev/null; echo "old name: $?"
                getfattr -n user.keychain.accessible --only-values "$1/default/b"; echo
                k mv default/b work/c && k get work/c; echo
                ls "$1/default"
                k cp work/c default/d && k get default/d; echo
                printf two | k set default/e
                k cp -n work/c default/e; echo "no-clobber: $?"
                k get default/e; echo
                k mv default/missing default/f; echo "missing: $?"
                """, arguments: [mnt])
            #expect(
                used.stdout == """
                    one
                    old name: 2
                    afterFirstUnlock
                    one
                    one
                    no-clobber: 1
                    two
                    missing: 2

                    """, "\(used)")
            #expect(used.stderr.contains("default/e exists and was kept (--no-clobber)"), "\(used)")
        }

        /// `get` reads the same through its fast path (no argument parser:
        /// the item with `--keychain DIR` before or after it, `--keychain=DIR`,
        /// or the keychain from the environment) as through the parser (`--`
        /// before the item), and says the same of an absent item.
        @Test func everyFormOfGetReadsTheSameAndFailsTheSame() throws {
            let (harness, _) = try MountHarness.unlockedMount()
            #expect(harness.sh("printf 's3cret' | \"$K\" set default/x --keychain \"$KC\"").succeeded)
            let forms = [
                "get default/x --keychain \"$KC\"", "get --keychain \"$KC\" default/x",
                "get --keychain=\"$KC\" default/x", "get default/x --keychain=\"$KC\"",
                "get -- default/x"
            ]
            for form in forms + ["get default/x"] {
                let read = harness.sh("KEYCHAINFS_KEYCHAIN=\"$KC\" \"$K\" " + form)
                #expect(read.status == 0 && read.stdout == "s3cret" && read.stderr.isEmpty, "\(form): \(read)")
                let absent = harness.sh(
                    "KEYCHAINFS_KEYCHAIN=\"$KC\" \"$K\" "
                        + form.replacingOccurrences(of: "default/x", with: "default/y"))
                #expect(
                    absent.status == 2 && absent.stderr == "keychainfs: default/y does not exist\n",
                    "\(form): \(absent)")
            }
            // Two items, or an option the fast path does not take: the parser's word.
            #expect(harness.sh("\"$K\" get default/x default/y --keychain \"$KC\"").status == 64)
            #expect(harness.sh("\"$K\" get --keychain default/x").status == 64)
            // The keychain named however a path may name it is the same one:
            // relative, with `.`, `..`, doubled or trailing slashes.
            let root = (harness.keychain as NSString).deletingLastPathComponent
            for path in [
                "keychain", "./keychain/", "\(root)/./keychain", "\(root)//keychain", "\(root)/keychain/",
                "\(root)/keychain/.", "\(root)/keychain/../keychain", "\(root)/keychain//"
            ] {
                let read = harness.sh("cd \"$1\" && \"$K\" get default/x --keychain \"$2\"", arguments: [root, path])
                #expect(read.status == 0 && read.stdout == "s3cret", "\(path): \(read)")
            }
            // A name that only looks like one of those is a path as it is.
            let dotted = harness.sh("\"$K\" get default/x --keychain \"$1\"", arguments: [root + "/keychain..."])
            #expect(dotted.status == 2 && dotted.stderr.contains(root + "/keychain..."), "\(dotted)")
        }

        @Test func execPutsItemsInTheEnvironmentOrRunsNothing() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            #expect(harness.sh("printf s3cret > \"$1/default/token\"", arguments: [mnt]).succeeded)
            let ran = harness.sh(
                "\"$K\" exec --keychain \"$KC\" --env TOKEN=default/token -- sh -c 'printf \"%s\" \"$TOKEN\"'")
            #expect(ran.succeeded && ran.stdout == "s3cret", "\(ran)")
            #expect(harness.sh("\"$K\" exec --keychain \"$KC\" --env T=default/token -- sh -c 'exit 7'").status == 7)
            let absent = harness.sh("\"$K\" exec --keychain \"$KC\" --env T=default/missing -- touch \"$R/ran\"")
            #expect(absent.status == 2 && access(harness.root + "/ran", F_OK) == -1)
            #expect(harness.control(mnt, "lock").succeeded)
            let locked = harness.sh("\"$K\" exec --keychain \"$KC\" --env T=default/token -- touch \"$R/ran\"")
            #expect(locked.status == 3 && access(harness.root + "/ran", F_OK) == -1)
        }

        /// With the real `git credential fill`, `approve` and `reject` (no network).
        @Test func gitFindsItsCredentialsThroughTheHelper() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let bin = harness.root + "/bin"
            #expect(mkdir(bin, 0o700) == 0 && symlink(harness.binary, bin + "/git-credential-keychainfs") == 0)
            let git = """
                export PATH="$R/bin:$PATH" GIT_CONFIG_GLOBAL="$R/gitconfig" GIT_CONFIG_NOSYSTEM=1 GIT_TERMINAL_PROMPT=0
                git config --global credential.helper "keychainfs --keychain $KC"
                git config --global credential.useHttpPath true
                """
            let request = "printf 'protocol=https\\nhost=example.com\\npath=org/repo.git\\n\\n'"
            #expect(
                harness.sh(
                    git
                        + "\nprintf 'protocol=https\\nhost=example.com\\npath=org/repo.git\\nusername=ada\\npassword=s3cret\\n\\n' | git credential approve"
                ).succeeded)
            #expect(harness.sh("ls \"$1/git\"", arguments: [mnt]).stdout == "https:example.com:org%2Frepo.git\n")
            let filled = harness.sh(git + "\n\(request) | git credential fill")
            #expect(filled.succeeded && filled.stdout.contains("username=ada\npassword=s3cret\n"), "\(filled)")
            // Locked: git gets nothing, the user is told why, and reject erases nothing.
            #expect(harness.control(mnt, "lock").succeeded)
            let locked = harness.sh(git + "\n\(request) | git credential fill")
            #expect(!locked.succeeded && locked.stderr.contains("the keychain is locked"), "\(locked)")
            #expect(
                harness.sh(
                    git
                        + "\nprintf 'protocol=https\\nhost=example.com\\npath=org/repo.git\\nusername=ada\\n\\n' | git credential reject"
                )
                .stderr.contains("nothing was erased"))
            // A store while locked says so, and the helper's status says it
            // too (git's own approve ignores a helper's status).
            let store =
                "printf 'protocol=https\\nhost=example.com\\npath=org/repo.git\\nusername=ada\\npassword=new\\n\\n'"
            let approved = harness.sh(git + "\n\(store) | git credential approve")
            #expect(approved.stderr.contains("the keychain is locked; the credentials were not stored"), "\(approved)")
            let helper = harness.sh(git + "\n\(store) | git-credential-keychainfs --keychain \"$KC\" store")
            #expect(helper.status == 3, "\(helper)")
            try harness.unlock(mnt)
            #expect(harness.sh(git + "\n\(request) | git credential fill").stdout.contains("password=s3cret"))
            #expect(
                harness.sh(
                    git
                        + "\nprintf 'protocol=https\\nhost=example.com\\npath=org/repo.git\\nusername=ada\\n\\n' | git credential reject"
                ).succeeded)
            #expect(harness.sh("ls \"$1/git\"", arguments: [mnt]).stdout == "")
            // A port is not a path: host=example.com:8080's credential is not example.com/8080's.
            #expect(
                harness.sh(
                    git
                        + "\nprintf 'protocol=https\\nhost=example.com:8080\\nusername=ada\\npassword=port\\n\\n' | git credential approve"
                ).succeeded)
            #expect(harness.sh("ls \"$1/git\"", arguments: [mnt]).stdout == "https:example.com%3A8080\n")
            let path = harness.sh(
                git
                    + "\nprintf 'protocol=https\\nhost=example.com\\npath=8080\\nusername=ada\\n\\n' | git credential fill"
            )
            #expect(!path.stdout.contains("password=port"), "\(path)")
            #expect(
                harness.sh(
                    git + "\nprintf 'protocol=https\\nhost=example.com:8080\\nusername=ada\\n\\n' | git credential fill"
                )
                .stdout.contains("password=port"))
        }

        /// docker-credential-helpers' protocol, driven as docker drives it (no options, JSON on stdio).
        @Test func dockerCredentialHelperSpeaksDockersProtocol() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let bin = harness.root + "/bin"
            #expect(mkdir(bin, 0o700) == 0 && symlink(harness.binary, bin + "/docker-credential-keychainfs") == 0)
            let helper = "KEYCHAINFS_KEYCHAIN=\"$KC\" \"$R/bin/docker-credential-keychainfs\""
            // As docker-credential-helpers say theirs: the name and the version.
            let version = harness.sh("\(helper) version").stdout.trimmingCharacters(in: .newlines)
            #expect(
                version.hasPrefix("docker-credential-keychainfs ")
                    && harness.sh("\"$K\" --version").stdout.contains(version.split(separator: " ").last ?? "-"),
                "\(version)")
            let url = "https://registry.example.com/v2/"
            let stored = harness.sh(
                "printf '%s' '{\"ServerURL\":\"\(url)\",\"Username\":\"ada\",\"Secret\":\"s3\\\"cret\"}' | \(helper) store"
            )
            #expect(stored.succeeded && stored.stdout.isEmpty, "\(stored)")
            #expect(
                harness.sh("ls \"$1/docker\"", arguments: [mnt]).stdout == "https:%2F%2Fregistry.example.com%2Fv2%2F\n")
            let got = harness.sh("printf '%s\\n' '\(url)' | \(helper) get")
            #expect(
                got.succeeded
                    && got.stdout == "{\"ServerURL\":\"\(url)\",\"Username\":\"ada\",\"Secret\":\"s3\\\"cret\"}\n",
                "\(got)")
            #expect(harness.sh("\(helper) list").stdout == "{\"\(url)\":\"ada\"}\n")
            // docker's own "not found" reply, on stdout with status 1.
            let missing = harness.sh("printf 'https://other.example.com' | \(helper) get")
            #expect(missing.status == 1 && missing.stdout == "credentials not found in native keychain\n")
            // One URL however docker spaces it: stored padded, found and erased plain.
            #expect(
                harness.sh(
                    "printf '%s' '{\"ServerURL\":\" padded.example \",\"Username\":\"bo\",\"Secret\":\"p\"}' | \(helper) store"
                ).succeeded)
            #expect(harness.sh("printf 'padded.example\\n' | \(helper) get").stdout.contains("\"Username\":\"bo\""))
            #expect(harness.sh("printf ' padded.example' | \(helper) erase").succeeded)
            #expect(
                harness.sh("printf 'padded.example' | \(helper) get").stdout
                    == "credentials not found in native keychain\n")
            // Bad input changes nothing.
            #expect(
                harness.sh("printf '{\"ServerURL\":\"x\"}' | \(helper) store").stdout == "no credentials username\n")
            #expect(harness.sh("printf 'not json' | \(helper) store").status == 1)
            #expect(harness.sh("\(helper) frobnicate").stdout == "Unknown credential action `frobnicate`\n")
            // Locked: an error that says so, never "not found" (docker would then ask for a login).
            #expect(harness.control(mnt, "lock").succeeded)
            let locked = harness.sh("printf '%s' '\(url)' | \(helper) get")
            #expect(locked.status == 1 && locked.stdout.contains("the keychain is locked"), "\(locked)")
            #expect(harness.sh("\(helper) list").stdout.contains("the keychain is locked"))
            try harness.unlock(mnt)
            #expect(harness.sh("printf '%s' '\(url)' | \(helper) erase").succeeded)
            #expect(harness.sh("\(helper) list").stdout == "{}\n")
            let gone = harness.sh("printf '%s' '\(url)' | \(helper) erase")
            #expect(gone.status == 1 && gone.stdout == "credentials not found in native keychain\n")
            // No device: the helper starts it (booted, locked); the empty group lists as before.
            #expect(harness.sh("\"$K\" unmount \"$1\"", arguments: [mnt]).succeeded)
            let restarted = harness.sh("\(helper) list")
            #expect(restarted.succeeded && restarted.stdout == "{}\n", "\(restarted)")
            #expect(harness.sh("\"$K\" status --keychain \"$KC\"").stdout.hasPrefix("state: locked"))
        }
    }
}
