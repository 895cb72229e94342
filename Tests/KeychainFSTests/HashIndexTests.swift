@testable import KeychainFS
import KeychainCore
import Testing

/// The inode table's name index keeps hashes, not names; names whose hashes
/// collide must still find their own inode. Real names collide about once in
/// 2^64, so these keys collide on purpose.
@Suite struct HashIndexTests {
    /// Equal only to itself, hashed by `bucket` alone.
    struct Colliding: Hashable {
        let name: String
        let bucket: Int
        func hash(into hasher: inout Hasher) { hasher.combine(bucket) }
    }

    @Test func collidingKeysFindTheirOwnInodes() {
        let a = Colliding(name: "a", bucket: 1), b = Colliding(name: "b", bucket: 1),
            c = Colliding(name: "c", bucket: 2)
        var entries: [UInt64: Colliding] = [10: a, 11: b, 12: c]
        var index = HashIndex<Colliding>()
        for (inode, key) in entries.sorted(by: { $0.key < $1.key }) { index.insert(key, boundTo: inode) }
        #expect(index.inode(of: a) { entries[$0] } == 10)
        #expect(index.inode(of: b) { entries[$0] } == 11)
        #expect(index.inode(of: c) { entries[$0] } == 12)
        #expect(index.inode(of: Colliding(name: "d", bucket: 1)) { entries[$0] } == nil)

        // Removing the one that holds the hash leaves the other findable,
        // and removing with the wrong inode removes nothing.
        index.remove(a, boundTo: 10)
        entries[10] = nil
        #expect(index.inode(of: a) { entries[$0] } == nil)
        #expect(index.inode(of: b) { entries[$0] } == 11)
        index.remove(b, boundTo: 99)
        #expect(index.inode(of: b) { entries[$0] } == 11)
        index.remove(b, boundTo: 11)
        #expect(index.inode(of: b) { entries[$0] } == nil)
        #expect(index.inode(of: c) { entries[$0] } == 12)
    }

    @Test func aKeyRemovedFromTheCollisionsLeavesTheHoldersBinding() {
        let a = Colliding(name: "a", bucket: 7), b = Colliding(name: "b", bucket: 7)
        let entries: [UInt64: Colliding] = [1: a, 2: b]
        var index = HashIndex<Colliding>([a: 1])
        index.insert(b, boundTo: 2)
        index.remove(b, boundTo: 2)
        #expect(index.inode(of: a) { entries[$0] } == 1)
        #expect(index.inode(of: b) { entries[$0] } == nil)
    }
}
