import Foundation
import KeychainCore
import Testing
import TestSupport

extension SerialTests {
    /// `keychainfs edit` (docs/FILESYSTEM.md, "What pass users find"): the
    /// value goes to $EDITOR as a file in a private FUSE directory held in the
    /// command's locked memory, and is saved only when the editor succeeds.
    /// The editors here are scripts that write as real editors do: in place
    /// (nano, vim), or a new file renamed over the old one (sed -i, vim with
    /// backupcopy=no).
    @Suite struct EditTests {
        let harness: MountHarness

        init() throws {
            harness = try MountHarness()
            #expect(k("unlock", stdin: MountHarness.passcode + "\n").succeeded)
        }

        func k(_ arguments: String, stdin: String? = nil) -> ShellResult {
            harness.sh("\"$K\" \(arguments) --keychain \"$KC\"", stdin: stdin)
        }

        /// Writes an editor script; the edited file's path is its $1.
        func editor(_ name: String, _ body: String) throws -> String {
            let path = harness.root + "/" + name
            try ("#!/bin/sh\nset -e\n" + body + "\n").write(toFile: path, atomically: true, encoding: .utf8)
            chmod(path, 0o755)
            return path
        }

        /// Scratch directories mounted in this test's runtime directory.
        func scratchMounts() -> Int {
            Int(
                harness.sh("grep -c \" $XDG_RUNTIME_DIR/keychainfs/edit\\.\" /proc/mounts || true").stdout
                    .trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
        }

        @Test func anEditorThatReplacesTheFileChangesTheValueAndLeavesNothingBehind() throws {
            #expect(k("set default/db", stdin: "old-password").succeeded)
            // What the editor sees: the value, in a private FUSE directory another user cannot open.
            let sed = try editor(
                "sed-editor",
                """
                cat "$1" > "$R/seen"
                stat -c '%a %U' "$(dirname "$1")" "$1" >> "$R/seen"
                grep " $(dirname "$1") " /proc/mounts | cut -d' ' -f1,3 >> "$R/seen"
                setpriv --reuid=65534 --regid=65534 --clear-groups cat "$1" 2>> "$R/seen" || echo "other user: $?" >> "$R/seen"
                sed -i 's/old/new/' "$1"
                """)
            let edited = harness.sh("EDITOR=\"$1\" \"$K\" edit default/db --keychain \"$KC\"", arguments: [sed])
            #expect(edited.succeeded && edited.stdout.isEmpty && edited.stderr.isEmpty, "\(edited)")
            let seen = try String(contentsOfFile: harness.root + "/seen", encoding: .utf8)
            #expect(seen.hasPrefix("old-password700 root\n600 root\nkeychainfs-edit fuse.keychainfs\n"), "\(seen)")
            #expect(seen.contains("Permission denied") && seen.hasSuffix("other user: 1\n"), "\(seen)")
            // sed wrote a newline the value never had: not part of the secret.
            #expect(k("get default/db").stdout == "new-password")
            #expect(scratchMounts() == 0)
            #expect(harness.sh("ls \"$XDG_RUNTIME_DIR/keychainfs\" | grep -c '^edit\\.' || true").stdout == "0\n")
        }

        @Test func anEditorWritingInPlaceKeepsANewlineTheValueHad() throws {
            #expect(k("set default/note", stdin: "line one\n").succeeded)
            let append = try editor("append-editor", "printf 'line two\\n' >> \"$1\"")
            #expect(
                harness.sh("EDITOR=\"$1\" \"$K\" edit default/note --keychain \"$KC\"", arguments: [append]).succeeded)
            #expect(k("get default/note").stdout == "line one\nline two\n")
        }

        /// An item in a folder (`email/work/imap`, as pass names it) is
        /// edited as its last part: the scratch directory is flat.
        @Test func anItemInAFolderIsEditedByItsLastPart() throws {
            #expect(k("set email/work/imap", stdin: "old").succeeded)
            let sed = try editor("sed-editor", "basename \"$1\" > \"$R/name\"\nsed -i 's/old/new/' \"$1\"")
            let edited = harness.sh("EDITOR=\"$1\" \"$K\" edit email/work/imap --keychain \"$KC\"", arguments: [sed])
            #expect(edited.succeeded, "\(edited)")
            #expect(try String(contentsOfFile: harness.root + "/name", encoding: .utf8) == "imap\n")
            #expect(k("get email/work/imap").stdout == "new")
        }

