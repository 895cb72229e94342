internal import CSodium
#if canImport(Glibc)
import Glibc
#endif

/// Runs work on key material on a thread of its own whose whole stack is
/// ours: mapped fresh, locked in memory (never swapped), left out of core
/// dumps, and wiped before it is unmapped.
///
/// Why: libsodium wipes its own state, but not everything its callers'
/// stacks see. `blake2b_final` copies the hash to a stack buffer it does not
/// wipe, so an Argon2id tag (its last step is BLAKE2b) and every BLAKE2b
/// derived key stay in the dead part of the calling thread's stack, and
/// libfuse's worker stacks live as long as the process. Deriving on a stack
/// that is wiped afterwards leaves no copy behind.
enum SecretThread {
    /// Enough for Argon2id (its blocks are on the heap) and Swift frames.
    static let stackSize = 1 << 20

    /// Runs `body` on a fresh wiped-afterwards stack and returns its result;
    /// the caller's thread waits. Falls back to the calling thread only if
    /// no thread can be made (then `body` still runs, and the failure is logged).
    static func run<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        try withoutActuallyEscaping(body) { (escapable: @escaping () throws(E) -> R) throws(E) -> R in
            let job = Job(escapable)
            guard runOnOwnStack(job) else {
                Diagnostics.log("could not start a thread for key derivation; deriving on the calling thread")
                return try escapable()
            }
            return try job.result!.get()
        }
    }

    private final class Job<R, E: Error>: @unchecked Sendable {
        // Written by the secret thread before the join, read after it.
        let body: () throws(E) -> R
        var result: Result<R, E>?
        init(_ body: @escaping () throws(E) -> R) { self.body = body }
        func run() {
            do throws(E) { result = .success(try body()) } catch { result = .failure(error) }
        }
    }

    private static func runOnOwnStack<R, E: Error>(_ job: Job<R, E>) -> Bool {
        guard let stack = mmap(nil, stackSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0),
            stack != MAP_FAILED
        else { return false }
        defer {
            sodium_memzero(stack, stackSize)
            munlock(stack, stackSize)
            munmap(stack, stackSize)
        }
        if mlock(stack, stackSize) != 0 { Diagnostics.log("could not lock the key-derivation stack in memory") }
        _ = madvise(stack, stackSize, MADV_DONTDUMP)
        let thread = Threads.start(stack: UnsafeMutableRawBufferPointer(start: stack, count: stackSize)) { job.run() }
        guard let thread else { return false }
        pthread_join(thread, nil)
        return true
    }
}
