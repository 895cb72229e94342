import Synchronization
import Foundation
import Glibc
import Testing
@testable import KeychainCore
@testable import KeychainProtocol

@Suite struct SecretMemoryTests {
    @Test func releasedSlotsAreWipedBeforeReuse() throws {
        let arena = SecretArena()  // private to this test, so no one reuses the slot meanwhile
        let slot = try #require(arena.allocate(capacity: 40))
        slot.pointer.initializeMemory(as: UInt8.self, repeating: 0xA5, count: 40)
        arena.release(slot.pointer, sizeClass: slot.sizeClass, used: 40)
        // The slot is back in the arena (still mapped): its bytes must be zero.
        #expect(UnsafeRawBufferPointer(start: slot.pointer, count: 40).allSatisfy { $0 == 0 })
        #expect(arena.allocate(capacity: 40)?.pointer == slot.pointer)
    }

    /// Slots are cut from a slab as they are asked for: each is zeroed and
    /// overlaps no other, through a slab's end and into the next one.
    @Test func slotsCutFromSlabsAreZeroedAndDistinct() throws {
        let arena = SecretArena()
        var slots: [UnsafeMutableRawPointer] = []
        for index in 0..<1100 {
            let slot = try #require(arena.allocate(capacity: 64))
            #expect(slot.sizeClass == 0)
            #expect(UnsafeRawBufferPointer(start: slot.pointer, count: 64).allSatisfy { $0 == 0 })
            slot.pointer.initializeMemory(as: UInt8.self, repeating: UInt8(truncatingIfNeeded: index), count: 64)
            slots.append(slot.pointer)
        }
        #expect(Set(slots).count == slots.count)
        for (index, pointer) in slots.enumerated() {
            #expect(
                UnsafeRawBufferPointer(start: pointer, count: 64).allSatisfy { $0 == UInt8(truncatingIfNeeded: index) })
            arena.release(pointer, sizeClass: 0, used: 64)
        }
    }

    /// Every value, and every protocol frame (a value with its names), has a slot; nothing larger.
    @Test func sizeClassesCoverEveryValueAndFrameUpToTheLimit() {
        #expect(SecretArena.sizeClass(for: 1) == 0)
        #expect(SecretArena.sizeClass(for: 65) == 1)
        #expect(SecretArena.sizeClass(for: ItemLimits.maximumValueSize) != nil)
        #expect(SecretArena.sizeClass(for: 4 + DeviceProtocol.maximumBody) != nil)
        #expect(SecretArena.sizeClass(for: SecretArena.maximumSize + 1) == nil)
        #expect(throws: KeychainError.valueTooLarge) { try SecureBytes(count: SecretArena.maximumSize + 1) }
        // The value limit itself is the writers' to enforce.
        #expect(throws: KeychainError.valueTooLarge) {
            try SecureBuffer().write(UnsafeRawBufferPointer(start: nil, count: 0), at: ItemLimits.maximumValueSize + 1)
        }
    }

    /// A `keychainfs get` holds a small request and a small reply: it locks
    /// a page for each, not a 64 KiB slab per size. Where RLIMIT_MEMLOCK is
    /// the kernel's old default of 64 KiB, two slabs did not fit, and every
    /// command warned that secrets might reach swap.
    @Test func aFewSmallSecretsLockAPagePerSizeNotASlab() throws {
        let arena = SecretArena()
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let request = try #require(arena.allocate(capacity: 29))
        let reply = try #require(arena.allocate(capacity: 71))
        let value = try #require(arena.allocate(capacity: 44))
        let held = arena.residency
        #expect(held.locked + held.unlocked == 2 * page)
        for slot in [request, reply, value] { arena.release(slot.pointer, sizeClass: slot.sizeClass, used: 0) }
    }

    /// Past RLIMIT_MEMLOCK (here a stand-in `mlock` that always fails), a
    /// large slot is counted as unlocked while held and leaves that count
    /// when unmapped: the locked count never dropped for a slot it never
    /// had. Refusing arenas (the service's) hand out no unpinned large slot.
    @Test func slotsThatCouldNotBePinnedAreCountedAsSuchAndRefusedWhereAsked() throws {
        let arena = SecretArena(lock: { _, _ in false })
        let large = SecretArena.classSizes[SecretArena.classSizes.count - 2]
        let slots = try (0..<6).map { _ in try #require(arena.allocate(capacity: large)) }
        #expect(arena.residency.locked == 0 && arena.residency.unlocked == 6 * large)
        for slot in slots { arena.release(slot.pointer, sizeClass: slot.sizeClass, used: 0) }
        // Four are kept for reuse, two unmapped: counted where they were counted.
        #expect(arena.residency.locked == 0 && arena.residency.unlocked == 4 * large, "\(arena.residency)")

        let refusing = SecretArena(lock: { _, _ in false })
        refusing.refuseUnlockedLargeSlots()
        #expect(refusing.allocate(capacity: large) == nil)
        #expect(refusing.allocate(capacity: 100) != nil, "small slots, which every command needs, are never refused")
        #expect(refusing.residency.unlocked < 65536)
    }

    /// Free large slots kept for reuse give way under the limit: after a
    /// flood, four free slots of each large size stayed pinned and took the
    /// whole limit, and every later large request of another size was
    /// refused until the service restarted. Now they are unpinned first.
    @Test func freeLargeSlotsGiveWayToALargeRequestUnderTheLimit() throws {
        let budget = 8 << 20
        let pinned = Mutex(0)
        let arena = SecretArena(
            lock: { _, bytes in
                pinned.withLock { total in
                    guard total + bytes <= budget else { return false }
                    total += bytes
                    return true
                }
            },
            unlock: { _, bytes in pinned.withLock { $0 -= bytes } })
        arena.refuseUnlockedLargeSlots()
        let biggest = SecretArena.maximumSize
        let held = try (0..<4).map { _ in try #require(arena.allocate(capacity: biggest)) }
        for slot in held { arena.release(slot.pointer, sizeClass: slot.sizeClass, used: 0) }
        #expect(arena.residency.locked == budget, "the flood's slots are kept, pinned, for reuse")
        // A value of another size: refused before, given now (the kept slots are unpinned).
        let value = try #require(arena.allocate(capacity: 900_000))
        #expect(arena.residency.locked == SecretArena.classSizes[value.sizeClass])
        arena.release(value.pointer, sizeClass: value.sizeClass, used: 0)
    }

    /// A body is taken as it arrives: a peer that announces the largest body
    /// and sends ten bytes of it was lent 4 KiB, not the 2 MiB its header
    /// asked for (32 such connections took the service's whole locked-memory
    /// limit); a whole body grows through larger slots and arrives intact.
    @Test func aBodyIsHeldAsItArrivesNotAsItsHeaderAnnounces() throws {
        var lent: [Int] = []
        let announced = DeviceProtocol.maximumBody
        let cut = DeviceProtocol.receiveBody(count: announced) { buffer in
            lent.append(buffer.count)
            return false  // the peer sent ten bytes and went quiet: its deadline passed
        }
        #expect(cut == nil)
        #expect(lent == [DeviceProtocol.firstBodySlot])

        let whole = (0..<announced).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        var offset = 0
        lent = []
        let received = try #require(
            DeviceProtocol.receiveBody(count: announced) { buffer in
                lent.append(buffer.count)
                whole.withUnsafeBytes { source in
                    buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: source[offset..<(offset + buffer.count)]))
                }
                offset += buffer.count
                return true
            })
        #expect(received.bytes() == whole)
        #expect(lent.first == DeviceProtocol.firstBodySlot && lent.reduce(0, +) == announced, "\(lent)")
    }

    @Test func arenaMemoryIsLockedAgainstSwapWhenTheLimitAllows() throws {
        let secret = try SecureBytes("x")
        var limit = rlimit()
        getrlimit(__rlimit_resource_t(__RLIMIT_MEMLOCK.rawValue), &limit)
        if limit.rlim_cur == rlim_t.max || limit.rlim_cur >= 1 << 20 {
            #expect(SecretArena.shared.residency.locked > 0)
        }
        #expect(secret.count == 1)
    }

    @Test func constantTimeComparisonNeedsEqualLengthAndBytes() throws {
        #expect(try SecureBytes("abc") == SecureBytes("abc"))
        #expect(try SecureBytes("abc") != SecureBytes("abd"))
        #expect(try SecureBytes("abc") != SecureBytes("abcd"))
        #expect(try SecureBytes("") == SecureBytes([]))
    }

    @Test func guardedKeysAreUnreadableWhileIdle() throws {
        let key = GuardedKey.random()
        // Touching a PROT_NONE page would crash the test, so read the
        // protection the kernel reports for the key's page instead.
        #expect(try protection(of: key.pointer) == "---p")
        let inside = try key.withKey { pointer in
            let readable = try protection(of: UnsafeRawPointer(pointer))
            // A key in use is never taken away, however late it is.
            #expect(key.protectIfIdle(now: .max / 2) != nil)
            return readable
        }
        #expect(inside == "r--p")
        // Idle for longer than the delay: unreadable again.
        #expect(key.protectIfIdle(now: MonotonicClock.milliseconds() + GuardedKey.idleMilliseconds) == nil)
        #expect(try protection(of: key.pointer) == "---p")
    }

    @Test func theBackgroundThreadProtectsKeysOnceIdle() throws {
        let key = GuardedKey.random()
        let inside = try key.withKey { pointer in try protection(of: UnsafeRawPointer(pointer)) }
        #expect(inside == "r--p")
        // Nothing here protects it: only the thread can (a generous bound for loaded machines).
        let deadline = MonotonicClock.milliseconds() + 10_000
        var seen = try protection(of: key.pointer)
        while seen != "---p" && MonotonicClock.milliseconds() < deadline {
            var pause = timespec(tv_sec: 0, tv_nsec: 5_000_000)
            nanosleep(&pause, nil)
            seen = try protection(of: key.pointer)
        }
        #expect(seen == "---p")
    }

    /// The permissions column of /proc/self/maps for the mapping holding `address`.
    private func protection(of address: UnsafeRawPointer) throws -> String {
        // /proc files report size 0, so read them as a stream.
        let handle = try #require(FileHandle(forReadingAtPath: "/proc/self/maps"))
        let maps = String(decoding: handle.readDataToEndOfFile(), as: UTF8.self)
        let target = UInt(bitPattern: address)
        for line in maps.split(separator: "\n") {
            let fields = line.split(separator: " ")
            let range = fields[0].split(separator: "-").compactMap { UInt($0, radix: 16) }
            if range.count == 2, range[0] <= target, target < range[1] { return String(fields[1]) }
        }
        throw KeychainError.itemNotFound
    }
}
