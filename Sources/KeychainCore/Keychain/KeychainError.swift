/// An error of the keychain core, carrying the OSStatus that Security.framework
/// uses for the same situation, so callers can tell "locked" from "absent".
public struct KeychainError: Error, RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The OSStatus value.
    public let rawValue: Int32

    /// Creates the error with an OSStatus value.
    public init(rawValue: Int32) { self.rawValue = rawValue }

    /// No item with that identifier in that group (errSecItemNotFound).
    public static let itemNotFound = KeychainError(rawValue: -25300)
    /// The item already exists (errSecDuplicateItem).
    public static let duplicateItem = KeychainError(rawValue: -25299)
    /// The class key is unavailable: locked, or before the first unlock (errSecInteractionNotAllowed).
    public static let interactionNotAllowed = KeychainError(rawValue: -25308)
    /// Wrong passcode, or an unlock attempt during a lockout (errSecAuthFailed).
    public static let authFailed = KeychainError(rawValue: -25293)
    /// Stored bytes failed authentication: tampering or corruption (errSecDecode).
    public static let decode = KeychainError(rawValue: -26275)
    /// An invalid name, group, class or value (errSecParam).
    public static let param = KeychainError(rawValue: -50)
    /// A name longer than 255 bytes (errSecParam; kept apart so it maps to ENAMETOOLONG).
    public static let nameTooLong = KeychainError(rawValue: -50_001)
    /// A value larger than ``ItemLimits/maximumValueSize`` (errSecParam; maps to EFBIG).
    public static let valueTooLarge = KeychainError(rawValue: -50_002)
    /// The operation is not valid in this state, e.g. removing a non-empty group (errSecBadReq).
    public static let badRequest = KeychainError(rawValue: -909)
    /// Reading or writing the store failed (errSecIO).
    public static let io = KeychainError(rawValue: -36)
    /// No keychain exists at that place (errSecNoSuchKeychain).
    public static let noSuchKeychain = KeychainError(rawValue: -25294)
    /// A keychain already exists at that place (errSecDuplicateKeychain).
    public static let duplicateKeychain = KeychainError(rawValue: -25296)
    /// No keychain is available: no keychainfs service answers (errSecNotAvailable).
    public static let notAvailable = KeychainError(rawValue: -25291)
    /// The keychain holds as many items, or bytes, as its quota allows: the
    /// service's share of one user (errSecDskFull, "the disk is full").
    public static let quotaExceeded = KeychainError(rawValue: -34)

    /// The calling program is not entitled to the item's access group
    /// (errSecMissingEntitlement, as Security.framework reports an app
    /// outside its `keychain-access-groups`).
    public static let missingEntitlement = KeychainError(rawValue: -34018)

    /// The OSStatus family the error belongs to: the refinements of errSecParam
    /// report -50, as Security.framework would.
    public var osStatus: Int32 {
        switch self {
        case .nameTooLong, .valueTooLarge: return KeychainError.param.rawValue
        case .keychainInUse: return KeychainError.badRequest.rawValue
        case .insecurePermissions, .tpmUnavailable, .tpmMismatch, .tpmStorageKeyChanged, .rollbackCounterGone:
            return KeychainError.io.rawValue
        case .diskFull: return KeychainError.quotaExceeded.rawValue  // errSecDskFull
        case .readOnly: return -61  // errSecWrPerm
        case .nameConflict: return KeychainError.duplicateItem.rawValue
        case .tpmLockedOut, .ownerDenied: return KeychainError.authFailed.rawValue
        case .rolledBack: return KeychainError.decode.rawValue
        default: return rawValue
        }
    }

    /// A sentence for users; never includes a value or passcode.
    public var description: String {
        switch self {
        case .itemNotFound: return "the item does not exist"
        case .duplicateItem: return "the item already exists"
        case .interactionNotAllowed: return "the keychain is locked for this item's protection class"
        case .authFailed: return "wrong passcode, or unlocking is locked out"
        case .decode: return "stored data failed authentication (tampered or corrupt)"
        case .param: return "invalid parameter"
        case .nameTooLong: return "name longer than 255 bytes"
        case .valueTooLarge: return "value larger than 1 MiB"
        case .badRequest: return "operation not valid in this state"
        case .io: return "the keychain store could not be read or written"
        case .noSuchKeychain: return "no keychain exists there"
        case .missingEntitlement: return "this program is not entitled to the access group"
        case .duplicateKeychain: return "a keychain already exists there"
        case .notAvailable: return "no keychainfs service answers"
        case .keychainInUse: return "another process holds this keychain's keys"
        case .insecurePermissions: return "the keychain's files are owned or readable by someone else"
        case .quotaExceeded: return "the keychain holds as many items or bytes as its quota allows; remove some first"
        case .tpmUnavailable:
            return "the keychain's keys are sealed by a TPM, and no TPM answers now (absent, or busy: try again)"
        case .tpmMismatch:
            return "the keychain's keys are sealed by another TPM (or by this one before it was cleared, "
                + "or for another user through the keychainfs service); "
                + "`keychainfs recover` opens it with its recovery key"
        case .tpmLockedOut:
            return "the TPM refuses passcode tries for now (its dictionary-attack lockout after wrong passcodes; "
                + "through the keychainfs service, your user's share of it)"
        case .rolledBack:
            return "the keychain is older than its TPM rollback counter: an older copy of its files was put back "
                + "(or the counter was moved); if you put them back yourself, "
                + "`keychainfs recover --accept-rollback` accepts them"
        case .tpmStorageKeyChanged:
            return "the TPM's storage key changed: another TPM (a new motherboard, a cleared TPM), or something "
                + "in between this machine and its TPM; nothing derived from the passcode was sent. If the TPM "
                + "changed, `keychainfs recover` opens the keychain with its recovery key"
        case .rollbackCounterGone:
            return "the keychain's TPM rollback counter is gone or was replaced (a TPM clear, or someone removed "
                + "it); `keychainfs recover` opens the keychain with its recovery key"
        case .ownerDenied:
            return "the item belongs to another program, and you did not allow this one (or could not be asked)"
        case .diskFull:
            return "no space left on the device holding the keychain: free some space there; nothing was changed"
        case .nameConflict:
            return "an item and a folder of items cannot have one name: the name holds items below it (NAME/...), "
                + "or a part of it before a / is an item"
        case .readOnly:
            return "the keychain's files cannot be written (a read-only filesystem or directory): it can be read, "
                + "and changes cannot be saved; nothing was changed"
        default: return "keychain error \(rawValue)"
        }
    }
}

