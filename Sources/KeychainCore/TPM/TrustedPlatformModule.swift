internal import CTSS
#if canImport(Glibc)
import Glibc
#endif

/// What a TPM said no to, in the terms a keychain needs (issue 30).
public enum TPMError: Error, Equatable, Sendable, CustomStringConvertible {
    /// No TPM answers at the TCTI, or tpm2-tss is not installed.
    case unavailable(String)
    /// The auth was wrong: counted by the TPM's dictionary-attack logic.
    case authFailed
    /// The TPM refuses every try of a DA-protected object for now
    /// (too many wrong auths; it forgives one each `recoveryTime`).
    case lockedOut
    /// The sealed object does not load in this TPM: sealed by another
    /// TPM, by this one before a TPM2_Clear, or cut or changed.
    case notThisTPM
    /// The NV index is taken already.
    case indexTaken
    /// The TPM answered with a warning (TPM 2.0 Part 2, 6.6.3: retry,
    /// yielded, testing, NV rate-limited or unavailable, out of memory):
    /// nothing was done; a later try may work.
    case busy(String, UInt32)
    /// Any other response code (TSS2_RC), with the call that got it.
    case failed(String, UInt32)

    public var description: String {
        switch self {
        case .unavailable(let why): return "no TPM: \(why)"
        case .authFailed: return "the TPM refused the authorization (counted against its lockout)"
        case .lockedOut: return "the TPM is in dictionary-attack lockout: it refuses every try for now"
        case .notThisTPM:
            return "the sealed key does not load in this TPM (another TPM, a cleared one, or a damaged blob)"
        case .indexTaken: return "the TPM's NV index is taken already"
        case .busy(let call, let code):
            return "the TPM is busy (\(call): response 0x\(String(code, radix: 16))); try again"
        case .failed(let call, let code): return "\(call) failed: TPM response 0x\(String(code, radix: 16))"
        }
    }
}

/// One TPM 2.0, reached through tpm2-tss's ESAPI over the TCTI that
/// `$TPM2TOOLS_TCTI` names (as tpm2-tools reads it: `swtpm:host=…,port=…`,
/// `device:/dev/tpmrm0`), else the TCTI loader's default (`/dev/tpmrm0`).
/// Used at `init`, boot and unlock only, never per request. Secrets and
/// auths cross the bus to the TPM only inside a salted session with
/// parameter encryption.
public final class TrustedPlatformModule: @unchecked Sendable {
    /// Response codes and constants of TPM 2.0 Part 2 (6.6, 6.13, 6.5),
    /// which tpm2-tss declares as casting macros Swift cannot import.
    private enum Code {
        static let initialize: UInt32 = 0x100  // TPM2_RC_INITIALIZE (RC_VER1 + 0x000)
        static let nvDefined: UInt32 = 0x14C  // TPM2_RC_NV_DEFINED (RC_VER1 + 0x04C)
        static let authFail: UInt32 = 0x08E  // TPM2_RC_AUTH_FAIL (RC_FMT1 + 0x00E)
        static let size: UInt32 = 0x095  // TPM2_RC_SIZE (RC_FMT1 + 0x015)
        static let integrity: UInt32 = 0x09F  // TPM2_RC_INTEGRITY (RC_FMT1 + 0x01F)
        static let badAuth: UInt32 = 0x0A2  // TPM2_RC_BAD_AUTH (RC_FMT1 + 0x022)
        static let lockout: UInt32 = 0x921  // TPM2_RC_LOCKOUT (RC_WARN + 0x021)
        static let formatOne: UInt32 = 0x080  // TPM2_RC_FMT1
        static let warning: UInt32 = 0x900  // TPM2_RC_WARN
        static let startupClear: UInt16 = 0x0000  // TPM2_SU_CLEAR
        static let tpmProperties: UInt32 = 6  // TPM2_CAP_TPM_PROPERTIES
        static let lockoutCounter: UInt32 = 0x20E  // TPM2_PT_LOCKOUT_COUNTER (PT_VAR + 14)
        static let maxAuthFail: UInt32 = 0x20F  // TPM2_PT_MAX_AUTH_FAIL
        static let lockoutInterval: UInt32 = 0x210  // TPM2_PT_LOCKOUT_INTERVAL
    }

    // Used by one thread at a time: the device's boot and unlock are serialised.
    private var context: OpaquePointer?
    private var tcti: OpaquePointer?

    /// The TCTI configuration the environment names, if any.
    public static var configuredTCTI: String? {
        getenv("TPM2TOOLS_TCTI").map { String(cString: $0) }.flatMap { $0.isEmpty ? nil : $0 }
    }

