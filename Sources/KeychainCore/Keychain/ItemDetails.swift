/// What the Secret Service keeps of an item beside its value: a label, the
/// content type and the lookup attributes by which programs find it again
/// (libsecret's `xdg:schema`, `service`, `username`...), with its creation
/// and modification times. Like an item's name these are not secrets: they
/// are readable while the device is locked (a search must find locked items,
/// as the spec wants), but they are stored sealed and bound to their row
/// (docs/FORMAT.md, "Item details"), so a copied disk does not show them in
/// the clear and a changed or swapped record fails to open.
public struct ItemDetails: Sendable, Equatable {
    /// What a person calls the item (the Secret Service's `Label`).
    public var label: String
    /// The value's MIME type (`text/plain` unless a program said otherwise).
    public var contentType: String
    /// The lookup attributes, as the program gave them.
    public var attributes: [String: String]
    /// Seconds since the epoch when the item was made over the bus.
    public var created: UInt64
    /// Seconds since the epoch when its value or details last changed.
    public var modified: UInt64
    /// The program that made the item over the bus (docs/SECRET-SERVICE.md,
    /// "Whose an item is"): it alone reads, changes and deletes it there
    /// without the person being asked. Nil for an item made through a mount or
    /// the command line.
    public var owner: ProgramClaim?
    /// The programs the person allowed besides its owner ("Always allow").
    public var allowed: [ProgramClaim] = []

    /// These details as an item of no program's: no owner, no access list.
    public var ownerless: ItemDetails {
        var details = self
        details.owner = nil
        details.allowed = []
        return details
    }

    /// Details to write; times of 0 are stamped by the device when it
    /// writes them (`created` then keeps the replaced item's, if it had one).
    public init(
        label: String, contentType: String = ItemDetails.defaultContentType, attributes: [String: String],
        created: UInt64 = 0, modified: UInt64 = 0
    ) {
        self.label = label
        self.contentType = contentType
        self.attributes = attributes
        self.created = created
        self.modified = modified
    }

    public static let defaultContentType = "text/plain"

    /// Bounds that keep one row small and every field printable in a
    /// listing: at most 64 attributes; a name 1-255 bytes, a value, label or
    /// content type at most 4,096 bytes; no control characters in names;
    /// 32 KiB in all.
    public static let maximumAttributes = 64
    public static let maximumAttributeName = 255
    public static let maximumText = 4096
    /// And 32 KiB for the whole record, so that a `set` with details fits
    /// in one frame of the device's protocol beside a 1 MiB value.
    public static let maximumEncodedSize = 32 << 10
    /// Programs an item's access list holds at most, besides its owner.
    public static let maximumAllowed = 16

    /// ``KeychainError/param`` unless every field is within the bounds.
    public func validate() throws(KeychainError) {
        // No NUL in any text: a D-Bus string cannot hold one, so the bus
        // would show a label written through a mount cut at it.
        guard attributes.count <= Self.maximumAttributes, allowed.count <= Self.maximumAllowed,
            label.utf8.count <= Self.maximumText, contentType.utf8.count <= Self.maximumText,
            !label.utf8.contains(0), !contentType.utf8.contains(0)
        else { throw .param }
        for claim in [owner].compactMap({ $0 }) + allowed {
            // A package or unit, when there is one, is 1-255 bytes: an
            // empty one would be a second encoding of none (reply fields
            // write none as "").
            guard claim.digest.count == ExecutableDigest.size,
                claim.program.isWellFormed, claim.program.encoded.utf8.count <= Self.maximumText,
                claim.package.map({ (1...Self.maximumAttributeName).contains($0.utf8.count) }) ?? true,
                claim.unit.map({ (1...Self.maximumAttributeName).contains($0.utf8.count) }) ?? true,
                claim.script.map({
                    $0.path.hasPrefix("/") && $0.path.utf8.count <= Self.maximumText
                        && $0.digest.count == ExecutableDigest.size
                }) ?? true
            else { throw .param }
        }
        for (name, value) in attributes {
            guard (1...Self.maximumAttributeName).contains(name.utf8.count), value.utf8.count <= Self.maximumText,
                !name.utf8.contains(where: { $0 < 0x20 || $0 == 0x7f }), !value.utf8.contains(0)
            else { throw .param }
        }
        guard encoded().count <= Self.maximumEncodedSize else { throw .param }
    }

    /// Whether every pair of `wanted` is among the attributes.
    public func matches(_ wanted: [String: String]) -> Bool {
        wanted.allSatisfy { attributes[$0.key] == $0.value }
    }

    // MARK: Encoding

    /// Byte order of UTF-8, as SQLite and the kernel compare names (Swift's
    /// `<` on strings compares canonical equivalents as equal).
    static func precedes(_ first: String, _ second: String) -> Bool {
        first.utf8.lexicographicallyPrecedes(second.utf8)
    }

