import KeychainCore
import Foundation
import Testing
import TestSupport

extension SerialTests {
    /// `keychainfs log`: what real processes did through real mounts and the
    /// socket, as the log shows it, and `--verify` against edits.
    @Suite struct AuditLogCommandTests {
        func log(_ harness: MountHarness, _ options: String = "") -> ShellResult {
            harness.sh("\"$K\" log --keychain \"$KC\" \(options)")
        }

        @Test func theLogShowsEveryAccessAndDenialAndDeviceEventWithTheProgramThatAsked() throws {
            let (harness, mnt) = try MountHarness.withPolicedGroup()
            #expect(harness.grant("secure", exe: harness.root + "/granted-cat").succeeded)
            #expect(harness.run("granted-cat", mnt + "/secure/token").stdout == "s3cret")
            #expect(!harness.run("other-cat", mnt + "/secure/token").succeeded)
            #expect(harness.control(mnt, "unlock not-the-passcode").stderr.contains("Permission denied"))
            #expect(harness.control(mnt, "lock").succeeded)
            try harness.unlock(mnt)
            #expect(harness.sh("\"$K\" get default/open --keychain \"$KC\"").stdout == "open")
            let revoked = harness.sh(
                "\"$K\" revoke secure --all --keychain \"$KC\"", stdin: MountHarness.passcode + "\n")
            #expect(revoked.succeeded)

            let lines = log(harness).stdout.split(separator: "\n").map(String.init)
            func has(_ words: String, exe: String) -> Bool {
                lines.contains { $0.contains(" \(words)") && $0.contains(" exe=\(exe)") }
            }
            #expect(
                has("create ok secure/token", exe: "/usr/bin/dash")
                    || has("create ok secure/token", exe: "/usr/bin/bash"))
            #expect(has("grant ok secure (\(harness.root)/granted-cat sha256=", exe: harness.binary))
            #expect(has("read ok secure/token", exe: harness.root + "/granted-cat"))
            #expect(has("lookup denied secure/token", exe: harness.root + "/other-cat"))
            #expect(has("unlock refused", exe: "/usr/bin/printf"))
            #expect(has("lock ok", exe: "/usr/bin/printf"))
            #expect(has("unlock ok", exe: harness.binary))
            #expect(has("get ok default/open", exe: harness.binary))
            #expect(has("revoke ok secure (all)", exe: harness.binary))
            #expect(!lines.joined().contains("s3cret") && !lines.joined().contains("not-the-passcode"))

            // --json: one object per line; --group: only that group's events.
            for line in log(harness, "--json --group secure").stdout.split(separator: "\n") {
                let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
                #expect(object["group"] as? String == "secure")
                #expect(object["seq"] is Int && object["op"] is String && object["result"] is String)
            }
            let verified = log(harness, "--verify")
            #expect(verified.succeeded && verified.stdout.hasPrefix("the audit log is intact: "), "\(verified)")
        }

        @Test func verifyFindsAnEditedLineAndACutEnd() throws {
            let (harness, mnt) = try MountHarness.withPolicedGroup()
            #expect(readFile(mnt + "/default/open") == "open")
            #expect(harness.sh("\"$K\" unmount \"$1\"", arguments: [mnt]).succeeded)
            #expect(log(harness, "--verify").succeeded)
            #expect(
                harness.sh(
                    "cp \"$KC/audit.log\" \"$R/saved.log\" && sed -i '2s/result=ok/result=denied/' \"$KC/audit.log\""
                ).succeeded)
            let edited = log(harness, "--verify")
            #expect(
                edited.status == 1 && edited.stderr.contains("audit.log line 2: its MAC does not match"), "\(edited)")
            #expect(harness.sh("head -n 1 \"$R/saved.log\" > \"$KC/audit.log\"").succeeded)
            let cut = log(harness, "--verify")
            #expect(cut.status == 1 && cut.stderr.contains("its end was cut"), "\(cut)")
        }

        /// A command that opens a keychain no device holds records its lines
        /// and anchors the newest one, as a stopping device does: cutting it
        /// off is seen.
        @Test func aCutIsFoundAfterCommandsThatRanWithoutADevice() throws {
            let harness = try MountHarness()
            let backup = harness.sh(
                "\"$K\" backup \"$R/b.kcbak\" --keychain \"$KC\"",
                stdin: MountHarness.passcode + "\nbackup-pw\nbackup-pw\n")
            #expect(backup.succeeded, "\(backup)")
            let lines = (try String(contentsOfFile: harness.keychain + "/audit.log", encoding: .utf8)).split(
                separator: "\n")
            #expect(lines.last?.contains("op=backup") == true, "\(lines)")
            #expect(log(harness, "--verify").succeeded)
            #expect(harness.sh("sed -i '$d' \"$KC/audit.log\"").succeeded)
            let cut = log(harness, "--verify")
            #expect(cut.status == 1 && cut.stderr.contains("its end was cut"), "\(cut)")
        }

        /// `--follow` prints what is recorded from then on, as it happens
        /// (read through a FIFO: each read blocks until the line is there).
        @Test func followPrintsNewEventsAsTheyHappen() throws {
            let (harness, mnt) = try MountHarness.withPolicedGroup()
            let followed = harness.sh(
                """
                mkfifo "$R/events"
                "$K" log --follow --group secure --keychain "$KC" > "$R/events" & follower=$!
                trap 'kill $follower 2> /dev/null' EXIT
                exec 3< "$R/events"
                read -r created <&3
                cat "$1/secure/token" > /dev/null
                read -r read <&3
                kill $follower; wait $follower 2> /dev/null
                printf '%s\\n%s\\n' "$created" "$read"
                """, arguments: [mnt])
            let lines = followed.stdout.split(separator: "\n")
            #expect(lines.count == 2, "\(followed)")
            #expect(lines.first?.contains(" create ok secure/token ") == true)
            #expect(
                lines.last?.contains(" read ok secure/token ") == true
                    && lines.last?.contains("exe=/usr/bin/cat") == true)
        }

        /// Names and paths are anyone's text: a program installed at
        /// `…/d exe=/usr/bin/app` must not print a second `exe=` field, nor an
        /// item renamed to `c) exe=y (` close the detail's parentheses.
        @Test func namesAndPathsCannotForgeFieldsOfTheTextLog() throws {
            let (harness, mnt) = try MountHarness.unlockedMount()
            let ran = harness.sh(
                """
                mkdir -p "$R/d exe=/usr/bin" && cp /usr/bin/cat "$R/d exe=/usr/bin/app" &&
                printf v > "$1/default/a exe=b" && "$R/d exe=/usr/bin/app" "$1/default/a exe=b" > /dev/null &&
                mv "$1/default/a exe=b" "$1/default/c) exe=y ("
                """, arguments: [mnt])
            #expect(ran.succeeded, "\(ran)")
            let lines = harness.sh("\"$K\" log --keychain \"$KC\"").stdout.split(separator: "\n")
            let read = lines.first { $0.contains(" read ok ") }
            #expect(read?.contains(" read ok default/a\\x20exe=b ") == true, "\(lines)")
            #expect(read?.contains(" exe=\(harness.root)/d\\x20exe=/usr/bin/app") == true, "\(lines)")
            #expect(read.map { $0.components(separatedBy: " exe=").count } == 2, "\(lines)")
            // The detail (the new name) cannot end its parentheses early.
            #expect(
                lines.contains { $0.contains(" rename ok default/a\\x20exe=b (c\\x29 exe=y \\x28) pid=") }, "\(lines)")
        }
    }
}
