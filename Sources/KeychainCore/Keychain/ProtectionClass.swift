/// When an item may be read or written, as iOS's kSecAttrAccessible values.
public enum ProtectionClass: Int64, CaseIterable, Sendable, CustomStringConvertible {
    case whenUnlocked = 1
    case afterFirstUnlock = 2
    case always = 3
    case whenUnlockedThisDeviceOnly = 4
    case afterFirstUnlockThisDeviceOnly = 5
    case alwaysThisDeviceOnly = 6

    /// The class for an access mode, in its `ThisDeviceOnly` form when not migratable.
    public init(mode: AccessMode, migratable: Bool) {
        switch (mode, migratable) {
        case (.whenUnlocked, true): self = .whenUnlocked
        case (.afterFirstUnlock, true): self = .afterFirstUnlock
        case (.always, true): self = .always
        case (.whenUnlocked, false): self = .whenUnlockedThisDeviceOnly
        case (.afterFirstUnlock, false): self = .afterFirstUnlockThisDeviceOnly
        case (.always, false): self = .alwaysThisDeviceOnly
        }
    }

    /// Parses the full class name (`alwaysThisDeviceOnly`); nil for anything else.
    public init?(name: String) {
        guard let match = Self.allCases.first(where: { $0.name == name }) else { return nil }
        self = match
    }

    /// When the class key is available, regardless of migration.
    public var mode: AccessMode {
        switch self {
        case .whenUnlocked, .whenUnlockedThisDeviceOnly: return .whenUnlocked
        case .afterFirstUnlock, .afterFirstUnlockThisDeviceOnly: return .afterFirstUnlock
        case .always, .alwaysThisDeviceOnly: return .always
        }
    }

    /// Whether the item may leave this device in a backup.
    public var isMigratable: Bool { rawValue <= 3 }

    /// The full name, as in `user.keychain.accessible`.
    public var name: String {
        switch self {
        case .whenUnlocked: return "whenUnlocked"
        case .afterFirstUnlock: return "afterFirstUnlock"
        case .always: return "always"
        case .whenUnlockedThisDeviceOnly: return "whenUnlockedThisDeviceOnly"
        case .afterFirstUnlockThisDeviceOnly: return "afterFirstUnlockThisDeviceOnly"
        case .alwaysThisDeviceOnly: return "alwaysThisDeviceOnly"
        }
    }

    /// The full name.
    public var description: String { name }
}

/// The availability part of a protection class (UYLPasswordManager's accessMode).
public enum AccessMode: String, CaseIterable, Sendable {
    case whenUnlocked
    case afterFirstUnlock
    case always
}

/// Rules for group names, identifiers and values.
public enum ItemLimits {
    /// The largest value: 1 MiB.
    public static let maximumValueSize = 1 << 20
    /// The longest name in bytes of UTF-8 (NAME_MAX).
    public static let maximumNameLength = 255
    /// The group of items written with no group.
    public static let defaultGroup = "default"
    /// Names the filesystem reserves at the root of a mount.
    public static let reservedNames: Set<String> = [".", "..", ".control", ".events"]

    /// Throws ``KeychainError/param`` or ``KeychainError/nameTooLong`` unless
    /// `name` can be a group or an identifier: non-empty UTF-8 without `/`
    /// or control characters (C0, DEL, C1: a name is printed in listings and
    /// status lines, where a newline could forge a line), in Unicode
    /// Normalization Form C, at most 255 bytes, not one of ``reservedNames``.
    ///
    /// NFC because Swift compares strings by canonical equivalence, SQLite
    /// and the kernel by bytes: `café` spelled with U+00E9 and with
    /// `e` + U+0301 are one `String` key but two rows and two directory
    /// entries, so every name-keyed table in the device (inodes, known rows,
    /// access policies) would confuse them, and a listing would show two
    /// names that look alike. Two different NFC strings are never
    /// canonically equivalent: requiring NFC makes both comparisons agree.
    /// `legacy` skips that rule, for records written before it (docs/FILESYSTEM.md).
    public static func validate(name: String, legacy: Bool = false) throws(KeychainError) {
        // One pass over the bytes: this runs several times per filesystem request.
        let count = name.utf8.count
        guard count > 0 else { throw .param }
        let bytes = name.utf8.withContiguousStorageIfAvailable(scanName) ?? scanName(Array(name.utf8))
        // Every reserved name starts with a dot: one byte decides for most names.
        let reserved = count <= 8 && name.utf8.first == UInt8(ascii: ".") && reservedNames.contains(name)
        guard bytes.clean, !reserved else { throw .param }
        guard bytes.ascii || legacy || isNFC(name) else { throw .param }
        guard count <= maximumNameLength else { throw .nameTooLong }
    }

    /// Throws unless `identifier` can name an item: a name, or names joined
    /// by `/` (pass's `work/imap`), which a mount shows as folders in the
    /// group (docs/FILESYSTEM.md, "Names with a /"): every part a name by
    /// ``validate(name:legacy:)`` (so none empty, `.` or `..`), the whole
    /// at most 255 bytes.
    public static func validate(identifier: String, legacy: Bool = false) throws(KeychainError) {
        guard identifier.utf8.contains(UInt8(ascii: "/")) else { return try validate(name: identifier, legacy: legacy) }
        guard identifier.utf8.count <= maximumNameLength else { throw .nameTooLong }
        for part in identifier.split(separator: "/", omittingEmptySubsequences: false) {
            try validate(name: String(part), legacy: legacy)
        }
    }

