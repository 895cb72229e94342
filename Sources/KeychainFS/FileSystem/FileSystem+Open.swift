import KeychainCore
import KeychainProtocol
#if canImport(Glibc)
import Glibc
#endif

extension FileSystem {
    /// Opens an item. Needs the key of the item's class; a writer also needs
    /// the key of the class its commit will give (docs/FILESYSTEM.md, "Operations and errno": writing needs both).
    /// Without them: EACCES, and nothing changes.
    /// Checked against the group's entitlements and recorded in the audit
    /// log as a `read` or a `write`. `inode` is the one the kernel opens
    /// (nil: the one bound to the name now); if it was detached meanwhile,
    /// registering the descriptor fails with ESTALE and the kernel looks the
    /// name up again.
    func openItem(
        group: String, identifier: String, inode: UInt64? = nil, flags: Int32,
        opener: ProcessIdentity
    ) throws(Errno) -> OpenFile {
        let operation = flags & O_ACCMODE == O_RDONLY ? "read" : "write"
        try admit(
            group, items: [identifier], verb: operation == "read" ? "read the secret of" : "change the secret of",
            caller: opener, operation: operation)
        return try audited(operation, group: group, identifier: identifier, caller: opener) { () throws(Errno) in
            let file = try opening(
                group: group, identifier: identifier,
                inode: inode ?? nodes.inode(for: .item(group: group, identifier: identifier)),
                flags: flags, opener: opener)
            // Once more just before the reply: a process that let a tracer or
            // foreign code in while the value was being decrypted gets nothing.
            try recheckEntitlement(group, caller: opener)
            return file
        }
    }

    /// How often an open follows a name that keeps being replaced under it.
    static let openAttempts = 8

    /// Opens the item behind `inode` and registers the descriptor: the
    /// file and its handle for the kernel. An open that raced the removal
    /// or replacement of the item's name (its inode was detached after the
    /// kernel looked the name up) is answered as if it came just after:
    /// with the item the name holds then (a name replaced with `rename`
    /// always holds one), or ENOENT. ESTALE would make the kernel look the
    /// name up again, but only once (fs/namei.c, `do_filp_open`): under
    /// churn a reader of an atomically replaced name got it (docs/SECURITY.md,
    /// "Bad input and what it gets"). An `O_CREAT` open of a removed name stays
    /// ESTALE, so that the kernel's second lookup finds it absent and creates
    /// it.
    func openDescriptor(inode: UInt64, flags: Int32, opener: ProcessIdentity) throws(Errno) -> (OpenFile, UInt64) {
        var target = inode
        for _ in 0..<Self.openAttempts {
            let node: Node
            var numberedHere = false
            if let bound = nodes.node(for: target) {
                node = bound
            } else if let detached = nodes.detachedItem(target) {
                node = detached
                if let current = nodes.existingInode(for: detached) {
                    target = current
                } else if flags & O_CREAT != 0 {
                    throw Errno(ESTALE)
                } else {
                    // Unnumbered: absent, or never looked up since. openItem says which
                    // (ENOENT only to a program the group's policy admits).
                    target = nodes.inode(for: detached)
                    numberedHere = true
                }
            } else {
                throw Errno(ESTALE)
            }
            guard case .item(let group, let identifier) = node else { throw Errno(EISDIR) }
            do throws(Errno) {
                let file = try openItem(
                    group: group, identifier: identifier, inode: target, flags: flags, opener: opener)
                return (file, try nodes.add(file))
            } catch .stale {
                continue  // detached again meanwhile: follow the name once more
            } catch {
                if numberedHere { nodes.dropIfUnused(target) }
                throw error
            }
        }
        throw Errno(ESTALE)
    }

