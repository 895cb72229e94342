import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The keychain as UYLPasswordManager offered it, in Swift form: register,
/// read, validate and delete keys by identifier and access group, with the
/// `accessMode` and `migrate` settings applied to items written afterwards
/// and a cache of the last access that ``purge()`` wipes.
///
/// Every operation throws, so that "locked" (``KeychainError/interactionNotAllowed``)
/// is never mistaken for "absent" (``KeychainError/itemNotFound``). Any number
/// of threads may use one instance.
///
/// A manager either holds the keychain's device itself (``init(device:)``),
/// or, as apps reach iOS's securityd, is a client of the device process that
/// holds it (``open(_:)`` while a `keychainfs` device runs): the same
/// operations with the same errors, carried over the device's socket
/// (docs/PROTOCOL.md). A client keeps no cache: values stay in the device.
public final class PasswordManager: Sendable {
    private enum Backend: Sendable {
        case local(Device)
        case remote(any RemoteKeychain)
    }
    private let backend: Backend

    private struct Settings {
        var accessMode: AccessMode = .whenUnlocked
        var migrate = true
    }
    private let settings = Mutex(Settings())

    /// The last key read or written: UYLPasswordManager's cache of the last access.
    private struct CacheEntry: Sendable {
        var group: String
        var identifier: String
        var value: SecureBytes
        var protectionClass: ProtectionClass
        var epoch: UInt64
        /// Its details, once known (the owner rule asks for them at every
        /// open): `.some(nil)` when the row has none, nil when not read yet.
        var details: ItemDetails?? = nil
        /// Which remembered access this is: details read meanwhile are noted only in the same one.
        var serial: UInt64 = 0
    }
    private let cache = Mutex<CacheEntry?>(nil)
    private let cacheSerial = Atomic<UInt64>(0)
    /// Which items have an owner (docs/FILESYSTEM.md, "Items another program
    /// owns"), so that the owner rule costs no query for the others
    /// (``mayHaveOwner(_:inGroup:)``).
    let ownerIndex = Mutex(OwnerIndex())
    private let observer = Mutex<Int?>(nil)

    /// A manager over `device`. The cache is purged whenever the device locks.
    public init(device: Device) {
        backend = .local(device)
        let token = device.addObserver { [weak self] event in
            switch event {
            case .locked: self?.purge()
            // A change made by another manager of the device (an access
            // list edited with `acl`): what this one remembered of the item
            // (its details, for the owner rule) is stale.
            case .changed(.written(let group, let identifier)):
                self?.forgetDetails(group: group, identifier: identifier)
                self?.ownerIndex.withLock { $0.changed(group, identifier) }
            case .changed(.removed(let group, let identifier)):
                self?.forgetDetails(group: group, identifier: identifier)
                self?.ownerIndex.withLock { $0.removed(group, identifier) }
            case .changed(.renamed(let group, let from, let to)):
                self?.forgetDetails(group: group, identifier: from)
                self?.forgetDetails(group: group, identifier: to)
                self?.ownerIndex.withLock {
                    $0.removed(group, from)
                    $0.changed(group, to)
                }
            case .unlocked, .changed(.groupCreated), .changed(.groupRemoved), .entitlementsChanged, .willLock:
                break
            }
        }
        observer.withLock { $0 = token }
    }

    /// A client of the device `remote` reaches (``RemoteKeychain``).
    package init(remote: any RemoteKeychain) {
        backend = .remote(remote)
    }

    deinit {
        if case .local(let device) = backend, let token = observer.withLock({ $0 }) { device.removeObserver(token) }
    }

    /// Whether the operations go to a device process rather than a device in this process.
    public var isClientOfRunningDevice: Bool {
        if case .remote = backend { return true }
        return false
    }

    /// The device in this process whose keys this manager uses;
    /// ``KeychainError/keychainInUse`` for a client of a running device
    /// (another process holds the keys: use ``lock()``, ``unlock(passcode:)``
    /// and ``status``, which work either way).
    public var device: Device {
        get throws(KeychainError) {
            guard case .local(let device) = backend else { throw .keychainInUse }
            return device
        }
    }

    /// The device of a manager made with ``init(device:)`` (the filesystem's and the tests').
    package var localDevice: Device {
        guard case .local(let device) = backend else {
            preconditionFailure("a client of a running device has no local device")
        }
        return device
    }