        @Test func aFailedOrOversizeEditChangesNothing() throws {
            #expect(k("set default/db", stdin: "kept").succeeded)
            let failing = harness.sh("EDITOR='printf x >> \"$1\"; false' \"$K\" edit default/db --keychain \"$KC\"")
            #expect(
                failing.status == 1
                    && failing.stderr == "keychainfs: the editor exited with status 1; default/db is unchanged\n",
                "\(failing)")
            // Past 1 MiB the editor's own write fails (EFBIG), and so does it.
            let huge = try editor("huge-editor", "head -c 1100000 /dev/zero > \"$1\"")
            let oversize = harness.sh("EDITOR=\"$1\" \"$K\" edit default/db --keychain \"$KC\" 2>&1", arguments: [huge])
            #expect(oversize.status == 1 && oversize.stdout.contains("File too large"), "\(oversize)")
            #expect(k("get default/db").stdout == "kept")
            #expect(k("lock").succeeded)
            let locked = harness.sh("EDITOR=true \"$K\" edit default/db --keychain \"$KC\"")
            #expect(locked.status == 3 && locked.stderr.contains("locked"), "\(locked)")
            #expect(scratchMounts() == 0)
        }

        @Test func aNewItemIsCreatedUnlessLeftEmpty() throws {
            let write = try editor("write-editor", "printf 'fresh\\n' > \"$1\"")
            #expect(
                harness.sh("EDITOR=\"$1\" \"$K\" edit default/new --keychain \"$KC\"", arguments: [write]).succeeded)
            #expect(k("get default/new").stdout == "fresh")
            let empty = harness.sh("EDITOR=true \"$K\" edit default/other --keychain \"$KC\"")
            #expect(empty.status == 1 && empty.stderr.contains("left empty"), "\(empty)")
            #expect(k("get default/other").status == 2)
        }

        /// An update never loses data: a value changed meanwhile is kept and the edit saved beside it.
        @Test func aValueChangedDuringTheEditIsKeptAndTheEditSavedBeside() throws {
            #expect(k("set default/db", stdin: "v1").succeeded)
            let racing = try editor(
                "racing-editor",
                """
                printf v2 | "$K" set default/db --keychain "$KC"
                printf mine > "$1"
                """)
            let edited = harness.sh("EDITOR=\"$1\" \"$K\" edit default/db --keychain \"$KC\"", arguments: [racing])
            #expect(edited.status == 1 && edited.stderr.contains("changed while you edited it"), "\(edited)")
            #expect(k("get default/db").stdout == "v2")
            #expect(k("get default/db~edit").stdout == "mine")
        }

        /// kill -9 leaves a dead mount (the kernel cannot ask a dead process);
        /// the next edit clears it. Nothing of the value outlived the process.
        @Test func aKilledEditLeavesADeadMountThatTheNextEditClears() throws {
            #expect(k("set default/db", stdin: "v1").succeeded)
            let killer = try editor(
                "killer-editor",
                """
                p=$PPID
                [ "$(cat /proc/$p/comm)" = keychainfs ] || p=$(awk '/^PPid/ { print $2 }' /proc/$p/status)
                kill -9 "$p"
                """)
            let killed = harness.sh(
                "EDITOR=\"$1\" \"$K\" edit default/db --keychain \"$KC\"; echo \"status $?\"", arguments: [killer])
            #expect(killed.stdout == "status 137\n", "\(killed)")
            #expect(scratchMounts() == 1)
            #expect(harness.sh("EDITOR=true \"$K\" edit default/db --keychain \"$KC\"").succeeded)
            #expect(scratchMounts() == 0)
            #expect(harness.sh("ls \"$XDG_RUNTIME_DIR/keychainfs\" | grep -c '^edit\\.' || true").stdout == "0\n")
            #expect(k("get default/db").stdout == "v1")
        }
    }
}
