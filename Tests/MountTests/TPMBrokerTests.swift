import Foundation
@testable import KeychainCore
@testable import KeychainProtocol
@testable import KeychainTPM
import Synchronization
import Testing
import TestSupport

extension SerialTests {
    /// The TPM for every user (docs/FORMAT.md, "The TPM through the service"):
    /// what the service does for a user who cannot reach the TPM, tried as
    /// another user would (their own uid, the first user's blobs and
    /// counters, a flood of wrong passcodes), on swtpm (3 tries, 1000 s to
    /// forgive one).
    @Suite(.serialized) struct TPMBrokerTests {
        static let alice: UInt32 = 60_001
        static let bob: UInt32 = 60_002

        /// A broker on `tpm` in a scratch state directory, with a clock the test moves.
        final class Broker: @unchecked Sendable {
            let scratch: KeyProtectionTests.Scratch
            let clock = TestClock()
            let broker: TPMBroker

            init(on tpm: SoftwareTPM) throws {
                scratch = try KeyProtectionTests.Scratch()
                broker = TPMBroker(stateDirectory: scratch.root, tcti: tpm.tcti, clock: clock.read)
            }

            func ask<Result: DeviceResult>(_ call: DeviceCall<Result>, as uid: UInt32, person: UInt32? = nil)
                -> DeviceOutcome<Result>
            {
                guard case .tpm(let request) = call.request else { return .failure(.unexpected) }
                return call.outcome(of: broker.answer(request, uid: uid, person: person))
            }
        }

        static func secret(_ text: String) throws -> SecureBytes { try SecureBytes(text) }

        static func refusal<Result>(_ outcome: DeviceOutcome<Result>) -> KeychainError? {
            guard case .failure(let refusal) = outcome else { return nil }
            return refusal.keychainError
        }

        /// A blob or counter of one uid's opens, reads, moves and frees for
        /// no other uid, even with the right auth: the service binds each
        /// auth to the caller's uid.
        @Test func anotherUsersBlobsAndCountersAreNotTheirs() throws {
            let tpm = try SoftwareTPM()
            let broker = try Broker(on: tpm)
            let auth = try Self.secret("the same auth")
            let sealed = try broker.ask(
                .tpmSeal(try Self.secret("alice's secret"), auth: auth, guarded: false), as: Self.alice
            )
            .get()
            let opened = try broker.ask(
                .tpmUnseal(sealed.blob, auth: auth, storageKey: sealed.storageKey), as: Self.alice
            )
            .get()
            #expect(opened.secret == (try Self.secret("alice's secret")))
            #expect(
                Self.refusal(
                    broker.ask(.tpmUnseal(sealed.blob, auth: auth, storageKey: sealed.storageKey), as: Self.bob))
                    == .authFailed)
            // Nor directly with the auth the user knows: the TPM holds the bound one.
            let direct = try TrustedPlatformModule(tcti: tpm.tcti)
            #expect(throws: TPMError.authFailed) { try direct.unseal(sealed.blob, auth: auth) }

