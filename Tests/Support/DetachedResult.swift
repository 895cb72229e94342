import Foundation

extension Thread {
    /// Runs `body` on a new thread; `value()` waits for its result.
    package static func detachedResult<T: Sendable>(_ body: @escaping @Sendable () -> T) -> DetachedResult<T> {
        let result = DetachedResult<T>()
        Thread.detachNewThread { result.set(body()) }
        return result
    }
}

package final class DetachedResult<T: Sendable>: @unchecked Sendable {
    package init() {}
    private let condition = NSCondition()
    private var stored: T?
    package func set(_ value: T) { condition.lock(); stored = value; condition.broadcast(); condition.unlock() }
    package func value() -> T {
        condition.lock()
        defer { condition.unlock() }
        while stored == nil { condition.wait() }
        return stored!
    }
}
