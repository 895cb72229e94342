import Foundation
import KeychainCore
import KeychainTPM
import Testing
import TestSupport

extension SerialTests {
    /// The TPM layer (docs/SECURITY.md, "Keys sealed by the TPM"), against a
    /// software TPM per test: a secret sealed under an auth opens only with
    /// that auth, only on that TPM; wrong auths lock the TPM out, across a
    /// reboot; the NV counter only goes up and survives a reboot.
    @Suite struct TrustedPlatformModuleTests {
        static func secret(_ text: String) throws -> SecureBytes { try SecureBytes(text) }

        @Test func aSealedSecretOpensOnlyWithItsAuth() throws {
            let software = try SoftwareTPM()
            let tpm = try TrustedPlatformModule(tcti: software.tcti)
            let blob = try tpm.seal(
                try Self.secret("device secret of 32 bytes, exact"), auth: try Self.secret("right auth"))
            #expect(blob.count > 100)
            let opened = try tpm.unseal(blob, auth: try Self.secret("right auth"))
            #expect(opened.withUnsafeBytes { Array($0) } == Array("device secret of 32 bytes, exact".utf8))
            #expect(throws: TPMError.authFailed) { try tpm.unseal(blob, auth: try Self.secret("wrong auth")) }
            // The wrong one was counted by the TPM itself.
            #expect(try tpm.lockout().failures == 1)
            // A damaged blob opens nothing.
            #expect(throws: TPMError.notThisTPM) {
                try tpm.unseal(Array(blob.dropLast(7)), auth: try Self.secret("right auth"))
            }
        }

        @Test func wrongAuthsLockTheTPMOutEvenAcrossAReboot() throws {
            let software = try SoftwareTPM()
            var tpm = try TrustedPlatformModule(tcti: software.tcti)
            let blob = try tpm.seal(try Self.secret("s"), auth: try Self.secret("1234"))
            let limits = try tpm.lockout()
            #expect(limits.maximum >= 1)
            for _ in 0..<Int(limits.maximum) {
                #expect(throws: TPMError.authFailed) { try tpm.unseal(blob, auth: try Self.secret("0000")) }
            }
            // Now even the right passcode gets nothing: guesses are bounded in hardware.
            #expect(throws: TPMError.lockedOut) { try tpm.unseal(blob, auth: try Self.secret("1234")) }
            try software.restart()
            tpm = try TrustedPlatformModule(tcti: software.tcti)
            #expect(throws: TPMError.lockedOut) { try tpm.unseal(blob, auth: try Self.secret("1234")) }
            #expect(try tpm.lockout().failures == limits.maximum)
        }

        @Test func aBlobSealedByAnotherTPMDoesNotLoad() throws {
            let first = try SoftwareTPM(), second = try SoftwareTPM()
            let blob = try TrustedPlatformModule(tcti: first.tcti).seal(
                try Self.secret("s"), auth: try Self.secret("1234"))
            let other = try TrustedPlatformModule(tcti: second.tcti)
            #expect(throws: TPMError.notThisTPM) { try other.unseal(blob, auth: try Self.secret("1234")) }
            // And the right TPM still opens it.
            let opened = try TrustedPlatformModule(tcti: first.tcti).unseal(blob, auth: try Self.secret("1234"))
            #expect(opened.withUnsafeBytes { Array($0) } == Array("s".utf8))
        }

        @Test func theCounterOnlyGoesUpSurvivesARebootAndAnswersOnlyItsAuth() throws {
            let software = try SoftwareTPM()
            var tpm = try TrustedPlatformModule(tcti: software.tcti)
            let index: UInt32 = 0x0180_4B43
            let auth = try Self.secret("counter-auth")
            let name = try tpm.defineCounter(at: index, auth: auth)
            let counter = CounterReference(index: index, name: name, auth: auth)
            let first = try tpm.value(of: counter)
            #expect(first >= 1)
            try tpm.increment(counter)
            try tpm.increment(counter)
            #expect(try tpm.value(of: counter) == first + 2)
            #expect(throws: TPMError.indexTaken) { try tpm.defineCounter(at: index, auth: auth) }
            // Another auth moves nothing, and reads nothing.
            let guessed = CounterReference(index: index, name: name, auth: try Self.secret("guessed"))
            #expect(throws: TPMError.authFailed) { try tpm.increment(guessed) }
            #expect(try tpm.value(of: counter) == first + 2)
            #expect(throws: TPMError.authFailed) { try tpm.value(of: guessed) }
            try software.restart()
            tpm = try TrustedPlatformModule(tcti: software.tcti)
            #expect(try tpm.value(of: counter) == first + 2)
            // Freed, it is gone; defined again, it has the same name only if made alike, and starts no lower.
            try tpm.undefine(counter)
            #expect(throws: TPMError.counterMissing) { try tpm.value(of: counter) }
        }

        /// tpm2-tss loads the TCTI module `$TPM2TOOLS_TCTI` names, and takes
        /// a name with a `/` in it for a file: a library of the user's so
        /// named ran in the setgid device and read the login password out of
        /// its memory (an outsider's attack). A module named by a path is
        /// loaded only when root controls the file: the user's is refused,
        /// absolute or relative to the working directory, and its
        /// constructor never runs; root's own is loaded.
        @Test func aTCTIModuleNamedByAPathIsLoadedOnlyWhenRootControlsIt() throws {
            let directory = try makeTemporaryDirectory("kcfs-tcti", in: "/tmp/")
            defer { try? FileManager.default.removeItem(atPath: directory) }
            chmod(directory, 0o777)  // as anyone's directory in /tmp is someone else's to change
            try """
            #include <fcntl.h>
            #include <unistd.h>
            __attribute__((constructor)) static void ran(void) { close(open("\(directory)/ran", O_CREAT | O_WRONLY, 0600)); }
            """.write(toFile: directory + "/evil.c", atomically: true, encoding: .utf8)
            #expect(
                Spawn.run(["/usr/bin/gcc", "-shared", "-fPIC", "-o", directory + "/evil.so", directory + "/evil.c"])
                    == 0)
            for named in [directory + "/evil.so:host=127.0.0.1", "../../" + directory + "/evil.so"] {
                #expect {
                    try TrustedPlatformModule(tcti: named)
                } throws: { error in
                    guard case TPMError.unavailable(let why) = error else { return false }
                    return why.contains("is not a file only root can change")
                }
            }
            #expect(access(directory + "/ran", F_OK) != 0, "the user's module was loaded")
            let system = try #require(
                ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"].map { $0 + "/libtss2-tcti-swtpm.so.0" }
                    .first { access($0, F_OK) == 0 })
            #expect(TrustedPlatformModule.moduleProblem(system + ":host=127.0.0.1,port=1") == nil)
            #expect(TrustedPlatformModule.moduleProblem("swtpm:host=127.0.0.1,port=1") == nil)
        }

        @Test func noTPMIsSaidPlainly() {
            #expect {
                try TrustedPlatformModule(tcti: "swtpm:host=127.0.0.1,port=1")
            } throws: { error in
                guard case TPMError.unavailable = error else { return false }
                return true
            }
        }
    }
}
