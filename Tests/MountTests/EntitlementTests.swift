import KeychainCore
import Foundation
import Testing
import TestSupport

extension SerialTests {
    /// Access groups enforced per program, through real mounts and real
    /// processes: two programs that differ only in their executable's hash (a
    /// copy of `cat`, and one with a byte appended), the test process itself,
    /// the shell's tools and `keychainfs` as socket clients.
    @Suite struct EntitlementTests {
        @Test func onlyTheGrantedProgramUsesAPolicedGroupAndEveryOtherGetsEPERM() throws {
            let (harness, mnt) = try MountHarness.withPolicedGroup()
            let granted = harness.grant("secure", exe: harness.root + "/granted-cat")
            let digest = harness.sh("sha256sum \"$R/granted-cat\" | cut -d' ' -f1").stdout.dropLast()
            #expect(
                granted.succeeded
                    && granted.stdout == "granted secure to \(harness.root)/granted-cat (sha256 \(digest))\n",
                "\(granted)")
            #expect(
                harness.sh("\"$K\" policy --keychain \"$KC\"").stdout
                    == "secure \(harness.root)/granted-cat sha256=\(digest)\n")

            #expect(harness.run("granted-cat", mnt + "/secure/token").stdout == "s3cret")
            let other = harness.run("other-cat", mnt + "/secure/token")
            #expect(!other.succeeded && other.stderr.contains("Operation not permitted"), "\(other)")
            // The unpoliced group stays readable by both, and by this process.
            #expect(harness.run("granted-cat", mnt + "/default/open").stdout == "open")
            #expect(harness.run("other-cat", mnt + "/default/open").stdout == "open")
            #expect(readFile(mnt + "/default/open") == "open")

