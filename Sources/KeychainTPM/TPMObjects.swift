import KeychainCore
import KeychainProtocol
internal import CSodium
internal import CTSS

#if canImport(Glibc)
import Glibc
#endif

/// The TPM structures a keychain builds and reads (TPM 2.0 Part 2), in
/// Swift: the C shim declares tpm2-tss's calls and nothing more
/// (docs/CONTRIBUTING.md, "Where a new piece goes"). A template here must stay
/// byte for byte what it was: the storage key is derived from its template, and
/// a keychain records that key's name. TPM2_ALG_ (Part 2, 6.3), which tpm2-tss
/// declares as casting macros Swift cannot import.
enum TPMAlgorithm {
    static let aes: UInt16 = 0x0006
    static let keyedHash: UInt16 = 0x0008
    static let sha256: UInt16 = 0x000B
    static let null: UInt16 = 0x0010
    static let ecc: UInt16 = 0x0023
    static let cfb: UInt16 = 0x0043
}

enum TPMObjects {
    /// TPMA_OBJECT (Part 2, 8.3), and the curve of the storage key.
    private enum Value {
        static let fixedTPM: UInt32 = 0x0000_0002
        static let fixedParent: UInt32 = 0x0000_0010
        static let sensitiveDataOrigin: UInt32 = 0x0000_0020
        static let userWithAuth: UInt32 = 0x0000_0040
        static let noDA: UInt32 = 0x0000_0400
        static let restricted: UInt32 = 0x0001_0000
        static let decrypt: UInt32 = 0x0002_0000
        static let curveP256: UInt16 = 0x0003  // TPM2_ECC_NIST_P256
    }

    /// The storage primary key: an ECC P-256 restricted decryption key
    /// under the owner hierarchy, made again from this template whenever it
    /// is needed (the TPM derives it from its storage seed: the same key on
    /// this TPM, another on any other, and none after TPM2_Clear). NODA: it
    /// has no auth. Everything not set is zero.
    static var storagePrimary: TPM2B_PUBLIC {
        var template = TPM2B_PUBLIC()
        template.publicArea.type = TPMAlgorithm.ecc
        template.publicArea.nameAlg = TPMAlgorithm.sha256
        template.publicArea.objectAttributes =
            Value.fixedTPM | Value.fixedParent | Value.sensitiveDataOrigin | Value.userWithAuth | Value.restricted
            | Value.decrypt | Value.noDA
        template.publicArea.parameters.eccDetail.symmetric.algorithm = TPMAlgorithm.aes
        template.publicArea.parameters.eccDetail.symmetric.keyBits.aes = 128
        template.publicArea.parameters.eccDetail.symmetric.mode.aes = TPMAlgorithm.cfb
        template.publicArea.parameters.eccDetail.scheme.scheme = TPMAlgorithm.null
        template.publicArea.parameters.eccDetail.curveID = Value.curveP256
        template.publicArea.parameters.eccDetail.kdf.scheme = TPMAlgorithm.null
        return template
    }

    /// A sealed object: a keyed-hash object holding data, used with its
    /// auth. `counted`: every wrong auth counts against the TPM's
    /// dictionary-attack lockout, during which it is refused; otherwise
    /// NODA, usable in a lockout (for an empty auth, which no one can
    /// guess wrong).
    static func sealedObject(counted: Bool) -> TPM2B_PUBLIC {
        var template = TPM2B_PUBLIC()
        template.publicArea.type = TPMAlgorithm.keyedHash
        template.publicArea.nameAlg = TPMAlgorithm.sha256
        template.publicArea.objectAttributes =
            Value.fixedTPM | Value.fixedParent | Value.userWithAuth | (counted ? 0 : Value.noDA)
        template.publicArea.parameters.keyedHashDetail.scheme.scheme = TPMAlgorithm.null
        return template
    }

    /// The secret and auth of a sealed object, as Create takes them; nil
    /// when either is too long (128 and 64 bytes). Wiped by ``wipe(_:)``.
    static func sensitive(data: SecureBytes, auth: SecureBytes) -> TPM2B_SENSITIVE_CREATE? {
        var sensitive = TPM2B_SENSITIVE_CREATE()
        guard data.count <= MemoryLayout.size(ofValue: sensitive.sensitive.data.buffer),
            auth.count <= MemoryLayout.size(ofValue: sensitive.sensitive.userAuth.buffer)
        else { return nil }
        sensitive.sensitive.data.size = UInt16(data.count)
        withUnsafeMutableBytes(of: &sensitive.sensitive.data.buffer) { buffer in
            data.withUnsafeBytes { buffer.copyMemory(from: $0) }
        }
        sensitive.sensitive.userAuth.size = UInt16(auth.count)
        withUnsafeMutableBytes(of: &sensitive.sensitive.userAuth.buffer) { buffer in
            auth.withUnsafeBytes { buffer.copyMemory(from: $0) }
        }
        return sensitive
    }

