import KeychainCore
import Synchronization

/// When the device syncs by itself (docs/SYNC.md, "When it syncs"): a few
/// seconds after a change (more changes in that time wait for the same
/// round), at each unlock (values that waited for their class key go
/// then), and every `interval` while it runs. A round runs on this
/// schedule's own thread, so no read or write ever waits for the network.
package final class SyncSchedule: Sendable {
    private struct State {
        /// When the next round is due (monotonic milliseconds); nil: none asked.
        var due: Int64? = nil
        var lastRound: Int64 = 0
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

    private func step() -> WakeableThread.Next {
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
