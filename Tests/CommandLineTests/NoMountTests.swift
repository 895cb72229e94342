import Foundation
import KeychainCore
import Testing
import TestSupport

extension SerialTests {
    /// The device without a mount (docs/FILESYSTEM.md, "Quick reference"):
    /// the first client that needs it starts it (booted, locked), as
    /// gpg-agent starts on first use; unlock, lock and status take the
    /// keychain as well as a mount point.
    @Suite struct NoMountTests {
        @Test func clientsStartTheDeviceAndUnlockLockAndStatusNeedNoMount() throws {
            let harness = try MountHarness()
            func k(_ arguments: String, stdin: String? = nil) -> ShellResult {
                harness.sh("\"$K\" \(arguments) --keychain \"$KC\"", stdin: stdin)
            }
            #expect(k("status").stdout == "state: stopped\nmode: per-user\nkey-protection: file\n")
            // The first client starts the device: booted, so locked.
            let locked = k("set default/token", stdin: "v")
            #expect(locked.status == 3 && locked.stderr.contains("locked"), "\(locked)")
            #expect(k("status").stdout.hasPrefix("state: locked\nfirst-unlock: no\n"))
            let wrong = k("unlock", stdin: "nope\n")
            #expect(wrong.status == 4 && wrong.stderr.contains("wrong passcode"), "\(wrong)")
            #expect(k("unlock", stdin: MountHarness.passcode + "\n").succeeded)
            #expect(k("set default/token", stdin: "s3cret").succeeded)
            #expect(k("get default/token").stdout == "s3cret")
            #expect(
                k("status").stdout.hasPrefix(
                    "state: unlocked\nfirst-unlock: yes\naccessmode: whenUnlocked\nmigrate: yes\npasscode: yes\n"
                        + "failed-attempts: 0\n"))
            // A mount joins the running device and leaves it running.
            let mnt = try harness.prepareMountpoint("mnt")
            #expect(harness.sh("\"$K\" mount \"$1\" --keychain \"$KC\"", arguments: [mnt]).succeeded)
            #expect(readFile(mnt + "/default/token") == "s3cret")
            #expect(harness.sh("\"$K\" unmount \"$1\"", arguments: [mnt]).succeeded)
            #expect(k("get default/token").stdout == "s3cret")
            #expect(k("lock").succeeded)
            #expect(k("get default/token").status == 3)
            #expect(k("stop").succeeded)
            #expect(k("status").stdout.hasPrefix("state: stopped"))
        }

        /// `service --daemon` run by an ordinary user said only that the log
        /// could not be opened (a first day's report): it says that root
        /// starts the service, and that the user's own keychain needs none.
        @Test func anOrdinaryUsersServiceDaemonSaysRootStartsIt() throws {
            let harness = try MountHarness(as: try OrdinaryUser())
            let used = harness.sh("\"$K\" service --daemon")
            #expect(
                used.status == 1
                    && used.stderr.contains("Permission denied; the service serves every user, and root starts it")
                    && used.stderr.contains("your own keychain needs none (keychainfs start)"), "\(used)")
        }

        /// git's `store` with no device running is not dropped unseen.
        /// RLIMIT_MEMLOCK at 64 KiB, the kernel's default before 5.16 and
        /// still where a distribution or a container sets it so: an ordinary
        /// user's `get` and `set` lock their secrets in memory within it,
        /// and say nothing. When each size of secret had a 64 KiB slab, a
        /// `get` of a 44-byte value needed two and warned that secrets
        /// might reach swap.
        @Test func aSmallMemoryLockLimitHoldsACommandsSecrets() throws {
            let harness = try MountHarness(as: try OrdinaryUser())
            func limited(_ arguments: String, stdin: String? = nil) -> ShellResult {
                harness.sh("ulimit -l 64 && exec \"$K\" \(arguments) --keychain \"$KC\"", stdin: stdin)
            }
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: MountHarness.passcode + "\n").succeeded)
            let value = String(repeating: "7", count: 44)
            let set = limited("set default/token", stdin: value)
            #expect(set.succeeded && set.stderr.isEmpty, "\(set)")
            let got = limited("get default/token")
            #expect(got.succeeded && got.stdout == value && got.stderr.isEmpty, "\(got)")
        }

        @Test func gitsStoreWithNoDeviceStartsItAndSaysItIsLocked() throws {
            let harness = try MountHarness()
            let store = harness.sh(
                "\"$K\" git-credential store --keychain \"$KC\"",
                stdin: "protocol=https\nhost=example.com\nusername=ada\npassword=pw\n\n")
            #expect(store.stderr.contains("locked"), "\(store)")
            #expect(harness.sh("\"$K\" unlock --keychain \"$KC\"", stdin: MountHarness.passcode + "\n").succeeded)
            #expect(
                harness.sh(
                    "\"$K\" git-credential store --keychain \"$KC\"",
                    stdin: "protocol=https\nhost=example.com\nusername=ada\npassword=pw\n\n"
                ).succeeded)
            let get = harness.sh(
                "\"$K\" git-credential get --keychain \"$KC\"", stdin: "protocol=https\nhost=example.com\n\n")
            #expect(get.stdout.contains("password=pw"), "\(get)")
        }

        /// `watch` and `autolock` take the keychain too: a watcher is one more
        /// client of the device (it starts it, and keeps it running) and sees
        /// what the command line and a mount change. Reads block on real
        /// events; the auto-lock is waited for by its `will-lock` line.
        @Test func watchAndAutoLockNeedNoMount() throws {
            let harness = try MountHarness()
            let mnt = try harness.prepareMountpoint("mnt")
            let watched = harness.sh(
                """
                mkfifo "$R/events"
                "$K" watch --keychain "$KC" > "$R/events" 2> "$R/watch.err" & watcher=$!
                trap 'kill $watcher 2> /dev/null' EXIT
                exec 3< "$R/events"
                read -r state <&3
                printf '%s\\n' "$2" | "$K" unlock --keychain "$KC"
                printf s3cret | "$K" set default/token --keychain "$KC"
                "$K" mount "$1" --keychain "$KC" && rm "$1/default/token" && "$K" unmount "$1"
                "$K" autolock 8d --keychain "$KC" 2> "$R/bad.err"; echo "bad duration $?"; head -c 36 "$R/bad.err"; echo
                "$K" autolock 1s --grace 0 --keychain "$KC"
                lines="$state"
                for n in 1 2 3 4 5; do read -r line <&3; lines="$lines|$line"; done
                "$K" status --keychain "$KC" | grep autolock
                "$K" stop --keychain "$KC"
                wait $watcher; echo "watch status $?"; cat "$R/watch.err"
                printf '%s\\n' "$lines"
                """, arguments: [mnt, MountHarness.passcode])
            let tab = "\t"
            #expect(
                watched.stdout == """
                    bad duration 64
                    Error: The value '8d' is invalid for
                    autolock: 1
                    autolock-grace: 0
                    watch status 1
                    keychainfs: the device went away
                    locked|unlocked|written\(tab)default\(tab)token|removed\(tab)default\(tab)token|will-lock\(tab)0|locked

                    """, "\(watched)")
            #expect(!watched.stdout.contains("s3cret"))
        }
    }
}

