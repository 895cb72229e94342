internal import CFuse
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// Extended attributes: an item's attributes (``ItemAttribute``).
extension FuseOperations {
    static func setExtendedAttribute(
        _ req: fuse_req_t?, _ inode: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ value: UnsafePointer<CChar>?,
        _ size: Int, _ flags: Int32
    ) {
        serve(req) { fs throws(Errno) in
            let bytes = UnsafeRawBufferPointer(start: value, count: size)
            guard let text = String(validating: bytes, as: UTF8.self) else { throw Errno(EINVAL) }
            let node = try fs.entitledNode(inode, caller: caller(req), operation: "xattr")
            let name = try kernelName(name)
            if case .item(let group, let identifier) = node,
                let attribute = ItemAttribute(extendedAttributeName: name), let verb = attribute.writeVerb
            {
                try fs.admit(
                    group, items: [identifier], verb: verb, caller: caller(req), operation: attribute.writeOperation)
                // Setting an attribute changes the item's class or details: a change worth recording.
                try fs.audited(
                    attribute.writeOperation, group: group, identifier: identifier, detail: name + "=" + text,
                    caller: caller(req)
                ) { () throws(Errno) in
                    try fs.setExtendedAttribute(name, value: text, flags: flags, of: node)
                }
            } else {
                // Not an attribute a program writes: its error (ENOTSUP, EINVAL for bad flags).
                try fs.setExtendedAttribute(name, value: text, flags: flags, of: node)
            }
            fuse_reply_err(req, 0)
        }
    }

    static func getExtendedAttribute(
        _ req: fuse_req_t?, _ inode: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ size: Int
    ) {
        serve(req) { fs throws(Errno) in
            let value = Array(
                try fs.extendedAttribute(
                    try kernelName(name), of: try fs.entitledNode(inode, caller: caller(req), operation: "xattr")
                ).utf8)
            try replyXattr(req, value, size: size)
        }
    }

    static func listExtendedAttributes(_ req: fuse_req_t?, _ inode: fuse_ino_t, _ size: Int) {
        serve(req) { fs throws(Errno) in
            let names = fs.extendedAttributeNames(
                of: try fs.entitledNode(inode, caller: caller(req), operation: "xattr")
            ).flatMap { Array($0.utf8) + [UInt8(0)] }
            try replyXattr(req, names, size: size)
        }
    }

    static func removeExtendedAttribute(_ req: fuse_req_t?, _ inode: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        serve(req) { fs throws(Errno) in
            try fs.removeExtendedAttribute(
                try kernelName(name), of: try fs.entitledNode(inode, caller: caller(req), operation: "xattr"))
        }
    }

    /// getxattr/listxattr: size 0 asks for the length; too small a buffer is ERANGE.
    private static func replyXattr(_ req: fuse_req_t?, _ value: [UInt8], size: Int) throws(Errno) {
        if size == 0 {
            fuse_reply_xattr(req, value.count)
        } else if size < value.count {
            throw Errno(ERANGE)
        } else {
            value.withUnsafeBytes { _ = fuse_reply_buf(req, $0.baseAddress, $0.count) }
        }
    }
}
