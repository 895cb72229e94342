internal import CFuse
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// Listings: opendir, readdir, readdirplus, releasedir.
extension FuseOperations {
    static func openDirectory(_ req: fuse_req_t?, _ inode: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        serve(req) { fs throws(Errno) in
            guard let fi else { throw Errno(EINVAL) }
            // One listing per opendir: a directory read in several
            // chunks neither re-queries the store nor skips or repeats
            // entries when items change meanwhile.
            let changeCount = fs.nodes.changeCount  // before the listing's query
            let node = try fs.node(inode)
            try fs.requireEntitlement(inDirectory: node, caller: caller(req), operation: "list")
            let listing = DirectoryListing(try fs.listing(of: node), changeCount: changeCount)
            fi.pointee.fh = FuseHandle.make(listing)
            fuse_reply_open(req, fi)
        }
    }

    static func readDirectory(
        _ req: fuse_req_t?, _: fuse_ino_t, _ size: Int, _ offset: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>?
    ) {
        replyListing(req, fi, size: size, offset: offset) { fs, _, listed, room, roomSize, next in
            var info = stat()
            info.st_ino = ino_t(fs.nodes.inode(for: listed.node))
            info.st_mode = listed.mode
            return fuse_add_direntry(req, room, roomSize, listed.name, &info, next)
        }
    }

    static func readDirectoryPlus(
        _ req: fuse_req_t?, _: fuse_ino_t, _ size: Int, _ offset: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>?
    ) {
        replyListing(req, fi, size: size, offset: offset) { fs, listing, listed, room, roomSize, next in
            // An entry without a number (ino 0) is a bare name: the
            // kernel takes no reference and keeps what it has. So are
            // `.` and `..`, and nodes this kernel already holds, whose
            // cached attributes are exact and would be replaced by the
            // listing's, kept for less long.
            var entry = fuse_entry_param()
            entry.attr.st_mode = listed.mode
            if let known = fs.nodes.existingInode(for: listed.node),
                listed.name == "." || listed.name == ".." || fs.kernelCache.knows(known)
            {
                entry.attr.st_ino = ino_t(known)
            } else {
                entry = fs.entry(listed: listed, current: fs.nodes.changeCount == listing.changeCount)
            }
            let needed = fuse_add_direntry_plus(req, room, roomSize, listed.name, &entry, next)
            if needed > roomSize && entry.ino != 0 {
                fs.nodes.forget(UInt64(entry.ino), count: 1, by: fs.kernelCache)  // not sent
            }
            return needed
        }
    }

    static func releaseDirectory(_ req: fuse_req_t?, _: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        if let fi { FuseHandle.take(fi.pointee.fh, as: DirectoryListing.self) }
        fuse_reply_err(req, 0)
    }

    /// Replies to READDIR or READDIRPLUS from the listing taken at opendir:
    /// the entries from `offset` on that fit in `size` bytes. `add` writes one
    /// entry (the filesystem, the listing, the entry, the room left and its
    /// size, the entry's next offset) and returns the bytes it needs; more than
    /// the room means it did not fit, and the reply ends before it.
    private static func replyListing(
        _ req: fuse_req_t?, _ fi: UnsafeMutablePointer<fuse_file_info>?, size: Int, offset: off_t,
        add: (FileSystem, DirectoryListing, DirectoryListing.Entry, UnsafeMutablePointer<CChar>, Int, off_t) -> Int
    ) {
        serve(req) { fs throws(Errno) in
            guard let fi, let listing = FuseHandle.object(fi.pointee.fh, as: DirectoryListing.self) else {
                throw Errno(EBADF)
            }
            let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: size)
            defer { buffer.deallocate() }
            var used = 0
            var index = Int(offset)
            while index < listing.entries.count {
                let needed = add(fs, listing, listing.entries[index], buffer + used, size - used, off_t(index + 1))
                if needed > size - used { break }
                used += needed
                index += 1
            }
            fuse_reply_buf(req, buffer, used)
        }
    }
}