    // MARK: The device

    /// Locks the device (its `whenUnlocked` keys are wiped).
    public func lock() throws(KeychainError) {
        switch backend {
        case .local(let device): device.lock()
        case .remote(let remote): try remote.lock()
        }
    }

    /// Unlocks the device; ``KeychainError/authFailed`` for a wrong passcode or during a lockout.
    public func unlock(passcode: SecureBytes?) throws(KeychainError) {
        switch backend {
        case .local(let device): try device.unlock(passcode: passcode)
        case .remote(let remote): try remote.unlock(passcode: passcode)
        }
    }

    /// The device's lock state and lockout.
    public var status: DeviceStatus {
        get throws(KeychainError) {
            switch backend {
            case .local(let device): return device.status
            case .remote(let remote):
                return try remote.status()
            }
        }
    }

    // MARK: Settings

    /// When items written from now on are readable (UYLPasswordManager's `accessMode`).
    /// Starts as `whenUnlocked` each time the manager is created.
    public var accessMode: AccessMode {
        get { settings.withLock { $0.accessMode } }
        set { settings.withLock { $0.accessMode = newValue } }
    }

    /// Whether items written from now on may leave the device in a backup;
    /// `false` gives them the `ThisDeviceOnly` form of ``accessMode``.
    public var migrate: Bool {
        get { settings.withLock { $0.migrate } }
        set { settings.withLock { $0.migrate = newValue } }
    }

    /// The class that an item written now receives.
    public var classForNewWrites: ProtectionClass {
        settings.withLock { ProtectionClass(mode: $0.accessMode, migratable: $0.migrate) }
    }

    // MARK: Keys

    /// Adds or replaces the key of `identifier` (UYLPasswordManager's
    /// `registerKey:forIdentifier:inGroup:`). The item gets the class of the
    /// current ``accessMode`` and ``migrate``. Needs the key of the item's
    /// current class and of the new one; on any failure the old value stays.
    public func register(_ key: SecureBytes, forIdentifier identifier: String, inGroup group: String? = nil)
        throws(KeychainError)
    {
        try write(
            key, identifier: identifier, group: group ?? ItemLimits.defaultGroup, protectionClass: classForNewWrites)
    }

    /// Adds or replaces a key given as a string (stored as its UTF-8 bytes).
    public func register(_ key: String, forIdentifier identifier: String, inGroup group: String? = nil)
        throws(KeychainError)
    {
        try register(try SecureBytes(key), forIdentifier: identifier, inGroup: group)
    }

    /// When a write may happen, by whether the item exists.
    public enum WriteCondition: String, Sendable {
        /// Add or replace.
        case always
        /// Create only (as `O_EXCL`): ``KeychainError/duplicateItem`` if it exists.
        case ifAbsent
        /// Replace only: ``KeychainError/itemNotFound`` if it was deleted
        /// meanwhile (a commit through a descriptor of a removed file must
        /// not bring the secret back).
        case ifPresent
    }

    /// What a write replaced, so that the writer can take the write back
    /// (``revert(_:)``) when what it belonged to fails later.
    public struct WriteReceipt: Sendable {
        private(set) var group: String
        private(set) var identifier: String
        let replaced: SealedItem?
        let generation: Int64
        /// Whether the write emptied the item, and the class and details it left it with.
        var emptied = false
        var protectionClass: ProtectionClass?
        var details: ItemDetails?
        /// Whether the item has been renamed since (``at(group:identifier:)``).
        private(set) var renamed = false

        /// This receipt for the item under the name it has now, which a
        /// rename since may have changed.
        public func at(group: String, identifier: String) -> WriteReceipt {
            guard group != self.group || identifier != self.identifier else { return self }
            var moved = self
            (moved.group, moved.identifier, moved.renamed) = (group, identifier, true)
            return moved
        }
    }

    /// Writes a value under an explicit class (the filesystem's commit
    /// path), with `details` (``ItemDetails``; nil: a replaced item keeps
    /// its own, with the time of this change).
    @discardableResult
    public func write(
        _ value: SecureBytes, identifier: String, group: String, protectionClass: ProtectionClass,
        condition: WriteCondition = .always, details: ItemDetails? = nil
    ) throws(KeychainError) -> WriteReceipt {
        // Without a precondition, every write that does not throw is made.
        try write(
            value, identifier: identifier, group: group, protectionClass: protectionClass, condition: condition,
            details: details, provided: { true })!
    }