    /// The details as fields of a device reply: label, content type,
    /// created, modified, the number of attributes, then name and value of
    /// each (``init(fields:)`` reads them back).
    package var fields: [String] {
        var fields = [label, contentType, String(created), String(modified), String(attributes.count)]
        for (name, value) in attributes.sorted(by: { Self.precedes($0.key, $1.key) }) { fields += [name, value] }
        fields.append(String((owner == nil ? 0 : 1) + allowed.count))
        if let owner { fields += Self.claimFields(owner, role: "owner") }
        for claim in allowed { fields += Self.claimFields(claim, role: "allowed") }
        return fields
    }

    /// A claim as reply fields: role, executable, digest (hex), package,
    /// unit, JIT (`1`, `0`, or "" when not recorded), script path and
    /// script digest (hex) ("" when none).
    private static func claimFields(_ claim: ProgramClaim, role: String) -> [String] {
        [
            role, claim.program.encoded, Hex.string(claim.digest), claim.package ?? "", claim.unit ?? "",
            claim.jit.map { $0 ? "1" : "0" } ?? "", claim.script?.path ?? "",
            claim.script.map { Hex.string($0.digest) } ?? ""
        ]
    }

    static let claimFieldCount = 8

    /// Reads ``fields`` from the front of `fields`, removing them; nil when
    /// they are not what ``fields`` makes.
    package init?(fields: inout ArraySlice<String>) {
        guard fields.count >= 5, let created = UInt64(fields[fields.startIndex + 2]),
            let modified = UInt64(fields[fields.startIndex + 3]), let count = Int(fields[fields.startIndex + 4]),
            (0...Self.maximumAttributes).contains(count), fields.count >= 5 + 2 * count
        else { return nil }
        label = fields[fields.startIndex]
        contentType = fields[fields.startIndex + 1]
        self.created = created
        self.modified = modified
        attributes = [:]
        fields = fields.dropFirst(5)
        for _ in 0..<count {
            attributes[fields[fields.startIndex]] = fields[fields.startIndex + 1]
            fields = fields.dropFirst(2)
        }
        guard let claims = fields.first.flatMap({ Int($0) }), (0...Self.maximumAllowed + 1).contains(claims),
            fields.count >= 1 + Self.claimFieldCount * claims
        else { return nil }
        fields = fields.dropFirst()
        for _ in 0..<claims {
            let part = Array(fields.prefix(Self.claimFieldCount))
            fields = fields.dropFirst(Self.claimFieldCount)
            guard let digest = Hex.bytes(part[2], count: ExecutableDigest.size), ["", "0", "1"].contains(part[5])
            else { return nil }
            var script: ProgramScript?
            if !part[6].isEmpty {
                guard let scriptDigest = Hex.bytes(part[7], count: ExecutableDigest.size) else { return nil }
                script = ProgramScript(path: part[6], digest: scriptDigest)
            } else if !part[7].isEmpty {
                return nil
            }
            guard let program = ProgramName(encoded: part[1]) else { return nil }
            let claim = ProgramClaim(
                program: program, digest: digest, package: part[3].isEmpty ? nil : part[3],
                unit: part[4].isEmpty ? nil : part[4], script: script, jit: part[5].isEmpty ? nil : part[5] == "1")
            switch part[0] {
            case "owner" where owner == nil: owner = claim
            case "allowed": allowed.append(claim)
            default: return nil
            }
        }
    }

    /// `version u8 = 1 | label | content type | created u64 | modified u64 |
    /// count u32 | (name | value)*` sorted by name, each string as
    /// `u16 LE length | UTF-8`: one encoding per value, so a record's bytes
    /// say exactly what it holds. Version 2, written only for an item with
    /// an owner or an access list, adds `| hasOwner u8 [| claim] |
    /// allowed u8 | claim*`, a claim being `executable | sha256[32] |
    /// hasPackage u8 [| package] | hasUnit u8 [| unit]`.
    /// Version 3, written only when a claim records a script
    /// or whether its program ran a JIT, adds to each claim `| flags u8
    /// [| script path | script sha256[32]]`: bit 0 the JIT, bit 1 "not
    /// recorded" (a claim from version 2), bit 2 a script follows
    /// (docs/FORMAT.md, "Item details").
    static let encodingVersion: UInt8 = 1
    static let ownedVersion: UInt8 = 2
    static let identifiedVersion: UInt8 = 3

    package func encoded() -> [UInt8] {
        var writer = ByteWriter()
        let owned = owner != nil || !allowed.isEmpty
        let identified = claimsSayMore
        writer.append(identified ? Self.identifiedVersion : owned ? Self.ownedVersion : Self.encodingVersion)
        writer.appendPrefixed(label)
        writer.appendPrefixed(contentType)
        writer.append(created)
        writer.append(modified)
        writer.append(UInt32(attributes.count))
        for (name, value) in attributes.sorted(by: { Self.precedes($0.key, $1.key) }) {
            writer.appendPrefixed(name)
            writer.appendPrefixed(value)
        }
        if owned {
            writer.append(UInt8(owner == nil ? 0 : 1))
            if let owner { Self.append(owner, to: &writer, identified: identified) }
            writer.append(UInt8(allowed.count))
            for claim in allowed { Self.append(claim, to: &writer, identified: identified) }
        }
        return writer.bytes
    }