            let counter = try broker.ask(.tpmDefineCounter(auth: auth, candidates: []), as: Self.alice).get()
            let handle = TPMCounterHandle(index: counter.index, name: counter.name, auth: auth)
            // Known from its index alone, as a probe for a passcode binding
            // names it (KeychainTPM.bindingCounter(of:)): the answers below are the probe's too.
            #expect(counter.name == TPMObjects.counterName(at: counter.index))
            #expect(try broker.ask(.tpmCounterValue(handle), as: Self.alice).get().value == counter.value)
            // Not Bob's: he did not define it through the broker, so the TPM is not even asked.
            #expect(Self.refusal(broker.ask(.tpmCounterValue(handle), as: Self.bob)) == .rollbackCounterGone)
            #expect(Self.refusal(broker.ask(.tpmIncrement(handle), as: Self.bob)) == .rollbackCounterGone)
            #expect(Self.refusal(broker.ask(.tpmRelease(handle), as: Self.bob)) == .rollbackCounterGone)
            #expect(try broker.ask(.tpmCounterValue(handle), as: Self.alice).get().value == counter.value, "unmoved")
            #expect(throws: Never.self) { try broker.ask(.tpmIncrement(handle), as: Self.alice).get() }
            #expect(try broker.ask(.tpmCounterValue(handle), as: Self.alice).get().value == counter.value + 1)
            #expect(throws: Never.self) { try broker.ask(.tpmRelease(handle), as: Self.alice).get() }
            #expect(Self.refusal(broker.ask(.tpmCounterValue(handle), as: Self.alice)) == .rollbackCounterGone)
            // A definition tries a bounded number of indexes: it keeps the TPM busy for no one else.
            let many = Array(repeating: UInt32(0x0181_0000), count: TPMBroker.candidatesPerDefinition + 1)
            #expect(Self.refusal(broker.ask(.tpmDefineCounter(auth: auth, candidates: many), as: Self.alice)) == .param)
            // Counters go only where keychains' do.
            #expect(
                Self.refusal(broker.ask(.tpmDefineCounter(auth: auth, candidates: [0x0180_0400]), as: Self.alice))
                    == .param)
        }

        /// The broker's counter requests on an index the caller did not
        /// define through it: an index of `tpm2_nvdefine`'s defaults (its auth
        /// counted by the dictionary-attack logic), named with its real NV
        /// name. Before, each value, increment or release was a wrong auth
        /// on it, a failure of the machine's TPM that no share counted:
        /// lockout for everyone, the caller's own share untouched. Now each
        /// is refused before the TPM is asked, and the TPM's failure count
        /// stays where it was.
        @Test func counterRequestsOnAnIndexTheCallerDidNotDefineAreRefused() throws {
            let tpm = try SoftwareTPM()
            let broker = try Broker(on: tpm)
            let index: UInt32 = 0x0181_7777
            let defined = try TPMTools.run(
                "tpm2_nvdefine 0x\(String(index, radix: 16)) -C o -s 8 -a 'authread|authwrite|nt=counter' -p secret",
                on: tpm)
            try #require(defined.status == 0, "\(defined.output)")
            let shown = try TPMTools.run("tpm2_nvreadpublic 0x\(String(index, radix: 16))", on: tpm).output
            let name = try #require(
                shown.split(separator: "\n").first { $0.contains("name:") }.flatMap {
                    Hex.bytes(String($0.split(separator: " ").last ?? ""))
                })
            func failures() throws -> String {
                let variable = try TPMTools.run("tpm2_getcap properties-variable", on: tpm).output
                // "TPM2_PT_LOCKOUT_COUNTER: 0x0"
                return variable.split(separator: "\n").first { $0.hasPrefix("TPM2_PT_LOCKOUT_COUNTER:") }
                    .map(String.init) ?? ""
            }
            let before = try failures()
            #expect(before == "TPM2_PT_LOCKOUT_COUNTER: 0x0")
            let handle = TPMCounterHandle(index: index, name: name, auth: try Self.secret("a guess"))
            #expect(Self.refusal(broker.ask(.tpmCounterValue(handle), as: Self.alice)) == .rollbackCounterGone)
            #expect(Self.refusal(broker.ask(.tpmIncrement(handle), as: Self.alice)) == .rollbackCounterGone)
            #expect(Self.refusal(broker.ask(.tpmRelease(handle), as: Self.alice)) == .rollbackCounterGone)
            // Outside the keychains' range: not a counter of the broker's at all.
            let outside = TPMCounterHandle(index: 0x0150_0000, name: name, auth: try Self.secret("a guess"))
            #expect(Self.refusal(broker.ask(.tpmCounterValue(outside), as: Self.alice)) == .param)
            #expect(try failures() == before, "the TPM counted no failure")
        }

        /// One uid's wrong passcodes never lock the TPM out for the others:
        /// past its share (1 of swtpm's 3), the service passes none of its
        /// tries until the TPM would have forgiven one, and a right
        /// passcode forgives nothing.
        @Test func oneUsersWrongPasscodesLeaveTheTPMOpenToOthers() throws {
            let tpm = try SoftwareTPM()
            let broker = try Broker(on: tpm)
            let right = try Self.secret("right"), wrong = try Self.secret("wrong")
            let alices = try broker.ask(.tpmSeal(try Self.secret("a"), auth: right, guarded: true), as: Self.alice)
                .get()
            let bobs = try broker.ask(.tpmSeal(try Self.secret("b"), auth: right, guarded: true), as: Self.bob).get()
            func unseal(_ sealed: TPMSealed, _ auth: SecureBytes, as uid: UInt32) -> KeychainError? {
                Self.refusal(broker.ask(.tpmUnseal(sealed.blob, auth: auth, storageKey: sealed.storageKey), as: uid))
            }
            #expect(try broker.ask(.tpmLockout, as: Self.alice).get().triesLeft == 1)
            #expect(unseal(alices, wrong, as: Self.alice) == .authFailed)
            #expect(try broker.ask(.tpmLockout, as: Self.alice).get().triesLeft == 0)
            // A flood of guesses at Alice's own blob, and at Bob's: none reaches the TPM.
            for _ in 0..<20 {
                #expect(unseal(alices, wrong, as: Self.alice) == .tpmLockedOut)
                #expect(unseal(bobs, wrong, as: Self.alice) == .tpmLockedOut)
            }
            #expect(unseal(alices, right, as: Self.alice) == .tpmLockedOut, "her right one waits too")
            let state = try broker.ask(.tpmLockout, as: Self.bob).get()
            #expect(state.state.failures == 1 && state.triesLeft == 1, "the TPM counted one; Bob has his share")
            #expect(unseal(bobs, right, as: Self.bob) == nil, "the TPM is open to Bob")
            // Once the TPM would have forgiven it, Alice tries again.
            broker.clock.now.add(Int64(state.state.recoverySeconds), ordering: .relaxed)
            #expect(unseal(alices, right, as: Self.alice) == nil)
            // Her record is the service's, across its restarts.
            let restarted = TPMBroker(stateDirectory: broker.scratch.root, tcti: tpm.tcti, clock: broker.clock.read)
            #expect(unseal(alices, wrong, as: Self.alice) == .authFailed)
            let again = restarted.answer(
                .unseal(blob: alices.blob, auth: right, storageKey: alices.storageKey), uid: Self.alice)
            #expect(
                DeviceCall.tpmUnseal(alices.blob, auth: right, storageKey: alices.storageKey).outcome(of: again)
                    .failure?.keychainError == .tpmLockedOut)
        }

        /// NV space is the machine's: a uid holds at most eight counters
        /// through the service; one freed, or undefined by root, makes room.
        /// Subordinate uids (`useradd` gives each account 65,536 in
        /// `/etc/subuid`, `newuidmap` runs processes as them) are their
        /// owner: counted per uid, 120 of them defined about 955 counters and
        /// filled the TPM's NV. Now the service counts a subordinate uid's
        /// counters and wrong passcodes with its owner's, and refuses a uid
        /// that is nobody's.
        @Test func subordinateUidsCountAsTheirOwner() throws {
            let scratch = try KeyProtectionTests.Scratch()
            let subuid = scratch.root + "/subuid"
            try "root:300000:65536\nnobody-such-account-xyz:400000:10\n".write(
                toFile: subuid, atomically: true, encoding: .utf8)
            #expect(MachinePeople.person(of: 0, subordinateIDs: subuid) == 0)
            #expect(MachinePeople.person(of: 300_123, subordinateIDs: subuid) == 0)
            #expect(MachinePeople.person(of: 400_001, subordinateIDs: subuid) == nil, "an owner with no account")
            #expect(MachinePeople.person(of: 500_000, subordinateIDs: subuid) == nil, "nobody's")

            let tpm = try SoftwareTPM()
            let broker = try Broker(on: tpm)
            let auth = try Self.secret("auth")
            for number in 0..<TPMBroker.countersPerUser {
                // Each from another subordinate uid of alice's.
                let defined = broker.ask(
                    .tpmDefineCounter(auth: auth, candidates: []), as: 300_000 + UInt32(number), person: Self.alice)
                #expect(throws: Never.self) { try defined.get() }
            }
            #expect(
                Self.refusal(broker.ask(.tpmDefineCounter(auth: auth, candidates: []), as: 300_999, person: Self.alice))
                    == .quotaExceeded)
            #expect(
                Self.refusal(broker.ask(.tpmDefineCounter(auth: auth, candidates: []), as: Self.alice))
                    == .quotaExceeded, "alice's own uid shares the quota")
        }

        /// The TPM locked out by guesses that are not the caller's (root's,
        /// through tpm2-tools): the refusal says the TPM itself is in its
        /// lockout, where it blamed "your user's share", which is untouched.
        @Test func aLockoutThatIsNotTheCallersIsSaidAsSuch() throws {
            let tpm = try SoftwareTPM()
            let broker = try Broker(on: tpm)
            let auth = try Self.secret("alice's passcode auth")
            let sealed = try broker.ask(.tpmSeal(try Self.secret("secret"), auth: auth, guarded: true), as: Self.alice)
                .get()
            let guessed = try TPMTools.run(
                """
                tpm2_nvdefine 0x1817778 -C o -s 8 -a 'authread|authwrite|nt=counter' -p right > /dev/null
                for n in 1 2 3; do tpm2_nvread 0x1817778 -C 0x1817778 -P wrong > /dev/null 2>&1; done
                tpm2_getcap properties-variable | grep LOCKOUT_COUNTER
                """, on: tpm)
            #expect(guessed.output.contains("TPM2_PT_LOCKOUT_COUNTER: 0x3"), "\(guessed.output)")
            let refused = broker.ask(
                .tpmUnseal(sealed.blob, auth: auth, storageKey: sealed.storageKey), as: Self.alice)
            #expect(Self.refusal(refused) == .tpmLockedOut)
            #expect(refused.failure?.sentence.contains("the TPM itself is in its lockout") == true, "\(refused)")
        }

        /// However many people, each within their own share, the broker holds
        /// at most so many counters for all of them: the TPM's NV keeps room
        /// for the system.
        @Test func everyoneTogetherHoldsABoundedNumberOfCounters() throws {
            let tpm = try SoftwareTPM()
            let broker = try Broker(on: tpm)
            let auth = try Self.secret("auth")
            let people = TPMBroker.countersForEveryone / TPMBroker.countersPerUser
            for person in 0..<UInt32(people) {
                for _ in 0..<TPMBroker.countersPerUser {
                    let defined = broker.ask(.tpmDefineCounter(auth: auth, candidates: []), as: 70_000 + person)
                    #expect(throws: Never.self) { try defined.get() }
                }
            }
            let over = broker.ask(.tpmDefineCounter(auth: auth, candidates: []), as: 80_000)
            #expect(Self.refusal(over) == .quotaExceeded)
            #expect(over.failure?.sentence.contains("for this machine's users already") == true, "\(over)")
            #expect(try TPMTools.counterIndexes(on: tpm).count == TPMBroker.countersForEveryone)
        }

        @Test func aUserHoldsABoundedNumberOfCounters() throws {
            let tpm = try SoftwareTPM()
            let broker = try Broker(on: tpm)
            let auth = try Self.secret("auth")
            var held: [TPMCounter] = []
            for _ in 0..<TPMBroker.countersPerUser {
                held.append(try broker.ask(.tpmDefineCounter(auth: auth, candidates: []), as: Self.alice).get())
            }
            let over = broker.ask(.tpmDefineCounter(auth: auth, candidates: []), as: Self.alice)
            #expect(Self.refusal(over) == .quotaExceeded)
            #expect(over.failure?.sentence.contains("tpm2_nvundefine") == true)
            #expect(throws: Never.self, "Bob has his own") {
                try broker.ask(.tpmDefineCounter(auth: auth, candidates: []), as: Self.bob).get()
            }
            let first = TPMCounterHandle(index: held[0].index, name: held[0].name, auth: auth)
            #expect(throws: Never.self) { try broker.ask(.tpmRelease(first), as: Self.alice).get() }
            #expect(throws: Never.self) {
                try broker.ask(.tpmDefineCounter(auth: auth, candidates: []), as: Self.alice).get()
            }
            // Root frees one by hand: the service sees it is gone at the next definition.
            let undefined = try TPMTools.run("tpm2_nvundefine 0x\(String(held[1].index, radix: 16)) -C o", on: tpm)
            #expect(undefined.status == 0, "\(undefined.output)")
            #expect(throws: Never.self) {
                try broker.ask(.tpmDefineCounter(auth: auth, candidates: []), as: Self.alice).get()
            }
        }
    }
}

/// A clock a test moves.
final class TestClock: Sendable {
    let now = Atomic<Int64>(1_000_000)
    var read: @Sendable () -> Int64 { { [self] in now.load(ordering: .relaxed) } }
}

extension Swift.Result {
    fileprivate var failure: Failure? {
        guard case .failure(let failure) = self else { return nil }
        return failure
    }
}