    /// Connects to the TPM at `tcti` (nil: ``configuredTCTI``, else the default).
    public init(tcti configuration: String? = TrustedPlatformModule.configuredTCTI) throws(TPMError) {
        guard CTSS_available() != 0 else {
            throw .unavailable("tpm2-tss is not installed (apt install libtss2-esys-3.0.2-0 libtss2-tctildr0)")
        }
        // tpm2-tss writes every TPM error it receives to stderr (a wrong
        // passcode is one): errors are ours to report, unless the user asked
        // for its log.
        setenv("TSS2_LOG", "all+NONE", 0)
        var tcti: OpaquePointer?
        var rc = CTSS_Tss2_TctiLdr_Initialize(configuration, &tcti)
        guard rc == 0, let tcti else {
            throw .unavailable("cannot reach \(configuration ?? "the default TCTI") (0x\(String(rc, radix: 16)))")
        }
        var context: OpaquePointer?
        rc = CTSS_Esys_Initialize(&context, tcti)
        guard rc == 0, context != nil else {
            var owned: OpaquePointer? = tcti
            CTSS_Tss2_TctiLdr_Finalize(&owned)
            throw .unavailable("ESAPI could not start (0x\(String(rc, radix: 16)))")
        }
        self.tcti = tcti
        self.context = context
        // A TPM that was started already says TPM2_RC_INITIALIZE: that is fine.
        rc = CTSS_Esys_Startup(context, Code.startupClear)
        guard rc == 0 || Self.base(rc) == Code.initialize else {
            throw .unavailable("the TPM did not start (0x\(String(rc, radix: 16)))")
        }
    }

    deinit {
        CTSS_Esys_Finalize(&context)
        CTSS_Tss2_TctiLdr_Finalize(&tcti)
    }

    /// The response code without its layer and, for format-one codes, without
    /// the number of the handle, session or parameter it concerns.
    static func base(_ rc: UInt32) -> UInt32 {
        let code = rc & 0xFFFF
        return code & Code.formatOne != 0 ? code & 0xBF : code & 0xFFF
    }

    private func check(_ rc: UInt32, _ call: String) throws(TPMError) {
        guard rc != 0 else { return }
        switch Self.base(rc) {
        case Code.authFail, Code.badAuth: throw .authFailed
        case Code.lockout: throw .lockedOut
        case Code.nvDefined: throw .indexTaken
        case let code where rc & 0xFF0000 == 0 && code & 0xF00 == Code.warning: throw .busy(call, rc)
        default: throw .failed(call, rc)
        }
    }

    /// Runs `body` with the storage primary key and a salted session, flushed after.
    private func withPrimaryAndSession<R>(_ body: (_ primary: UInt32, _ session: UInt32) throws(TPMError) -> R)
        throws(TPMError) -> R
    {
        var primary: UInt32 = 0, session: UInt32 = 0
        try check(CTSS_create_primary(context, &primary), "CreatePrimary")
        defer { _ = CTSS_Esys_FlushContext(context, primary) }
        try check(CTSS_start_salted_session(context, primary, &session), "StartAuthSession")
        defer { _ = CTSS_Esys_FlushContext(context, session) }
        return try body(primary, session)
    }

    /// Seals `secret` (at most 128 bytes) so that only this TPM, given
    /// `auth` (at most 32 bytes), unseals it; returns the blob to keep.
    /// `guarded`: wrong auths count towards the TPM's dictionary-attack
    /// lockout, during which it is refused (for an auth that can be
    /// guessed); otherwise usable in a lockout (for an empty auth).
    public func seal(_ secret: SecureBytes, auth: SecureBytes, guarded: Bool = true) throws(TPMError) -> [UInt8] {
        try withPrimaryAndSession { (primary, session) throws(TPMError) in
            var blob = [UInt8](repeating: 0, count: 4096)
            var length = 0
            let rc = secret.withUnsafeBytes { data in
                auth.withUnsafeBytes { auth in
                    blob.withUnsafeMutableBytes { out in
                        CTSS_seal(
                            context, primary, session, data.baseAddress?.assumingMemoryBound(to: UInt8.self),
                            data.count,
                            auth.baseAddress?.assumingMemoryBound(to: UInt8.self), auth.count, guarded ? 0 : 1,
                            out.baseAddress?.assumingMemoryBound(to: UInt8.self), out.count, &length)
                    }
                }
            }
            try check(rc, "Create")
            return Array(blob.prefix(length))
        }
    }

