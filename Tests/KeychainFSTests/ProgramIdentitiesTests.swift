@testable import KeychainFS
import Testing

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
}