    /// ``write(_:identifier:group:protectionClass:condition:details:)`` made
    /// only if `holds()` says so when asked inside the store's write
    /// section, where no other change can commit until the write is done:
    /// nil, with nothing written, otherwise. The filesystem's commit asks
    /// whether its descriptor's inode still holds the name it is writing
    /// to, so that no rename or removal (which rebind names as they commit:
    /// ``Device/addCommitObserver(_:)``) can come between the two.
    package func write(
        _ value: SecureBytes, identifier: String, group: String, protectionClass: ProtectionClass,
        condition: WriteCondition = .always, details: ItemDetails? = nil, provided holds: () -> Bool
    ) throws(KeychainError) -> WriteReceipt? {
        try ItemLimits.validate(name: group)
        try ItemLimits.validate(identifier: identifier)
        guard value.count <= ItemLimits.maximumValueSize else { throw .valueTooLarge }
        try details?.validate()
        guard case .local(let device) = backend else {
            // Another process's store: asked here, as close to the write as this process gets.
            if !holds() { return nil }
            try remote.set(
                group: group, identifier: identifier, value: value, protectionClass: protectionClass,
                condition: condition, details: details)
            return WriteReceipt(group: group, identifier: identifier, replaced: nil, generation: 0)
        }
        let key = try device.classKey(protectionClass)
        var abandoned = false
        var writtenDetails: ItemDetails?
        let written: (replaced: SealedItem?, generation: Int64)
        do throws(KeychainError) {
            written = try device.store.write(group: group, identifier: identifier) {
                existing, generation throws(KeychainError) in
                if !holds() {
                    abandoned = true
                    throw .badRequest
                }
                // Replacing an item needs its current class key too: a locked
                // device must not let its `whenUnlocked` secrets be overwritten.
                if let existing {
                    if condition == .ifAbsent { throw .duplicateItem }
                    _ = try device.classKey(existing.protectionClass)
                } else if condition == .ifPresent {
                    throw .itemNotFound
                }
                let sealedDetails = try Self.details(of: existing, replacedBy: details, touched: true, on: device)
                writtenDetails = sealedDetails?.0
                return ItemCipher.seal(
                    value, group: group, identifier: identifier, protectionClass: protectionClass,
                    generation: generation, key: key, details: sealedDetails)
            }
        } catch .badRequest where abandoned {
            return nil
        }
        forget(group: group, identifier: identifier)
        return WriteReceipt(
            group: group, identifier: identifier, replaced: written.replaced, generation: written.generation,
            emptied: value.count == 0, protectionClass: protectionClass, details: writtenDetails)
    }

    /// The details a row written now carries, with the key that seals
    /// them: `new` when given, else the details `existing` had (so a write
    /// through a mount keeps what the Secret Service stored). Times left 0
    /// in `new` are stamped: `created` with the replaced item's, else now;
    /// `modified` now, as on every change of the value when `touched`.
    private static func details(
        of existing: SealedItem?, replacedBy new: ItemDetails?, touched: Bool,
        on device: Device
    ) throws(KeychainError) -> (ItemDetails, key: GuardedKey)? {
        // Most writes (a mount's, the command line's) have none: nothing to do on that path.
        guard new != nil || existing?.details != nil else { return nil }
        let key = device.secret.detailsKey
        let now = UInt64(max(0, device.clock()))
        let old = try existing.flatMap { (row) throws(KeychainError) in try ItemCipher.openDetails(row, key: key) }
        guard var details = new ?? old else { return nil }
        if new != nil {
            // Whose the item is, is not the writer's to say (docs/SECRET-SERVICE.md,
            // "Whose an item is"): an item keeps its owner and access list (none for
            // one made through a mount or the command line); a new one gets the owner
            // its writer names (the Secret Service names its caller) and an empty
            // list. ``allow(_:forIdentifier:inGroup:)`` alone adds to it.
            details.owner = existing == nil ? new?.owner : old?.owner
            details.allowed = existing == nil ? [] : old?.allowed ?? []
        }
        if details.created == 0 { details.created = old?.created ?? now }
        if touched, new?.modified ?? 0 == 0 { details.modified = now }
        return (details, key)
    }

