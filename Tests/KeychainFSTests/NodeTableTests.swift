@testable import KeychainFS
import KeychainCore
import Testing

/// Issue 32 asked whether a removed item's inode number can be handed out
/// again while something still holds it: the path to the loss SSKeychain's
/// users met (a writer of the old item landing in the new one). These
/// drive the table through removals, re-creations, renames and the
/// kernels' FORGETs, in any order, and check that a number never stands
/// for two items.
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
                nodes.detach(name, info: nil)
            case 3:  // rename over another name
                let target = names[steps.next(names.count)]
                guard target != name, let moved = nodes.existingInode(for: name) else { continue }
                nodes.move(name, to: target, replacedInfo: nil)
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

extension NodeTableTests.Steps: RandomNumberGenerator {
    mutating func next() -> UInt64 { UInt64(next(Int.max)) }
}