extension KeychainError {
    /// Another process (or Device) holds this keychain's keys (errSecBadReq family).
    public static let keychainInUse = KeychainError(rawValue: -909_001)
    /// The keychain directory or a file in it is another user's, or others
    /// may read or write it (reported as errSecIO); ``KeychainDirectory/permissionProblem()`` says what to fix.
    public static let insecurePermissions = KeychainError(rawValue: -909_002)
    /// The keychain's device secret is sealed by a TPM and none answers (errSecIO family).
    public static let tpmUnavailable = KeychainError(rawValue: -909_003)
    /// The sealed device secret or passcode object does not load in the TPM
    /// that answers: another machine's, a cleared one (errSecIO family).
    public static let tpmMismatch = KeychainError(rawValue: -909_004)
    /// The TPM's dictionary-attack lockout refuses passcode tries for now
    /// (errSecAuthFailed family; nothing was tried, nothing counted).
    public static let tpmLockedOut = KeychainError(rawValue: -909_005)
    /// The keychain's state is older than its TPM rollback counter: an older
    /// copy of its files was put back (errSecDecode family).
    public static let rolledBack = KeychainError(rawValue: -909_006)
    /// The item belongs to another program (docs/SECRET-SERVICE.md, "Whose an
    /// item is"), and the person did not allow the caller: they denied it, or
    /// could not be asked (errSecAuthFailed family, as macOS answers a denied
    /// keychain prompt).
    public static let ownerDenied = KeychainError(rawValue: -909_007)
    /// The TPM answered with another storage primary key than the one the
    /// keychain was sealed under (docs/SECURITY.md, "Bound to this machine,
    /// against whoever holds the files and the TPM"): another TPM, or an
    /// interposer on its bus. Nothing passcode-derived was sent (errSecIO
    /// family).
    public static let tpmStorageKeyChanged = KeychainError(rawValue: -909_008)
    /// The keychain's rollback counter is not on the TPM, or another index
    /// took its place (docs/SECURITY.md, "Bound to this machine, against
    /// whoever holds the files and the TPM"): `recover` makes a new one
    /// (errSecIO family).
    public static let rollbackCounterGone = KeychainError(rawValue: -909_009)
    /// The filesystem holding the keychain is full (SQLITE_FULL, ENOSPC):
    /// the write was rolled back, nothing changed (errSecDskFull family).
    public static let diskFull = KeychainError(rawValue: -909_010)
    /// The keychain's files cannot be written (a read-only filesystem, a
    /// directory without write permission): its device reads and refuses
    /// every change (errSecWrPerm family; docs/FILESYSTEM.md, "A read-only
    /// keychain").
    public static let readOnly = KeychainError(rawValue: -909_011)
    /// A new item's name is a folder of other items (`a` beside `a/b`), or
    /// one of its folders is an item (`a/b` beside `a`): a mount could show
    /// only one of them (errSecDuplicateItem family; docs/FILESYSTEM.md,
    /// "Names with a /").
    public static let nameConflict = KeychainError(rawValue: -909_012)
}
