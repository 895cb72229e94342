@testable import KeychainCore
import Testing
#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// The audit log names who asked by `/proc/TID/exe`, built on the stack for
/// every request: a wrong digit there would name another process.
@Suite struct ProgramIdentitiesTests {
    @Test(arguments: [1, 9, 10, 99, 100, 32_767, 4_194_304, Int32.max])
    func procPathsNameTheThread(_ thread: Int32) {
        let built = ProgramIdentities.withProcPath(thread, "exe") { String(cString: $0) }
        #expect(built == "/proc/\(thread)/exe")
        let status = ProgramIdentities.withProcPath(thread, "status") { String(cString: $0) }
        #expect(status == "/proc/\(thread)/status")
    }

    /// The `unit=` of audit lines and the `--unit` of rules come from the
    /// caller's `/proc/PID/cgroup` (cgroups(7)).
    @Test(
        arguments: [
            // Pure cgroup v2, a user service nested in its manager's slice.
            ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/backup.service\n", "backup.service"),
            // A scope.
            ("0::/user.slice/user-1000.slice/session-2.scope\n", "session-2.scope"),
            // Hybrid: v2 says nothing, systemd's named hierarchy does.
            ("12:memory:/system.slice/cron.service\n1:name=systemd:/system.slice/cron.service\n0::/\n", "cron.service"),
            // Both: the unified hierarchy wins.
            ("1:name=systemd:/system.slice/old.service\n0::/system.slice/new.service\n", "new.service"),
            // A controller's path alone names nothing.
            ("4:memory:/system.slice/db.service\n0::/\n", nil),
            // No unit anywhere, a bare root, a malformed line, nothing at all.
            ("0::/process_api/f90b906877a4\n", nil),
            ("0::/\n", nil),
            ("garbage without colons\n0::/a.scope/b\n", "a.scope"),
            ("", nil)
        ] as [(String, String?)])
    func unitsComeFromTheCgroupFile(_ file: String, _ unit: String?) {
        #expect(ProgramIdentities.unit(ofCgroupFile: Array(file.utf8)) == unit)
    }

    @Test func thisProcessHasTheUnitOfItsCgroupFile() throws {
        let file = try String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8)
        #expect(ProgramIdentities.unit(of: getpid()) == ProgramIdentities.unit(ofCgroupFile: Array(file.utf8)))
    }
}
