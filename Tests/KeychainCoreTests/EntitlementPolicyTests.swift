import Synchronization
import Testing
@testable import KeychainCore

/// Entitlement policies in the core: who a rule admits, how grants and
/// revocations are authorised and kept, and what tampering does.
@Suite struct EntitlementPolicyTests {
    static let digestA = [UInt8](repeating: 0xa1, count: ExecutableDigest.size)
    static let digestB = [UInt8](repeating: 0xb2, count: ExecutableDigest.size)
    static let ruleA = EntitlementRule(executable: "/usr/bin/app-a", digest: digestA)

    static func program(_ executable: String, _ digest: [UInt8], unit: String? = nil, uid: UInt32 = 1000)
        -> ProgramIdentity
    {
        ProgramIdentity(program: .executable(executable), digest: digest, unit: unit, uid: uid)
    }

    @Test func aRuleAdmitsOnlyItsExecutableWithItsDigestInItsUnitAsItsUid() {
        let a = Self.program("/usr/bin/app-a", Self.digestA, unit: "a.service")
        #expect(Self.ruleA.admits(a))
        #expect(!Self.ruleA.admits(Self.program("/usr/bin/app-a", Self.digestB)))  // replaced binary
        #expect(!Self.ruleA.admits(Self.program("/tmp/app-a", Self.digestA)))  // a copy elsewhere
        let inUnit = EntitlementRule(executable: "/usr/bin/app-a", digest: Self.digestA, unit: "a.service", uid: 1000)
        #expect(inUnit.admits(a))
        #expect(!inUnit.admits(Self.program("/usr/bin/app-a", Self.digestA, unit: "b.service")))
        #expect(!inUnit.admits(Self.program("/usr/bin/app-a", Self.digestA, unit: nil)))
        #expect(!inUnit.admits(Self.program("/usr/bin/app-a", Self.digestA, unit: "a.service", uid: 0)))
    }