    /// Takes a write back: the item gets the exact value (and class) it had
    /// before, without needing any class key, so it also works after a lock.
    /// Only while the item still holds that write; returns whether it did.
    /// A write that created the item is not taken back (there is no old value to lose).
    @discardableResult
    public func revert(_ receipt: WriteReceipt) throws(KeychainError) -> Bool {
        guard let previous = receipt.replaced, case .local(let device) = backend else { return false }
        defer { forget(group: receipt.group, identifier: receipt.identifier) }
        if !receipt.renamed,
            try device.store.revert(
                group: receipt.group, identifier: receipt.identifier, written: receipt.generation, previous: previous)
        {
            return true
        }
        return restoreEmptiedValue(receipt, previous: previous, on: device)
    }

    /// Takes back an emptying (a mount's `O_TRUNC`, the one write a mount
    /// takes back) whose row was changed since, but not its value: the item
    /// is still empty, and its details, its class or its name are not those
    /// the emptying left. A label, a class or a rename in between once made
    /// the take-back find the row changed and leave the item empty (two
    /// outsiders' attacks). The old value goes back under the details and
    /// name the item has now, and under its class now if that was changed
    /// (else its old one, as a take-back gives); it needs the keys of both
    /// classes, and without them the item stays as it is.
    private func restoreEmptiedValue(_ receipt: WriteReceipt, previous: SealedItem, on device: Device) -> Bool {
        guard receipt.emptied else { return false }
        do throws(KeychainError) {
            _ = try device.store.write(group: receipt.group, identifier: receipt.identifier) {
                existing, generation throws(KeychainError) in
                guard let current = existing, current.generation != receipt.generation,
                    try ItemCipher.open(current, key: try device.classKey(current.protectionClass)).count == 0
                else { throw .itemNotFound }
                let reclassed = current.protectionClass != receipt.protectionClass
                let redetailed = try ItemCipher.openDetails(current, key: device.secret.detailsKey) != receipt.details
                guard receipt.renamed || reclassed || redetailed else { throw .itemNotFound }
                let value = try ItemCipher.open(previous, key: try device.classKey(previous.protectionClass))
                let restoredClass = reclassed ? current.protectionClass : previous.protectionClass
                return ItemCipher.seal(
                    value, group: receipt.group, identifier: receipt.identifier, protectionClass: restoredClass,
                    generation: generation, key: try device.classKey(restoredClass),
                    details: try Self.details(of: current, replacedBy: nil, touched: false, on: device))
            }
            return true
        } catch {
            return false
        }
    }

    /// The key of `identifier` (UYLPasswordManager's `keyForIdentifier:`).
    /// Throws ``KeychainError/itemNotFound`` when there is none and
    /// ``KeychainError/interactionNotAllowed`` when its class is locked.
    public func key(forIdentifier identifier: String, inGroup group: String? = nil) throws(KeychainError) -> SecureBytes
    {
        try item(forIdentifier: identifier, inGroup: group).value
    }

    /// The key and the class it is stored under, from one read of the store.
    public func item(forIdentifier identifier: String, inGroup group: String? = nil)
        throws(KeychainError) -> (value: SecureBytes, protectionClass: ProtectionClass)
    {
        let group = group ?? ItemLimits.defaultGroup
        try ItemLimits.validate(name: group)
        try ItemLimits.validate(identifier: identifier)
        guard case .local(let device) = backend else {
            return try remote.get(group: group, identifier: identifier)
        }
        let epoch = device.lockEpoch
        if let hit = cache.withLock({ entry -> (SecureBytes, ProtectionClass)? in
            guard let entry, entry.epoch == epoch, entry.group == group, entry.identifier == identifier else {
                return nil
            }
            return (entry.value, entry.protectionClass)
        }) {
            return hit
        }
        guard let item = try device.store.item(group: group, identifier: identifier) else { throw .itemNotFound }
        let value = try ItemCipher.open(item, key: try device.classKey(item.protectionClass))
        remember(
            value, group: group, identifier: identifier, protectionClass: item.protectionClass, epoch: epoch,
            details: item.details == nil ? .some(nil) : nil)
        return (value, item.protectionClass)
    }