    /// The secret `blob` holds, given the `auth` it was sealed with. A wrong
    /// auth is ``TPMError/authFailed`` and counts against the TPM's lockout.
    public func unseal(_ blob: [UInt8], auth: SecureBytes) throws(TPMError) -> SecureBytes {
        try withPrimaryAndSession { (primary, session) throws(TPMError) in
            var object: UInt32 = 0
            let loaded = blob.withUnsafeBytes {
                CTSS_load(context, primary, $0.baseAddress?.assumingMemoryBound(to: UInt8.self), $0.count, &object)
            }
            guard loaded == 0 else {
                // A blob made under another storage seed fails its integrity check.
                let code = Self.base(loaded)
                if code == Code.integrity || code == Code.size || loaded & 0xFF0000 != 0 { throw .notThisTPM }
                try check(loaded, "Load")
                throw .notThisTPM
            }
            defer { _ = CTSS_Esys_FlushContext(context, object) }
            try check(
                auth.withUnsafeBytes {
                    CTSS_set_auth(context, object, $0.baseAddress?.assumingMemoryBound(to: UInt8.self), $0.count)
                },
                "TR_SetAuth")
            var data: UnsafeMutablePointer<TPM2B_SENSITIVE_DATA>?
            try check(CTSS_Esys_Unseal(context, object, session, &data), "Unseal")
            guard let data else { throw .failed("Unseal", 0) }
            defer {
                memset(data, 0, MemoryLayout<TPM2B_SENSITIVE_DATA>.size)
                CTSS_Esys_Free(data)
            }
            let count = Int(data.pointee.size)
            do {
                let secret = try SecureBytes(count: count)
                withUnsafeBytes(of: data.pointee.buffer) { source in
                    secret.mutableBytes.copyMemory(from: UnsafeRawBufferPointer(rebasing: source.prefix(count)))
                }
                return secret
            } catch {
                throw .failed("Unseal", 0)
            }
        }
    }

    /// The TPM's dictionary-attack state: failures counted, the most it
    /// allows before lockout, and the seconds after which it forgets one.
    public func lockout() throws(TPMError) -> (failures: UInt32, maximum: UInt32, recoverySeconds: UInt32) {
        var data: UnsafeMutablePointer<TPMS_CAPABILITY_DATA>?
        try check(CTSS_Esys_GetCapability(context, Code.tpmProperties, Code.lockoutCounter, 3, &data), "GetCapability")
        guard let data else { throw .failed("GetCapability", 0) }
        defer { CTSS_Esys_Free(data) }
        return (
            CTSS_property(data, Code.lockoutCounter), CTSS_property(data, Code.maxAuthFail),
            CTSS_property(data, Code.lockoutInterval)
        )
    }

    /// TPM2_Clear under the platform hierarchy (empty auth: a software TPM;
    /// firmware sets its own on a real one): a new storage seed, every
    /// sealed object and NV index gone, what a user's "clear TPM" in the
    /// firmware setup does. For the tests of recovery.
    package func clear() throws(TPMError) {
        try check(CTSS_Esys_Clear(context), "Clear")
    }

    /// Defines a monotonic counter at NV `index` (0x01xxxxxx, owner
    /// hierarchy) and increments it once, so that it reads 1 or more.
    public func defineCounter(at index: UInt32) throws(TPMError) {
        var handle: UInt32 = 0
        try check(CTSS_define_counter(context, index, &handle), "NV_DefineSpace")
        try check(CTSS_Esys_NV_Increment(context, handle), "NV_Increment")
    }

    /// Adds one to the counter at `index`; returns its new value.
    @discardableResult
    public func increment(counter index: UInt32) throws(TPMError) -> UInt64 {
        var handle: UInt32 = 0
        try check(CTSS_Esys_TR_FromTPMPublic(context, index, &handle), "TR_FromTPMPublic")
        try check(CTSS_Esys_NV_Increment(context, handle), "NV_Increment")
        return try read(handle)
    }

    /// The counter at `index`.
    public func counter(at index: UInt32) throws(TPMError) -> UInt64 {
        var handle: UInt32 = 0
        try check(CTSS_Esys_TR_FromTPMPublic(context, index, &handle), "TR_FromTPMPublic")
        return try read(handle)
    }

    private func read(_ handle: UInt32) throws(TPMError) -> UInt64 {
        var data: UnsafeMutablePointer<TPM2B_MAX_NV_BUFFER>?
        try check(CTSS_Esys_NV_Read(context, handle, 8, &data), "NV_Read")
        guard let data else { throw .failed("NV_Read", 0) }
        defer { CTSS_Esys_Free(data) }
        return CTSS_counter_value(data)
    }
}
