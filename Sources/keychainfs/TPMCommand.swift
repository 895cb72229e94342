import ArgumentParser
import KeychainCore
import KeychainProtocol
import KeychainTPM
#if canImport(Glibc)
import Glibc
#endif

/// `keychainfs tpm take-lockout|release-lockout|reset-lockout`
/// (docs/SECURITY.md, "Bound to this machine, against whoever holds the files
/// and the TPM"): root takes the TPM's lockout hierarchy, so that nobody else
/// who reaches the TPM can reset its count of wrong passcodes or switch it off
/// (``TPMLockoutHierarchy``).
struct TPMCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tpm",
        abstract: "Take the TPM's lockout hierarchy, so that its limit on passcode guesses holds.",
        subcommands: [TakeLockout.self, ReleaseLockout.self, ResetLockout.self])

    /// Where the sealed lockout auth is kept: root's by default, beside the service's keychains.
    struct Place: ParsableArguments {
        @Option(help: "Where the sealed lockout auth is kept (default: /var/lib/keychainfs, root's).")
        var stateDirectory = ServicePaths.defaultStateDirectory
    }

    struct TakeLockout: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "take-lockout",
            abstract: "Give the TPM's lockout hierarchy a random auth, kept sealed by the TPM.",
            discussion: """
                With an empty lockout auth (most machines), anyone who reaches the TPM can clear its count of \
                wrong passcodes or stop the counting. This sets a random one, sealed by the TPM into \
                STATE-DIRECTORY/tpm-lockout-auth (mode 0600), and first switches the counting on if it is off \
                (32 tries, one forgiven every 2 hours). `release-lockout` gives it back; clearing the TPM in the \
                firmware setup also does (and then every sealed keychain needs its recovery key).
                """)

        @OptionGroup var place: Place

        func run() throws {
            let state: TPMLockoutState
            do {
                state = try TPMLockoutHierarchy.take(stateDirectory: place.stateDirectory)
            } catch .badRequest {
                throw fail(
                    "the TPM's lockout auth is set already (by an earlier take-lockout, or by someone else); "
                        + "nothing was changed")
            } catch .tpmUnavailable {
                throw fail("no TPM answers ($TPM2TOOLS_TCTI, else /dev/tpmrm0); nothing was changed")
            } catch {
                throw fail("could not take the TPM's lockout hierarchy: \(error)")
            }
            print(
                "took the TPM's lockout hierarchy: \(state.maximum) tries, one forgiven every "
                    + "\(state.recoverySeconds) s; its auth is sealed in \(place.stateDirectory)/\(TPMLockoutHierarchy.fileName)"
            )
        }
    }

    struct ReleaseLockout: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "release-lockout", abstract: "Give the TPM's lockout hierarchy its empty auth back.")

        @OptionGroup var place: Place

        func run() throws {
            try TPMCommand.sealed(at: place) { () throws(KeychainError) in
                try TPMLockoutHierarchy.release(stateDirectory: place.stateDirectory)
            }
            print("the TPM's lockout auth is empty again")
        }
    }

    struct ResetLockout: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "reset-lockout",
            abstract: "Clear the TPM's count of wrong passcodes (for a user it locked out, once you know it is them).")

        @OptionGroup var place: Place

        func run() throws {
            try TPMCommand.sealed(at: place) { () throws(KeychainError) in
                try TPMLockoutHierarchy.resetCount(stateDirectory: place.stateDirectory)
            }
            print("the TPM's count of wrong passcodes is 0")
        }
    }

    /// Runs a command that needs the sealed auth, its refusals said.
    static func sealed(at place: Place, _ body: () throws(KeychainError) -> Void) throws {
        do {
            try body()
        } catch .noSuchKeychain {
            throw fail(
                "no sealed lockout auth in \(place.stateDirectory) (`keychainfs tpm take-lockout` was not run there)")
        } catch .tpmUnavailable {
            throw fail("no TPM answers ($TPM2TOOLS_TCTI, else /dev/tpmrm0); nothing was changed")
        } catch .tpmLockedOut {
            throw fail(
                "the TPM's lockout hierarchy is locked out itself, after a wrong lockout auth, for its lockout "
                    + "recovery time (24 hours once taken); nothing was changed")
        } catch {
            throw fail("the TPM refused: \(error); nothing was changed")
        }
    }
}
