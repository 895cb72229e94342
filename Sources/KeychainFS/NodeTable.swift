import Synchronization

/// What an inode number stands for. Groups are directories, identifiers files.
enum Node: Hashable, Sendable {
    case root
    case control
    case group(String)
    case item(group: String, identifier: String)
}

/// Stable inode numbers for nodes, handed out on first sight. Numbers are
/// never reused while the mount lives, so a stale kernel reference can only
/// ever name the node it named (the store then answers whether it exists).
final class NodeTable: Sendable {
    static let rootInode: UInt64 = 1
    static let controlInode: UInt64 = 2

    private struct State {
        var byInode: [UInt64: Node] = [NodeTable.rootInode: .root, NodeTable.controlInode: .control]
        var byNode: [Node: UInt64] = [.root: NodeTable.rootInode, .control: NodeTable.controlInode]
        var next: UInt64 = 3
    }
    private let state = Mutex(State())

    func inode(for node: Node) -> UInt64 {
        state.withLock { state in
            if let inode = state.byNode[node] { return inode }
            let inode = state.next
            state.next += 1
            state.byNode[node] = inode
            state.byInode[inode] = node
            return inode
        }
    }

    /// After a rename the kernel keeps the inode under its new name: the
    /// number must now stand for the new node. A node that was at the target
    /// is replaced (rename(2)); its number goes stale.
    func move(_ old: Node, to new: Node) {
        state.withLock { state in
            if let replaced = state.byNode.removeValue(forKey: new) { state.byInode.removeValue(forKey: replaced) }
            guard let inode = state.byNode.removeValue(forKey: old) else { return }
            state.byNode[new] = inode
            state.byInode[inode] = new
        }
    }

    func node(for inode: UInt64) -> Node? {
        state.withLock { $0.byInode[inode] }
    }
}