    /// Whether a claim records what version 2 cannot: a script, or whether its program ran a JIT.
    private var claimsSayMore: Bool {
        ([owner].compactMap { $0 } + allowed).contains { $0.jit != nil || $0.script != nil }
    }

    private static let jitFlag: UInt8 = 1
    private static let jitUnknownFlag: UInt8 = 2
    private static let scriptFlag: UInt8 = 4

    private static func append(_ claim: ProgramClaim, to writer: inout ByteWriter, identified: Bool) {
        writer.appendPrefixed(claim.program.encoded)
        writer.append(claim.digest)
        writer.append(UInt8(claim.package == nil ? 0 : 1))
        if let package = claim.package { writer.appendPrefixed(package) }
        writer.append(UInt8(claim.unit == nil ? 0 : 1))
        if let unit = claim.unit { writer.appendPrefixed(unit) }
        guard identified else { return }
        let jit = claim.jit.map { $0 ? jitFlag : 0 } ?? jitUnknownFlag
        writer.append(jit | (claim.script == nil ? 0 : scriptFlag))
        if let script = claim.script {
            writer.appendPrefixed(script.path)
            writer.append(script.digest)
        }
    }

    private static func readClaim(
        _ reader: inout ByteReader<[UInt8]>, identified: Bool, malformed: KeychainError
    ) throws(KeychainError) -> ProgramClaim {
        guard let program = ProgramName(encoded: try reader.readPrefixed()) else { throw malformed }
        let digest = try reader.read(ExecutableDigest.size)
        func optional(_ reader: inout ByteReader<[UInt8]>) throws(KeychainError) -> String? {
            switch try reader.readByte() {
            case 0: return nil
            case 1: return try reader.readPrefixed()
            default: throw malformed
            }
        }
        let package = try optional(&reader)
        var claim = ProgramClaim(program: program, digest: digest, package: package, unit: try optional(&reader))
        guard identified else { return claim }
        let flags = try reader.readByte()
        // One encoding per value: known bits only, and "not recorded" never beside a JIT.
        guard flags & ~(jitFlag | jitUnknownFlag | scriptFlag) == 0, flags & (jitFlag | jitUnknownFlag) != 3 else {
            throw malformed
        }
        claim.jit = flags & jitUnknownFlag != 0 ? nil : flags & jitFlag != 0
        if flags & scriptFlag != 0 {
            claim.script = ProgramScript(
                path: try reader.readPrefixed(), digest: try reader.read(ExecutableDigest.size))
        }
        return claim
    }

    /// Reads ``encoded()``; `malformed` for anything else, or for fields
    /// past the bounds (``validate()``).
    package init(decoding bytes: [UInt8], malformed: KeychainError = .decode) throws(KeychainError) {
        var reader = ByteReader(bytes, malformed: malformed)
        let version = try reader.readByte()
        guard [Self.encodingVersion, Self.ownedVersion, Self.identifiedVersion].contains(version) else {
            throw malformed
        }
        let identified = version == Self.identifiedVersion
        label = try reader.readPrefixed()
        contentType = try reader.readPrefixed()
        created = try reader.readUInt64()
        modified = try reader.readUInt64()
        let count = try reader.readUInt32()
        guard count <= Self.maximumAttributes else { throw malformed }
        attributes = [:]
        var previous: String?
        for _ in 0..<count {
            // Sorted, each name once: one encoding per value.
            let name = try reader.readPrefixed()
            guard previous.map({ Self.precedes($0, name) }) ?? true,
                attributes.updateValue(try reader.readPrefixed(), forKey: name) == nil
            else { throw malformed }
            previous = name
        }
        if version != Self.encodingVersion {
            switch try reader.readByte() {
            case 0: owner = nil
            case 1: owner = try Self.readClaim(&reader, identified: identified, malformed: malformed)
            default: throw malformed
            }
            let count = try reader.readByte()
            guard Int(count) <= Self.maximumAllowed else { throw malformed }
            for _ in 0..<count {
                allowed.append(try Self.readClaim(&reader, identified: identified, malformed: malformed))
            }
            // One encoding per value: version 2 only when there is something to say, 3 only when a claim says more.
            guard owner != nil || !allowed.isEmpty else { throw malformed }
            guard claimsSayMore == identified else { throw malformed }
        }
        guard reader.isAtEnd else { throw malformed }
        do { try validate() } catch { throw malformed }
    }
}