    /// The key as a string; ``KeychainError/decode`` if it is not UTF-8.
    public func string(forIdentifier identifier: String, inGroup group: String? = nil) throws(KeychainError) -> String {
        guard let string = try key(forIdentifier: identifier, inGroup: group).string() else { throw .decode }
        return string
    }

    /// Whether the stored key equals `key`, compared in constant time; with a
    /// nil `key`, whether an item exists at all (UYLPasswordManager's `validKey:`).
    /// A locked item throws rather than answering false.
    public func validKey(_ key: SecureBytes?, forIdentifier identifier: String, inGroup group: String? = nil)
        throws(KeychainError) -> Bool
    {
        guard let key else {
            return try info(forIdentifier: identifier, inGroup: group) != nil
        }
        let stored: SecureBytes
        do {
            stored = try self.key(forIdentifier: identifier, inGroup: group)
        } catch .itemNotFound {
            return false
        }
        return stored == key
    }

    /// As ``validKey(_:forIdentifier:inGroup:)`` with a string.
    public func validKey(_ key: String?, forIdentifier identifier: String, inGroup group: String? = nil)
        throws(KeychainError) -> Bool
    {
        try validKey(
            try key.map { (key: String) throws(KeychainError) in try SecureBytes(key) },
            forIdentifier: identifier, inGroup: group)
    }

    /// Deletes the key of `identifier`. Works while locked, as on iOS.
    public func deleteKey(forIdentifier identifier: String, inGroup group: String? = nil) throws(KeychainError) {
        let group = group ?? ItemLimits.defaultGroup
        try ItemLimits.validate(name: group)
        try ItemLimits.validate(identifier: identifier)
        forget(group: group, identifier: identifier)
        guard case .local(let device) = backend else {
            try remote.remove(group: group, identifier: identifier)
            return
        }
        do throws(KeychainError) {
            guard try device.store.delete(group: group, identifier: identifier) else { throw .itemNotFound }
        } catch .diskFull where device.directory.releaseSpaceReserve() {
            // A removal is how a person frees space: it uses the room kept for it.
            guard try device.store.delete(group: group, identifier: identifier) else { throw .itemNotFound }
            device.directory.keepSpaceReserve()
        }
    }

    /// The class and exact size of an item, or nil; needs no key.
    /// Whether items of `group` sit below `folder` (named `folder/...`),
    /// which a mount shows as a folder (docs/FILESYSTEM.md, "Names with a
    /// /"). The device's own store: a mount is always served by it.
    package func holdsItems(below folder: String, inGroup group: String) throws(KeychainError) -> Bool {
        try ItemLimits.validate(name: group)
        try ItemLimits.validate(identifier: folder)
        return try localDevice.store.holdsItems(below: folder, inGroup: group)
    }

    public func info(forIdentifier identifier: String, inGroup group: String? = nil) throws(KeychainError) -> ItemInfo?
    {
        let group = group ?? ItemLimits.defaultGroup
        try ItemLimits.validate(name: group)
        try ItemLimits.validate(identifier: identifier)
        guard case .local(let device) = backend else {
            do {
                return try remote.info(group: group, identifier: identifier)
            } catch .itemNotFound {
                return nil
            }
        }
        return try device.store.info(group: group, identifier: identifier)
    }

    /// Re-encrypts an item under another class. Needs both class keys.
    public func setProtectionClass(
        _ protectionClass: ProtectionClass, forIdentifier identifier: String,
        inGroup group: String? = nil
    ) throws(KeychainError) {
        let group = group ?? ItemLimits.defaultGroup
        try ItemLimits.validate(name: group)
        try ItemLimits.validate(identifier: identifier)
        guard case .local(let device) = backend else {
            try remote.setClass(group: group, identifier: identifier, protectionClass: protectionClass)
            return
        }
        let newKey = try device.classKey(protectionClass)
        try device.store.write(group: group, identifier: identifier) { existing, generation throws(KeychainError) in
            // Opened inside the transaction, so no concurrent write slips between.
            guard let current = existing else { throw .itemNotFound }
            let value = try ItemCipher.open(current, key: try device.classKey(current.protectionClass))
            return ItemCipher.seal(
                value, group: group, identifier: identifier, protectionClass: protectionClass,
                generation: generation, key: newKey,
                details: try Self.details(of: current, replacedBy: nil, touched: false, on: device))
        }
        forget(group: group, identifier: identifier)
    }

