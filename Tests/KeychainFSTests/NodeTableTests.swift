import Foundation
@testable import KeychainFS
import KeychainCore
import KeychainTPM
import Synchronization
import TestSupport
import Testing

/// Whether a removed item's inode number can be handed out again while
/// something still holds it (docs/FILESYSTEM.md, "Operations and errno",
/// `rm item`): the path to the loss SSKeychain's users met (a writer of the
/// old item landing in the new one). These drive the table through
/// removals, re-creations, renames and the kernels' FORGETs, in any order,
/// and check that a number never stands for two items.
@Suite struct NodeTableTests {
    /// A small deterministic generator (SplitMix64): the same run every time.
    struct Steps {
        var state: UInt64
        mutating func next(_ bound: Int) -> Int {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE5_E4B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return Int((z ^ (z >> 31)) % UInt64(bound))
        }
    }

    @Test(arguments: [1, 2, 3] as [UInt64])
    func aNumberNeverStandsForASecondItem(seed: UInt64) {
        let nodes = NodeTable()
        let kernels = [KernelCache(scope: .keychain), KernelCache(scope: .keychain)]
        var steps = Steps(state: seed)
        // Every number ever handed out, with the item it was handed out for;
        // a rename moves a number to the new name (the kernel keeps it).
        var meaning: [UInt64: Node] = [:]
        // What each kernel holds: number -> references.
        var held: [[UInt64: UInt64]] = [[:], [:]]
        let names = (0..<4).map { Node.item(group: "default", identifier: "u\($0)") }
        for _ in 0..<20_000 {
            let kernel = steps.next(2), name = names[steps.next(names.count)]
            switch steps.next(5) {
            case 0, 1:  // a lookup or create hands the number to a kernel
                let inode = nodes.lookedUp(name, by: kernels[kernel])
                if let earlier = meaning[inode] {
                    #expect(earlier == name, "inode \(inode) handed out for \(name) after it stood for \(earlier)")
                }
                meaning[inode] = name
                held[kernel][inode, default: 0] += 1
            case 2:  // unlink, or a removal through the socket
                nodes.detach(name)
            case 3:  // rename over another name
                let target = names[steps.next(names.count)]
                guard target != name, let moved = nodes.existingInode(for: name) else { continue }
                nodes.move(name, to: target)
                meaning[moved] = target
            default:  // the kernel forgets some of what it holds
                guard let (inode, count) = held[kernel].randomElement(using: &steps) else { continue }
                let dropped = UInt64(steps.next(Int(count)) + 1)
                nodes.forget(inode, count: dropped, by: kernels[kernel])
                held[kernel][inode] = count > dropped ? count - dropped : nil
            }
        }
        // A number the kernels still hold for a removed item stays removed.
        for inode in held.flatMap(\.keys) where nodes.node(for: inode) == nil {
            #expect(nodes.detachedItem(inode) != nil, "inode \(inode), still held, was forgotten")
        }
    }
}

/// The table follows the store: whoever removes or renames an
/// item (a mount, the socket, the bus, the library itself), the inode of
/// its name is detached or moved as the change commits, before any other
/// change can commit; nobody has to tell the table.
@Suite struct NodeTableFollowingTests {
    final class Keychain {
        let root: String
        let manager: PasswordManager
        let nodes: NodeTable

        init() throws {
            root = try makeTemporaryDirectory("kcfs-nodes", in: "/tmp/")
            let directory = KeychainDirectory(path: root + "/keychain")
            try Device.createKeychain(at: directory, passcode: nil, kdf: .insecureFastForTests, tpm: .declined)
            let device = try Device(directory: directory)
            manager = PasswordManager(device: device)
            nodes = NodeTable(following: device)
        }

        deinit { try? FileManager.default.removeItem(atPath: root) }

        func write(_ identifier: String, _ value: String) throws {
            try manager.write(
                try SecureBytes(value), identifier: identifier, group: "default", protectionClass: .always)
        }
    }

    static func item(_ identifier: String) -> Node { .item(group: "default", identifier: identifier) }

    @Test func aRemovalOrRenameThroughTheLibraryRebindsTheNames() throws {
        let keychain = try Keychain()
        let nodes = keychain.nodes, kernel = KernelCache(scope: .keychain)
        try keychain.write("a", "one")
        let a = nodes.lookedUp(Self.item("a"), by: kernel)

        try keychain.manager.renameKey(forIdentifier: "a", to: "b", inGroup: "default")
        #expect(nodes.node(for: a) == Self.item("b"))
        #expect(nodes.existingInode(for: Self.item("a")) == nil)

        // Renamed over: the replaced item's inode is detached, the moved one takes its name.
        try keychain.write("c", "three")
        let c = nodes.lookedUp(Self.item("c"), by: kernel)
        try keychain.manager.renameKey(forIdentifier: "b", to: "c", inGroup: "default", replacing: true)
        #expect(nodes.node(for: a) == Self.item("c"))
        #expect(nodes.node(for: c) == nil && nodes.detachedItem(c) == Self.item("c"))

        try keychain.manager.deleteKey(forIdentifier: "c", inGroup: "default")
        #expect(nodes.node(for: a) == nil && nodes.detachedItem(a) == Self.item("c"))
        // An item made later under the name gets a number of its own.
        try keychain.write("c", "new")
        #expect(![a, c].contains(nodes.inode(for: Self.item("c"))))
    }

    /// The inodes are rebound inside the write section: an observer of the
    /// device's events, told after the commit, already finds them rebound.
    @Test func theNamesAreReboundBeforeTheChangeIsAnnounced() throws {
        let keychain = try Keychain()
        let nodes = keychain.nodes, kernel = KernelCache(scope: .keychain)
        try keychain.write("a", "one")
        let a = nodes.lookedUp(Self.item("a"), by: kernel)
        let seen = Mutex<[Node?]>([])
        let token = keychain.manager.localDevice.addObserver { event in
            if case .changed(.removed) = event { seen.withLock { $0.append(nodes.node(for: a)) } }
        }
        defer { keychain.manager.localDevice.removeObserver(token) }
        try keychain.manager.deleteKey(forIdentifier: "a", inGroup: "default")
        #expect(seen.withLock { $0 } == [nil])
    }
}

extension NodeTableTests.Steps: RandomNumberGenerator {
    mutating func next() -> UInt64 { UInt64(next(Int.max)) }
}