    private func opening(
        group: String, identifier: String, inode: UInt64, flags: Int32,
        opener: ProcessIdentity
    ) throws(Errno) -> OpenFile {
        let truncates = flags & O_TRUNC != 0
        if flags & O_ACCMODE == O_RDONLY || !truncates {
            // One read of the store and one decryption (or the cache): the
            // value for readers, the starting content for writers that keep it.
            let item = try core { () throws(KeychainError) in
                try manager.item(forIdentifier: identifier, inGroup: group)
            }
            if flags & O_ACCMODE == O_RDONLY {
                // A reader's value is locked memory too, held while the
                // descriptor is: a user's descriptors of their own items of
                // just over 256 KiB (a 1 MiB slot each), read a little and
                // held open, once kept another user's large values out of
                // the service (an outsider's attack).
                let held = try lockedMemory(grownFrom: nil, held: 0, for: item.value.count)
                return OpenFile(
                    inode: inode, value: item.value, buffer: nil, appends: false,
                    protectionClass: item.protectionClass, targetClass: nil, opener: opener, readPlace: held.place)
            }
            // Held before the copy is made: the share bounds the locked memory itself.
            let held = try lockedMemory(grownFrom: nil, held: 0, for: item.value.count)
            do throws(Errno) {
                let buffer = try core { () throws(KeychainError) in try SecureBuffer(copying: item.value) }
                let file = try writer(
                    inode: inode, buffer: buffer, current: item.protectionClass, flags: flags, opener: opener)
                (file.lockedMemoryPlace, file.lockedMemoryHeld) = held
                return file
            } catch {
                Self.releaseLockedMemory(held.place)
                throw error
            }
        }
        // O_TRUNC: the old value is not needed, only that its key is there.
        guard
            let info = try core({ () throws(KeychainError) in
                try manager.info(forIdentifier: identifier, inGroup: group)
            })
        else { throw Errno(ENOENT) }
        guard manager.localDevice.isAvailable(info.protectionClass) else { throw Errno(EACCES) }
        let file = try writer(
            inode: inode, buffer: SecureBuffer(), current: info.protectionClass, flags: flags, opener: opener)
        file.noteTruncation()
        return file
    }

    /// A writing descriptor; EACCES unless the class its commit will give is available too.
    private func writer(
        inode: UInt64, buffer: SecureBuffer, current: ProtectionClass, flags: Int32,
        opener: ProcessIdentity
    ) throws(Errno) -> OpenFile {
        let target = manager.classForNewWrites
        guard manager.localDevice.isAvailable(target) else { throw Errno(EACCES) }
        return OpenFile(
            inode: inode, value: nil, buffer: buffer, appends: flags & O_APPEND != 0,
            protectionClass: current, targetClass: target, opener: opener)
    }

    /// Creates an empty item at once (as creat(2) makes a file exist), with
    /// the class of the current access mode. EEXIST if it appeared meanwhile
    /// and `O_EXCL` was asked; otherwise that item is opened instead.
    func createItem(group: String, identifier: String, flags: Int32, opener: ProcessIdentity) throws(Errno) -> OpenFile
    {
        try admit(group, caller: opener, operation: "create", identifier: identifier)
        let target = manager.classForNewWrites
        // Numbered before the item exists: a removal that commits after the
        // write then finds the inode bound, and detaches it (NodeTable). One
        // numbered after could be bound to an item already removed, and a
        // later item of the name would reach this descriptor.
        let inode = nodes.inode(for: .item(group: group, identifier: identifier))
        do throws(KeychainError) {
            try manager.write(
                try SecureBytes([]), identifier: identifier, group: group, protectionClass: target,
                condition: .ifAbsent)
        } catch .duplicateItem {
            nodes.dropIfUnused(inode)
            if flags & O_EXCL != 0 { throw Errno(EEXIST) }
            return try openItem(group: group, identifier: identifier, flags: flags, opener: opener)
        } catch {
            nodes.dropIfUnused(inode)
            audit("create", group: group, identifier: identifier, caller: opener, result: AuditEvent.result(of: error))
            throw Errno(error)
        }
        audit("create", group: group, identifier: identifier, caller: opener, result: "ok")
        return try writer(inode: inode, buffer: SecureBuffer(), current: target, flags: flags, opener: opener)
    }

    // MARK: Read and write

    /// Lends the bytes of `[offset, offset + size)` to `reply`.
    func read(_ file: OpenFile, offset: Int, size: Int, reply: (UnsafeRawBufferPointer) -> Void) throws(Errno) {
        try file.lock.withLock { () throws(Errno) in
            try file.checkAccess(manager.localDevice)
            if let value = file.value {
                value.withUnsafeBytes { all in
                    let start = min(max(offset, 0), all.count)
                    let end = min(all.count, start + size)
                    reply(UnsafeRawBufferPointer(rebasing: all[start..<end]))
                }
            } else if let buffer = file.buffer {
                buffer.withBytes(from: offset, length: size, reply)
            } else {
                throw Errno(EBADF)
            }
        }
    }

