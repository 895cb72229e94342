import Dispatch
#if canImport(Glibc)
import Glibc
#endif
import Synchronization
import Testing
@testable import KeychainCore

@Suite struct ConcurrencyTests {
    /// Password hashing runs within one memory budget per process: a
    /// hashing that would pass it waits until enough has ended, so many
    /// restores at once (each Argon2id of up to 256 MiB) cannot take the
    /// service to gigabytes; one larger than the whole budget runs alone.
    @Test func passwordHashingWaitsForRoomInItsBudget() throws {
        let budget = PasswordHashingBudget(bytes: 512)
        try budget.take(300)
        let second = Atomic<Bool>(false)
        let waiting = try #require(
            Threads.start {
                try? budget.take(300)
                second.store(true, ordering: .releasing)
                budget.give(300)
            })
        // 300 + 300 is past 512: the second waits for the first, however long that is.
        for _ in 0..<1000 { sched_yield() }
        let ranBeside = second.load(ordering: .acquiring)
        #expect(!ranBeside, "the second hashing ran beside the first, past the budget")
        budget.give(300)
        pthread_join(waiting, nil)
        let ranAfter = second.load(ordering: .acquiring)
        #expect(ranAfter)
        try budget.take(1000)  // alone, larger than the budget: runs
        budget.give(1000)
    }

    /// A hashing that waits for room for a client that has left gives up
    /// (docs/SECURITY.md, "What an ordinary user of the machine can try"): six restores queued
    /// by a client that hung up once ran, one after another, for nobody.
    @Test func aHashingWaitingForAClientThatLeftGivesUp() throws {
        let budget = PasswordHashingBudget(bytes: 512)
        try budget.take(300)
        let present = Atomic<Bool>(true)
        let outcome = Mutex<KeychainError?>(nil)
        let waiting = try #require(
            Threads.start {
                do throws(KeychainError) {
                    try PasswordHashingBudget.forClient({ present.load(ordering: .acquiring) }) {
                        () throws(KeychainError) in try budget.take(300)
                    }
                    budget.give(300)
                } catch {
                    outcome.withLock { $0 = error }
                }
            })
        present.store(false, ordering: .releasing)
        pthread_join(waiting, nil)
        #expect(outcome.withLock { $0 } == .badRequest)
        // It took nothing: what is left of the budget is all there.
        try budget.take(212)
        budget.give(512)
    }

    @Test func manyThreadsReadAndWriteOneManagerWithoutLosingOrMixingValues() throws {
        let keychain = try TemporaryKeychain()
        let manager = try keychain.manager()
        try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
        manager.accessMode = .always
        let threads = 8
        let rounds = 200
        let failures = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: threads) { thread in
            do {
                for round in 0..<rounds {
                    let own = "t\(thread)"
                    try manager.register("\(own)-\(round)", forIdentifier: own)
                    let read = try manager.string(forIdentifier: own)
                    if read != "\(own)-\(round)" { failures.withLock { $0.append("\(own) read \(read)") } }
                    // A shared item: whatever is read must be a whole value someone wrote.
                    try manager.register("shared-\(thread)-\(round)", forIdentifier: "shared")
                    let shared = try manager.string(forIdentifier: "shared")
                    if !shared.hasPrefix("shared-") { failures.withLock { $0.append("shared read \(shared)") } }
                    if round % 50 == 0 { manager.purge() }
                }
            } catch {
                failures.withLock { $0.append("thread \(thread): \(error)") }
            }
        }
        #expect(failures.withLock { $0 } == [])
        #expect(try manager.identifiers().count == threads + 1)
    }

    @Test func lockingWhileOthersReadNeverLeaksAWhenUnlockedValue() throws {
        let keychain = try TemporaryKeychain()
        let manager = try keychain.manager()
        let passcode = try secure(TemporaryKeychain.passcode)
        try manager.localDevice.unlock(passcode: passcode)
        try manager.register("guarded", forIdentifier: "item")
        let unexpected = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: 4) { worker in
            for _ in 0..<300 {
                if worker == 0 {
                    manager.localDevice.lock()
                    // Right after the lock returns, nothing may read the item.
                    do throws(KeychainError) {
                        let value = try manager.string(forIdentifier: "item")
                        unexpected.withLock { $0.append("read \(value) right after lock") }
                    } catch {
                        if error != .interactionNotAllowed { unexpected.withLock { $0.append("\(error)") } }
                    }
                    try? manager.localDevice.unlock(passcode: passcode)
                } else {
                    do throws(KeychainError) {
                        _ = try manager.string(forIdentifier: "item")
                    } catch {
                        if error != .interactionNotAllowed { unexpected.withLock { $0.append("\(error)") } }
                    }
                }
            }
        }
        #expect(unexpected.withLock { $0 } == [])
    }
}
