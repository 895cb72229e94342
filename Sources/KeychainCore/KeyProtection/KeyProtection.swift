import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// How a keychain's device secret is kept (docs/SECURITY.md, "Keys sealed by
/// the TPM"), as `status` and `.control` say it.
public enum KeyProtection: String, Sendable, Equatable {
    /// Sealed by a TPM 2.0: the files alone open nothing, and every
    /// passcode guess goes through the TPM and its lockout.
    case tpm2
    /// Sealed by a TPM 2.0 that the keychainfs service reaches for a user
    /// who cannot (docs/FORMAT.md, "The TPM through the service"): as ``tpm2``,
    /// with every object and counter bound to the user's uid by the service.
    case tpm2Service = "tpm2-service"
    /// In a file of the keychain: a copy of the files can be guessed at
    /// offline, at Argon2id's pace.
    case file
}

extension KeyProtection {
    /// Why no TPM answers at the default place (`/dev/tpmrm0`), for a
    /// keychain kept in a file: none is there, or one is there that this
    /// user cannot reach (Debian gives it to root and group tss, mode 0660),
    /// which the service reaches for every user.
    public static func whyNoTPM(device: String = "/dev/tpmrm0") -> String {
        guard access(device, F_OK) == 0 else { return "this machine has none (\(device) is missing)" }
        guard access(device, R_OK | W_OK) == 0 else {
            return "this machine has one (\(device)), but you cannot reach it (only root and group tss can); "
                + "ask root to add you to group tss, or ask root for the keychainfs service (`systemctl enable --now keychainfs.socket`), "
                + "which seals keychains for every user"
        }
        return "\(device) does not answer"
    }

    /// Why a keychain sealed through the service was not sealed directly,
    /// in a few words: the user reaches no TPM of their own.
    public static func whyNotYours(device: String = "/dev/tpmrm0") -> String {
        guard access(device, F_OK) == 0 else { return "you reach no TPM yourself (\(device) is missing)" }
        return "you cannot reach \(device) yourself (only root and group tss can)"
    }
}

/// What `init` (and `passcode --tpm`) does about a TPM.
public enum TPMChoice: Sendable, Equatable {
    /// Seal to the TPM when one answers, else keep the device secret in a file.
    case whenPresent
    /// Seal to the TPM; fail when none answers.
    case required
    /// Keep the device secret in a file (`--no-tpm`).
    case declined
}