extension SerialTests {
    /// A keychain on a full filesystem (a small tmpfs, filled): `set` said
    /// "could not be read or written", as if the store were damaged. Now it
    /// says that the device holding the keychain has no space left, exits
    /// 1, and the old value stays; `rm`, which frees space, works (the
    /// device keeps room for it), and so do `lock` and `unlock`; once there
    /// is room again, a write goes through.
    @Suite struct FullDiskTests {
        /// An emptied `keychain.db` and a missing `device-secret` were said as
        /// a store that "could not be read or written" and one that "failed
        /// its integrity check": now each is named for what it is, and what
        /// to do.
        @Test func anEmptiedDatabaseAndAMissingDeviceSecretAreSaidAsSuch() throws {
            let harness = try MountHarness()
            let used = harness.sh(
                """
                cp -a "$KC" "$R/copy"
                : > "$KC/keychain.db"
                printf '1234\\n' | "$K" unlock --keychain "$KC"; echo "emptied: $?"
                rm -rf "$KC" && mv "$R/copy" "$KC" && rm "$KC/device-secret"
                "$K" get default/x --keychain "$KC"; echo "no device secret: $?"
                """)
            #expect(used.stdout == "emptied: 5\nno device secret: 5\n", "\(used)")
            #expect(
                used.stderr.contains("the keychain's database \(harness.keychain)/keychain.db is empty (0 bytes)")
                    && used.stderr.contains("the keychain's device secret \(harness.keychain)/device-secret is missing"),
                "\(used)")
        }

