import Testing
@testable import KeychainCore

/// Every request and reply of the device's protocol survives its frame:
/// what a client sends is what the device reads, field for field, and the
/// other way round (docs/PROTOCOL.md).
@Suite struct DeviceProtocolTests {
    static func secret(_ text: String) -> SecureBytes { try! SecureBytes(text) }

    /// One request of every kind, with every optional field both present
    /// and absent somewhere, and distinct values in fields of one type (a
    /// swapped pair would not survive).
    static let requests: [DeviceRequest] = [
        .ping,
        .mount(group: nil, mountpoint: "/home/ada/kc"),
        .mount(group: "TEAMID.shared", mountpoint: "/home/ada/shared"),
        .unmount(mountpoint: "/home/ada/kc"),
        .changePasscode(old: secret("1234"), new: secret("56789")),
        .changePasscode(old: nil, new: nil),
        .backup(path: "/tmp/a.kcbak", password: secret("backup pw")),
        .backup(
            path: "/tmp/p.kcbak", password: secret("pw"), policedGroups: ["secure", "team.app"],
            passcode: secret("1234")),
        .restore(path: "/tmp/b.kcbak", password: secret("restore pw"), policy: .overwrite),
        .restore(path: "/tmp/d.kcbak", password: secret("restore pw"), policy: .overwrite, passcode: secret("1234")),
        .restore(path: "/tmp/c.kcbak", password: secret("pw"), policy: .keep),
        .get(group: "default", identifier: "github.com"),
        .set(
            group: "git", identifier: "host", value: secret("v\u{0}alue\n"), protectionClass: .alwaysThisDeviceOnly,
            condition: .ifAbsent),
        .set(group: "default", identifier: "empty", value: secret(""), protectionClass: nil, condition: .always),
        .set(
            group: "default", identifier: "Wi-Fi", value: secret("pw"), protectionClass: nil, condition: .always,
            details: ItemDetails(
                label: "Home Wi-Fi", contentType: "text/plain",
                attributes: ["xdg:schema": "org.example.Wifi", "ssid": "home", "note": ""], created: 5, modified: 7)),
        .details(group: "default", identifier: nil),
        .details(group: "default", identifier: "Wi-Fi"),
        .serveBus(address: "unix:path=/run/user/1000/bus", replace: false),
        .serveBus(address: "unix:path=/tmp/b", replace: true),
        .setDetails(
            group: "default", identifier: "Wi-Fi", details: ItemDetails(label: "renamed", attributes: ["ssid": "home"])),
        .remove(group: "default", identifier: "old"),
        .list(group: nil),
        .list(group: "default"),
        .info(group: "default", identifier: "size"),
        .setClass(group: "default", identifier: "k", protectionClass: .afterFirstUnlock),
        .rename(group: "default", from: "a", to: "b", replacing: true),
        .rename(group: "default", from: "b", to: "a", replacing: false),
        .createGroup("new.group"),
        .removeGroup("old.group"),
        .lock,
        .unlock(passcode: secret("1234")),
        .unlock(passcode: nil),
        .status,
        .sync,
        .grant(group: "secure", executable: "/usr/bin/app", unit: "app.service", uid: 1000, passcode: secret("1234")),
        .grant(group: "secure", executable: "/usr/bin/app", unit: nil, uid: nil, passcode: nil),
        .grant(
            group: "secure", executable: "/usr/bin/node", unit: nil, uid: nil, passcode: secret("1234"), allowJIT: true),
        .access(
            group: "default", identifier: "Chromium Safe Storage", executable: "/usr/bin/secret-tool", change: .add,
            passcode: secret("1234")),
        .access(group: "default", identifier: "token", executable: "/opt/app", change: .remove, passcode: nil),
        .access(
            group: "default", identifier: "imported", executable: "/usr/lib/chromium/chromium", change: .claim,
            passcode: nil),
        .apps(group: "default", open: true, passcode: secret("1234")),
        .apps(group: "default", open: nil, passcode: nil),
        .revoke(
            group: "secure", executable: "/usr/bin/app", unit: "app.service", uid: 1000, all: false,
            passcode: secret("1234")),
        .revoke(group: "secure", executable: nil, unit: nil, uid: nil, all: true, passcode: nil),
        .policy(group: nil),
        .policy(group: "secure"),
        .create(passcode: secret("98765")),
        .create(passcode: nil),
        .attach(group: nil, mountpoint: "/home/ada/kc"),
        .attach(group: "team.app", mountpoint: "/home/ada/team"),
        .auditLog(rotated: false),
        .auditLog(rotated: true),
        .verifyLog,
        .stop,
        .watch,
        .autoLock(after: 300, grace: nil),
        .autoLock(after: nil, grace: 0),
        .autoLock(after: nil, grace: nil)
    ]

