import ArgumentParser
import KeychainCore
import SecretService
#if canImport(Glibc)
import Glibc
#endif

struct ImportCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import",
        abstract: "Move in from another password manager.",
        subcommands: [ImportPassCommand.self, ImportSecretServiceCommand.self])
}

struct ImportPassCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pass",
        abstract: "Import every entry of a pass password store (decrypted by gpg).",
        discussion: """
            An entry DIR/NAME becomes the item DIR/NAME: its first directory is the group, the rest \
            the identifier (email/work/imap is the item work/imap of email, in the folder work of a \
            mount); an entry at the top goes to the group default. With \
            --group every entry goes to that group, its whole path the identifier. A one-line entry \
            is stored without its final newline (the password as pass -c copies it); a longer one \
            whole, so otp and the extra lines keep working. Nothing is overwritten unless --force: an \
            existing item is kept and reported. Each entry is reported on a line (imported, kept, \
            failed). Exit 0 when every entry was imported or kept, 1 when one failed, 3 when the \
            keychain is locked (nothing is decrypted then).
            """)

    @Argument(help: "The password store (default: $PASSWORD_STORE_DIR, else ~/.password-store).")
    var directory: String?

    @Option(help: "Put every entry in this group, its path as the identifier.")
    var group: String?

    @Flag(help: "Replace items that exist.")
    var force = false

    @Flag(name: .customLong("dry-run"), help: "Report the names only; decrypt and store nothing.")
    var dryRun = false

    @OptionGroup var options: KeychainOptions

    func validate() throws { try validateGroupName(group) }

    func run() throws {
        let store = try storeDirectory()
        let entries = PassStore.entries(in: store)
        guard !entries.isEmpty else { throw fail("no entries (*.gpg) in \(store)", status: ExitStatus.absent) }
        var counts = (imported: 0, kept: 0, failed: 0)
        if dryRun {
            for entry in entries {
                let report =
                    PassStore.address(of: entry, group: group).map { "\(shown(entry)) -> \($0)" }
                    ?? "\(shown(entry)): no item name fits"
                print(report)
            }
            return
        }
        guard let gpg = findOnPath("gpg") else { throw fail("gpg is not installed (apt install gnupg)") }
        let device = try RunningDevice(options.place)
        // Locked: say so before decrypting anything (a status request starts the device if need be).
        if try device.isLocked() { throw fail("the keychain is locked; unlock it first", status: ExitStatus.locked) }
        for entry in entries {
            guard let item = PassStore.address(of: entry, group: group) else {
                print("failed   \(shown(entry)): no item name fits (a name of at most 255 bytes, NFC)")
                counts.failed += 1
                continue
            }
            let value: SecureBytes
            switch PassStore.decrypt(store + "/" + entry + ".gpg", with: gpg) {
            case .success(let decrypted): value = decrypted
            case .failure(let problem):
                print("failed   \(shown(entry)): \(problem)")
                counts.failed += 1
                continue
            }
            switch try device.tryStore(PassStore.storedValue(value), at: item, condition: force ? .always : .ifAbsent) {
            case nil:
                print("imported \(shown(entry)) -> \(item)")
                counts.imported += 1
            case .duplicateItem?:
                print("kept     \(shown(entry)) -> \(item) (it exists; --force replaces it)")
                counts.kept += 1
            case .interactionNotAllowed?:
                throw fail(
                    "the keychain locked during the import; \(counts.imported) imported before",
                    status: ExitStatus.locked)
            case let error?:
                print("failed   \(shown(entry)) -> \(item): \(error)")
                counts.failed += 1
            }
        }
        // Every item line before the summary, where both go to one place.
        fflush(nil)
        printError("\(counts.imported) imported, \(counts.kept) kept, \(counts.failed) failed")
        if counts.failed > 0 { throw ExitStatus.failure }
    }

    private func storeDirectory() throws -> String {
        if let directory { return absolutePath(directory) }
        if let chosen = getenv("PASSWORD_STORE_DIR").map({ String(cString: $0) }), !chosen.isEmpty {
            return absolutePath(chosen)
        }
        guard let home = getenv("HOME").map({ String(cString: $0) }) else {
            throw fail("HOME is not set; name the store")
        }
        return home + "/.password-store"
    }
}