        /// A keychain on a read-only filesystem (a live system's home, a
        /// backup disk): even `get` failed, "could not be read or written",
        /// exit 5. Now the device reads it and refuses every change, saying
        /// why (exit 1 on the command line, EROFS through a mount, where a
        /// failed commit once left the descriptor giving ERANGE); a backup
        /// to a writable place works; `status` says so; wrong passcodes are
        /// counted all the same. Once writable again, nothing had changed.
        @Test func aReadOnlyKeychainIsReadAndRefusesEveryChange() throws {
            let harness = try MountHarness(as: try OrdinaryUser())
            let mnt = try harness.prepareMountpoint("mnt")
            #expect(
                harness.sh(
                    """
                    printf '1234\\n' | "$K" unlock --keychain "$KC" && printf old | "$K" set default/x --keychain "$KC" \
                        && "$K" stop --keychain "$KC"
                    """
                ).succeeded)
            let audit = try String(contentsOfFile: harness.keychain + "/audit.log", encoding: .utf8)
            try #require(
                harness.sh(
                    "mount --bind \"$KC\" \"$KC\" && mount -o remount,bind,ro \"$KC\"", asRoot: true
                ).succeeded)
            var mounted = true
            defer { if mounted { _ = harness.sh("umount -l \"$KC\"", asRoot: true) } }
            let used = harness.sh(
                """
                export KEYCHAINFS_KEYCHAIN="$KC"
                "$K" get default/x; echo "get while locked: $?"
                "$K" ls default; echo "ls: $?"
                printf 'nope\\n' | "$K" unlock 2> /dev/null; echo "wrong passcode: $?"
                "$K" status | grep -E '^(failed-attempts|read-only):' | cut -c1-60
                printf '1234\\n' | "$K" unlock; echo "unlock: $?"
                "$K" get default/x; echo " get: $?"
                printf new | "$K" set default/x; echo "set: $?"
                "$K" rm default/x 2> /dev/null; echo "rm: $?"
                "$K" sync 2> /dev/null; echo "sync: $?"
                printf 'backup-pw-9876\\nbackup-pw-9876\\n' | "$K" backup "$R/copy.kcbackup" > /dev/null; echo "backup: $?"
                "$K" mount "$1" > /dev/null; echo "mount: $?"
                cat "$1/default/x"; echo " cat: $?"
                python3 -c '
                import errno, os, sys
                def attempt(what, call):
                    try: call(); print(what + ": done")
                    except OSError as error: print(what + ": " + errno.errorcode[error.errno])
                item = sys.argv[1] + "/default/x"
                fd = os.open(item, os.O_WRONLY | os.O_TRUNC)
                os.write(fd, b"zz")
                attempt("close", lambda: os.close(fd))
                fd = os.open(item, os.O_WRONLY | os.O_TRUNC)
                attempt("a flush that empties", lambda: os.close(os.dup(fd)))
                attempt("the next write", lambda: os.write(fd, b"zz"))
                attempt("its close", lambda: os.close(fd))
                attempt("rm", lambda: os.unlink(item))
                attempt("mkdir", lambda: os.mkdir(sys.argv[1] + "/other"))
                ' "$1"
                cat "$1/default/x"; echo " cat: $?"
                "$K" unmount "$1"; "$K" stop
                """, arguments: [mnt])
            #expect(
                used.stdout == """
                    get while locked: 3
                    x
                    ls: 0
                    wrong passcode: 4
                    failed-attempts: 1
                    read-only: yes: the keychain's files cannot be written; it i
                    unlock: 0
                    old get: 0
                    set: 1
                    rm: 1
                    sync: 1
                    backup: 0
                    mount: 0
                    old cat: 0
                    close: EROFS
                    a flush that empties: EROFS
                    the next write: EROFS
                    its close: EROFS
                    rm: EROFS
                    mkdir: EROFS
                    old cat: 0

                    """, "\(used)")
            #expect(
                used.stderr.contains(
                    "default/x: the keychain's files cannot be written (a read-only filesystem or directory): it can be "
                        + "read, and changes cannot be saved; nothing was changed"), "\(used)")
            _ = harness.sh("umount -l \"$KC\"", asRoot: true)
            mounted = false
            // Writable again: nothing had changed, not even the audit log; the backup holds the item.
            #expect(try String(contentsOfFile: harness.keychain + "/audit.log", encoding: .utf8) == audit)
            let after = harness.sh(
                """
                export KEYCHAINFS_KEYCHAIN="$KC"
                printf '1234\\n' | "$K" unlock && "$K" get default/x && echo && "$K" status | grep -c read-only
                "$K" rm default/x && printf 'backup-pw-9876\\n' | "$K" restore "$R/copy.kcbackup" > /dev/null && "$K" get default/x
                "$K" stop
                """)
            #expect(after.stdout == "old\n0\nold", "\(after)")
        }

        @Test func aFullDiskIsSaidAsSuchAndChangesNothing() throws {
            let harness = try MountHarness(creating: false)
            let small = harness.root + "/small"
            try FileManager.default.createDirectory(atPath: small, withIntermediateDirectories: true)
            try #require(Spawn.run(["/bin/mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", small]) == 0)
            defer { _ = Spawn.run(["/bin/umount", "-l", small]) }
            let used = harness.sh(
                """
                export KEYCHAINFS_KEYCHAIN="$1/keychain"
                printf '1234\\n1234\\n' | "$K" init > /dev/null && printf '1234\\n' | "$K" unlock || exit 90
                printf old | "$K" set default/x || exit 91
                # The rest of the filesystem, taken.
                dd if=/dev/zero of="$1/fill" bs=64k 2> /dev/null
                head -c 200000 /dev/urandom | "$K" set default/x; echo "set: $?"
                "$K" get default/x; echo
                # A removal is how space is freed: it works on the full disk, with the room kept for it.
                "$K" rm default/x; echo "rm: $?"
                "$K" get default/x 2> /dev/null; echo "get: $?"
                "$K" lock; echo "lock: $?"
                printf '1234\\n' | "$K" unlock; echo "unlock: $?"
                rm "$1/fill"
                printf new | "$K" set default/x && "$K" get default/x; echo
                "$K" stop
                """, arguments: [small])
            #expect(
                used.stdout == """
                    set: 1
                    old
                    rm: 0
                    get: 2
                    lock: 0
                    unlock: 0
                    new

                    """, "\(used)")
            #expect(
                used.stderr.contains("no space left on the device holding \(small)/keychain: free some space there"),
                "\(used)")
        }
    }
}