    /// Paths are bytes to the kernel: a copy of the entitled binary at a
    /// path that only looks the same (`e` + U+0301 for `é`, K for the
    /// Kelvin sign) is a copy elsewhere, though Swift calls the strings equal.
    @Test func aCopyAtACanonicallyEquivalentPathIsNotAdmitted() {
        for (granted, copy) in [("/opt/caf\u{E9}/app", "/opt/cafe\u{301}/app"), ("/opt/Kit/app", "/opt/\u{212A}it/app")]
        {
            #expect(granted == copy)  // what String's == says
            let rule = EntitlementRule(executable: granted, digest: Self.digestA, unit: "a.service")
            #expect(rule.admits(Self.program(granted, Self.digestA, unit: "a.service")))
            #expect(!rule.admits(Self.program(copy, Self.digestA, unit: "a.service")))
            #expect(
                !rule.matches(executable: copy, unit: nil, uid: nil)
                    && rule.matches(executable: granted, unit: nil, uid: nil))
            // A grant for the look-alike is another rule, not a replacement of this one.
            let other = EntitlementRule(executable: copy, digest: Self.digestB, unit: "a.service")
            #expect(!other.namesSameProgram(as: rule) && rule.namesSameProgram(as: rule))
        }
    }

    @Test func aGroupWithoutPolicyAdmitsEveryoneAndAPolicedOneOnlyItsPrograms() throws {
        let keychain = try TemporaryKeychain()
        let device = try keychain.device()
        let a = Self.program("/usr/bin/app-a", Self.digestA), b = Self.program("/usr/bin/app-b", Self.digestB)
        try device.checkEntitlement("shared") { b }
        try device.checkEntitlement("shared") { nil }
        try device.grant(Self.ruleA, toGroup: "shared", passcode: secure(TemporaryKeychain.passcode))
        try device.checkEntitlement("shared") { a }
        expectError(.missingEntitlement) { try device.checkEntitlement("shared") { b } }
        // A caller that cannot be identified is never admitted to a policed group.
        expectError(.missingEntitlement) { try device.checkEntitlement("shared") { nil } }
        try device.checkEntitlement("default") { b }
    }

    @Test func grantsAndRevocationsNeedThePasscodeAndCountWrongOnes() throws {
        let keychain = try TemporaryKeychain()
        let device = try keychain.device(policy: LockoutPolicy(delays: [0, 60]))
        expectError(.authFailed) { try device.grant(Self.ruleA, toGroup: "shared", passcode: secure("wrong")) }
        expectError(.authFailed) { try device.grant(Self.ruleA, toGroup: "shared", passcode: nil) }
        #expect(device.entitlementPolicies.isEmpty)
        #expect(device.status.failedAttempts == 2)
        // Locked out: even the right passcode is refused until the delay passes.
        expectError(.authFailed) {
            try device.grant(Self.ruleA, toGroup: "shared", passcode: secure(TemporaryKeychain.passcode))
        }
        keychain.clock.advance(61)
        try device.grant(Self.ruleA, toGroup: "shared", passcode: secure(TemporaryKeychain.passcode))
        #expect(device.status.failedAttempts == 0)
        expectError(.authFailed) {
            try device.revoke(
                group: "shared", executable: nil, unit: nil, uid: nil, all: true, passcode: secure("wrong"))
        }
        #expect(device.entitlementRules(forGroup: "shared") == [Self.ruleA])
    }

    @Test func thePolicySurvivesARestartAndRevokingTheLastRuleAdmitsNoOne() throws {
        let keychain = try TemporaryKeychain()
        let passcode = try secure(TemporaryKeychain.passcode)
        let ruleB = EntitlementRule(executable: "/usr/bin/app-b", digest: Self.digestB, unit: "b.service", uid: 1000)
        do {
            let device = try keychain.device()
            try device.grant(Self.ruleA, toGroup: "shared", passcode: passcode)
            try device.grant(ruleB, toGroup: "shared", passcode: passcode)
            // Granting the same program again (a rebuilt binary) replaces its digest.
            try device.grant(
                EntitlementRule(executable: "/usr/bin/app-a", digest: Self.digestB), toGroup: "shared",
                passcode: passcode)
        }
        let device = try keychain.device()
        #expect(
            device.entitlementRules(forGroup: "shared")
                == [ruleB, EntitlementRule(executable: "/usr/bin/app-a", digest: Self.digestB)])
        expectError(.itemNotFound) {
            try device.revoke(
                group: "shared", executable: "/usr/bin/none", unit: nil, uid: nil, all: false, passcode: passcode)
        }
        #expect(
            try device.revoke(
                group: "shared", executable: "/usr/bin/app-a", unit: nil, uid: nil, all: false,
                passcode: passcode) == 1)
        #expect(
            try device.revoke(
                group: "shared", executable: nil, unit: "b.service", uid: nil, all: false,
                passcode: passcode) == 1)
        #expect(device.entitlementRules(forGroup: "shared") == [])
        expectError(.missingEntitlement) {
            try device.checkEntitlement("shared") { Self.program("/usr/bin/app-b", Self.digestB) }
        }
        #expect(
            try device.revoke(group: "shared", executable: nil, unit: nil, uid: nil, all: true, passcode: passcode) == 0
        )
        #expect(device.entitlementRules(forGroup: "shared") == nil)
    }

    @Test func badRulesAreRefusedAndChangeNothing() throws {
        let keychain = try TemporaryKeychain()
        let device = try keychain.device()
        let passcode = try secure(TemporaryKeychain.passcode)
        expectError(.param) { try device.grant(Self.ruleA, toGroup: "a/b", passcode: passcode) }
        expectError(.param) {
            try device.grant(
                EntitlementRule(executable: "relative", digest: Self.digestA), toGroup: "g", passcode: passcode)
        }
        expectError(.param) {
            try device.grant(EntitlementRule(executable: "/x", digest: [1, 2]), toGroup: "g", passcode: passcode)
        }
        #expect(device.entitlementPolicies.isEmpty)
    }

    @Test func observersHearOfPolicyChanges() throws {
        let keychain = try TemporaryKeychain()
        let device = try keychain.device()
        let heard = Heard()
        device.addObserver { heard.append($0) }
        try device.grant(Self.ruleA, toGroup: "shared", passcode: secure(TemporaryKeychain.passcode))
        #expect(heard.events == [.entitlementsChanged(group: "shared")])
    }

    // MARK: Tampering

    @Test(arguments: [
        changingByte(6, ofMetaRecord: "entitlements"),
        "DELETE FROM meta WHERE key = 'entitlements'",
        // The MAC is over the record only: another record's bytes do not pass.
        "UPDATE meta SET value = (SELECT value FROM meta WHERE key = 'lockout') WHERE key = 'entitlements'"
    ])
    func aTamperedOrMissingPolicyStopsTheBoot(_ sql: String) throws {
        let keychain = try TemporaryKeychain()
        try keychain.device().grant(Self.ruleA, toGroup: "shared", passcode: secure(TemporaryKeychain.passcode))
        try keychain.withRawDatabase { try $0.execute(sql) }
        expectError(.decode) { try keychain.device() }
    }

    @Test func aKeychainOfAnEarlierFormatGetsAnEmptyPolicyOnceAndRequiresItFromThenOn() throws {
        let keychain = try TemporaryKeychain(copying: GoldenKeychainTests.fixture("golden-v2"))
        #expect(try keychain.device().entitlementPolicies.isEmpty)  // boots once: upgraded
        try keychain.withRawDatabase { try $0.execute("DELETE FROM meta WHERE key = 'entitlements'") }
        expectError(.decode) { try keychain.device() }
    }

    @Test func recordsRoundTripAndRejectTrailingBytes() throws {
        let secret = DeviceSecret(secret: try SecureBytes([UInt8](repeating: 3, count: Crypto.keySize)))
        var policy = EntitlementPolicy()
        policy.groups = [
            "a": [Self.ruleA, EntitlementRule(executable: "/b", digest: Self.digestB, unit: "u.scope", uid: 7)],
            "empty": []
        ]
        let record = policy.encoded(secret: secret)
        #expect(try EntitlementPolicy(decoding: record, secret: secret) == policy)
        let body = Array(record.dropLast(Crypto.macSize)) + [0]
        expectError(.decode) {
            try EntitlementPolicy(decoding: body + secret.mac("kcfs-entitlements-v1", body), secret: secret)
        }
        #expect(record.first == 1)  // no rule needs flags: still version 1, bootable by older builds
    }

    /// A rule that allows JIT code keeps the flag across a reboot (record
    /// version 2, only then); the flag alone decides about anonymous code.
    @Test func aRuleAllowingJITIsKeptAndAdmitsAnonymousCodeOnlyWhenAllowed() throws {
        let secret = DeviceSecret(secret: try SecureBytes([UInt8](repeating: 3, count: Crypto.keySize)))
        var policy = EntitlementPolicy()
        let jit = EntitlementRule(executable: "/usr/bin/node", digest: Self.digestB, allowsJIT: true)
        policy.groups = ["a": [Self.ruleA, jit]]
        let record = policy.encoded(secret: secret)
        #expect(record.first == 2)
        #expect(try EntitlementPolicy(decoding: record, secret: secret) == policy)
        // A version 2 record without a JIT rule is not the one encoding of its policy.
        var plain = Array(record.dropLast(Crypto.macSize))
        plain[plain.count - 1] = 0  // the last rule's flags
        expectError(.decode) {
            try EntitlementPolicy(decoding: plain + secret.mac("kcfs-entitlements-v1", plain), secret: secret)
        }

        var node = ProgramIdentity(
            program: .executable("/usr/bin/node"), digest: Self.digestB, unit: nil, uid: 1000, runsAnonymousCode: true)
        #expect(jit.admits(node))
        #expect(!EntitlementRule(executable: "/usr/bin/node", digest: Self.digestB).admits(node))
        node.distrust = "it is being traced by process 1"
        #expect(!jit.admits(node))  // JIT allows anonymous code, nothing else
        #expect(node.doubt == "it is being traced by process 1")
    }
}

private final class Heard: @unchecked Sendable {
    private let lock = Mutex<[DeviceEvent]>([])
    func append(_ event: DeviceEvent) { lock.withLock { $0.append(event) } }
    var events: [DeviceEvent] { lock.withLock { $0 } }
}