    /// Overwrites a structure that held a secret with zeros.
    static func wipe<T>(_ value: inout T) {
        withUnsafeMutableBytes(of: &value) { wipeMemory($0) }
    }

    /// A sealed object's blob, as keychains keep it: its public and private
    /// parts, marshalled one after the other; nil when they do not marshal.
    static func blob(public publicPart: UnsafePointer<TPM2B_PUBLIC>, private privatePart: UnsafePointer<TPM2B_PRIVATE>)
        -> [UInt8]?
    {
        var blob = [UInt8](repeating: 0, count: MemoryLayout<TPM2B_PUBLIC>.size + MemoryLayout<TPM2B_PRIVATE>.size)
        var offset = 0
        let marshalled = blob.withUnsafeMutableBufferPointer { buffer in
            CTSS_Tss2_MU_TPM2B_PUBLIC_Marshal(publicPart, buffer.baseAddress, buffer.count, &offset) == 0
                && CTSS_Tss2_MU_TPM2B_PRIVATE_Marshal(privatePart, buffer.baseAddress, buffer.count, &offset) == 0
        }
        return marshalled ? Array(blob.prefix(offset)) : nil
    }

    /// The public and private parts of a blob; nil unless it is exactly the two.
    static func parts(of blob: [UInt8]) -> (public: TPM2B_PUBLIC, private: TPM2B_PRIVATE)? {
        var parts = (public: TPM2B_PUBLIC(), private: TPM2B_PRIVATE())
        var offset = 0
        let read = blob.withUnsafeBufferPointer { buffer in
            CTSS_Tss2_MU_TPM2B_PUBLIC_Unmarshal(buffer.baseAddress, buffer.count, &offset, &parts.public) == 0
                && CTSS_Tss2_MU_TPM2B_PRIVATE_Unmarshal(buffer.baseAddress, buffer.count, &offset, &parts.private) == 0
        }
        return read && offset == blob.count ? parts : nil
    }

    /// Whether the object of `blob` counts a wrong auth against the
    /// dictionary-attack lockout (it is not NODA); false for what is no blob.
    static func isCounted(_ blob: [UInt8]) -> Bool {
        guard let parts = parts(of: blob) else { return false }
        return parts.public.publicArea.objectAttributes & Value.noDA == 0
    }

    /// One tagged property of a TPM2_CAP_TPM_PROPERTIES answer (0 when absent).
    static func property(_ data: UnsafePointer<TPMS_CAPABILITY_DATA>, _ property: UInt32) -> UInt32 {
        var properties = data.pointee.data.tpmProperties
        let count = Int(properties.count)
        return withUnsafeBytes(of: &properties.tpmProperty) { raw in
            let tagged = raw.bindMemory(to: TPMS_TAGGED_PROPERTY.self)
            return tagged.prefix(min(count, tagged.count)).first { $0.property == property }?.value ?? 0
        }
    }

    /// The NV name (Part 1, 16) a counter defined at `index` by
    /// ``TrustedPlatformModule/defineCounter(at:auth:)`` has once it was
    /// incremented: SHA-256 over its public area, which holds its index,
    /// attributes (written), empty policy and size, never its auth. So it
    /// is known before the TPM is asked, and says nothing of whose it is.
    static func counterName(at index: UInt32) -> [UInt8] {
        var area: [UInt8] = []
        func append<T: FixedWidthInteger>(_ value: T) { withUnsafeBytes(of: value.bigEndian) { area += $0 } }
        append(index)
        append(TPMAlgorithm.sha256)
        append(TrustedPlatformModule.NVAttribute.counter | TrustedPlatformModule.NVAttribute.written)
        append(UInt16(0))  // authPolicy: empty
        append(UInt16(8))  // dataSize
        var digest = [UInt8](repeating: 0, count: Int(crypto_hash_sha256_BYTES))
        _ = crypto_hash_sha256(&digest, area, UInt64(area.count))
        return [0x00, 0x0B] + digest
    }

    /// The value of an NV counter's read: 8 bytes, big-endian.
    static func counterValue(_ data: UnsafePointer<TPM2B_MAX_NV_BUFFER>) -> UInt64 {
        var buffer = data.pointee
        let count = min(Int(buffer.size), 8)
        return withUnsafeBytes(of: &buffer.buffer) { raw in
            raw.prefix(count).reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        }
    }
}
