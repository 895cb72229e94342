internal import CFuse
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// renameat2(2) flags (linux/fs.h; glibc exposes them only with _GNU_SOURCE).
private let renameNoReplace: UInt32 = 1 << 0
private let renameExchange: UInt32 = 1 << 1
/// setxattr(2) flags (linux/xattr.h).
private let xattrCreate: Int32 = 1
private let xattrReplace: Int32 = 2

extension FileSystem {
    /// `rm`: works while locked, as deleting a keychain item does on iOS.
    /// The item's inode is detached from the name: descriptors still open on
    /// it keep reading it, and what they write goes nowhere (POSIX).
    func unlink(parent: Node, name: String, caller: ProcessIdentity) throws(Errno) {
        guard Self.specialFiles[name] == nil || parent != .root else { throw Errno(EPERM) }
        guard let (group, folder) = itemDirectory(of: parent) else {
            throw Errno(parent == .root ? EISDIR : ENOTDIR)
        }
        let identifier = folder + name
        try admit(group, items: [identifier], verb: "delete", caller: caller, operation: "remove")
        try audited("remove", group: group, identifier: identifier, caller: caller) { () throws(Errno) in
            try changingNames { () throws(Errno) in
                try core { () throws(KeychainError) in
                    try manager.deleteKey(forIdentifier: identifier, inGroup: group)
                }
            }
        }
        keepFolder(folder, inGroup: group)
    }

    /// The folder (ending with `/`; empty: the group's top) that an item
    /// left stays, empty, until rmdir, as a directory does: `rm -r` removes
    /// it last.
    private func keepFolder(_ folder: String, inGroup group: String) {
        if !folder.isEmpty { nodes.makeFolder(String(folder.dropLast()), inGroup: group) }
    }

    /// `mkdir` creates an access group at the root of a whole-keychain
    /// mount, and a folder in a group (kept in memory until an item is
    /// made in it: docs/FILESYSTEM.md, "Names with a /").
    func makeDirectory(parent: Node, name: String) throws(Errno) -> Node {
        if parent == .root, scope == .keychain {
            if Self.specialFiles[name] != nil { throw Errno(EEXIST) }
            try core { () throws(KeychainError) in try manager.createGroup(name) }
            return .group(name)
        }
        guard let (group, folder) = itemDirectory(of: parent) else { throw Errno(EPERM) }
        if parent == .root, Self.specialFiles[name] != nil { throw Errno(EEXIST) }
        let path = folder + name
        try core { () throws(KeychainError) in try ItemLimits.validate(identifier: path) }
        let item = try core { () throws(KeychainError) in try manager.info(forIdentifier: path, inGroup: group) }
        guard item == nil, !isFolder(path, inGroup: group) else { throw Errno(EEXIST) }
        nodes.makeFolder(path, inGroup: group)
        return .folder(group: group, path: path)
    }

    /// `rmdir` removes an empty access group (`default` always exists), or
    /// an empty folder of a group.
    func removeDirectory(parent: Node, name: String, caller: ProcessIdentity) throws(Errno) {
        guard parent == .root, scope == .keychain else {
            guard let (group, folder) = itemDirectory(of: parent) else { throw Errno(EPERM) }
            let path = folder + name
            if try core({ () throws(KeychainError) in try manager.holdsItems(below: path, inGroup: group) })
                || !nodes.madeFolders(in: path + "/", ofGroup: group).isEmpty
            {
                throw Errno(ENOTEMPTY)
            }
            if nodes.removeFolder(path, inGroup: group) { return }
            let item = try core { () throws(KeychainError) in try manager.info(forIdentifier: path, inGroup: group) }
            throw Errno(item != nil ? ENOTDIR : ENOENT)
        }
        if Self.specialFiles[name] != nil { throw Errno(ENOTDIR) }
        if name == ItemLimits.defaultGroup || isGroupMounted(name) { throw Errno(EBUSY) }
        try admit(name, caller: caller, operation: "remove-group")
        try changingNames { () throws(Errno) in
            try core { () throws(KeychainError) in try manager.removeGroup(name) }
        }
    }

    /// `mv` within a group. Across groups EXDEV (the group is bound into the
    /// ciphertext; `mv` then copies and deletes, which works through our
    /// read and write). Needs the item's class key (EACCES without it).
    func rename(
        parent: Node, name: String, newParent: Node, newName: String, flags: UInt32,
        caller: ProcessIdentity
    ) throws(Errno) {
        if Self.specialFiles[name] != nil || Self.specialFiles[newName] != nil { throw Errno(EPERM) }
        // RENAME_EXCHANGE is not offered, RENAME_WHITEOUT is for overlay
        // filesystems, and an unknown flag must not be taken for a plain rename.
        guard flags & ~renameNoReplace == 0 else { throw Errno(EINVAL) }
        try validate(name)
        try validate(newName)
        guard let (group, folder) = itemDirectory(of: parent) else {
            // Renaming a group would re-encrypt every item in it: not offered.
            throw Errno(EXDEV)
        }
        guard let (newGroup, newFolder) = itemDirectory(of: newParent), newGroup == group else { throw Errno(EXDEV) }
        let source = folder + name, target = newFolder + newName
        // A folder is its items: moving one would rename each (mv then copies and removes them, one by one).
        if isFolder(source, inGroup: group),
            try core({ () throws(KeychainError) in try manager.info(forIdentifier: source, inGroup: group) }) == nil
        {
            throw Errno(EXDEV)
        }
        try admit(group, items: [source, target], verb: "rename or replace", caller: caller, operation: "rename")
        try audited("rename", group: group, identifier: source, detail: target, caller: caller) { () throws(Errno) in
            try changingNames { () throws(Errno) in
                try core { () throws(KeychainError) in
                    try manager.renameKey(
                        forIdentifier: source, to: target, inGroup: group, replacing: flags & renameNoReplace == 0)
                }
            }
        }
        keepFolder(folder, inGroup: group)
    }

