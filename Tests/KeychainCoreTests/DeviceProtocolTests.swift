import Foundation
import Glibc
import Testing
@testable import KeychainCore
@testable import KeychainProtocol

/// Every request and reply of the device's protocol survives its frame:
/// what a client sends is what the device reads, field for field, and the
/// other way round (docs/PROTOCOL.md).
@Suite struct DeviceProtocolTests {
    static func secret(_ text: String) -> SecureBytes { try! SecureBytes(text) }

    /// One request of every kind, with every optional field both present
    /// and absent somewhere, and distinct values in fields of one type (a
    /// swapped pair would not survive).
    static let requests: [DeviceRequest] = [
        .process(.ping),
        .mount(.mount(group: nil, mountpoint: "/home/ada/kc")),
        .mount(.mount(group: "TEAMID.shared", mountpoint: "/home/ada/shared")),
        .mount(.unmount(mountpoint: "/home/ada/kc")),
        .device(.changePasscode(old: secret("1234"), new: secret("56789"))),
        .device(.changePasscode(old: nil, new: nil)),
        .file(.backup(path: "/tmp/a.kcbak", password: secret("backup pw"))),
        .file(
            .backup(
                path: "/tmp/p.kcbak", password: secret("pw"), policedGroups: ["secure", "team.app"],
                passcode: secret("1234"))),
        .file(.restore(path: "/tmp/b.kcbak", password: secret("restore pw"), policy: .overwrite)),
        .file(
            .restore(path: "/tmp/d.kcbak", password: secret("restore pw"), policy: .overwrite, passcode: secret("1234"))
        ),
        .file(.restore(path: "/tmp/c.kcbak", password: secret("pw"), policy: .keep)),
        .item(.get(group: "default", identifier: "github.com")),
        .item(
            .set(
                group: "git", identifier: "host", value: secret("v\u{0}alue\n"), protectionClass: .alwaysThisDeviceOnly,
                condition: .ifAbsent)),
        .item(.set(group: "default", identifier: "empty", value: secret(""), protectionClass: nil, condition: .always)),
        .item(
            .set(
                group: "default", identifier: "Wi-Fi", value: secret("pw"), protectionClass: nil, condition: .always,
                details: ItemDetails(
                    label: "Home Wi-Fi", contentType: "text/plain",
                    attributes: ["xdg:schema": "org.example.Wifi", "ssid": "home", "note": ""], created: 5, modified: 7)
            )),
        .item(.details(group: "default", identifier: nil)),
        .item(.details(group: "default", identifier: "Wi-Fi")),
        .process(.serveBus(address: "unix:path=/run/user/1000/bus", replace: false)),
        .process(.serveBus(address: "unix:path=/tmp/b", replace: true)),
        .item(
            .setDetails(
                group: "default", identifier: "Wi-Fi",
                details: ItemDetails(label: "renamed", attributes: ["ssid": "home"]))),
        .item(.remove(group: "default", identifier: "old")),
        .item(.list(group: nil)),
        .item(.list(group: "default")),
        .item(.info(group: "default", identifier: "size")),
        .item(.setClass(group: "default", identifier: "k", protectionClass: .afterFirstUnlock)),
        .item(.rename(group: "default", from: "a", to: "b", replacing: true)),
        .item(.rename(group: "default", from: "b", to: "a", replacing: false)),
        .item(.createGroup("new.group")),
        .item(.removeGroup("old.group")),
        .device(.lock),
        .device(.unlock(passcode: secret("1234"))),
        .device(.unlock(passcode: nil)),
        .device(.status(mountpoint: nil)),
        .device(.status(mountpoint: "/home/ada/team")),
        .device(.sync),
        .policy(
            .grant(
                group: "secure", executable: "/usr/bin/app", unit: "app.service", uid: 1000, passcode: secret("1234"))),
        .policy(.grant(group: "secure", executable: "/usr/bin/app", unit: nil, uid: nil, passcode: nil)),
        .policy(
            .grant(
                group: "secure", executable: "/usr/bin/node", unit: nil, uid: nil, passcode: secret("1234"),
                allowJIT: true)),
        .policy(
            .access(
                group: "default", identifier: "Chromium Safe Storage", executable: "/usr/bin/secret-tool", change: .add,
                passcode: secret("1234"))),
        .policy(.access(group: "default", identifier: "token", executable: "/opt/app", change: .remove, passcode: nil)),
        .policy(
            .access(
                group: "default", identifier: "imported", executable: "/usr/lib/chromium/chromium", change: .claim,
                passcode: nil)),
        .policy(.apps(group: "default", open: true, passcode: secret("1234"))),
        .policy(.apps(group: "default", open: nil, passcode: nil)),
        .policy(
            .revoke(
                group: "secure", executable: "/usr/bin/app", unit: "app.service", uid: 1000, all: false,
                passcode: secret("1234"))),
        .policy(.revoke(group: "secure", executable: nil, unit: nil, uid: nil, all: true, passcode: nil)),
        .policy(.policy(group: nil)),
        .policy(.policy(group: "secure")),
        .process(.create(passcode: secret("98765"))),
        .process(.create(passcode: nil)),
        .mount(.attach(group: nil, mountpoint: "/home/ada/kc")),
        .mount(.attach(group: "team.app", mountpoint: "/home/ada/team")),
        .file(.auditLog(rotated: false)),
        .file(.auditLog(rotated: true)),
        .file(.verifyLog),
        .process(.stop),
        .process(.watch),
        .device(.autoLock(after: 300, grace: nil)),
        .device(.autoLock(after: nil, grace: 0)),
        .device(.autoLock(after: nil, grace: nil)),
        .device(.purge), .device(.background), .device(.accessMode(.always)), .device(.accessMode(.whenUnlocked)),
        .device(.migrate(false)), .device(.migrate(true)),
        .tpm(.seal(secret: secret("device secret"), auth: secret(""), guarded: false)),
        .tpm(.seal(secret: secret("passcode's"), auth: secret("auth"), guarded: true)),
        .tpm(.unseal(blob: [0, 0x2e, 0xff], auth: secret("auth"), storageKey: [0, 0x0b, 1])),
        .tpm(.defineCounter(auth: secret("auth"), candidates: [])),
        .tpm(.defineCounter(auth: secret("auth"), candidates: [0x0181_0000, 0x01BF_FFFF])),
        .tpm(.counterValue(TPMCounterHandle(index: 0x0181_0000, name: [0, 0x0b, 2], auth: secret("a")))),
        .tpm(.increment(TPMCounterHandle(index: 0x0181_0001, name: [0, 0x0b, 3], auth: secret("a")))),
        .tpm(.release(TPMCounterHandle(index: 0x0181_0002, name: [0, 0x0b, 4], auth: secret("a")))),
        .tpm(.lockout),
        .sync(.start(remote: "git@example.org:me/keychain.git", groups: [])),
        .sync(.start(remote: "/srv/keychain.git", groups: ["default", "work"])),
        .sync(.joinWithRecoveryKey(remote: "ssh://h/r.git", recoveryKey: secret("cbde-fghi"), groups: ["work"])),
        .sync(.join(remote: "https://h/r.git", groups: [])),
        .sync(.join(remote: nil, groups: [])),
        .sync(.cancelJoin), .sync(.confirmJoin(code: "123 456")), .sync(.now), .sync(.status),
        .sync(.joinRequests(device: nil)),
        .sync(.joinRequests(device: "00112233aabbccdd")),
        .sync(.joinCode(device: "00112233aabbccdd")),
        .sync(.approve(device: "00112233aabbccdd", code: "123 456")),
        .sync(.remove(device: "laptop")), .sync(.leave),
        .sync(.groups(set: nil)), .sync(.groups(set: [])), .sync(.groups(set: ["work"]))
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

    /// A client of the socket names no owner: whatever its details say of one
    /// is dropped before the device sees them (docs/SECRET-SERVICE.md,
    /// "Whose an item is").
    @Test func aSocketClientsOwnerIsDropped() throws {
        var details = ItemDetails(label: "Chromium Safe Storage", attributes: ["application": "chromium"])
        details.owner = ProgramClaim(
            program: .executable("/usr/lib/chromium/chromium"), digest: Array(repeating: 1, count: 32))
        details.allowed = [ProgramClaim(program: .executable("/tmp/evil"), digest: Array(repeating: 2, count: 32))]
        let planted = ItemRequest.set(
            group: "default", identifier: "key", value: Self.secret("k"), condition: .ifAbsent, details: details)
        guard case .set(_, _, _, _, _, let kept?) = planted.withoutOwner else {
            Issue.record("no details left"); return
        }
        #expect(
            kept.owner == nil && kept.allowed.isEmpty && kept.label == details.label
                && kept.attributes == details.attributes)
        guard
            case .setDetails(_, _, let changed) = ItemRequest.setDetails(
                group: "default", identifier: "key", details: details
            )
            .withoutOwner
        else { Issue.record("not a setDetails"); return }
        #expect(changed.owner == nil && changed.allowed.isEmpty)
    }