    /// Renames an item within its group. Needs its class key (the identifier
    /// is bound into the ciphertext). Replaces an existing target only when
    /// `replacing` is true (as rename(2)); otherwise ``KeychainError/duplicateItem``.
    public func renameKey(
        forIdentifier identifier: String, to newIdentifier: String, inGroup group: String? = nil,
        replacing: Bool = false
    ) throws(KeychainError) {
        let group = group ?? ItemLimits.defaultGroup
        try ItemLimits.validate(name: group)
        try ItemLimits.validate(identifier: identifier)
        try ItemLimits.validate(identifier: newIdentifier)
        guard case .local(let device) = backend else {
            try remote.rename(group: group, from: identifier, to: newIdentifier, replacing: replacing)
            return
        }
        try device.store.rename(group: group, from: identifier, to: newIdentifier, replacing: replacing) {
            old, generation throws(KeychainError) in
            let key = try device.classKey(old.protectionClass)
            let value = try ItemCipher.open(old, key: key)
            return ItemCipher.seal(
                value, group: group, identifier: newIdentifier, protectionClass: old.protectionClass,
                generation: generation, key: key,
                details: try Self.details(of: old, replacedBy: nil, touched: false, on: device))
        }
        forget(group: group, identifier: identifier)
        forget(group: group, identifier: newIdentifier)
    }

    // MARK: Details (no key needed)

    /// The details of an item (nil: it has none), as the Secret Service
    /// stored them; ``KeychainError/itemNotFound`` when there is no item.
    public func details(forIdentifier identifier: String, inGroup group: String? = nil) throws(KeychainError)
        -> ItemDetails?
    {
        let group = group ?? ItemLimits.defaultGroup
        try ItemLimits.validate(name: group)
        try ItemLimits.validate(identifier: identifier)
        guard case .local(let device) = backend else {
            return try remote.details(group: group, identifier: identifier).first?.details
        }
        guard let row = try device.store.item(group: group, identifier: identifier) else { throw .itemNotFound }
        return try ItemCipher.openDetails(row, key: device.secret.detailsKey)
    }

    /// Replaces an item's details; its value stays as it is. Needs the key
    /// of its class (the value is sealed again with the row).
    public func setDetails(_ details: ItemDetails, forIdentifier identifier: String, inGroup group: String? = nil)
        throws(KeychainError)
    {
        let group = group ?? ItemLimits.defaultGroup
        try ItemLimits.validate(name: group)
        try ItemLimits.validate(identifier: identifier)
        try details.validate()
        guard case .local(let device) = backend else {
            try remote.setDetails(group: group, identifier: identifier, details: details)
            return
        }
        try device.store.write(group: group, identifier: identifier) { existing, generation throws(KeychainError) in
            guard let current = existing else { throw .itemNotFound }
            let key = try device.classKey(current.protectionClass)
            return ItemCipher.seal(
                try ItemCipher.open(current, key: key), group: group, identifier: identifier,
                protectionClass: current.protectionClass, generation: generation, key: key,
                details: try Self.details(of: current, replacedBy: details, touched: true, on: device))
        }
        forget(group: group, identifier: identifier)
    }

    /// Adds `program` to the access list of an item that has an owner (the
    /// person's "Always allow" at a Secret Service prompt): it reads and
    /// changes the item over the bus from then on without being asked. A
    /// program already on the list is replaced (its new digest); the
    /// owner, or an item without one, is left as it is. Local only: the
    /// provider that asked the person is in the device's process.
    public func allow(_ program: ProgramClaim, forIdentifier identifier: String, inGroup group: String? = nil)
        throws(KeychainError)
    {
        _ = try changeAccess(forIdentifier: identifier, inGroup: group) { (details, owner) -> Int in
            guard
                !owner.admits(
                    ProgramIdentity(program: program.program, digest: program.digest, unit: nil, uid: 0))
            else { return 0 }
            // The same program again (a new build, a new digest); an interpreter's other scripts stay.
            details.allowed.removeAll {
                $0.program.sameBytes(program.program)
                    && EntitlementRule.sameBytes($0.script?.path, program.script?.path)
            }
            details.allowed.append(program)
            if details.allowed.count > ItemDetails.maximumAllowed { details.allowed.removeFirst() }
            return 1
        }
    }