    static let replies: [DeviceReply] = [
        .ok([]),
        .ok(["default", "whenUnlocked", "6", ""]),
        .keychainError(.interactionNotAllowed, "the device is locked"),
        .systemError(16, "mount point is busy"),
        .value(secret("s3cret"), .whenUnlockedThisDeviceOnly),
        .value(secret(""), .always)
    ]

    /// The body of a frame: after its u32 length.
    static func body<R>(of frame: SecureBytes, _ read: (UnsafeRawBufferPointer) throws(KeychainError) -> R) throws -> R
    {
        try frame.withUnsafeBytes { raw in
            #expect(Int(raw.load(as: UInt32.self).littleEndian) == raw.count - 4)
            return try read(UnsafeRawBufferPointer(rebasing: raw[4...]))
        }
    }

    /// A client of the socket names no owner (issue 31): whatever its
    /// details say of one is dropped before the device sees them.
    @Test func aSocketClientsOwnerIsDropped() throws {
        var details = ItemDetails(label: "Chromium Safe Storage", attributes: ["application": "chromium"])
        details.owner = ProgramClaim(executable: "/usr/lib/chromium/chromium", digest: Array(repeating: 1, count: 32))
        details.allowed = [ProgramClaim(executable: "/tmp/evil", digest: Array(repeating: 2, count: 32))]
        let planted = DeviceRequest.set(
            group: "default", identifier: "key", value: Self.secret("k"), condition: .ifAbsent, details: details)
        guard case .set(_, _, _, _, _, let kept?) = planted.withoutOwner else {
            Issue.record("no details left"); return
        }
        #expect(
            kept.owner == nil && kept.allowed.isEmpty && kept.label == details.label
                && kept.attributes == details.attributes)
        guard
            case .setDetails(_, _, let changed) = DeviceRequest.setDetails(
                group: "default", identifier: "key", details: details
            )
            .withoutOwner
        else { Issue.record("not a setDetails"); return }
        #expect(changed.owner == nil && changed.allowed.isEmpty)
    }

    @Test func everyRequestKindIsCoveredHere() throws {
        let kinds = try Set(Self.requests.map { request in try Self.body(of: try request.frame()) { $0[1] } })
        #expect(kinds == Set(DeviceRequest.Operation.allCases.map(\.rawValue)))
    }

    @Test(arguments: requests) func aRequestReadsBackAsItWasSent(_ request: DeviceRequest) throws {
        let parsed = try Self.body(of: try request.frame()) { body throws(KeychainError) in
            try DeviceRequest(body: body)
        }
        #expect(parsed == request)
    }

    @Test(arguments: replies) func aReplyReadsBackAsItWasSent(_ reply: DeviceReply) throws {
        let parsed = try Self.body(of: try reply.frame()) { body throws(KeychainError) in try DeviceReply(body: body) }
        #expect(parsed == reply)
    }

    /// A request cut anywhere, or with a byte more, is malformed (param),
    /// never another request.
    @Test(arguments: requests) func aCutOrLongerRequestIsRefused(_ request: DeviceRequest) throws {
        let bytes = try Self.body(of: try request.frame()) { Array($0) }
        for length in 0..<bytes.count {
            #expect(throws: KeychainError.param) {
                try bytes[..<length].withUnsafeBytes { raw in try DeviceRequest(body: raw) }
            }
        }
        #expect(throws: KeychainError.param) { try (bytes + [0]).withUnsafeBytes { try DeviceRequest(body: $0) } }
    }

    /// An auto-lock past a week (or below zero) is refused by the reader,
    /// whatever a client sends.
    @Test(arguments: [DeviceRequest.autoLock(after: 7 * 86400 + 1, grace: nil), .autoLock(after: nil, grace: -1)])
    func anAutoLockOutOfRangeIsRefused(_ request: DeviceRequest) throws {
        #expect(throws: KeychainError.param) {
            try Self.body(of: try request.frame()) { body throws(KeychainError) in try DeviceRequest(body: body) }
        }
    }

    /// A group's listing reads back through the reply frame as it was
    /// sent; fields that are not whole triples of a name, a class and a
    /// size are another build's: refused, never cut short or guessed.
    @Test func aListingReadsBackAndAForeignOneIsRefused() throws {
        let items = [
            ItemListing(identifier: "github.com", info: ItemInfo(protectionClass: .whenUnlocked, size: 6)),
            ItemListing(identifier: "wifi", info: ItemInfo(protectionClass: .alwaysThisDeviceOnly, size: 0))
        ]
        let reply = DeviceReply.ok(ItemListing.fields(items))
        let parsed = try Self.body(of: try reply.frame()) { body throws(KeychainError) in try DeviceReply(body: body) }
        guard case .ok(let fields) = parsed else { Issue.record("not ok: \(parsed)"); return }
        #expect(try ItemListing.items(fromFields: fields) == items)
        for foreign in [
            ["github.com", "whenUnlocked"], ["github.com", "sometimes", "6"], ["github.com", "always", "-1"],
            ["github.com", "always", "six"]
        ] {
            #expect(throws: KeychainError.io) { try ItemListing.items(fromFields: foreign) }
        }
    }

    /// A policy listing, and the details of a group's items, read back
    /// through the reply frame as sent; a foreign row is refused.
    @Test func policyAndDetailsListingsReadBack() throws {
        let rows = [
            PolicyListing(
                group: "TEAMID.shared",
                rule: EntitlementRule(
                    executable: "/usr/bin/deploy",
                    digest: Array(repeating: 7, count: 32),
                    unit: "deploy.service", uid: 1000, allowsJIT: true)),
            PolicyListing(
                group: "TEAMID.shared",
                rule: EntitlementRule(
                    executable: "/usr/bin/backup",
                    digest: Array(repeating: 9, count: 32))),
            PolicyListing(group: "closed", rule: nil)
        ]
        let reply = DeviceReply.ok(PolicyListing.fields(rows))
        let parsed = try Self.body(of: try reply.frame()) { body throws(KeychainError) in try DeviceReply(body: body) }
        guard case .ok(let fields) = parsed else { Issue.record("not ok: \(parsed)"); return }
        #expect(try PolicyListing.rows(fromFields: fields) == rows)
        for foreign in [
            ["g", "/bin/x", "abcd", "", "", ""], ["g", "/bin/x", String(repeating: "0", count: 64), "", "-1", ""],
            ["g", "", "", "", "", "jit"], ["g", "/bin/x"]
        ] {
            #expect(throws: KeychainError.io) { try PolicyListing.rows(fromFields: foreign) }
        }
        let details = [(identifier: "github.com", details: ItemDetails(label: "GitHub", attributes: ["user": "ada"]))]
        let listed = try ItemDetails.listed(fromFields: ItemDetails.listingFields(details))
        #expect(listed.count == 1 && listed[0].identifier == "github.com" && listed[0].details == details[0].details)
    }
    /// The fields of an `ok` reply read back through the frame as sent.
    static func readBack(_ fields: [String]) throws -> [String] {
        let parsed = try body(of: try DeviceReply.ok(fields).frame()) { body throws(KeychainError) in
            try DeviceReply(body: body)
        }
        guard case .ok(let read) = parsed else { throw KeychainError.io }
        return read
    }

    /// The status's first lines, which `.control` and `keychainfs status`
    /// both start with: the same keys in the same order, a mount's own
    /// lines after `first-unlock`, `retry-after` only during a lockout.
    @Test func everyViewOfTheStatusStartsWithTheSameLines() {
        var status = DeviceStatus(
            isLocked: true, hasUnlockedSinceBoot: false, retryAfter: 60, failedAttempts: 5, hasPasscode: true,
            autoLockAfter: 300, autoLockGrace: 10)
        #expect(
            status.lines(afterFirstUnlock: ["accessmode: whenUnlocked"]) == [
                "state: locked", "first-unlock: no", "accessmode: whenUnlocked", "passcode: yes", "failed-attempts: 5",
                "retry-after: 60", "autolock: 300", "autolock-grace: 10"
            ])
        status.retryAfter = 0
        status.isLocked = false
        #expect(
            status.lines() == [
                "state: unlocked", "first-unlock: no", "passcode: yes", "failed-attempts: 5", "autolock: 300",
                "autolock-grace: 10"
            ])
    }

    /// The small results (an item's info, a pinned program, a count, a
    /// restore's summary, a group's apps setting, an unmount's outcome, the
    /// auto-lock setting, whether an audit log came)
    /// read back as sent; fields of another shape are another build's.
    @Test func smallResultsReadBackAndForeignOnesAreRefused() throws {
        let info = ItemInfo(protectionClass: .afterFirstUnlockThisDeviceOnly, size: 4096)
        #expect(try ItemInfo(fields: Self.readBack(info.fields)) == info)
        let pinned = PinnedProgram(executable: "/usr/bin/deploy", digest: Array(0..<32))
        #expect(try PinnedProgram(fields: Self.readBack(pinned.fields)) == pinned)
        #expect(try ReplyCount(fields: Self.readBack(ReplyCount(17).fields)) == ReplyCount(17))
        var summary = RestoreSummary()
        (summary.added, summary.replaced, summary.unchanged, summary.kept) = (3, 1, 4, 1)
        #expect(try RestoreSummary(fields: Self.readBack(summary.fields)) == summary)
        for apps in [GroupApps.own, .open] { #expect(try GroupApps(fields: Self.readBack(apps.fields)) == apps) }
        for outcome in [UnmountOutcome.othersRemain, .last] {
            #expect(try UnmountOutcome(fields: Self.readBack(outcome.fields)) == outcome)
        }
        let setting = AutoLockSetting(after: 300, grace: 10)
        #expect(try AutoLockSetting(fields: Self.readBack(setting.fields)) == setting)
        for file in [AuditLogFile.attached, .absent] {
            #expect(try AuditLogFile(fields: Self.readBack(file.fields)) == file)
        }
        let foreign: [(String, () throws -> Void)] = [
            ("info without a size", { _ = try ItemInfo(fields: ["always"]) }),
            ("info of no class", { _ = try ItemInfo(fields: ["sometimes", "3"]) }),
            ("a negative size", { _ = try ItemInfo(fields: ["always", "-3"]) }),
            ("a short digest", { _ = try PinnedProgram(fields: ["/bin/x", "abcd"]) }),
            ("a digest not in hex", { _ = try PinnedProgram(fields: ["/bin/x", String(repeating: "z", count: 64)]) }),
            ("no count", { _ = try ReplyCount(fields: []) }),
            ("a negative count", { _ = try ReplyCount(fields: ["-1"]) }),
            ("three counts of four", { _ = try RestoreSummary(fields: ["1", "2", "3"]) }),
            ("a count not a number", { _ = try RestoreSummary(fields: ["1", "2", "3", "x"]) }),
            ("apps neither own nor open", { _ = try GroupApps(fields: ["shared"]) }),
            ("an unmount's unknown word", { _ = try UnmountOutcome(fields: ["first"]) }),
            ("an auto-lock without its grace", { _ = try AutoLockSetting(fields: ["300"]) }),
            ("a negative grace", { _ = try AutoLockSetting(fields: ["300", "-1"]) }),
            ("an audit log neither passed nor absent", { _ = try AuditLogFile(fields: ["gone"]) })
        ]
        for (what, decode) in foreign {
            #expect(throws: KeychainError.io, "\(what)") { try decode() }
        }
    }
}
