internal import CLinux
import Synchronization

/// How many large secret buffers each person holds at once in the service:
/// a request's body longer than ``largeBody``, arriving or being answered,
/// or a mount's descriptor whose unwritten value grew past it (each takes a
/// slot of its own in locked memory, 2 MiB at most: ``SecretArena``). One
/// user's eight connections, each sending most of a large body and then
/// nothing, once held the service's whole locked memory within their 5 s,
/// and another user's large `set`s were refused; six descriptors of a
/// mount, each written 1 MB and held open, did the same for as long as
/// they stayed open (docs/SECURITY.md, "What an ordinary user of the
/// machine can try"). A person is a passwd entry: a subordinate uid counts
/// with its owner (``MachinePeople``), or the service would count 65,536
/// people per user.
///
/// A person may hold an eighth of the service's locked memory in such
/// slots, one at least: 8 with the unit's 128 MiB, 1 where the machine gave
/// the service 8 MiB. Eight people, not one, then take it all.
package final class LockedMemoryShares: Sendable {
    /// The service's shares (nil in a per-user device, whose one person
    /// holds what they like): every door of the process takes its places here.
    package static let serving = Mutex<LockedMemoryShares?>(nil)

    /// Buffers longer than this take a slot of their own.
    package static let largeBody = 65536

    package let perPerson: Int
    private let held = Mutex<[UInt32: Int]>([:])

    package init(perPerson: Int) { self.perPerson = perPerson }

    /// The share for a service whose locked memory is `lockedMemory` bytes.
    package convenience init(lockedMemory: UInt64) {
        self.init(perPerson: Int(max(1, min(lockedMemory / 8 / Self.largestSlot, 1024))))
    }

    /// The largest slot a request's body takes (the arena's largest class,
    /// for a body of `DeviceProtocol.maximumBody`).
    static let largestSlot: UInt64 = 2 << 20

    /// This process's RLIMIT_MEMLOCK.
    package static var lockedMemoryLimit: UInt64 { CLinux_locked_memory_limit() }

    /// Takes one of `person`'s places; false when they hold ``perPerson``.
    package func take(_ person: UInt32) -> Bool {
        held.withLock { held in
            guard held[person, default: 0] < perPerson else { return false }
            held[person, default: 0] += 1
            return true
        }
    }

    /// Takes one of the places of the person `uid` is (its passwd entry, or
    /// its `/etc/subuid` owner's, ``MachinePeople``; an unknown uid counts as
    /// itself): that person, to give it back with ``release(_:)``, or nil
    /// when they hold ``perPerson``.
    package func take(for uid: UInt32) -> UInt32? {
        let person = MachinePeople.person(of: uid) ?? uid
        return take(person) ? person : nil
    }

    /// Gives back a place ``take(_:)`` took.
    package func release(_ person: UInt32) {
        held.withLock { held in
            held[person, default: 1] -= 1
            if held[person] == 0 { held[person] = nil }
        }
    }
}
