import KeychainCore
import KeychainProtocol
internal import COpenSSL
internal import CTSS
#if canImport(Glibc)
import Glibc
#endif

/// What a TPM said no to, in the terms a keychain needs (docs/SECURITY.md,
/// "Keys sealed by the TPM").
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
    /// No NV index is defined at the counter's index (a TPM2_Clear, or
    /// someone undefined it).
    case counterMissing
    /// The NV index at the counter's index is not the counter that was
    /// made there: another name (defined again), or not a counter at all.
    case counterReplaced
    /// The storage primary key the TPM answered with is not the one the
    /// keychain was sealed under: another TPM, or something in between that
    /// substitutes its own key to read what is sent to it.
    case storageKeyChanged
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
        case .counterMissing: return "the TPM has no NV index at the rollback counter's index"
        case .counterReplaced:
            return "the NV index at the rollback counter's index is not the counter the keychain made"
        case .storageKeyChanged: return "the TPM's storage key is not the one the keychain was sealed under"
        case .busy(let call, let code):
            return "the TPM is busy (\(call): response 0x\(String(code, radix: 16))); try again"
        case .failed(let call, let code): return "\(call) failed: TPM response 0x\(String(code, radix: 16))"
        }
    }
}

/// One TPM 2.0, reached through tpm2-tss's ESAPI over the TCTI that
/// `$TPM2TOOLS_TCTI` names (as tpm2-tools reads it: `swtpm:host=…,port=…`,
/// `device:/dev/tpmrm0`), else the machine's own (``machineTCTI``).
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
        static let handle: UInt32 = 0x08B  // TPM2_RC_HANDLE (RC_FMT1 + 0x00B): no such index
        static let lockout: UInt32 = 0x921  // TPM2_RC_LOCKOUT (RC_WARN + 0x021)
        static let formatOne: UInt32 = 0x080  // TPM2_RC_FMT1
        static let warning: UInt32 = 0x900  // TPM2_RC_WARN
        static let startupClear: UInt16 = 0x0000  // TPM2_SU_CLEAR
        static let tpmProperties: UInt32 = 6  // TPM2_CAP_TPM_PROPERTIES
        static let lockoutCounter: UInt32 = 0x20E  // TPM2_PT_LOCKOUT_COUNTER (PT_VAR + 14)
        static let maxAuthFail: UInt32 = 0x20F  // TPM2_PT_MAX_AUTH_FAIL
        static let lockoutInterval: UInt32 = 0x210  // TPM2_PT_LOCKOUT_INTERVAL
        static let permanent: UInt32 = 0x200  // TPM2_PT_PERMANENT (TPMA_PERMANENT)
        static let lockoutRecovery: UInt32 = 0x211  // TPM2_PT_LOCKOUT_RECOVERY
        static let ownerAuthSet: UInt32 = 0x1  // TPMA_PERMANENT_OWNERAUTHSET
        static let lockoutAuthSet: UInt32 = 0x4  // TPMA_PERMANENT_LOCKOUTAUTHSET
        static let sessionContinue: UInt8 = 0x01  // TPMA_SESSION_CONTINUESESSION
        static let sessionDecrypt: UInt8 = 0x20  // TPMA_SESSION_DECRYPT
        static let sessionEncrypt: UInt8 = 0x40  // TPMA_SESSION_ENCRYPT
        static let passwordSession: UInt32 = 0x0FF  // ESYS_TR_PASSWORD
        static let noHandle: UInt32 = 0xFFF  // ESYS_TR_NONE
        static let lockoutHierarchy: UInt32 = 0x10A  // ESYS_TR_RH_LOCKOUT
    }

    /// The attributes of an NV index (TPM 2.0 Part 2, 13.4, TPMA_NV).
    enum NVAttribute {
        static let ownerWrite: UInt32 = 0x0000_0002
        static let authWrite: UInt32 = 0x0000_0004
        static let typeMask: UInt32 = 0x0000_00F0
        static let counterType: UInt32 = 0x0000_0010  // TPM2_NT_COUNTER << TPMA_NV_TPM2_NT_SHIFT
        static let ownerRead: UInt32 = 0x0002_0000
        static let authRead: UInt32 = 0x0004_0000
        static let noDA: UInt32 = 0x0200_0000
        /// Set by the TPM at an index's first write (or increment).
        static let written: UInt32 = 0x2000_0000
        /// A counter only the holder of its auth reads and increments:
        /// not the owner hierarchy (whose auth is empty on most machines),
        /// and outside the dictionary-attack logic (its auth is a key, not
        /// something to guess).
        static let counter = counterType | authWrite | authRead | noDA
    }

    // Used by one thread at a time: its own use's, or the thread whose boot
    // keeps it (``KeychainTPM/sharingSession(tcti:_:)``).
    private var context: OpaquePointer?
    private var tcti: OpaquePointer?
    /// The name of the storage primary key a session may be salted with
    /// (nil: any, when the keychain has none recorded yet): set by each
    /// use (``KeychainTPM/use(_:)``), since a boot's uses share a connection.
    var pinnedStorageKey: [UInt8]?
    /// The name of the storage primary key of the last salted session.
    public private(set) var storageKeyName: [UInt8]?
    /// Whether a salted session is kept after its command, for the
    /// authorized commands that follow (``endSharedSession()`` flushes it):
    /// a boot unseals, then reads its counter, in one session instead of two.
    var sharesSession = false
    private var sharedSession: UInt32?

    /// The machine's TPM, through the kernel's resource manager: what is
    /// reached when no TCTI is named. Never tpm2-tss's default list, which
    /// after `/dev/tpmrm0` and `/dev/tpm0` tries tabrmd and then swtpm and
    /// mssim on `localhost:2321`: a port any local user can listen on, so
    /// that for a user who cannot open the device (an ordinary Debian user)
    /// another user's software TPM would seal the keychain and hold its
    /// counters (docs/SECURITY.md, "The TPM is the machine's, or none").
    public static let machineTCTI = KeyProtection.machineTCTI

    /// The TCTI configuration the environment names, if any.
    public static var configuredTCTI: String? { KeyProtection.configuredTCTI }

    /// libcrypto started without its tables of every legacy cipher and
    /// digest name: OpenSSL 3's first fetch by name (tpm2-tss's first
    /// session) otherwise copies them whole into its name map, one
    /// `OBJ_obj2txt` and `BIO_snprintf` per name, which perf put at half of
    /// libcrypto's time in a device's boot and stop (docs/BENCHMARKS.md:
    /// boot with the TPM from 2.05-2.07x file mode to 1.72-1.76x). tpm2-tss fetches
    /// its algorithms by name from the default provider, which knows its
    /// own names, and the Secret Service's sessions use libcrypto's fixed
    /// objects (`EVP_aes_128_cbc`, `EVP_sha256`) and NIDs. The system's
    /// openssl.cnf is still read. Once per process, before tpm2-tss first
    /// uses libcrypto; one that started libcrypto before keeps what it has.
    private static let initializeCrypto: Void = {
        _ = COpenSSL_OPENSSL_init_crypto(
            UInt64(OPENSSL_INIT_NO_ADD_ALL_CIPHERS) | UInt64(OPENSSL_INIT_NO_ADD_ALL_DIGESTS), nil)
    }()

    /// Connects to the TPM at `tcti` (nil: the machine's, ``machineTCTI``;
    /// the default argument is ``configuredTCTI``). A keychain's use pins its storage key after
    /// (``pinnedStorageKey``): a session is salted with no other
    /// (``TPMError/storageKeyChanged``).
    public init(tcti configuration: String? = TrustedPlatformModule.configuredTCTI) throws(TPMError) {
        guard CTSS_available() != 0 else {
            throw .unavailable("tpm2-tss is not installed (apt install libtss2-esys-3.0.2-0 libtss2-tctildr0)")
        }
        // tpm2-tss writes every TPM error it receives to stderr (a wrong
        // passcode is one): errors are ours to report. Its log is off
        // whatever the environment asks: at its trace level it writes the
        // buffers it sends and receives, unsealed secrets among them, and a
        // device's standard error is a log its user reads.
        setenv("TSS2_LOG", "all+NONE", 1)
        Self.initializeCrypto
        let configuration = configuration ?? Self.machineTCTI
        if let problem = Self.moduleProblem(configuration) { throw .unavailable(problem) }
        var tcti: OpaquePointer?
        var rc = CTSS_Tss2_TctiLdr_Initialize(configuration, &tcti)
        guard rc == 0, let tcti else {
            throw .unavailable("cannot reach \(configuration) (0x\(String(rc, radix: 16)))")
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

    /// Why tpm2-tss must not load the TCTI module `configuration` names
    /// (nil: it may). Its loader takes the text before the first `:` as a
    /// file to `dlopen` first, then as `libtss2-tcti-NAME.so` (tctildr):
    /// a name with a `/` in it is a path, from the working directory when
    /// not absolute. A library of the user's, named in `$TPM2TOOLS_TCTI`,
    /// ran in the device, undumpable and setgid as it is, and read the
    /// login password out of its memory (an outsider's attack). A module
    /// named by a path must be a file root controls; a plain name is
    /// looked for where the loader looks for the system's libraries
    /// (docs/SECURITY.md, "The TPM is the machine's, or none").
    public static func moduleProblem(_ configuration: String) -> String? {
        let name = configuration.prefix { $0 != ":" }
        guard name.contains("/") else { return nil }
        guard RootControlledFile.status(of: String(name)) == nil else { return nil }
        return "the TCTI module \(name) is not a file only root can change (root's, in root's directories): "
            + "name a TCTI the system installed (device, swtpm, mssim, tabrmd)"
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

    /// Where the storage primary key is kept: TCG's handle for the storage
    /// root key (TCG TPM v2.0 Provisioning Guidance), where systemd
    /// (systemd-tpm2-setup) keeps the same key, made from the same template.
    public static let persistentStorageKey: UInt32 = 0x8100_0001

    /// Runs `body` with the storage primary key and a session salted with
    /// it, flushed after. The key is the persistent one when it is the key
    /// the keychain pinned, else it is made again from its template (the
    /// same on this TPM: ten milliseconds of a software TPM, often a hundred
    /// of a real one, at every boot and unlock); its name is checked against
    /// the pinned one before anything is sent encrypted to it: a key
    /// substituted by something in between would read every parameter of
    /// the session.
    private func withPrimaryAndSession<R>(_ body: (_ primary: UInt32, _ session: UInt32) throws(TPMError) -> R)
        throws(TPMError) -> R
    {
        let persistent = try persistentPrimary()
        defer { if let persistent { forget(persistent) } }
        if let persistent, let pinnedStorageKey, try name(of: persistent) == pinnedStorageKey {
            storageKeyName = pinnedStorageKey
            return try withSession(saltedWith: persistent, body)
        }
        var primary: UInt32 = 0
        var template = TPMObjects.storagePrimary
        var sensitive = TPM2B_SENSITIVE_CREATE()
        var outside = TPM2B_DATA()
        var pcrs = TPML_PCR_SELECTION()
        try check(CTSS_Esys_CreatePrimary(context, &sensitive, &template, &outside, &pcrs, &primary), "CreatePrimary")
        defer { _ = CTSS_Esys_FlushContext(context, primary) }
        let name = try self.name(of: primary)
        if let pinnedStorageKey, name != pinnedStorageKey { throw .storageKeyChanged }
        storageKeyName = name
        if persistent == nil { makePersistent(primary) }
        return try withSession(saltedWith: primary, body)
    }

    private func withSession<R>(
        saltedWith primary: UInt32, _ body: (_ primary: UInt32, _ session: UInt32) throws(TPMError) -> R
    ) throws(TPMError) -> R {
        if let shared = sharedSession { return try body(primary, shared) }
        let session = try startSession(salt: primary, attributes: Self.saltedAttributes)
        if sharesSession {
            sharedSession = session
            return try body(primary, session)
        }
        defer { _ = CTSS_Esys_FlushContext(context, session) }
        return try body(primary, session)
    }

    private static let saltedAttributes = Code.sessionContinue | Code.sessionDecrypt | Code.sessionEncrypt

    /// Flushes the session kept for sharing (``sharesSession``), and keeps none from now on.
    func endSharedSession() {
        sharesSession = false
        if let session = sharedSession { _ = CTSS_Esys_FlushContext(context, session) }
        sharedSession = nil
    }

    /// The ESAPI handle of the key at ``persistentStorageKey``, nil when
    /// none is there (whatever is there is checked by name before use).
    private func persistentPrimary() throws(TPMError) -> UInt32? {
        var handle: UInt32 = 0
        let rc = CTSS_Esys_TR_FromTPMPublic(context, Self.persistentStorageKey, &handle)
        if rc != 0, Self.base(rc) == Code.handle { return nil }
        try check(rc, "TR_FromTPMPublic")
        return handle
    }

    /// Keeps `primary` at ``persistentStorageKey``, free until now, as
    /// systemd-tpm2-setup does at boot, when the owner hierarchy's auth is
    /// empty (as most machines leave it; a set one is not tried). Best
    /// effort: without it the key is made again at every use.
    private func makePersistent(_ primary: UInt32) {
        var data: UnsafeMutablePointer<TPMS_CAPABILITY_DATA>?
        guard CTSS_Esys_GetCapability(context, Code.tpmProperties, Code.permanent, 1, &data) == 0, let data else {
            return
        }
        let ownerAuthSet = TPMObjects.property(data, Code.permanent) & Code.ownerAuthSet != 0
        CTSS_Esys_Free(data)
        guard !ownerAuthSet else { return }
        var persistent: UInt32 = 0
        if CTSS_Esys_EvictControl(context, primary, Self.persistentStorageKey, &persistent) == 0 { forget(persistent) }
    }

    /// An HMAC session, SHA-256, salted with `salt` (its secret sent
    /// encrypted to that key; nil: unsalted). With `sessionDecrypt` and
    /// `sessionEncrypt` the first parameter of each command and response is
    /// encrypted with AES-128-CFB: a passcode-derived auth, a secret being
    /// sealed or unsealed never cross the bus to the TPM in the clear.
    /// Unsalted, it still proves knowledge of an entity's auth without
    /// sending it.
    private func startSession(salt: UInt32?, attributes: UInt8) throws(TPMError) -> UInt32 {
        var symmetric = TPMT_SYM_DEF()
        symmetric.algorithm = TPMAlgorithm.aes
        symmetric.keyBits.aes = 128
        symmetric.mode.aes = TPMAlgorithm.cfb
        var session: UInt32 = 0
        try check(
            CTSS_Esys_StartAuthSession(context, salt ?? Code.noHandle, &symmetric, &session), "StartAuthSession")
        let set = CTSS_Esys_TRSess_SetAttributes(context, session, attributes, 0xFF)
        guard set == 0 else {
            _ = CTSS_Esys_FlushContext(context, session)
            try check(set, "TRSess_SetAttributes")
            return 0
        }
        return session
    }

    /// The TPM name of a loaded object or NV index (nameAlg | digest of its public area).
    private func name(of handle: UInt32) throws(TPMError) -> [UInt8] {
        var name: UnsafeMutablePointer<TPM2B_NAME>?
        try check(CTSS_Esys_TR_GetName(context, handle, &name), "TR_GetName")
        guard let name else { throw .failed("TR_GetName", 0) }
        defer { CTSS_Esys_Free(name) }
        return withUnsafeBytes(of: name.pointee.name) { Array($0.prefix(Int(name.pointee.size))) }
    }

    /// Seals `secret` (at most 128 bytes) so that only this TPM, given
    /// `auth` (at most 32 bytes), unseals it; returns the blob to keep.
    /// `guarded`: wrong auths count towards the TPM's dictionary-attack
    /// lockout, during which it is refused (for an auth that can be
    /// guessed); otherwise usable in a lockout (for an empty auth).
    public func seal(_ secret: SecureBytes, auth: SecureBytes, guarded: Bool = true) throws(TPMError) -> [UInt8] {
        guard var sensitive = TPMObjects.sensitive(data: secret, auth: auth) else { throw .failed("Create", 0) }
        // The secret and its auth, as they were handed over, are not kept.
        defer { TPMObjects.wipe(&sensitive) }
        var template = TPMObjects.sealedObject(counted: guarded)
        var outside = TPM2B_DATA()
        var pcrs = TPML_PCR_SELECTION()
        return try withPrimaryAndSession { (primary, session) throws(TPMError) in
            var sealedPrivate: UnsafeMutablePointer<TPM2B_PRIVATE>?
            var sealedPublic: UnsafeMutablePointer<TPM2B_PUBLIC>?
            try check(
                CTSS_Esys_Create(
                    context, primary, session, &sensitive, &template, &outside, &pcrs, &sealedPrivate, &sealedPublic),
                "Create")
            defer {
                CTSS_Esys_Free(sealedPrivate)
                CTSS_Esys_Free(sealedPublic)
            }
            guard let sealedPrivate, let sealedPublic,
                let blob = TPMObjects.blob(public: sealedPublic, private: sealedPrivate)
            else { throw .failed("Create", 0) }
            return blob
        }
    }

    /// The secret `blob` holds, given the `auth` it was sealed with. A wrong
    /// auth is ``TPMError/authFailed`` and counts against the TPM's lockout.
    public func unseal(_ blob: [UInt8], auth: SecureBytes) throws(TPMError) -> SecureBytes {
        try withPrimaryAndSession { (primary, session) throws(TPMError) in
            var object: UInt32 = 0
            // A blob that is not exactly a public and a private part was cut or changed.
            guard var parts = TPMObjects.parts(of: blob) else { throw .notThisTPM }
            let loaded = CTSS_Esys_Load(context, primary, &parts.private, &parts.public, &object)
            guard loaded == 0 else {
                // A blob made under another storage seed fails its integrity check.
                let code = Self.base(loaded)
                if code == Code.integrity || code == Code.size || loaded & 0xFF0000 != 0 { throw .notThisTPM }
                try check(loaded, "Load")
                throw .notThisTPM
            }
            defer { _ = CTSS_Esys_FlushContext(context, object) }
            var data: UnsafeMutablePointer<TPM2B_SENSITIVE_DATA>?
            try withAuth(object, auth) { () throws(TPMError) in
                try check(CTSS_Esys_Unseal(context, object, session, &data), "Unseal")
            }
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

    /// The TPM's dictionary-attack state (TPM 2.0 Part 1, 19.8): failures
    /// counted, the most it allows before lockout, the seconds after which
    /// it forgets one, and whether its lockout auth was ever set (if not,
    /// anyone who reaches it can clear the count or stop the counting).
    public func lockout() throws(TPMError) -> TPMLockoutState {
        var data: UnsafeMutablePointer<TPMS_CAPABILITY_DATA>?
        let count = Code.lockoutRecovery - Code.permanent + 1
        try check(CTSS_Esys_GetCapability(context, Code.tpmProperties, Code.permanent, count, &data), "GetCapability")
        guard let data else { throw .failed("GetCapability", 0) }
        defer { CTSS_Esys_Free(data) }
        return TPMLockoutState(
            failures: TPMObjects.property(data, Code.lockoutCounter),
            maximum: TPMObjects.property(data, Code.maxAuthFail),
            recoverySeconds: TPMObjects.property(data, Code.lockoutInterval),
            lockoutAuthSet: TPMObjects.property(data, Code.permanent) & Code.lockoutAuthSet != 0)
    }

    // MARK: The lockout hierarchy

    /// TPM2_HierarchyChangeAuth of the lockout hierarchy, from `current`
    /// (proven in the session's HMAC) to `new` (sent encrypted, in a
    /// session salted with the storage key).
    public func changeLockoutAuth(from current: SecureBytes, to new: SecureBytes) throws(TPMError) {
        var value = try Self.authValue(new, "HierarchyChangeAuth")
        defer { withUnsafeMutableBytes(of: &value) { _ = $0.initializeMemory(as: UInt8.self, repeating: 0) } }
        try withPrimaryAndSession { (_, session) throws(TPMError) in
            try withAuth(Code.lockoutHierarchy, current) { () throws(TPMError) in
                try check(
                    CTSS_Esys_HierarchyChangeAuth(context, Code.lockoutHierarchy, session, &value),
                    "HierarchyChangeAuth")
            }
        }
    }

    /// TPM2_DictionaryAttackParameters, authorized by the lockout auth.
    public func setLockoutParameters(
        auth: SecureBytes, maximum: UInt32, recoverySeconds: UInt32, lockoutRecoverySeconds: UInt32
    ) throws(TPMError) {
        try authorized(Code.lockoutHierarchy, auth) { session throws(TPMError) in
            try check(
                CTSS_Esys_DictionaryAttackParameters(
                    context, session, maximum, recoverySeconds, lockoutRecoverySeconds), "DictionaryAttackParameters")
        }
    }

    /// TPM2_DictionaryAttackLockReset: the count of failures back to 0.
    public func resetLockoutCount(auth: SecureBytes) throws(TPMError) {
        try authorized(Code.lockoutHierarchy, auth) { session throws(TPMError) in
            try check(CTSS_Esys_DictionaryAttackLockReset(context, session), "DictionaryAttackLockReset")
        }
    }

    /// TPM2_Clear under the platform hierarchy (empty auth: a software TPM;
    /// firmware sets its own on a real one): a new storage seed, every
    /// sealed object and NV index gone, what a user's "clear TPM" in the
    /// firmware setup does. For the tests of recovery.
    package func clear() throws(TPMError) {
        try check(CTSS_Esys_Clear(context), "Clear")
    }

    /// Defines a monotonic counter at NV `index` (0x01xxxxxx, owner
    /// hierarchy, whose auth is empty as most machines leave it) that only
    /// `auth` reads and increments (``NVAttribute/counter``), increments it
    /// once, so that it reads 1 or more (the TPM starts a new counter at the
    /// highest count any counter of it ever had: it never goes back), and
    /// returns its name, which binds its attributes and auth policy.
    public func defineCounter(at index: UInt32, auth: SecureBytes) throws(TPMError) -> [UInt8] {
        var handle: UInt32 = 0
        var info = TPM2B_NV_PUBLIC()
        info.nvPublic.nvIndex = index
        info.nvPublic.nameAlg = TPMAlgorithm.sha256
        info.nvPublic.attributes = NVAttribute.counter
        info.nvPublic.dataSize = 8
        var value = try Self.authValue(auth, "NV_DefineSpace")
        defer { withUnsafeMutableBytes(of: &value) { _ = $0.initializeMemory(as: UInt8.self, repeating: 0) } }
        // The auth is the first parameter: it crosses the bus encrypted.
        try withPrimaryAndSession { (_, session) throws(TPMError) in
            try check(CTSS_Esys_NV_DefineSpace(context, session, &value, &info, &handle), "NV_DefineSpace")
        }
        defer { forget(handle) }
        try authorized(handle, auth) { session throws(TPMError) in
            try check(CTSS_Esys_NV_Increment(context, handle, session), "NV_Increment")
        }
        return try withHandle(of: index) { (written) throws(TPMError) in try name(of: written) }
    }

    /// Adds one to `counter` (one authorized command: its new value is not
    /// read back, each such command costs a TPM's HMAC work).
    public func increment(_ counter: CounterReference) throws(TPMError) {
        try withVerified(counter) { handle throws(TPMError) in
            try authorized(handle, counter.auth) { session throws(TPMError) in
                try check(CTSS_Esys_NV_Increment(context, handle, session), "NV_Increment")
            }
        }
    }

    /// The value of `counter`.
    public func value(of counter: CounterReference) throws(TPMError) -> UInt64 {
        try withVerified(counter) { handle throws(TPMError) in try read(handle, counter.auth) }
    }

    /// Frees `counter`'s index (owner hierarchy), when it is still that counter.
    public func undefine(_ counter: CounterReference) throws(TPMError) {
        try withVerified(counter) { handle throws(TPMError) in
            try check(CTSS_Esys_NV_UndefineSpace(context, handle), "NV_UndefineSpace")
        }
    }

    /// Runs `body` with the ESAPI handle of NV `index`, closed after (a
    /// boot's connection serves several uses: what one learns of an index
    /// is not kept for the next); ``TPMError/counterMissing`` when none is
    /// defined there.
    private func withHandle<R>(of index: UInt32, _ body: (UInt32) throws(TPMError) -> R) throws(TPMError) -> R {
        var handle: UInt32 = 0
        let rc = CTSS_Esys_TR_FromTPMPublic(context, index, &handle)
        if rc != 0, Self.base(rc) == Code.handle { throw .counterMissing }
        try check(rc, "TR_FromTPMPublic")
        defer { forget(handle) }
        return try body(handle)
    }

    /// Forgets an ESAPI handle of an NV index or a persistent key (it stays
    /// on the TPM; an index undefined meanwhile has no handle left to forget).
    private func forget(_ handle: UInt32) {
        var handle = handle
        _ = CTSS_Esys_TR_Close(context, &handle)
    }

    /// The handle of `counter`'s index once it is checked to be that
    /// counter: the name recorded when it was made (which covers its type,
    /// attributes and auth policy), or, for a counter recorded without one,
    /// at least a counter (an ordinary index can be written back to any
    /// value; a counter only goes up).
    /// Whether `counter`'s index holds it still (its NV name), whoever reads it.
    public func holds(_ counter: CounterReference) -> Bool {
        (try? withVerified(counter) { _ throws(TPMError) in }) != nil
    }

    private func withVerified<R>(_ counter: CounterReference, _ body: (UInt32) throws(TPMError) -> R)
        throws(TPMError) -> R
    {
        try withHandle(of: counter.index) { handle throws(TPMError) in
            try verify(handle, is: counter)
            return try body(handle)
        }
    }

    private func verify(_ handle: UInt32, is counter: CounterReference) throws(TPMError) {
        if let expected = counter.name {
            guard try name(of: handle) == expected else { throw .counterReplaced }
        } else {
            var info: UnsafeMutablePointer<TPM2B_NV_PUBLIC>?
            var name: UnsafeMutablePointer<TPM2B_NAME>?
            try check(CTSS_Esys_NV_ReadPublic(context, handle, &info, &name), "NV_ReadPublic")
            defer {
                CTSS_Esys_Free(info)
                CTSS_Esys_Free(name)
            }
            guard let info, info.pointee.nvPublic.attributes & NVAttribute.typeMask == NVAttribute.counterType,
                info.pointee.nvPublic.dataSize == 8
            else { throw .counterReplaced }
        }
    }

    /// `auth` as a TPM2B_AUTH (the caller zeroes it after use).
    private static func authValue(_ auth: SecureBytes, _ call: String) throws(TPMError) -> TPM2B_AUTH {
        var value = TPM2B_AUTH()
        guard auth.count <= MemoryLayout.size(ofValue: value.buffer) else { throw .failed(call, 0) }
        value.size = UInt16(auth.count)
        withUnsafeMutableBytes(of: &value.buffer) { buffer in
            auth.withUnsafeBytes { buffer.copyMemory(from: $0) }
        }
        return value
    }

    /// Runs `body` with `auth` set on `handle`, then set back to empty: the
    /// connection outlives the command, and the copy ESAPI keeps of an auth
    /// (a passcode's, the lockout hierarchy's) does not.
    private func withAuth<R>(_ handle: UInt32, _ auth: SecureBytes, _ body: () throws(TPMError) -> R)
        throws(TPMError) -> R
    {
        var value = try Self.authValue(auth, "TR_SetAuth")
        defer { TPMObjects.wipe(&value) }
        try check(CTSS_Esys_TR_SetAuth(context, handle, &value), "TR_SetAuth")
        defer {
            var empty = TPM2B_AUTH()
            _ = CTSS_Esys_TR_SetAuth(context, handle, &empty)
        }
        return try body()
    }

    /// Runs `body` with the session that authorizes `handle` with `auth`:
    /// an unsalted HMAC session (the auth proven, never sent), or a password
    /// session for an empty auth.
    private func authorized<R>(_ handle: UInt32, _ auth: SecureBytes?, _ body: (UInt32) throws(TPMError) -> R)
        throws(TPMError) -> R
    {
        guard let auth, auth.count > 0 else { return try body(Code.passwordSession) }
        return try withAuth(handle, auth) { () throws(TPMError) in
            if let shared = sharedSession {
                // Parameter encryption needs a sized buffer first (Part 1,
                // 21.1): NV_Read's and NV_Increment's are not; nothing secret crosses.
                try check(
                    CTSS_Esys_TRSess_SetAttributes(context, shared, Code.sessionContinue, 0xFF), "TRSess_SetAttributes")
                defer { _ = CTSS_Esys_TRSess_SetAttributes(context, shared, Self.saltedAttributes, 0xFF) }
                return try body(shared)
            }
            let session = try startSession(salt: nil, attributes: Code.sessionContinue)
            defer { _ = CTSS_Esys_FlushContext(context, session) }
            return try body(session)
        }
    }

    private func read(_ handle: UInt32, _ auth: SecureBytes?) throws(TPMError) -> UInt64 {
        try authorized(handle, auth) { session throws(TPMError) in
            var data: UnsafeMutablePointer<TPM2B_MAX_NV_BUFFER>?
            try check(CTSS_Esys_NV_Read(context, handle, session, 8, &data), "NV_Read")
            guard let data else { throw .failed("NV_Read", 0) }
            defer { CTSS_Esys_Free(data) }
            return TPMObjects.counterValue(data)
        }
    }
}