    /// Takes every program at `executable` off an item's access list;
    /// returns how many (``KeychainError/itemNotFound`` when none was on it).
    @discardableResult
    public func disallow(executable: String, forIdentifier identifier: String, inGroup group: String? = nil)
        throws(KeychainError) -> Int
    {
        try changeAccess(forIdentifier: identifier, inGroup: group) { (details, _) throws(KeychainError) -> Int in
            let before = details.allowed.count
            details.allowed.removeAll { EntitlementRule.sameBytes($0.program.encoded, executable) }
            guard details.allowed.count < before else { throw .itemNotFound }
            return before - details.allowed.count
        }
    }

    /// Makes an item that belongs to no program `program`'s (its details
    /// made for it when it has none): ``KeychainError/badRequest`` when it
    /// has an owner. Local only, as ``allow(_:forIdentifier:inGroup:)``.
    public func claim(_ identifier: String, inGroup group: String? = nil, for program: ProgramClaim)
        throws(KeychainError)
    {
        try resealDetails(forIdentifier: identifier, inGroup: group) { (found) throws(KeychainError) in
            var details = found ?? ItemDetails(label: identifier, attributes: [:])
            guard details.owner == nil else { throw .badRequest }
            details.owner = program
            details.allowed = []
            return details
        }
    }

    /// Changes the access list of an item with an owner (``KeychainError/badRequest``
    /// for one without), sealed again with its row.
    private func changeAccess(
        forIdentifier identifier: String, inGroup group: String?,
        _ change: (inout ItemDetails, ProgramClaim) throws(KeychainError) -> Int
    ) throws(KeychainError) -> Int {
        var count = 0
        try resealDetails(forIdentifier: identifier, inGroup: group) { (found) throws(KeychainError) in
            guard var details = found, let owner = details.owner else { throw .badRequest }
            count = try change(&details, owner)
            return details
        }
        return count
    }

    /// Seals an item again with the details `change` makes of the ones it
    /// has (nil: none); its value and class stay. Local only: owners and
    /// access lists are never set through the socket.
    private func resealDetails(
        forIdentifier identifier: String, inGroup group: String?,
        _ change: (ItemDetails?) throws(KeychainError) -> ItemDetails
    ) throws(KeychainError) {
        let group = group ?? ItemLimits.defaultGroup
        guard case .local(let device) = backend else { throw .badRequest }
        try device.store.write(group: group, identifier: identifier) { existing, generation throws(KeychainError) in
            guard let current = existing else { throw .itemNotFound }
            let detailsKey = device.secret.detailsKey
            let details = try change(try ItemCipher.openDetails(current, key: detailsKey))
            let key = try device.classKey(current.protectionClass)
            return ItemCipher.seal(
                try ItemCipher.open(current, key: key), group: group, identifier: identifier,
                protectionClass: current.protectionClass, generation: generation, key: key,
                details: (details, detailsKey))
        }
        forget(group: group, identifier: identifier)
    }

    /// Every item of `group` that has details, with them, sorted by identifier.
    public func itemsWithDetails(inGroup group: String) throws(KeychainError) -> [(
        identifier: String, details: ItemDetails
    )] {
        try ItemLimits.validate(name: group)
        guard case .local(let device) = backend else {
            return try remote.details(group: group, identifier: nil)
        }
        guard try device.store.groupExists(group) else { throw .itemNotFound }
        var found: [(identifier: String, details: ItemDetails)] = []
        for row in try device.store.rowsWithDetails(group: group) {
            if let details = try ItemCipher.openDetails(row, key: device.secret.detailsKey) {
                found.append((row.identifier, details))
            }
        }
        return found
    }

    // MARK: Groups and listing (no key needed)

    /// The access groups, sorted; `default` always among them.
    public func groups() throws(KeychainError) -> [String] {
        switch backend {
        case .local(let device): return try device.store.groups()
        case .remote(let remote): return try remote.groups()
        }
    }

    /// The identifiers in a group, sorted. Works while locked.
    public func identifiers(inGroup group: String? = nil) throws(KeychainError) -> [String] {
        try items(inGroup: group).map(\.identifier)
    }