/// A pass password store: its entries, their item names, their values.
enum PassStore {
    /// The entries (paths below the store without `.gpg`), sorted; hidden
    /// files and directories (.git, .gpg-id, .extensions) and symbolic links are not entries.
    static func entries(in store: String, below relative: String = "") -> [String] {
        guard let directory = opendir(relative.isEmpty ? store : store + "/" + relative) else { return [] }
        defer { closedir(directory) }
        var found: [String] = []
        while let entry = readdir(directory) {
            let name = entry.name
            guard !name.hasPrefix(".") else { continue }
            let path = relative.isEmpty ? name : relative + "/" + name
            var info = stat()
            guard lstat(store + "/" + path, &info) == 0 else { continue }
            switch info.st_mode & S_IFMT {
            case S_IFDIR: found += entries(in: store, below: path)
            case S_IFREG where name.hasSuffix(".gpg") && name.count > 4: found.append(String(path.dropLast(4)))
            default: continue
            }
        }
        return found.sorted()
    }

    /// The item an entry becomes (nil when no valid name fits): the first
    /// directory is the group (top-level entries: `default`), the rest the
    /// identifier; with `group`, the whole path is the identifier.
    static func address(of entry: String, group: String?) -> ItemAddress? {
        // Each part a name; a deeper / stays one, a folder of the group (docs/FILESYSTEM.md, "Names with a /").
        let parts = entry.split(separator: "/").map { ItemName.encoded(String($0)) }
        guard let last = parts.last else { return nil }
        let (groupName, identifier): (String, String)
        if let group {
            (groupName, identifier) = (group, parts.joined(separator: "/"))
        } else if parts.count == 1 {
            (groupName, identifier) = ("default", last)
        } else {
            (groupName, identifier) = (parts[0], parts.dropFirst().joined(separator: "/"))
        }
        guard (try? ItemLimits.validate(name: groupName)) != nil,
            (try? ItemLimits.validate(identifier: identifier)) != nil
        else { return nil }
        return ItemAddress(group: groupName, identifier: identifier)
    }

    /// pass keeps `password\n` for a one-line entry: the password is the line.
    static func storedValue(_ decrypted: SecureBytes) throws -> SecureBytes {
        let oneLine = decrypted.withUnsafeBytes { bytes in
            bytes.last == UInt8(ascii: "\n") && bytes.dropLast().firstIndex(of: UInt8(ascii: "\n")) == nil
        }
        guard oneLine else { return decrypted }
        return try decrypted.withUnsafeBytes {
            try SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0.dropLast()))
        }
    }

    /// The plaintext of one entry, from gpg's stdout (a pipe) into secret
    /// memory; gpg's own messages and pinentry go to the terminal as usual.
    static func decrypt(_ file: String, with gpg: String) -> Result<SecureBytes, DecryptionProblem> {
        guard
            let piped = startWithPipe([gpg, "--quiet", "--yes", "--decrypt", file], on: 1, keepingStandardError: true)
        else {
            return .failure(DecryptionProblem("gpg could not be started"))
        }
        let decrypted = Result { () throws(SecretInputError) in try readSecret(from: piped.end.borrowed) }
        let child = piped.pid
        _ = piped.end.close()
        let status = Spawn.wait(child)
        guard status == 0 else { return .failure(DecryptionProblem("gpg could not decrypt it (status \(status))")) }
        switch decrypted {
        case .success(let value): return .success(value)
        case .failure(.tooLarge): return .failure(DecryptionProblem("larger than an item's 1 MiB"))
        case .failure(.read(let error)): return .failure(DecryptionProblem("reading gpg's output: \(error)"))
        }
    }

    struct DecryptionProblem: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }
}