    /// Buffers a write. A write that would take the value past 1 MiB fails
    /// with EFBIG and poisons the descriptor, so that closing it stores
    /// nothing and the old value stays (docs/FILESYSTEM.md, What "closed" means).
    func write(_ file: OpenFile, bytes: UnsafeRawBufferPointer, offset: Int) throws(Errno) {
        try changing(file) { () throws(Errno) in
            guard let buffer = file.buffer else { throw Errno(EBADF) }
            guard file.failure == 0 else { throw Errno(file.failure) }
            let at = file.appends ? buffer.count : offset
            try holdLockedMemory(file, for: at + bytes.count)
            do throws(KeychainError) {
                // O_APPEND: the end of our buffer, not the kernel's idea of the size.
                try buffer.write(bytes, at: at)
            } catch {
                if error == .valueTooLarge { file.failure = EFBIG }
                throw Errno(error)
            }
            file.noteWrite()
        }
    }

    /// `ftruncate` through an open descriptor: resizes its buffer.
    func truncate(_ file: OpenFile, to size: Int) throws(Errno) {
        try changing(file) { () throws(Errno) in
            guard let buffer = file.buffer else { throw Errno(EBADF) }
            try holdLockedMemory(file, for: size)
            try core { () throws(KeychainError) in try buffer.resize(to: size) }
            file.noteWrite()
        }
    }

    /// Holds, for `file`'s buffer of `size` bytes, the locked memory its
    /// slot takes in the owner's share of the service's
    /// (``LockedMemoryShares``; nothing in a per-user device); ENOMEM when
    /// the share has not that much left, and the write, or the open,
    /// fails: a user's descriptors held open with 1 MB written each once
    /// kept every other user's large values out of the service, and, while
    /// only buffers past 64 KiB were counted, a hundred with 64 KiB each
    /// did too (docs/SECURITY.md, "What an ordinary user of the machine
    /// can try"). Checked without a lock until the buffer needs a larger
    /// slot than it holds, so a write costs nothing more.
    func holdLockedMemory(_ file: OpenFile, for size: Int) throws(Errno) {
        (file.lockedMemoryPlace, file.lockedMemoryHeld) = try lockedMemory(
            grownFrom: file.lockedMemoryPlace, held: file.lockedMemoryHeld, for: size)
    }

    /// `place` (covering `held` bytes) grown to cover a buffer of `size`;
    /// as it is, without a lock, while `held` covers it.
    func lockedMemory(grownFrom place: LockedMemoryShares.Place?, held: Int, for size: Int) throws(Errno) -> (
        place: LockedMemoryShares.Place?, held: Int
    ) {
        let needed = LockedMemoryShares.slot(for: size)
        guard needed > held else { return (place, held) }
        guard let shares = LockedMemoryShares.serving.withLock({ $0 }) else { return (nil, needed) }
        let grown: LockedMemoryShares.Place?
        if let place {
            grown = shares.grow(place, to: needed)
        } else {
            grown = shares.take(for: owner.uid, bytes: needed)
        }
        guard let grown else { throw Errno(ENOMEM) }
        return (grown, needed)
    }

    /// Gives back what ``lockedMemory(grownFrom:held:for:)`` took.
    static func releaseLockedMemory(_ place: LockedMemoryShares.Place?) {
        guard let place else { return }
        LockedMemoryShares.serving.withLock { $0 }?.release(place)
    }

    /// Gives back the place `file`'s buffer or value holds, as it is
    /// released. A descriptor opened for reading has no buffer, and its
    /// place was set once, so it takes no lock here: a reader's RELEASE
    /// arrives while the worker that sent its READ reply still holds that
    /// lock, and waiting for it cost every read through the mount 1.15x
    /// (docs/BENCHMARKS.md).
    func releaseLockedMemory(of file: OpenFile) {
        guard file.writable else { return Self.releaseLockedMemory(file.readPlace) }
        let place = file.lock.withLock { () -> LockedMemoryShares.Place? in
            defer { file.lockedMemoryPlace = nil }
            return file.lockedMemoryPlace
        }
        Self.releaseLockedMemory(place)
    }

    /// Runs a change of a writing descriptor's buffer under its lock. If it
    /// fails, an emptying by O_TRUNC that an earlier flush committed is taken
    /// back: the update failed, and the old value must not be lost with it.
    private func changing(_ file: OpenFile, _ body: () throws(Errno) -> Void) throws(Errno) {
        try file.lock.withLock { () throws(Errno) in
            do throws(Errno) {
                try file.checkAccess(manager.localDevice)
                try body()
            } catch {
                revertTruncation(file, because: error.rawValue)
                throw error
            }
        }
    }

