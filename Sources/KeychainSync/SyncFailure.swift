import KeychainCore

/// Why a sync, or a step of the circle, did not happen: a sentence for the
/// person, and what kind of problem it is (the command's exit status).
package struct SyncFailure: Error, Sendable, Equatable {
    package enum Reason: Sendable, Equatable {
        /// This keychain is in no circle (or is already in one).
        case notInCircle, alreadyInCircle
        /// The keys it needs are locked.
        case locked
        /// git could not reach or update the remote.
        case remote
        /// The remote served what no device of the circle wrote: refused, nothing changed.
        case refused
        /// This device was removed from the circle.
        case removed
        /// A bad argument: an unknown device, a wrong code or recovery key.
        case badInput
        /// The keychain's store failed.
        case store(KeychainError)
    }

    package let reason: Reason
    package let sentence: String

    package init(_ reason: Reason, _ sentence: String) {
        self.reason = reason
        self.sentence = sentence
    }

    static func refused(_ sentence: String) -> SyncFailure {
        SyncFailure(.refused, "the remote's keychain was refused, and nothing changed: " + sentence)
    }

    static func store(_ error: KeychainError) -> SyncFailure {
        if error == .interactionNotAllowed {
            return SyncFailure(.locked, "the keychain is locked: unlock it to sync")
        }
        return SyncFailure(.store(error), "the keychain's store failed (\(error))")
    }
}
