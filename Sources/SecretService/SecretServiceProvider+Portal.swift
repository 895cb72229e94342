import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// The Secret portal's backend, `org.freedesktop.impl.portal.Secret`: the
/// master secret that xdg-desktop-portal hands a sandboxed app's libsecret,
/// which keeps the app's passwords in a file of its own, encrypted with it.
/// Each app's secret is an item of the `portal` group, named after the app id
/// and owned by the app (``SandboxApp``), so that any other program that reads
/// it through the mount, the command line or the bus is asked first.
/// docs/SECRET-SERVICE.md, "Sandboxed apps".
extension SecretServiceProvider {
    static let portalInterface = "org.freedesktop.impl.portal.Secret"
    static let portalPath = "/org/freedesktop/portal/desktop"
    /// The access group of the apps' master secrets.
    static let portalGroup = "portal"
    /// The one program whose word about an app id counts: it reads the id
    /// from the sandbox of the app that asked (`/.flatpak-info`, the
    /// AppArmor label), as ``SandboxApps`` does. Any other caller could
    /// name any app.
    static let portalProgram = "/usr/libexec/xdg-desktop-portal"
    /// The size libsecret's file backend takes and nothing else (`PASSWORD_SIZE`).
    static let portalSecretSize = 64

    /// The portal's response codes (org.freedesktop.portal.Request): success, or "other".
    enum PortalResponse: UInt32 {
        case success = 0
        case failed = 2
    }

    /// `RetrieveSecret` ((osha{sv}) → (ua{sv})): writes the app's master
    /// secret to `sent` (the call's descriptor), made (64 random bytes) the first time.
    func retrieveSecret(_ call: BusCall, appID: String, fd sent: BorrowedDescriptor) throws(BusError) -> PortalReply {
        guard let fd = FileDescriptor(fcntl(sent.raw, F_DUPFD_CLOEXEC, 3)) else {
            return PortalReply(response: .failed)
        }
        guard let portal = callerIdentity(call), portal.distrust == nil,
            case .executable(let path) = portal.program, path == Self.portalProgram,
            PackageOwnership.package(of: path) != nil
        else {
            throw .accessDenied(
                "only \(Self.portalProgram), installed by its package, asks for an app's master secret")
        }
        let app = SandboxApp(portalAppID: appID)
        // A pipe or a socket only: a secret written to a file would stay in the page cache.
        var target = stat()
        guard let app, fstat(fd.raw, &target) == 0,
            target.st_mode & S_IFMT == S_IFIFO || target.st_mode & S_IFMT == S_IFSOCK
        else {
            return PortalReply(response: .failed)
        }
        guard let secret = portalSecret(of: app, for: call) else { return PortalReply(response: .failed) }
        let written = secret.withUnsafeBytes { bytes in (try? fd.borrowed.writeAll(bytes)) != nil }
        return PortalReply(response: written ? .success : .failed)
    }

    /// The master secret of `app`: its item, or a new one. Nil when the
    /// keychain is locked, or when the item there is not the app's (a
    /// program planted one before the app first asked: a secret somebody
    /// else knows is no secret, and it is left as it is).
    private func portalSecret(of app: SandboxApp, for call: BusCall) -> SecureBytes? {
        let owner = ProgramClaim(
            program: .app(app), digest: ExecutableDigest.of(bytes: Array(app.claimName.utf8)), jit: false)
        let identifier = app.claimName.split(separator: ":", maxSplits: 1).last.map(String.init) ?? app.claimName
        let group = Self.portalGroup
        switch outcome(.get(group: group, identifier: identifier), for: call) {
        case .success(let item):
            let value = item.value
            guard let details = (try? itemDetails(group, identifier, for: call)) ?? nil, details.owner == owner,
                value.count == Self.portalSecretSize
            else {
                Diagnostics.log("the master secret of \(app.described) is an item it does not own: not given")
                return nil
            }
            return value
        case .failure(.keychain(.itemNotFound, _)):
            // The group, made with the first app's secret (already there: a duplicate, and nothing changed).
            _ = outcome(.createGroup(group), for: call, audit: .failures)
            let secret = SecureBytes.random(count: Self.portalSecretSize)
            var details = ItemDetails(
                label: "Application key for \(app.described)", contentType: "application/octet-stream",
                attributes: ["app_id": identifier, "xdg:schema": Self.portalInterface])
            details.owner = owner
            let made = outcome(
                .set(group: group, identifier: identifier, value: secret, condition: .ifAbsent, details: details),
                for: call)
            switch made {
            case .success: return secret
            // Made meanwhile by another call of the same app: that one is the secret.
            case .failure(.keychain(.duplicateItem, _)): return portalSecret(of: app, for: call)
            case .failure(let refusal):
                Diagnostics.log("cannot keep the master secret of \(app.described): \(refusal.sentence)")
                return nil
            }
        case .failure:
            return nil
        }
    }
}
