@testable import KeychainCore
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// What names a sandboxed app (docs/SECRET-SERVICE.md, "Sandboxed apps"):
/// the app id of a `.flatpak-info` as flatpak writes it, a snap's AppArmor
/// label, and the claim an item keeps of either. A name that is not one of
/// theirs names no app.
@Suite struct SandboxAppTests {
    @Test func theAppIdComesFromTheApplicationGroupOnly() {
        let info = """
            [Instance]
            name=org.example.Other
            instance-id=1

            [Application]
            runtime=runtime/org.example.Platform/x86_64/1
            name = org.example.Mail\r
            """
        #expect(SandboxApps.flatpakAppID(fromInfo: info) == "org.example.Mail")
        #expect(SandboxApps.flatpakAppID(fromInfo: "[Runtime]\nname=org.example.Platform\n") == nil)
        #expect(SandboxApps.flatpakAppID(fromInfo: "") == nil)
    }

    @Test(arguments: [
        ("org.example.Mail", true), ("com.github.x-y_z.App", true), ("org.example", false),
        ("org..example.Mail", false), ("org.example.1Mail", false), ("org.example.Mäil", false),
        ("org.example.Mail/../x", false), (".org.example.Mail", false),
        ("org.example." + String(repeating: "a", count: 243), true),
        ("org.example." + String(repeating: "a", count: 244), false)
    ])
    func appIdsFollowFlatpaksRule(_ id: String, valid: Bool) {
        #expect(SandboxApps.isFlatpakAppID(Substring(id)) == valid)
        #expect(SandboxApps.flatpakAppID(fromInfo: "[Application]\nname=\(id)\n") == (valid ? id : nil))
    }

    @Test(
        arguments: [
            ("snap.firefox.firefox (enforce)\n", "firefox"), ("snap.my-app_beta.daemon (enforce)", "my-app_beta"),
            ("snap.firefox.hook.configure (enforce)", "firefox"), ("snap.firefox.firefox (complain)", nil),
            ("unconfined", nil), ("/usr/bin/man (enforce)", nil), ("snap.Firefox.firefox (enforce)", nil),
            ("snap.-x.app (enforce)", nil), ("snap.firefox (enforce)", nil)
        ] as [(String, String?)])
    func aSnapIsTheSnapItsEnforcedLabelNames(_ label: String, name: String?) {
        #expect(SandboxApps.snapName(fromLabel: label) == name)
    }

    @Test func aClaimOfAnAppReadsBackAndPassesTheDetailsBounds() throws {
        for app in [SandboxApp.flatpak("org.example.Mail"), .snap("firefox")] {
            #expect(SandboxApp(claimName: app.claimName) == app)
            let claim = ProgramClaim(
                program: .app(app), digest: ExecutableDigest.of(bytes: Array(app.claimName.utf8)), jit: false)
            #expect(claim.described == app.described)
            var details = ItemDetails(label: "x", attributes: [:])
            details.owner = claim
            try details.validate()
            #expect(try ItemDetails(decoding: details.encoded()) == details)
        }
        #expect(SandboxApp(claimName: "flatpak:org.example") == nil)
        #expect(SandboxApp(claimName: "/app/bin/mail") == nil)
        // Any other name that is no path is still refused.
        var details = ItemDetails(label: "x", attributes: [:])
        details.owner = ProgramClaim(program: .executable("mail"), digest: [UInt8](repeating: 1, count: 32))
        #expect(throws: KeychainError.param) { try details.validate() }
    }

    /// The test process runs in the host's mount namespace: no sandbox, whatever `/.flatpak-info` says.
    @Test func aProcessOnTheHostIsNoSandboxedApp() {
        #expect(SandboxApps.app(of: getpid()) == nil)
    }
}