    /// The folders an identifier sits in: `a` and `a/b` for `a/b/c`.
    public static func folders(of identifier: String) -> [String] {
        var folders: [String] = []
        var index = identifier.startIndex
        while let slash = identifier[index...].firstIndex(of: "/") {
            folders.append(String(identifier[..<slash]))
            index = identifier.index(after: slash)
        }
        return folders
    }

    /// Why ``validate(identifier:legacy:)`` refuses `identifier`, said as
    /// ``problem(with:)`` says it of the part that is wrong.
    public static func problem(withIdentifier identifier: String) -> String? {
        guard (try? validate(identifier: identifier)) == nil else { return nil }
        guard identifier.utf8.contains(UInt8(ascii: "/")) else { return problem(with: identifier) }
        if identifier.utf8.count > maximumNameLength {
            return "it is \(identifier.utf8.count) bytes long; a name holds at most \(maximumNameLength) bytes of UTF-8"
        }
        for part in identifier.split(separator: "/", omittingEmptySubsequences: false) {
            if let problem = problem(with: String(part)) { return "a part of it, \"\(part)\": " + problem }
        }
        return "it is not valid"
    }

    /// Why ``validate(name:legacy:)`` refuses `name`, in words a person can
    /// act on (which character, which limit); nil when it does not.
    public static func problem(with name: String) -> String? {
        do throws(KeychainError) {
            try validate(name: name)
            return nil
        } catch {
            if name.isEmpty { return "it is empty" }
            if error == .nameTooLong {
                return "it is \(name.utf8.count) bytes long; a name holds at most \(maximumNameLength) bytes of UTF-8"
            }
            if reservedNames.contains(name) {
                return "\(name) is reserved (\(reservedNames.sorted().joined(separator: " ")))"
            }
            for scalar in name.unicodeScalars
            where scalar == "/" || scalar.value < 0x20 || (0x7f...0x9f).contains(scalar.value) {
                let hex = String(scalar.value, radix: 16, uppercase: true)
                let code = "U+" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
                return scalar == "/"
                    ? "a name holds no / (groups are not nested)" : "it holds the control character \(code)"
            }
            return "it is not in Unicode's composed form (NFC): type it composed (é as one character, U+00E9)"
        }
    }

    /// Whether the name's bytes are its NFC form (ASCII always is).
    /// `_withNFCCodeUnits` is the standard library's own normalizer, the
    /// one `==` uses; it streams, so the check allocates nothing.
    static func isNFC(_ name: String) -> Bool {
        var bytes = name.utf8.makeIterator()
        var same = true
        name._withNFCCodeUnits { unit in
            if same, bytes.next() != unit { same = false }
        }
        return same && bytes.next() == nil
    }

    /// A valid item name made from `text` (a Secret Service label): in
    /// NFC, `/` and control characters as `_`, cut to 255 bytes at a
    /// character's end; nil when nothing valid is left (empty, or a
    /// reserved name).
    public static func name(from text: String) -> String? {
        var units: [UInt8] = []
        text._withNFCCodeUnits { units.append($0) }
        var name = ""
        for character in String(decoding: units, as: UTF8.self) {
            let cleaned =
                character.unicodeScalars.contains { $0.value < 0x20 || (0x7f...0x9f).contains($0.value) || $0 == "/" }
                ? "_" : String(character)
            guard name.utf8.count + cleaned.utf8.count <= maximumNameLength else { break }
            name += cleaned
        }
        return (try? validate(name: name)) == nil ? nil : name
    }

    /// `base`, then `base (2)` to `base (1000)`, each cut to fit a name:
    /// the names to try, in turn, for a new item named after a label.
    public static func candidateNames(_ base: String) -> some Sequence<String> {
        (1...1000).lazy.map { number in
            guard number > 1 else { return base }
            let suffix = " (\(number))"
            var stem = base
            while stem.utf8.count + suffix.utf8.count > maximumNameLength { stem.removeLast() }
            return stem + suffix
        }
    }

    /// `clean`: no `/`, no C0 control (NUL included), no DEL, no C1 control
    /// (U+0080...U+009F, UTF-8 `C2 80`...`C2 9F`). `ascii`: no byte above 0x7F.
    private static func scanName<C: RandomAccessCollection>(_ bytes: C) -> (clean: Bool, ascii: Bool)
    where C.Element == UInt8 {
        var previous: UInt8 = 0
        var high: UInt8 = 0
        for byte in bytes {
            if byte < 0x20 || byte == 0x7f || byte == UInt8(ascii: "/") { return (false, false) }
            if previous == 0xc2 && (0x80...0x9f).contains(byte) { return (false, false) }
            high |= byte
            previous = byte
        }
        return (true, high < 0x80)
    }
}
