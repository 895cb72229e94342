import Foundation
import KeychainCore
import Testing
import TestSupport

extension SerialTests {
    /// The cheapest ways around the lock, the question and the TPM
    /// (docs/SECURITY.md, "What an ordinary user of the machine can try"),
    /// each run as ordinary users the test makes, each failing on the code
    /// before its fix.
    @Suite(.serialized) struct CheapAttackTests {
        /// Another user's software TPM on `localhost:2321`, where tpm2-tss's
        /// default TCTI list looks after `/dev/tpmrm0`: before, a user who
        /// could not open the device (every ordinary Debian user, everyone on
        /// a machine without a TPM) had the keychain sealed by it, its
        /// counters kept there, and a copy of the files opened with the
        /// attacker's TPM. Now, with no TCTI named, only the machine's TPM is
        /// asked: none answers here, so the keys are kept in a file.
        @Test func anotherUsersSoftwareTPMOnTheDefaultPortIsNeverUsed() throws {
            let attacker = try MountHarness(as: try OrdinaryUser(), creating: false)
            let listening = attacker.sh(
                """
                mkdir -p "$R/tpm"
                setsid /usr/bin/swtpm socket --tpm2 --server type=tcp,port=2321,bindaddr=127.0.0.1 \\
                    --ctrl type=tcp,port=2322,bindaddr=127.0.0.1 --tpmstate dir="$R/tpm" \\
                    --flags not-need-init,startup-clear > /dev/null 2>&1 < /dev/null &
                for n in $(seq 100); do
                    TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=2321 tpm2_getcap properties-fixed > /dev/null 2>&1 && exit 0
                    sleep 0.05
                done
                exit 1
                """)
            try #require(listening.succeeded, "the attacker's swtpm listens on 2321: \(listening)")

            // No TCTI named, no KEYCHAINFS_TPM: what a user who runs `init` has.
            let victim = try MountHarness(
                as: try OrdinaryUser(), environment: ["TPM2TOOLS_TCTI": "", "KEYCHAINFS_TPM": ""], creating: false)
            let created = victim.sh("\"$K\" init --keychain \"$KC\"", stdin: "2580\n2580\n")
            #expect(created.succeeded, "\(created)")
            let machineTPMOpens = victim.sh("test -r /dev/tpmrm0 && test -w /dev/tpmrm0").succeeded
            if !machineTPMOpens {
                #expect(created.stdout.contains("key protection: file"), "\(created)")
            }
            let indexes = attacker.sh(
                "TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=2321 TSS2_LOG=all+NONE tpm2_getcap handles-nv-index")
            #expect(indexes.succeeded && indexes.stdout.isEmpty, "the attacker's TPM holds: \(indexes)")
        }
    }
}
