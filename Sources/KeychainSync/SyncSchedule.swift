internal import CLinux
import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// When the device syncs by itself (docs/SYNC.md, "When it syncs"): a few
/// seconds after a change (more changes in that time wait for the same
/// round), at each unlock (values that waited for their class key go
/// then), and every `interval` while it runs. A round runs on this
/// schedule's own thread, so no read or write ever waits for the network,
/// and at background priority (SCHED_IDLE, the idle I/O class), so that on
/// a machine of two cores a read of the keychain takes the core from it at
/// once; a round asked for by `keychainfs sync` runs there too.
package final class SyncSchedule: Sendable {
    /// A caller waiting for a round: its outcome, and the pipe end a byte
    /// is written to once the outcome is in.
    private final class RoundWaiter: Sendable {
        let outcome = Mutex<Result<SyncReport, SyncFailure>?>(nil)
        let done: BorrowedDescriptor
        init(done: BorrowedDescriptor) { self.done = done }
    }

    private struct State {
        /// When the next round is due (monotonic milliseconds); nil: none asked.
        var due: Int64? = nil
        var lastRound: Int64 = 0
        /// Rounds asked for now by callers that wait.
        var waiting: [RoundWaiter] = []
    }

    private let engine: SyncEngine
    private let debounce: Int64
    private let interval: Int64
    private let state = Mutex(State())
    private let thread = Mutex<WakeableThread?>(nil)
    private let observer = Mutex<Int?>(nil)
    private let device: Device

    /// Follows `device`'s changes and unlocks; rounds through `engine`.
    package init(
        engine: SyncEngine, device: Device, debounceMilliseconds: Int64 = 3000,
        intervalMilliseconds: Int64 = 15 * 60 * 1000
    ) {
        self.engine = engine
        self.device = device
        debounce = debounceMilliseconds
        interval = intervalMilliseconds
        let thread = WakeableThread("sync") { [weak self] in self?.step() ?? .stop }
        self.thread.withLock { $0 = thread }
        let token = device.addObserver { [weak self] event in
            switch event {
            case .changed(.written), .changed(.removed), .changed(.renamed): self?.ask(after: self?.debounce ?? 0)
            case .unlocked: self?.ask(after: 0)
            case .changed, .locked, .willLock, .entitlementsChanged: break
            }
        }
        observer.withLock { $0 = token }
        ask(after: debounce)
    }

    deinit {
        if let token = observer.withLock({ $0 }) { device.removeObserver(token) }
    }

    /// Asks for a round `milliseconds` from now (an earlier one asked stays).
    package func ask(after milliseconds: Int64) {
        let now = MonotonicClock.milliseconds()
        state.withLock { state in
            let due = now + milliseconds
            state.due = min(state.due ?? due, due)
        }
        thread.withLock { $0?.wake() }
    }

    /// A round now, on the schedule's thread (at its priority), waited for.
    package func roundNow() throws(SyncFailure) -> SyncReport {
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0, let wait = FileDescriptor(ends[0]), let done = FileDescriptor(ends[1])
        else { return try engine.sync() }
        _ = fcntl(wait.raw, F_SETFD, FD_CLOEXEC)
        _ = fcntl(done.raw, F_SETFD, FD_CLOEXEC)
        let waiter = RoundWaiter(done: done.borrowed)
        state.withLock { $0.waiting.append(waiter) }
        thread.withLock { $0?.wake() }
        // The thread writes a byte once the outcome is in (or closes nothing: `done` is ours).
        var byte: UInt8 = 0
        _ = try? valueOrErrno(retryOnInterrupt: true) { read(wait.raw, &byte, 1) }
        withExtendedLifetime(done) {}
        guard let result = waiter.outcome.withLock({ $0 }) else { return try engine.sync() }
        return try result.get()
    }

    /// The schedule's thread at background priority, once: SCHED_IDLE and
    /// the idle I/O class for this thread alone (CLinux's shim says why not nice alone).
    private let backgrounded = Atomic<Bool>(false)
    /// Its name in `/proc/PID/task/TID/comm`, where its policy can be seen.
    package static let threadName = "kcfs-sync"
    private func background() {
        guard !backgrounded.exchange(true, ordering: .relaxed) else { return }
        _ = CLinux_name_thread(Self.threadName)
        _ = CLinux_background_this_thread()
    }

    private func step() -> WakeableThread.Next {
        background()
        let asked = state.withLock { state -> [RoundWaiter] in
            defer { state.waiting = [] }
            return state.waiting
        }
        if !asked.isEmpty {
            let result: Result<SyncReport, SyncFailure>
            do throws(SyncFailure) { result = .success(try engine.sync()) } catch { result = .failure(error) }
            state.withLock { $0.lastRound = MonotonicClock.milliseconds() }
            for waiter in asked {
                waiter.outcome.withLock { $0 = result }
                var byte: UInt8 = 1
                _ = write(waiter.done.raw, &byte, 1)
            }
            return .after(milliseconds: 0)
        }
        let now = MonotonicClock.milliseconds()
        let due = state.withLock { state -> Int64 in
            let periodic = state.lastRound + interval
            return min(state.due ?? periodic, periodic)
        }
        guard now >= due else { return .after(milliseconds: Int32(clamping: due - now)) }
        guard engine.isInCircle else {
            state.withLock {
                $0.due = nil
                $0.lastRound = now
            }
            return .after(milliseconds: Int32(clamping: interval))
        }
        state.withLock { $0.due = nil }
        do throws(SyncFailure) {
            _ = try engine.sync()
        } catch {
            // Kept for `sync status`; in the journal without a value or a name of an item.
            if error.reason != .locked { Diagnostics.log("sync: \(error.sentence)") }
        }
        let finished = MonotonicClock.milliseconds()
        // The round's own writes asked for another: one that finds nothing is cheap, and
        // a write of the person's made during the round must not wait for the interval.
        state.withLock { $0.lastRound = finished }
        return .after(milliseconds: 0)
    }
}
