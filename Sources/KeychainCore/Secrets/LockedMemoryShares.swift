internal import CLinux
import Synchronization

/// How much of the service's locked memory each person holds at once in
/// secret buffers of their own making: a request's body longer than
/// ``largeBody``, arriving or being answered (a slot of ``largestSlot``
/// each, ``SecretArena``), and a mount's descriptor's unwritten value (the
/// slot class its size needs, from 64 bytes). One user's eight
/// connections, each sending most of a large body and then nothing, once
/// held the service's whole locked memory within their 5 s, and another
/// user's large `set`s were refused; six descriptors of a mount, each
/// written 1 MB and held open, did the same for as long as they stayed
/// open; and, while only large buffers were counted, a hundred descriptors
/// each written 64 KiB did it too (docs/SECURITY.md, "What an ordinary
/// user of the machine can try"). A person is a passwd entry: a
/// subordinate uid counts with its owner (``MachinePeople``), or the
/// service would count 65,536 people per user.
///
/// A person may hold an eighth of the service's locked memory, and one
/// large slot at least: 16 MiB with the unit's 128 MiB, 2 MiB where the
/// machine gave the service 8 MiB. Eight people, not one, then take it all.
package final class LockedMemoryShares: Sendable {
    /// The service's shares (nil in a per-user device, whose one person
    /// holds what they like): every door of the process takes its places here.
    package static let serving = Mutex<LockedMemoryShares?>(nil)

    /// Request and reply bodies longer than this take a slot of their own.
    package static let largeBody = 65536

    /// The bytes each person may hold.
    package let perPerson: Int
    private let held = Mutex<[UInt32: Int]>([:])

    package init(perPerson bytes: Int) { self.perPerson = bytes }

    /// The share for a service whose locked memory is `lockedMemory` bytes.
    package convenience init(lockedMemory: UInt64) {
        self.init(perPerson: Int(max(Self.largestSlot, min(lockedMemory / 8, 1 << 40))))
    }

    /// The largest slot a request's body takes (the arena's largest class,
    /// for a body of `DeviceProtocol.maximumBody`).
    package static let largestSlot: UInt64 = 2 << 20

    /// The locked memory a buffer holding `size` bytes takes: its slot's class.
    package static func slot(for size: Int) -> Int {
        SecretArena.classSizes.first { $0 >= size } ?? Int(largestSlot)
    }

    /// This process's RLIMIT_MEMLOCK.
    package static var lockedMemoryLimit: UInt64 { CLinux_locked_memory_limit() }

    /// What one holder holds: whose share, and how many bytes of it.
    package struct Place: Sendable, Equatable {
        package let person: UInt32
        package let bytes: Int
    }

    /// What a request refused for its person's share is told: how much the
    /// share is, and what holds it. One sentence for every door that takes
    /// places: the socket's bodies and replies, backups, a mount's values.
    package var takenSentence: String {
        "you hold your \(perPerson >> 20) MiB of the service's locked memory already, in large requests "
            + "arriving or being answered (each holds 2 MiB), backups, or values open through a mount; its users "
            + "share it; nothing was changed: try again when one is done"
    }

    /// Takes `bytes` of `person`'s share; false when that would pass ``perPerson``.
    private func take(_ person: UInt32, bytes: Int) -> Bool {
        held.withLock { held in
            guard held[person, default: 0] + bytes <= perPerson else { return false }
            held[person, default: 0] += bytes
            return true
        }
    }

    /// Takes `bytes` (a large slot unless told) of the share of the person
    /// `uid` is (its passwd entry, or its `/etc/subuid` owner's,
    /// ``MachinePeople``; an unknown uid counts as itself): the place, to
    /// give back with ``release(_:)``, or nil when the person's share has
    /// not that much left.
    package func take(for uid: UInt32, bytes: Int = Int(largestSlot)) -> Place? {
        let person = MachinePeople.person(of: uid) ?? uid
        return take(person, bytes: bytes) ? Place(person: person, bytes: bytes) : nil
    }

    /// `place` grown to `bytes` (the difference taken from the same
    /// person's share), or nil when the share has not that much left; the
    /// place as it was is still held then.
    package func grow(_ place: Place, to bytes: Int) -> Place? {
        guard bytes > place.bytes else { return place }
        return take(place.person, bytes: bytes - place.bytes) ? Place(person: place.person, bytes: bytes) : nil
    }

    /// Gives back what a place holds.
    package func release(_ place: Place) {
        held.withLock { held in
            held[place.person, default: place.bytes] -= place.bytes
            if held[place.person, default: 0] <= 0 { held[place.person] = nil }
        }
    }
}
