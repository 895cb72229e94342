import KeychainCore
import KeychainFS
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The socket connections a device is serving, and the limits that keep
/// one peer, or one user, from starving everyone else (docs/SECURITY.md,
/// "Service mode under attack"): a whole request, and the reading of its reply,
/// must each be done within a deadline, whatever the pace of the bytes; a user
/// has at most ``perUser`` connections at once; and when the process runs out
/// of descriptors, connections still waiting for their request give their
/// places up first.
///
/// A deadline is kept by shutting the socket down (shutdown(2) wakes the
/// serving thread's blocked `recvmsg` or `write` at once), under the same
/// lock that ``remove(_:)`` takes before its caller closes the descriptor:
/// a number handed out again to a new connection is never shut down for
/// the old one.
final class ConnectionTable: Sendable {
    enum Phase: Equatable {
        /// Accepted; its request has not arrived whole.
        case receiving
        /// Its request is being carried out (an unlock's derivation, a backup): no deadline.
        case answering
        /// Its reply is being written.
        case replying
        /// A `watch`: events follow the reply for as long as the peer reads them.
        case following
    }

    private struct Connection {
        let uid: uid_t
        let accepted: Int64
        var phase: Phase
        var deadline: Int64?
    }

    /// Connections one user may hold at once (nil: no limit, a per-user device's own user).
    let perUser: Int?
    /// Milliseconds a peer has to send its request, and to read its reply.
    let deadline: Int64
    private let open = Mutex<[BorrowedDescriptor: Connection]>([:])

    init(perUser: Int?, deadline: Int64) {
        self.perUser = perUser
        self.deadline = deadline
    }

    /// Takes a new connection of `uid` in, unless that user holds ``perUser`` already.
    func admit(_ fd: BorrowedDescriptor, uid: uid_t) -> Bool {
        let now = MonotonicClock.milliseconds()
        return open.withLock { open in
            if let perUser, open.values.lazy.filter({ $0.uid == uid }).count >= perUser { return false }
            open[fd] = Connection(uid: uid, accepted: now, phase: .receiving, deadline: now + deadline)
            return true
        }
    }

    /// The connection moves on: a deadline starts for replying, none for answering and following.
    func enter(_ phase: Phase, _ fd: BorrowedDescriptor) {
        let now = MonotonicClock.milliseconds()
        open.withLock { open in
            open[fd]?.phase = phase
            open[fd]?.deadline = phase == .replying ? now + deadline : nil
        }
    }

    /// The connection is done; its caller closes the descriptor after this.
    func remove(_ fd: BorrowedDescriptor) {
        _ = open.withLock { $0.removeValue(forKey: fd) }
    }

    /// How many connections are open.
    var count: Int { open.withLock { $0.count } }

    /// Shuts down every connection past its deadline; returns the nearest
    /// deadline still ahead (nil: none).
    func expire(now: Int64) -> Int64? {
        open.withLock { open in
            var nearest: Int64?
            for (fd, connection) in open {
                guard let deadline = connection.deadline else { continue }
                if deadline <= now {
                    shutdown(fd.raw, Int32(SHUT_RDWR))
                    open[fd]?.deadline = nil
                } else {
                    nearest = min(nearest ?? deadline, deadline)
                }
            }
            return nearest
        }
    }

    /// Shuts down the connections that have waited more than `age`
    /// milliseconds for their request to arrive (a client sends its request
    /// as soon as it connects), or else the one that waited longest;
    /// returns how many.
    func shedIdle(olderThan age: Int64) -> Int {
        let now = MonotonicClock.milliseconds()
        return open.withLock { open in
            let idle = open.filter { $0.value.phase == .receiving && $0.value.deadline != nil }
            var victims = idle.filter { now - $0.value.accepted > age }.map(\.key)
            if victims.isEmpty, let oldest = idle.min(by: { $0.value.accepted < $1.value.accepted }) {
                victims = [oldest.key]
            }
            for fd in victims {
                shutdown(fd.raw, Int32(SHUT_RDWR))
                open[fd]?.deadline = nil
            }
            return victims.count
        }
    }
}