struct ImportSecretServiceCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "secret-service",
        abstract: "Import every item of the Secret Service on this session bus (gnome-keyring, KWallet, KeePassXC).",
        discussion: """
            The default collection (gnome-keyring's login keyring) becomes the group default, another \
            collection the group named after its label; with --group every item goes to that group. An \
            item becomes an item named after its label (a name in use gets " (2)", " (3)"...) that keeps \
            its label, attributes, content type and times, so the programs that stored it find it again \
            once keychainfs serves the bus (stop gnome-keyring's secrets component, then keychainfs \
            start --secret-service). An item whose \
            group holds one with the same label and attributes is kept, not imported again, unless \
            --force replaces its value. Secrets cross the bus encrypted (a DH session). A locked \
            collection is skipped and reported: unlock it in its provider first. Each item is reported \
            on a line (imported, kept, failed). Exit 0 when every item was imported or kept, 1 when one \
            failed or a collection was locked, 3 when the keychain is locked (nothing is read then).
            """)

    @Option(help: "Put every item in this group.")
    var group: String?

    @Flag(help: "Replace the value of an item that was imported before.")
    var force = false

    @Flag(name: .customLong("dry-run"), help: "Report the names only; read no secret and store nothing.")
    var dryRun = false

    @OptionGroup var options: KeychainOptions

    func validate() throws { try validateGroupName(group) }

    func run() throws {
        let source: ForeignSecretService
        do { source = try ForeignSecretService() } catch { throw fail(error.message) }
        let device = try RunningDevice(options.place)
        if !dryRun, try device.isLocked() {
            throw fail("the keychain is locked; unlock it first", status: ExitStatus.locked)
        }
        var counts = (imported: 0, kept: 0, failed: 0)
        do {
            for collection in try source.collections() {
                guard
                    let target = group
                        ?? (collection.isDefault ? ItemLimits.defaultGroup : ItemLimits.name(from: collection.label))
                else {
                    print("failed   \(shown(collection.label)): no group name fits its label (--group names one)")
                    counts.failed += 1
                    continue
                }
                guard !collection.isLocked else {
                    print("failed   \(shown(collection.label)): locked (unlock it in its provider first)")
                    counts.failed += 1
                    continue
                }
                let (items, refused) = try source.items(of: collection)
                for name in refused {
                    print(
                        "failed   \(shown(collection.label))/\(shown(name)): its attributes or label are past keychainfs's bounds"
                    )
                    counts.failed += 1
                }
                var existing = try device.itemsWithDetails(of: target)
                for item in items {
                    let from = "\(collection.label)/\(item.details.label)"
                    let same = existing.first {
                        $0.details.label == item.details.label && $0.details.attributes == item.details.attributes
                    }
                    if let same, !force {
                        print(
                            "kept     \(shown(from)) -> \(target)/\(same.identifier) (imported before; --force replaces it)"
                        )
                        counts.kept += 1
                        continue
                    }
                    let base = same?.identifier ?? ItemLimits.name(from: item.details.label) ?? "item"
                    if dryRun {
                        print("import   \(shown(from)) -> \(target)/\(base)")
                        counts.imported += 1
                        continue
                    }
                    var details = item.details
                    let (value, contentType) = try source.secret(of: item)
                    details.contentType = contentType.isEmpty ? ItemDetails.defaultContentType : contentType
                    switch try store(
                        value, named: base, in: target, details: details, replacing: same != nil, on: device)
                    {
                    case .success(let identifier):
                        print("imported \(shown(from)) -> \(target)/\(identifier)")
                        counts.imported += 1
                        existing.append((identifier, details))
                    case .failure(let error):
                        print("failed   \(shown(from)) -> \(target)/\(base): \(error)")
                        counts.failed += 1
                    }
                }
            }
        } catch let error as BusError {
            throw fail("reading the Secret Service: \(error.message)")
        }
        // Every item line before the summary, where both go to one place.
        fflush(nil)
        guard !dryRun else {
            // Nothing was stored: say what would be, not "0 imported" after a list of imports.
            return printError("would import \(counts.imported), keep \(counts.kept) (a dry run: nothing was stored)")
        }
        printError("\(counts.imported) imported, \(counts.kept) kept, \(counts.failed) failed")
        if counts.imported > 0 {
            // Who made them is not known here (docs/SECRET-SERVICE.md, "Whose
            // an item is").
            printError(
                "imported items belong to no program: every program of yours reads them over the bus; "
                    + "`keychainfs acl GROUP/ID --claim PROGRAM` makes one a program's, as if it had made it")
        }
        if counts.failed > 0 { throw ExitStatus.failure }
    }

    /// Stores an item under `base` (replacing it), or the first free name
    /// of ``ItemLimits/candidateNames(_:)``; the name used.
    private func store(
        _ value: SecureBytes, named base: String, in group: String, details: ItemDetails, replacing: Bool,
        on device: RunningDevice
    ) throws -> Result<String, KeychainError> {
        for identifier in ItemLimits.candidateNames(base) {
            let item = ItemAddress(group: group, identifier: identifier)
            switch try device.tryStore(value, at: item, condition: replacing ? .always : .ifAbsent, details: details) {
            case nil: return .success(identifier)
            case .duplicateItem? where !replacing: continue
            case .interactionNotAllowed?: throw fail("the keychain locked during the import", status: ExitStatus.locked)
            case let error?: return .failure(error)
            }
        }
        return .failure(.duplicateItem)
    }
}
