import KeychainCore
import KeychainProtocol
import KeychainTPM
import KeychainFS
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The keychains of the service: one per user, in `STATE/UID/`, opened on
/// the user's first request and kept open (booted, locked) until the
/// service stops. Only the service's account can read the state
/// directory; a user reaches their keychain only through the service.
final class ServiceKeychains: Sendable {
    let stateDirectory: String
    private let open = Mutex<[uid_t: ServedKeychain]>([:])
    /// Creating a keychain stretches its passcode (a second or so): not
    /// under the lock every request takes.
    private let creating = Mutex(())
    private let mountEnded: @Sendable () -> Void
    let limits: ServiceLimits
    /// The TPM for users who cannot reach it themselves (docs/FORMAT.md, "The
    /// TPM through the service").
    private let broker: TPMBroker

    init(stateDirectory: String, limits: ServiceLimits, mountEnded: @escaping @Sendable () -> Void) {
        self.stateDirectory = stateDirectory
        self.limits = limits
        self.mountEnded = mountEnded
        broker = TPMBroker(stateDirectory: stateDirectory)
        Device.keepTPMGuessShares(with: broker)
    }

    /// The keychain directory of a user.
    func directory(of uid: uid_t) -> KeychainDirectory {
        KeychainDirectory(path: stateDirectory + "/" + String(uid))
    }

    /// The peer's keychain, opened now if it was not; nil when the user has
    /// none yet. Throws why an existing one cannot be opened.
    func keychain(of credentials: PeerCredentials) throws(MountError) -> ServedKeychain? {
        try open.withLock { (open) throws(MountError) -> ServedKeychain? in
            if let served = open[credentials.uid] { return served }
            let directory = directory(of: credentials.uid)
            guard directory.exists else { return nil }
            let served = try ServedKeychain(
                keychain: directory, owner: (credentials.uid, credentials.gid),
                serviceLimits: limits, mountEnded: mountEnded)
            served.manager.localDevice.countTPMGuesses(
                as: MachinePeople.person(of: credentials.uid) ?? credentials.uid)
            open[credentials.uid] = served
            return served
        }
    }

    /// The keychains open in the service: the user's (nil: everyone's).
    /// None is opened for this: one not open since the service started is
    /// locked anyway (a keychain boots locked).
    func opened(_ uid: uid_t?) -> [ServedKeychain] {
        open.withLock { open in uid.map { open[$0].map { [$0] } ?? [] } ?? Array(open.values) }
    }

    /// One request of a user: `create` makes their keychain; anything else
    /// goes to their keychain (`existing`, as the device process looked it
    /// up when the peer connected), which must exist. `passed` is as for
    /// ``ServedKeychain/answer(_:client:policedAtConnect:atConnect:passed:attachments:)``.
    func answer(
        _ request: DeviceRequest, from credentials: PeerCredentials, existing: Result<ServedKeychain?, MountError>,
        client: BorrowedDescriptor, policedAtConnect: Bool, atConnect: ProgramIdentity?,
        passed: inout FileDescriptor?, attachments: inout ReplyAttachments
    ) -> DeviceReply {
        switch request {
        case .process(.create(let passcode)):
            return create(for: credentials.uid, passcode: passcode)
        case .tpm(let tpmRequest):
            // A per-user device's, whether or not the user has a keychain here; its shares are a
            // person's, a subordinate uid's counted with its owner's (docs/SECURITY.md).
            guard let person = MachinePeople.person(of: credentials.uid) else {
                return .keychainError(
                    .missingEntitlement,
                    "uid \(credentials.uid) is no account of this machine, nor an account's subordinate uid: "
                        + "the TPM is not used for it")
            }
            return broker.answer(tpmRequest, uid: credentials.uid, person: person)
        case .mount(.mount), .mount(.unmount), .process(.stop):
            // The service mounts, unmounts and stops nothing on a user's word:
            // its account could mount over what only it can reach (another
            // user's keychain directory). The user mounts (`attach`) and unmounts.
            return .systemError(
                EPERM, "the keychainfs service mounts nothing itself: `keychainfs mount` makes the mount and passes it")
        case .sync:
            // git must run as the person, with their ssh agent and credential helpers: not as the service.
            return .systemError(
                EPERM,
                "the keychainfs service does not sync: sync runs in your own device (`keychainfs start`), "
                    + "where git runs as you (docs/SYNC.md)")
        case .item, .device, .policy, .mount(.attach), .file, .process(.ping), .process(.watch), .process(.serveBus):
            break
        }
        switch existing {
        case .failure(let error):
            return .systemError(EIO, error.description)
        case .success(nil):
            if case .process(.ping) = request { return Done().reply }
            return .keychainError(
                .noSuchKeychain, "you have no keychain in the keychainfs service; create one with `keychainfs init`")
        case .success(let served?):
            return served.answer(
                request, client: client, policedAtConnect: policedAtConnect, atConnect: atConnect,
                passed: &passed, attachments: &attachments)
        }
    }

    private func create(for uid: uid_t, passcode: SecureBytes?) -> DeviceReply {
        creating.withLock { _ in
            let directory = directory(of: uid)
            if directory.exists {
                return .keychainError(.duplicateKeychain, "you have a keychain in the keychainfs service already")
            }
            do throws(KeychainError) {
                // Sealed by the TPM when the service's account reaches one
                // (the `tss` group's /dev/tpmrm0): the recovery key goes to
                // the user who created it, once, as a secret value.
                let recovery = try Device.createKeychain(at: directory, passcode: passcode)
                return CreatedKeychain(recoveryKey: recovery?.formatted()).reply
            } catch {
                return .keychainError(error, "cannot create your keychain in the service: \(error)")
            }
        }
    }

    /// The service stops: `.events` readers see their end, and a keychain
    /// with no mount folds its write-ahead log in. One with mounts is left
    /// as it is (their sessions end with the process; SQLite recovers its
    /// committed write-ahead log at the next open).
    func stop() {
        for served in open.withLock({ Array($0.values) }) {
            served.endEventStreams()
            if !served.hasMounts { served.manager.localDevice.shutDown() }
        }
    }
}