    /// A device that refuses a request before its body has all arrived
    /// (no locked memory for it) replies and closes. The command writing the
    /// rest of a large value was killed by SIGPIPE (exit 141, nothing said);
    /// now its write fails quietly, and it reads the device's sentence.
    @Test func aRequestRefusedBeforeItsBodyArrivedGetsTheDevicesSentence() throws {
        let keychain = try TemporaryKeychain()
        let path = keychain.directory.path + "/device.sock"
        let listener = try UnixSocket.listen(at: path)
        let listening = listener.raw
        let refusal = try DeviceReply.systemError(ENOMEM, "no locked memory is left for a request this large now")
            .frame()
        let served = try #require(
            Threads.start {
                guard let client = FileDescriptor(accept(listening, nil, nil)) else { return }
                var header = [UInt8](repeating: 0, count: 4096)
                _ = recv(client.raw, &header, header.count, 0)  // its start only, then the refusal
                refusal.withUnsafeBytes { _ = try? client.borrowed.writeAll($0) }
            })
        let value = try SecureBytes(count: 900_000)
        let outcome = DeviceClient.send(.set(group: "default", identifier: "big", value: value), to: path)
        pthread_join(served, nil)
        withExtendedLifetime(listener) {}
        guard case .failure(.system(let code, let sentence))? = outcome else {
            Issue.record("\(String(describing: outcome))")
            return
        }
        #expect(code == ENOMEM && sentence.contains("no locked memory is left"), "\(sentence)")
    }

    @Test func everyRequestKindIsCoveredHere() throws {
        let kinds = try Set(Self.requests.map { request in try Self.body(of: try request.frame()) { $0[1] } })
        #expect(kinds == Set(DeviceRequest.kindsOfEachGroup.joined()))
    }

    /// Each group names its own kind bytes; a byte that two groups claimed
    /// would be read as the first group's request.
    @Test func noKindByteIsTwoGroupsAndAByteOfNoneIsRefused() {
        let kinds = Array(DeviceRequest.kindsOfEachGroup.joined())
        #expect(Set(kinds).count == kinds.count)
        for unknown in Set(UInt8.min...UInt8.max).subtracting(kinds) {
            let body: [UInt8] = [DeviceProtocol.version, unknown, 0, 0, 0, 0]
            let refused = body.withUnsafeBytes { body in
                do throws(KeychainError) {
                    _ = try DeviceRequest(body: body)
                    return false
                } catch { return error == .param }
            }
            #expect(refused, "kind \(unknown)")
        }
    }

    /// docs/PROTOCOL.md is the protocol for clients in other languages:
    /// its version is this build's, and its table of requests has one row
    /// for each kind byte, and none for a byte no group claims.
    @Test func theProtocolsDocumentNamesEveryKindAndThisVersion() throws {
        let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let document = try String(contentsOf: repository.appendingPathComponent("docs/PROTOCOL.md"), encoding: .utf8)
        #expect(document.contains("(version \(DeviceProtocol.version))"))
        #expect(document.contains("version u8 = \(DeviceProtocol.version) |"))
        let requests =
            try #require(document.components(separatedBy: "### Requests (`code` 0)").last)
            .components(separatedBy: "\n### ").first ?? ""
        let rows = requests.split(separator: "\n").compactMap { line -> UInt8? in
            guard line.hasPrefix("| ") else { return nil }
            return UInt8(line.dropFirst(2).prefix { $0 != " " })
        }
        #expect(rows.sorted() == DeviceRequest.kindsOfEachGroup.joined().sorted())
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
    @Test(arguments: [
        DeviceRequest.device(.autoLock(after: 7 * 86400 + 1, grace: nil)), .device(.autoLock(after: nil, grace: -1))
    ])
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

    /// The status is built once (``DeviceStatus/report()``): `.control`,
    /// the socket and `keychainfs status` (text and --json) show the same
    /// keys in the same order; what a status does not know is left out,
    /// `retry-after` only during a lockout, and a path never forges a line.
    @Test func everyViewOfTheStatusIsOneReport() throws {
        var status = DeviceStatus(
            isLocked: true, hasUnlockedSinceBoot: false, retryAfter: 60, failedAttempts: 5, hasPasscode: true,
            autoLockAfter: 300, autoLockGrace: 10)
        #expect(
            status.report().map(\.line) == [
                "state: locked", "first-unlock: no", "passcode: yes", "failed-attempts: 5", "retry-after: 60",
                "autolock: 300", "autolock-grace: 10"
            ])
        status.retryAfter = 0
        status.keyProtection = KeyProtectionStatus(protection: .file)
        status.judge = DeviceJudge(
            pinentry: "/usr/bin/pinentry-curses", startedBy: "keychainfs ← bash", replaceableProgram: nil)
        status.serving = ServingFacts(
            accessMode: .afterFirstUnlock, migrate: false, pid: 4242, mode: .perUser,
            keychain: "/home/ada/kc\nstate: unlocked", secretService: "serving", group: "team.app")
        let report = status.report()
        #expect(
            report.map(\.key) == [
                "state", "first-unlock", "accessmode", "migrate", "passcode", "failed-attempts", "autolock",
                "autolock-grace", "pid", "mode", "mode-limits", "key-protection", "key-protection-limits", "keychain",
                "group", "secret-service", "pinentry", "started-by", "per-user-limit"
            ])
        #expect(report.first { $0.key == "pid" }?.value == .number(4242))
        #expect(report.first { $0.key == "accessmode" }?.value == .text("afterFirstUnlock"))
        // One line per entry: the path's newline is escaped, not a line of its own.
        #expect(report.text.split(separator: "\n").count == report.count)
        #expect(report.text.contains("keychain: /home/ada/kc\\nstate: unlocked\n"))
        // The whole status crosses the socket: the socket's `status` is the same report.
        let crossed = try Self.crossed(status, for: .status).get()
        #expect(crossed == status && crossed.report() == report)
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

    /// One call of every factory: each request is paired with its result
    /// type in DeviceCall.swift, and none is left out (docs/CONTRIBUTING.md,
    /// "Where a new piece goes").
    static let calls: [DeviceRequest] = [
        DeviceCall.get(group: "g", identifier: "i").request, DeviceCall.info(group: "g", identifier: "i").request,
        DeviceCall.groups.request, DeviceCall.items(inGroup: "g").request,
        DeviceCall.details(group: "g", identifier: nil).request,
        DeviceCall.set(group: "g", identifier: "i", value: secret("v")).request,
        DeviceCall.setDetails(group: "g", identifier: "i", details: ItemDetails(label: "l", attributes: [:])).request,
        DeviceCall.remove(group: "g", identifier: "i").request,
        DeviceCall.setClass(group: "g", identifier: "i", protectionClass: .always).request,
        DeviceCall.rename(group: "g", from: "a", to: "b", replacing: false).request,
        DeviceCall.createGroup("g").request, DeviceCall.removeGroup("g").request,
        DeviceCall.ping.request, DeviceCall.lock.request, DeviceCall.unlock(passcode: nil).request,
        DeviceCall.sync.request, DeviceCall.changePasscode(old: nil, new: nil).request, DeviceCall.stop.request,
        DeviceCall.watch.request, DeviceCall.serveBus(address: "unix:path=/b", replace: false).request,
        DeviceCall.mount(group: nil, mountpoint: "/m").request, DeviceCall.attach(group: nil, mountpoint: "/m").request,
        DeviceCall.create(passcode: nil).request, DeviceCall.status.request,
        DeviceCall.status(ofMount: "/m").request,
        DeviceCall.autoLock(after: nil, grace: nil).request, DeviceCall.unmount(mountpoint: "/m").request,
        DeviceCall.backup(path: "/b", password: secret("p")).request,
        DeviceCall.restore(path: "/b", password: secret("p"), policy: .keep).request,
        PolicyCall.grant(group: "g", executable: "/x", unit: nil, uid: nil, passcode: nil).call.request,
        PolicyCall.allow(group: "g", identifier: "i", executable: "/x", passcode: nil).call.request,
        PolicyCall.claim(group: "g", identifier: "i", executable: "/x", passcode: nil).call.request,
        PolicyCall.revoke(group: "g", executable: nil, unit: nil, uid: nil, all: true, passcode: nil).call.request,
        PolicyCall.disallow(group: "g", identifier: "i", executable: "/x", passcode: nil).call.request,
        PolicyCall.apps(group: "g", open: nil, passcode: nil).call.request,
        PolicyCall.policy(group: nil).call.request,
        DeviceCall.auditLog(rotated: false).request, DeviceCall.verifyLog.request,
        DeviceCall.tpmSeal(secret("s"), auth: secret("a"), guarded: true).request,
        DeviceCall.tpmUnseal([1], auth: secret("a"), storageKey: [2]).request,
        DeviceCall.tpmDefineCounter(auth: secret("a"), candidates: []).request,
        DeviceCall.tpmCounterValue(TPMCounterHandle(index: 1, name: [1], auth: secret("a"))).request,
        DeviceCall.tpmIncrement(TPMCounterHandle(index: 1, name: [1], auth: secret("a"))).request,
        DeviceCall.tpmRelease(TPMCounterHandle(index: 1, name: [1], auth: secret("a"))).request,
        DeviceCall.tpmLockout.request,
        DeviceCall.syncStart(remote: "/r").request, DeviceCall.syncJoin(remote: "/r", recoveryKey: secret("k")).request,
        DeviceCall.syncJoin(remote: nil).request, DeviceCall.syncCancelJoin.request,
        DeviceCall.syncConfirmJoin(code: "1").request, DeviceCall.syncNow.request,
        DeviceCall.syncStatus.request, DeviceCall.syncJoinRequests().request,
        DeviceCall.syncJoinCode(device: "1").request, DeviceCall.syncApprove(device: "1", code: "1").request,
        DeviceCall.syncRemove(device: "d").request, DeviceCall.syncLeave.request,
        DeviceCall.syncGroups(set: nil).request,
        DeviceCall.purge.request, DeviceCall.background.request, DeviceCall.accessMode(.afterFirstUnlock).request,
        DeviceCall.migrate(false).request
    ]

    @Test func everyRequestHasACall() throws {
        let kinds = try Set(Self.calls.map { request in try Self.body(of: try request.frame()) { $0[1] } })
        #expect(kinds == Set(DeviceRequest.kindsOfEachGroup.joined()))
    }

    /// An answer crosses the socket as its call's result: encoded by its
    /// type, framed, and decoded once on arrival into the same value.
    static func crossed<Result>(_ result: some DeviceResult, for call: DeviceCall<Result>) throws -> DeviceOutcome<
        Result
    > {
        let frame = try result.reply.frame()
        let reply = try body(of: frame) { (raw) throws(KeychainError) in try DeviceReply(body: raw) }
        return call.outcome(of: reply)
    }

    @Test func everyAnswerCrossesTheSocketAsItsCallsResult() throws {
        let listing = [ItemListing(identifier: "mail", info: ItemInfo(protectionClass: .always, size: 6))]
        #expect(try Self.crossed(ItemList(listing), for: .items(inGroup: "g")).get() == ItemList(listing))
        #expect(try Self.crossed(GroupList(["a", "b"]), for: .groups).get() == GroupList(["a", "b"]))
        #expect(try Self.crossed(Done(), for: .lock).get() == Done())
        let rule = EntitlementRule(executable: "/x", digest: Array(0..<32), unit: "u.service", uid: 7, allowsJIT: true)
        let policy = PolicyList([PolicyListing(group: "g", rule: rule), PolicyListing(group: "h", rule: nil)])
        #expect(try Self.crossed(policy, for: PolicyCall.policy(group: nil).call).get() == policy)
        let item = try Self.crossed(
            ItemValue(value: Self.secret("s3cret"), protectionClass: .whenUnlocked),
            for: .get(group: "g", identifier: "i")
        ).get()
        #expect(item.value.bytes() == Array("s3cret".utf8) && item.protectionClass == .whenUnlocked)
        let details = ItemDetails(label: "Mail", attributes: ["user": "ada"])
        let listed = try Self.crossed(DetailsList([("mail", details)]), for: .details(group: "g", identifier: nil))
            .get()
        #expect(listed.entries.map(\.identifier) == ["mail"] && listed.entries.first?.details == details)
        let status = DeviceStatus(
            isLocked: true, hasUnlockedSinceBoot: false, retryAfter: 3, failedAttempts: 2, hasPasscode: true,
            autoLockAfter: 300, autoLockGrace: 10)
        #expect(try Self.crossed(status, for: .status).get() == status)
        #expect(
            try Self.crossed(CreatedKeychain(recoveryKey: nil), for: .create(passcode: nil)).get().recoveryKey == nil)
        let recovery = try Self.crossed(
            CreatedKeychain(recoveryKey: Self.secret("ABCD-EFGH")), for: .create(passcode: nil)
        ).get()
        #expect(recovery.recoveryKey?.bytes() == Array("ABCD-EFGH".utf8))
        // The TPM's answers through the service (docs/PROTOCOL.md, "Requests (`code` 0)", kinds 35 to 41).
        let sealed = TPMSealed(blob: [0, 0x2e, 0xff], storageKey: [0, 0x0b, 9])
        #expect(
            try Self.crossed(sealed, for: .tpmSeal(Self.secret("s"), auth: Self.secret(""), guarded: false)).get()
                == sealed)
        let unsealed = try Self.crossed(
            TPMUnsealed(secret: Self.secret("device secret")),
            for: .tpmUnseal([1], auth: Self.secret(""), storageKey: [2])
        ).get()
        #expect(unsealed.secret.bytes() == Array("device secret".utf8))
        let counter = TPMCounter(index: 0x0181_2345, name: [0, 0x0b, 7], value: 41)
        #expect(
            try Self.crossed(counter, for: .tpmDefineCounter(auth: Self.secret("a"), candidates: [])).get() == counter)
        let handle = TPMCounterHandle(index: 1, name: [1], auth: Self.secret("a"))
        #expect(try Self.crossed(TPMCounterValue(value: 42), for: .tpmCounterValue(handle)).get().value == 42)
        let share = TPMLockoutShare(
            state: TPMLockoutState(failures: 1, maximum: 32, recoverySeconds: 7200, lockoutAuthSet: true), triesLeft: 14
        )
        #expect(try Self.crossed(share, for: .tpmLockout).get() == share)
        // Sync's answers (docs/SYNC.md).
        let summary = SyncSummary(received: 3, sent: 1, waiting: 2, conflicts: ["default/mail (conflict from h, d)"])
        #expect(try Self.crossed(summary, for: .syncNow).get() == summary)
        for step in [JoinStep.asked, .code("123 456"), .joined(summary)] {
            #expect(try Self.crossed(step, for: .syncJoin(remote: nil)).get() == step)
        }
        let lines = SyncStatusLines([SyncStatusLine("remote", "/r.git"), SyncStatusLine("pending", "0")])
        #expect(try Self.crossed(lines, for: .syncStatus).get() == lines)
        #expect(try Self.crossed(JoinCode(nil), for: .syncJoinCode(device: "1")).get() == JoinCode(nil))
        #expect(try Self.crossed(JoinCode("123 456"), for: .syncJoinCode(device: "1")).get() == JoinCode("123 456"))
        let started = try Self.crossed(SyncRecoveryKey(recoveryKey: Self.secret("cbde")), for: .syncStart(remote: "/r"))
            .get()
        #expect(started.recoveryKey.bytes() == Array("cbde".utf8))
        // A value reply of an item is no unsealed secret, and a blob is never empty.
        #expect(
            try Self.crossed(
                ItemValue(value: Self.secret("x"), protectionClass: .whenUnlocked),
                for: .tpmUnseal([1], auth: Self.secret(""), storageKey: [2])
            ).refusal == .unexpected)
        #expect(throws: KeychainError.io) { try TPMSealed(fields: ["", "000b"]) }
    }

    /// A reply of another call's shape is ``DeviceRefusal/unexpected``
    /// (another build answered), never a made-up answer; a refusal stays
    /// the refusal it was, "locked" as "locked".
    @Test func anotherCallsAnswerIsUnexpectedAndARefusalStaysItself() throws {
        #expect(try Self.crossed(GroupList(["a"]), for: .lock) == .failure(.unexpected))
        #expect(try Self.crossed(Done(), for: .get(group: "g", identifier: "i")).refusal == .unexpected)
        #expect(
            try Self.crossed(ItemValue(value: Self.secret("x"), protectionClass: .always), for: .groups)
                == .failure(.unexpected))
        #expect(
            try Self.crossed(GroupList(["a", "b"]), for: .info(group: "g", identifier: "i")) == .failure(.unexpected))
        #expect(
            try Self.crossed(
                ItemValue(value: Self.secret("x"), protectionClass: .whenUnlocked), for: .create(passcode: nil)
            )
            .refusal == .unexpected)
        let locked = DeviceReply.keychainError(.interactionNotAllowed, "the keychain is locked")
        #expect(
            DeviceCall.status.outcome(of: locked)
                == .failure(.keychain(.interactionNotAllowed, "the keychain is locked")))
        #expect(DeviceCall.groups.outcome(of: .systemError(2, "gone")).refusal?.keychainError == .itemNotFound)
    }

    /// In the device's own process an answer is the value itself; one of
    /// another type than the call's is unexpected, as from another build.
    @Test func anAnswerInTheSameProcessIsTheValueItself() throws {
        let info = ItemInfo(protectionClass: .afterFirstUnlock, size: 9)
        let answer: DeviceAnswer = .success(info)
        #expect(try answer.outcome(of: .info(group: "g", identifier: "i")).get() == info)
        #expect(answer.outcome(of: .groups) == .failure(.unexpected))
        let refused: DeviceAnswer = .failure(.keychain(.missingEntitlement, "not entitled"))
        #expect(refused.outcome(of: .groups) == .failure(.keychain(.missingEntitlement, "not entitled")))
    }
}