    /// Runs a change of names that this mount's request makes: the inodes
    /// follow the store as it commits (``NodeTable``), and the other mounts'
    /// kernels are told to forget the names, but not this one's, which keeps
    /// its own right and holds the directory's lock until the reply.
    private func changingNames(_ body: () throws(Errno) -> Void) throws(Errno) {
        try NodeTable.$changingMount.withValue(kernelCache) { Result { () throws(Errno) in try body() } }.get()
    }

    /// chmod, chown and fchmod that change nothing succeed, so that programs
    /// that restore a file's mode and owner (rsync, cp -p, install, tar,
    /// sed -i) work; a real change is EPERM (modes and owners are fixed).
    func checkOwnershipUnchanged(_ wanted: stat, toSet: Int32, current: stat) throws(Errno) {
        if toSet & FUSE_SET_ATTR_MODE != 0 && wanted.st_mode & 0o7777 != current.st_mode & 0o7777 { throw Errno(EPERM) }
        if toSet & FUSE_SET_ATTR_UID != 0 && wanted.st_uid != current.st_uid { throw Errno(EPERM) }
        if toSet & FUSE_SET_ATTR_GID != 0 && wanted.st_gid != current.st_gid { throw Errno(EPERM) }
    }

    func statistics() throws(Errno) -> statvfs {
        var info = statvfs()
        info.f_bsize = 4096
        info.f_frsize = 4096
        info.f_namemax = UInt(ItemLimits.maximumNameLength)
        return info
    }
}

// MARK: Extended attributes

extension FileSystem {
    /// The item attributes a mount shows, as `user.keychain.*` (``ItemAttribute``).
    static let extendedAttributes = ItemAttribute.allCases.filter { $0.extendedAttributeName != nil }

    /// An item's `user.keychain.*` attribute (``ItemAttribute``); readable
    /// while locked. ENODATA for any other `user.` name; ENOTSUP for the
    /// other namespaces (no SELinux labels, no ACLs, nothing trusted),
    /// which tells `ls -l` and `cp -a` once for the whole mount not to ask
    /// again for every file.
    func extendedAttribute(_ name: String, of node: Node) throws(Errno) -> String {
        try checkNamespace(name)
        guard case .item(let group, let identifier) = node, let attribute = ItemAttribute(extendedAttributeName: name)
        else { throw Errno(ENODATA) }
        return attribute.value(
            of: try view(of: identifier, in: group, withDetails: attribute.isKeptInDetails))
    }

    /// The item as its attributes are read: its class, and its details
    /// when they are asked for (both need no key).
    private func view(of identifier: String, in group: String, withDetails: Bool) throws(Errno) -> ItemView {
        try core { () throws(KeychainError) in
            guard let info = try manager.info(forIdentifier: identifier, inGroup: group) else {
                throw .itemNotFound
            }
            return ItemView(
                group: group, identifier: identifier, protectionClass: info.protectionClass,
                details: withDetails ? try manager.details(forIdentifier: identifier, inGroup: group) : nil)
        }
    }

    /// removexattr: an item's attributes always have a value (derived, or
    /// its identifier for a label), so none is removable; other `user.`
    /// names do not exist.
    func removeExtendedAttribute(_ name: String, of node: Node) throws(Errno) {
        try checkNamespace(name)
        throw Errno(extendedAttributeNames(of: node).contains(name) ? EPERM : ENODATA)
    }

    /// ENOTSUP outside `user.`: keychainfs keeps no other namespace.
    private func checkNamespace(_ name: String) throws(Errno) {
        guard name.hasPrefix("user.") else { throw Errno(ENOTSUP) }
    }

    func extendedAttributeNames(of node: Node) -> [String] {
        guard case .item = node else { return [] }
        return Self.extendedAttributes.compactMap(\.extendedAttributeName)
    }

    /// Writing a class attribute re-encrypts the item under the class it
    /// gives (needs both keys): `accessible` names it, `migratable` switches
    /// between a class and its ThisDeviceOnly form. Writing the label
    /// replaces it in the item's details (needs its class key).
    func setExtendedAttribute(_ name: String, value: String, flags: Int32, of node: Node) throws(Errno) {
        guard case .item(let group, let identifier) = node else { throw Errno(ENOTSUP) }
        // setxattr(2): XATTR_CREATE fails on an existing attribute, and an
        // item's attributes always exist; XATTR_REPLACE needs one to exist,
        // which they do. Anything else is not a flag.
        guard flags & ~(xattrCreate | xattrReplace) == 0, flags != xattrCreate | xattrReplace else {
            throw Errno(EINVAL)
        }
        if flags & xattrCreate != 0 && extendedAttributeNames(of: node).contains(name) { throw Errno(EEXIST) }
        guard let attribute = ItemAttribute(extendedAttributeName: name), attribute.isWritable else {
            throw Errno(ENOTSUP)
        }
        let item = try view(of: identifier, in: group, withDetails: attribute.isKeptInDetails)
        guard let change = attribute.change(written: value, to: item) else { throw Errno(EINVAL) }
        try core { () throws(KeychainError) in
            switch change {
            case .protectionClass(let newClass):
                try manager.setProtectionClass(newClass, forIdentifier: identifier, inGroup: group)
            case .details(let details):
                try manager.setDetails(details, forIdentifier: identifier, inGroup: group)
            }
        }
    }
}