    /// The identifiers of a group with their class and size. Works while locked.
    public func items(inGroup group: String? = nil) throws(KeychainError) -> [(identifier: String, info: ItemInfo)] {
        let group = group ?? ItemLimits.defaultGroup
        try ItemLimits.validate(name: group)
        guard case .local(let device) = backend else {
            return try remote.items(inGroup: group)
        }
        return try device.store.list(group: group)
    }

    /// Whether a group exists.
    public func groupExists(_ group: String) throws(KeychainError) -> Bool {
        try ItemLimits.validate(name: group)
        guard case .local(let device) = backend else { return try groups().contains(group) }
        return try device.store.groupExists(group)
    }

    /// Creates an empty group; ``KeychainError/duplicateItem`` if it exists.
    public func createGroup(_ group: String) throws(KeychainError) {
        try ItemLimits.validate(name: group)
        switch backend {
        case .local(let device): try device.store.createGroup(group)
        case .remote(let remote): try remote.createGroup(group)
        }
    }

    /// Removes an empty group: ``KeychainError/badRequest`` if it holds items,
    /// ``KeychainError/param`` for `default`, which always exists.
    public func removeGroup(_ group: String) throws(KeychainError) {
        try ItemLimits.validate(name: group)
        guard group != ItemLimits.defaultGroup else { throw .param }
        switch backend {
        case .local(let device): try device.store.removeGroup(group)
        case .remote(let remote): try remote.removeGroup(group)
        }
    }

    // MARK: Cache

    /// Wipes the cache of the last access (UYLPasswordManager's `purge`).
    public func purge() {
        let dropped = cache.withLock { entry -> CacheEntry? in
            defer { entry = nil }
            return entry
        }
        _ = dropped  // released (and wiped) here, outside the lock
    }

    /// What iOS does when the app goes to the background: purge the cache.
    public func background() {
        purge()
    }

    /// Whether the cache holds a value (for tests and the status report).
    public var isCacheEmpty: Bool { cache.withLock { $0 == nil } }

    private func remember(
        _ value: SecureBytes, group: String, identifier: String,
        protectionClass: ProtectionClass, epoch: UInt64, details: ItemDetails??
    ) {
        guard case .local(let device) = backend else { return }
        cache.withLock { entry in
            // A lock that happened while we decrypted must not be outlived by the plaintext.
            guard device.lockEpoch == epoch else { entry = nil; return }
            entry = CacheEntry(
                group: group, identifier: identifier, value: value,
                protectionClass: protectionClass, epoch: epoch, details: details,
                serial: cacheSerial.add(1, ordering: .relaxed).newValue)
        }
    }

    /// The details of an item as the owner rule reads them at every door:
    /// from the cache of the last access when it knows them (a `cat` read
    /// again costs no query), else from the store, noted in that cache.
    func detailsForConsent(_ identifier: String, inGroup group: String) throws(KeychainError) -> ItemDetails? {
        let (known, serial) = cache.withLock { entry -> (ItemDetails??, UInt64?) in
            guard let entry, entry.group == group, entry.identifier == identifier else { return (nil, nil) }
            return (entry.details, entry.serial)
        }
        if let known { return known }
        let details = try self.details(forIdentifier: identifier, inGroup: group)
        cache.withLock { entry in
            // Only the very entry seen before the read: a change meanwhile replaced or dropped it (`forget`).
            if let serial, entry?.serial == serial { entry?.details = .some(details) }
        }
        return details
    }

    /// Drops what the cache knows of an item's details (the value stays:
    /// a change of the value itself goes through ``forget(group:identifier:)``).
    private func forgetDetails(group: String, identifier: String) {
        cache.withLock { entry in
            if entry?.group == group && entry?.identifier == identifier {
                entry?.details = nil
                entry?.serial = cacheSerial.add(1, ordering: .relaxed).newValue
            }
        }
    }

    func forget(group: String, identifier: String) {
        cache.withLock { entry in
            if entry?.group == group && entry?.identifier == identifier { entry = nil }
        }
    }

    /// Makes every acknowledged write durable against power loss (the filesystem's fsync).
    public func sync() throws(KeychainError) {
        switch backend {
        case .local(let device): try device.sync()
        case .remote(let remote): try remote.sync()
        }
    }

    /// The connection of a client manager; only reached after the backend was found remote.
    private var remote: any RemoteKeychain {
        guard case .remote(let remote) = backend else { preconditionFailure("not a client of a running device") }
        return remote
    }
}