            // This test process is not entitled: EPERM, not EACCES (locked) nor
            // ENOENT (absent), also for a name that does not exist.
            #expect(openErrno(mnt + "/secure/token", O_RDONLY) == EPERM)
            #expect(openErrno(mnt + "/secure/absent", O_RDONLY) == EPERM)
            #expect(openErrno(mnt + "/secure/new", O_WRONLY | O_CREAT) == EPERM)
            #expect(openErrno(mnt + "/default/absent", O_RDONLY) == ENOENT)
            var info = stat()
            #expect(stat(mnt + "/secure/token", &info) == -1 && errno == EPERM)
            #expect(opendir(mnt + "/secure") == nil && errno == EPERM)
            #expect(getxattr(mnt + "/secure/token", "user.keychain.accessible", nil, 0) == -1 && errno == EPERM)
            #expect(
                renameat2(AT_FDCWD, mnt + "/secure/token", AT_FDCWD, mnt + "/secure/moved", 0) == -1 && errno == EPERM)
            #expect(unlink(mnt + "/secure/token") == -1 && errno == EPERM)
            #expect(writeErrno(mnt + "/secure/token", "overwritten") == EPERM)
            for tool in [
                "ls \"$1/secure\"", "getfattr -n user.keychain.accessible \"$1/secure/token\"",
                "mv \"$1/secure/token\" \"$1/secure/moved\"", "rm -f \"$1/secure/token\"",
                "printf overwritten > \"$1/secure/token\"", "rmdir \"$1/secure\""
            ] {
                let result = harness.sh(tool, arguments: [mnt])
                #expect(!result.succeeded && result.stderr.contains("Operation not permitted"), "\(tool): \(result)")
            }
            // Nothing changed, the group's name is still listed, `.control` is unaffected.
            #expect(harness.run("granted-cat", mnt + "/secure/token").stdout == "s3cret")
            #expect(harness.sh("ls \"$1\"", arguments: [mnt]).stdout == "default\nsecure\n")
            #expect(harness.status(mnt)["state"] == "unlocked")
        }

        @Test func lockedStaysEACCESForTheGrantedProgramWhileOthersGetEPERM() throws {
            let (harness, mnt) = try MountHarness.withPolicedGroup()
            #expect(harness.grant("secure", exe: harness.root + "/granted-cat").succeeded)
            #expect(harness.control(mnt, "lock").succeeded)
            #expect(harness.run("granted-cat", mnt + "/secure/token").stderr.contains("Permission denied"))
            #expect(harness.run("other-cat", mnt + "/secure/token").stderr.contains("Operation not permitted"))
            try harness.unlock(mnt)
            #expect(harness.run("granted-cat", mnt + "/secure/token").stdout == "s3cret")
        }

        @Test func aBinaryReplacedOrMovedIsNoLongerTheGrantedProgram() throws {
            let (harness, mnt) = try MountHarness.withPolicedGroup()
            #expect(harness.grant("secure", exe: harness.root + "/granted-cat").succeeded)
            #expect(harness.run("granted-cat", mnt + "/secure/token").stdout == "s3cret")
            // Rewritten in place with other content: same path, another hash.
            #expect(harness.sh("cat \"$R/other-cat\" > \"$R/granted-cat\"").succeeded)
            #expect(harness.run("granted-cat", mnt + "/secure/token").stderr.contains("Operation not permitted"))
            // The granted bytes again (a new inode and times): the same program.
            #expect(harness.sh("rm \"$R/granted-cat\" && cp /usr/bin/cat \"$R/granted-cat\"").succeeded)
            #expect(harness.run("granted-cat", mnt + "/secure/token").stdout == "s3cret")
            // The same bytes at another path: not the granted program.
            #expect(harness.sh("mv \"$R/granted-cat\" \"$R/moved-cat\"").succeeded)
            #expect(harness.run("moved-cat", mnt + "/secure/token").stderr.contains("Operation not permitted"))
        }

        @Test func grantingNeedsThePasscodeAndABadGrantChangesNothing() throws {
            let (harness, mnt) = try MountHarness.withPolicedGroup()
            let wrong = harness.grant("secure", exe: harness.root + "/other-cat", passcode: "not-it")
            #expect(wrong.status == 4 && wrong.stderr.contains("passcode is wrong"), "\(wrong)")
            #expect(harness.status(mnt)["failed-attempts"] == "1")
            let none = harness.sh("\"$K\" grant secure --exe \"$R/other-cat\" --keychain \"$KC\" < /dev/null")
            #expect(!none.succeeded && none.stderr.contains("no passcode given"), "\(none)")
            let missing = harness.grant("secure", exe: harness.root + "/no-such-program")
            #expect(!missing.succeeded && missing.stderr.contains("cannot read the executable"), "\(missing)")
            // Not a regular file: refused at once, through the running device (a FIFO used to wedge it).
            for (kind, make) in [("FIFO", "mkfifo \"$R/fifo\""), ("directory", "mkdir \"$R/dir\"")] {
                let path = harness.root + (kind == "FIFO" ? "/fifo" : "/dir")
                let refused = harness.sh(
                    make + " && printf '%s\\n' \"$2\" | timeout 10 \"$K\" grant secure --exe \"$1\" --keychain \"$KC\"",
                    arguments: [path, MountHarness.passcode])
                #expect(!refused.succeeded && refused.status != 124, "\(kind) (124: timed out): \(refused)")
                #expect(refused.stderr.contains("must be a regular file"), "\(kind): \(refused)")
            }
            let noExe = harness.sh("\"$K\" grant secure --keychain \"$KC\"", stdin: MountHarness.passcode + "\n")
            #expect(noExe.status == 64, "\(noExe)")
            #expect(harness.sh("\"$K\" policy --keychain \"$KC\"").stdout == "")
            #expect(readFile(mnt + "/secure/token") == "s3cret")  // still open to every program
        }

        /// Names and attributes that the kernel kept from before the grant
        /// (for up to 10 s and 600 s) must not let anyone in afterwards.
        @Test func aGrantTakesEffectAtOnceOnNamesAndAttributesTheKernelHolds() throws {
            let (harness, mnt) = try MountHarness.withPolicedGroup()
            var info = stat()
            #expect(readFile(mnt + "/secure/token") == "s3cret")
            // Last before the grant: a read makes the kernel ask for the
            // attributes again at the next stat (atime), a stat does not.
            #expect(stat(mnt + "/secure/token", &info) == 0 && info.st_size == 6)
            #expect(harness.grant("secure", exe: harness.root + "/granted-cat").succeeded)
            #expect(stat(mnt + "/secure/token", &info) == -1 && errno == EPERM)
            #expect(openErrno(mnt + "/secure/token", O_RDONLY) == EPERM)
            // The granted program's own lookups are not cached for others either.
            #expect(harness.run("granted-cat", mnt + "/secure/token").stdout == "s3cret")
            #expect(stat(mnt + "/secure/token", &info) == -1 && errno == EPERM)
        }

        @Test func socketClientsAreCheckedAsTheProgramAtTheOtherEnd() throws {
            let (harness, mnt) = try MountHarness.withPolicedGroup()
            #expect(harness.grant("secure", exe: harness.root + "/granted-cat").succeeded)
            for command in ["get secure/token", "set secure/token < /dev/null", "rm secure/token", "ls secure"] {
                let result = harness.sh("KEYCHAINFS_KEYCHAIN=\"$KC\" \"$K\" \(command)")
                #expect(result.status == 4 && result.stderr.contains("not entitled"), "\(command): \(result)")
            }
            #expect(harness.sh("\"$K\" ls --keychain \"$KC\"").stdout == "default\nsecure\n")
            #expect(harness.sh("\"$K\" get default/open --keychain \"$KC\"").stdout == "open")
            // Granting the command line itself lets it (and only it) in.
            #expect(harness.grant("secure", exe: harness.binary).succeeded)
            #expect(harness.sh("\"$K\" get secure/token --keychain \"$KC\"").stdout == "s3cret")
            #expect(openErrno(mnt + "/secure/token", O_RDONLY) == EPERM)
        }

        @Test func revokingTheLastRuleAdmitsNoProgramAndAllOpensTheGroupAgain() throws {
            let (harness, mnt) = try MountHarness.withPolicedGroup()
            #expect(harness.grant("secure", exe: harness.root + "/granted-cat").succeeded)
            let absent = harness.sh(
                "\"$K\" revoke secure --exe \"$R/other-cat\" --keychain \"$KC\"",
                stdin: MountHarness.passcode + "\n")
            #expect(absent.status == 2, "\(absent)")
            let revoked = harness.sh(
                "\"$K\" revoke secure --exe \"$R/granted-cat\" --keychain \"$KC\"",
                stdin: MountHarness.passcode + "\n")
            #expect(revoked.stdout == "revoked 1 rule of secure\n", "\(revoked)")
            #expect(
                harness.sh("\"$K\" policy secure --keychain \"$KC\"").stdout
                    == "secure (no program)\nsecure: apps own\n")
            #expect(harness.run("granted-cat", mnt + "/secure/token").stderr.contains("Operation not permitted"))
            let opened = harness.sh(
                "\"$K\" revoke secure --all --keychain \"$KC\"", stdin: MountHarness.passcode + "\n")
            #expect(opened.succeeded, "\(opened)")
            #expect(harness.run("other-cat", mnt + "/secure/token").stdout == "s3cret")
        }

        @Test func aGroupMountIsGuardedAtItsRootWhileItsControlFileIsNot() throws {
            let (harness, _) = try MountHarness.withPolicedGroup()
            #expect(harness.grant("secure", exe: harness.root + "/granted-cat").succeeded)
            let group = try harness.mount("group", group: "secure")
            #expect(harness.run("granted-cat", group + "/token").stdout == "s3cret")
            #expect(opendir(group) == nil && errno == EPERM)
            #expect(openErrno(group + "/token", O_RDONLY) == EPERM)
            #expect(harness.status(group)["state"] == "unlocked")
        }

        /// A rule with a unit admits the program only inside that systemd unit
        /// (its cgroup): here a scope made by hand in the cgroup2 hierarchy.
        @Test(.enabled(if: CgroupScope.isAvailable)) func aRuleWithAUnitAdmitsTheProgramOnlyInThatUnit() throws {
            let (harness, mnt) = try MountHarness.withPolicedGroup()
            let scope = try CgroupScope()
            #expect(
                harness.grant("secure", exe: harness.root + "/granted-cat", options: "--unit \(scope.name)").succeeded)
            #expect(harness.sh("\"$K\" policy --keychain \"$KC\"").stdout.hasSuffix(" unit=\(scope.name)\n"))
            #expect(harness.run("granted-cat", mnt + "/secure/token").stderr.contains("Operation not permitted"))
            let inside = harness.sh(
                "echo $$ > \"$2/cgroup.procs\" && exec \"$R/granted-cat\" \"$1/secure/token\"",
                arguments: [mnt, scope.path])
            #expect(inside.stdout == "s3cret", "\(inside)")
        }
    }
}

/// getxattr(2), which Swift's Glibc module does not import.
private let getxattr = libcFunction(
    "getxattr",
    as: (@convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>, UnsafeMutableRawPointer?, Int) -> Int).self)