    /// Commits what was written since the last commit (flush, fsync), or the
    /// emptying of an O_TRUNC open that wrote nothing yet, so that it is
    /// visible once `close` returns (POSIX empties at open; doing it at the
    /// first flush keeps the old value when the open's checks fail).
    /// `final` is release: it never reports (close has returned already).
    func commit(_ file: OpenFile, final: Bool) throws(Errno) {
        // Before the lock: a reader's RELEASE arrives while the READ that
        // woke its `close` may still hold the lock (it replies under it), and
        // waiting for it cost two context switches per read (strace: one
        // futex wait and wake per open+read+close).
        guard file.writable else { return }
        try file.lock.withLock { () throws(Errno) in
            if file.failure != 0 {
                if final { return }
                throw Errno(file.failure)
            }
            guard file.dirty || file.truncatePending else {
                // Done with the descriptor: its emptying is final.
                if final { file.pendingRevert = nil }
                return
            }
            do throws(Errno) {
                try file.checkAccess(manager.localDevice)
            } catch {
                revertTruncation(file, because: error.rawValue)
                throw error
            }
            guard let buffer = file.buffer else { throw Errno(EBADF) }
            do throws(KeychainError) {
                let receipt = try write(buffer, of: file)
                // Only an emptying before any data can need taking back.
                file.pendingRevert = file.dirty || final ? nil : receipt
            } catch .itemNotFound {
                // Removed meanwhile (through the core, not a FUSE unlink).
                file.pendingRevert = nil
            } catch {
                // A failure reported at close is final: release must not
                // store later what the writer was told was not stored. The
                // descriptor keeps the errno, which its later calls give
                // (it kept the core's code, which write(2) gave as ERANGE).
                let reported = Errno(error)
                file.failure = reported.rawValue
                revertTruncation(file, because: reported.rawValue)
                throw reported
            }
            file.dirty = false
            file.truncatePending = false
        }
    }

    /// Writes a descriptor's buffer to the item its inode is bound to. A
    /// rename moved the inode to the item's current name; a removal
    /// detached it (nil): the data goes nowhere (POSIX), and must never
    /// reach an item made later under the name. Names are rebound as their
    /// changes commit, so the binding is asked again inside the write's
    /// transaction, and a rename that came in between is followed.
    private func write(_ buffer: SecureBuffer, of file: OpenFile) throws(KeychainError) -> PasswordManager.WriteReceipt?
    {
        let value = try buffer.snapshot()
        for _ in 0..<Self.openAttempts {
            guard let bound = nodes.node(for: file.inode), case .item(let group, let identifier) = bound else {
                return nil
            }
            let written = try manager.write(
                value, identifier: identifier, group: group,
                protectionClass: manager.classForNewWrites, condition: .ifPresent
            ) { [nodes] in nodes.node(for: file.inode) == bound }
            if let written { return written }
        }
        // Renamed under it again and again: said, rather than written to a name it no longer has.
        throw .badRequest
    }

    /// Takes back an emptying that a flush committed for this descriptor,
    /// if the item still holds it. Call with the descriptor's lock held.
    private func revertTruncation(_ file: OpenFile, because code: Int32) {
        guard var receipt = file.pendingRevert else { return }
        file.pendingRevert = nil
        if file.failure == 0 { file.failure = code }
        // A rename since moved the descriptor's item: its value goes back under the name it has now.
        if case .item(let group, let identifier)? = nodes.node(for: file.inode) {
            receipt = receipt.at(group: group, identifier: identifier)
        }
        do throws(KeychainError) {
            try manager.revert(receipt)
        } catch {
            Diagnostics.log("could not restore the value an interrupted O_TRUNC write emptied: \(error)")
        }
    }

    /// `truncate(path)`: rewrites the stored value at once, under the keys
    /// that a write needs.
    func truncate(group: String, identifier: String, to size: Int, caller: ProcessIdentity) throws(Errno) {
        let file = try openItem(
            group: group, identifier: identifier,
            flags: size == 0 ? O_WRONLY | O_TRUNC : O_WRONLY, opener: caller)
        try truncate(file, to: size)
        try commit(file, final: true)
    }
}
