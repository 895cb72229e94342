/// The `device-secret` file: the 32 bytes themselves (file protection), or
/// the device secret sealed by the TPM (``KeyProtector/sealDeviceSecret(_:)``):
/// `"KCFSTPM2" | version u8 = 1 | blob` (docs/FORMAT.md, "Keys sealed by a TPM"), or
/// `"KCFSTPM2" | version u8 = 2 | length u16 LE | storage key name | blob`,
/// the name of the storage primary key it is sealed under, which every
/// session is checked against before it is salted with that key; version
/// 3, the same, sealed through the keychainfs service for its user
/// (``KeyProtector/throughService``).
package enum DeviceSecretFile {
    case plain(SecureBytes)
    case sealed([UInt8], storageKey: [UInt8]?, throughService: Bool)

    static let magic = Array("KCFSTPM2".utf8)
    static let unpinnedVersion: UInt8 = 1
    static let version: UInt8 = 2
    static let serviceVersion: UInt8 = 3
    /// A sealed object's public and private parts are a few hundred bytes.
    static let maximumSize = 4096

    /// The file's contents for `blob` sealed under `storageKey`, as written to disk.
    package static func sealedContents(_ blob: [UInt8], storageKey: [UInt8], throughService: Bool = false)
        throws(KeychainError) -> SecureBytes
    {
        try SecureBytes(encodeSealed(blob, storageKey: storageKey, throughService: throughService))
    }

    static func encodeSealed(_ blob: [UInt8], storageKey: [UInt8], throughService: Bool = false) -> [UInt8] {
        var writer = ByteWriter()
        writer.append(magic)
        writer.append(throughService ? serviceVersion : version)
        writer.append(UInt16(storageKey.count))
        writer.append(storageKey)
        writer.append(blob)
        return writer.bytes
    }

    init(_ contents: SecureBytes) throws(KeychainError) {
        if contents.count == Crypto.keySize {
            self = .plain(contents)
            return
        }
        var reader = ByteReader(contents.bytes())
        do throws(KeychainError) {
            guard try reader.read(Self.magic.count) == Self.magic else { throw .decode }
            switch try reader.readByte() {
            case Self.unpinnedVersion:
                self = .sealed(try reader.read(reader.remaining), storageKey: nil, throughService: false)
            case let version where version == Self.version || version == Self.serviceVersion:
                let length = Int(try reader.readUInt16())
                guard length > 0 else { throw .decode }
                let name = try reader.read(length)
                self = .sealed(
                    try reader.read(reader.remaining), storageKey: name, throughService: version == Self.serviceVersion)
            default: throw .decode
            }
            guard case .sealed(let blob, _, _) = self, !blob.isEmpty else { throw .decode }
        } catch {
            Diagnostics.log("the keychain's device secret is damaged")
            throw .decode
        }
    }
}
