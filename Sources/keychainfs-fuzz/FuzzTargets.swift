#if canImport(Glibc)
import Glibc
#endif
// @testable needs modules compiled for testing: debug builds only. A
// release build of the whole package (the manual plugin does one) gets a stub.
#if DEBUG
internal import CFuse
@testable import KeychainCore
@testable import KeychainProtocol
@testable import KeychainTPM
@testable import KeychainFS
@testable import SecretService

/// The parsers that read bytes an attacker controls, each with the
/// properties it must keep whatever the input. A broken property traps, so
/// that libFuzzer (and the replay of committed inputs) reports it.
enum FuzzTarget: String, CaseIterable {
    /// `.control` writes.
    case control
    /// Group and identifier names, and the escaping of status lines.
    case names
    /// The keybag record, behind a valid MAC (the parser, not the MAC, is under test).
    case keybag
    /// The lockout record, behind a valid MAC.
    case lockout
    /// The item-set state record, behind a valid MAC.
    case state
    /// The entitlement policy record, behind a valid MAC.
    case entitlements
    /// Lines of the audit log (`keychainfs log` reads a file anyone with the directory can edit).
    case auditline
    /// Request bodies on the device's socket.
    case request
    /// Backup files: the records after a valid header for a fixed password.
    case backup
    /// `otpauth://` key URIs in an item's value (`keychainfs otp`).
    case otpauth
    /// An item's details as stored, sent in a request and carried in a backup.
    case details
    /// A request on a FUSE connection: what a forged connection could send
    /// (docs/SECURITY.md, "Service mode under attack"), through the path the
    /// device serves a mount by: the check, then libfuse, then the filesystem.
    case fuserequest
    /// What a TPM-sealed keychain reads before it trusts anything: a typed
    /// recovery key, the recovery record, the rollback record (behind a valid
    /// MAC), the device-secret file, the passcode binding (behind a valid MAC)
    /// and its note of removals (docs/FORMAT.md, "The passcode binding"); the
    /// first byte chooses which.
    case keyprotection
    /// A Secret Service object path, as any program of the user can send
    /// one: one name per path and back.
    case objectpath
    /// A method call's arguments, read as each method's handler reads them: any
    /// program of the user can send any well-formed message.
    case busmessage

    func run(_ input: UnsafeRawBufferPointer) {
        switch self {
        case .control: control(input)
        case .names: names(input)
        case .keybag: keybag(input)
        case .lockout: lockout(input)
        case .state: state(input)
        case .entitlements: entitlements(input)
        case .auditline: auditLine(input)
        case .request: request(input)
        case .backup: backup(input)
        case .otpauth: otpauth(input)
        case .details: details(input)
        case .fuserequest: fuseRequest(input)
        case .keyprotection: keyProtection(input)
        case .objectpath: objectPath(input)
        case .busmessage: if let broken = BusMessageFuzzing.violation(input) { fatalError("busmessage: \(broken)") }
        }
    }

    private func objectPath(_ input: UnsafeRawBufferPointer) {
        let text = String(decoding: input, as: UTF8.self)
        switch ObjectPaths.object(at: text) {
        case .collection(let group)?:
            check(ObjectPaths.collection(group) == text, "a collection path is not the one its name makes")
        case .item(let group, let identifier)?:
            check(ObjectPaths.item(group, identifier) == text, "an item path is not the one its names make")
        case .portal?:
            check(text == SecretServiceProvider.portalPath, "the portal's object is at another path")
        case .service?, .session?, .alias?, .prompt?, nil:
            break
        }
        // Any text as a name: its element reads back as it.
        if !text.isEmpty {
            check(
                ObjectPaths.name(Substring(ObjectPaths.element(text))) == text,
                "a name does not read back from its element")
        }
    }

    private static let recoveryKey = RecoveryKey(
        typed: try! SecureBytes(String(repeating: "vcvcvcvc-", count: 7) + "vcvcvcvc"))!

    private func keyProtection(_ input: UnsafeRawBufferPointer) {
        guard let choice = input.first else { return }
        let rest = Array(input.dropFirst())
        switch choice % 6 {
        case 0:
            guard let typed = try? SecureBytes(rest), let key = RecoveryKey(typed: typed) else { return }
            let again = RecoveryKey(typed: key.formatted())
            check(again.map { $0.key == key.key } == true, "a recovery key does not read back as itself")
        case 1:
            // Never a trap, and nothing opens without the key that sealed it.
            if let opened = try? Self.recoveryKey.openRecord(rest) {
                check(opened.deviceSecret.count == Crypto.keySize, "a recovery record opened to a wrong size")
            }
        case 2:
            // Both versions: the first byte picks the domain it is MACed in.
            guard let version = rest.first else { return }
            let body = Array(rest.dropFirst())
            let record = body + Self.secret.mac(version & 1 == 0 ? "kcfs-rollback-v1" : "kcfs-rollback-v2", body)
            guard let decoded = try? RollbackRecord(decoding: record, secret: Self.secret) else { return }
            check(
                decoded.encoded(secret: Self.secret) == record,
                "an accepted rollback record does not re-encode to itself")
        case 4:
            let record = rest + Self.bindingKey.mac("kcfs-passcode-binding-v1", rest)
            guard let decoded = try? PasscodeBinding(decoding: record, key: Self.bindingKey) else { return }
            check(
                decoded.encoded(key: Self.bindingKey) == record,
                "an accepted passcode binding does not re-encode to itself")
        case 5:
            // Not authenticated: anything may be written there, and it must read back as itself.
            guard let removals = try? BindingRemovals(decoding: rest) else { return }
            check(removals.encoded == rest, "an accepted note of removals does not re-encode to itself")
        default:
            guard let contents = try? SecureBytes(rest), let file = try? DeviceSecretFile(contents) else { return }
            if case .sealed(let blob, let storageKey?, let throughService) = file {
                check(
                    DeviceSecretFile.encodeSealed(blob, storageKey: storageKey, throughService: throughService)
                        == rest,
                    "a sealed device-secret file does not re-encode to itself")
            }
        }
    }

    private func control(_ input: UnsafeRawBufferPointer) {
        let lines = input.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: true)
        do throws(Errno) {
            let commands = try ControlCommand.parse(input)
            check(input.count <= ControlCommand.maximumWrite, "accepted a write over the limit")
            check(lines.allSatisfy { $0.count <= ControlCommand.maximumLine + 1 }, "accepted an over-long line")
            check(commands.count <= lines.count, "more commands than lines")
        } catch {
            check(error.rawValue == EINVAL, "a parse error other than EINVAL")
        }
    }

    private func names(_ input: UnsafeRawBufferPointer) {
        let name = String(decoding: input, as: UTF8.self)
        do throws(KeychainError) {
            try ItemLimits.validate(name: name)
            check(!name.isEmpty && name.utf8.count <= ItemLimits.maximumNameLength, "accepted a bad length")
            check(
                !name.unicodeScalars.contains { $0.value < 0x20 || (0x7f...0x9f).contains($0.value) || $0 == "/" },
                "accepted a control character or a slash")
            check(!ItemLimits.reservedNames.contains(name), "accepted a reserved name")
        } catch {
            check(error == .param || error == .nameTooLong, "a validation error other than param")
        }
        let escaped = LineEscaping.escaped(name)
        check(
            !escaped.unicodeScalars.contains { $0.value < 0x20 || (0x7f...0x9f).contains($0.value) },
            "escaping left a control character")
        check(LineEscaping.unescaped(escaped) == name, "escaping does not round-trip")
        _ = LineEscaping.unescaped(name)  // arbitrary input must not trap
    }

    /// A fixed device secret: its MAC keys sign the fuzzed bodies.
    private static let secret: DeviceSecret = {
        Sodium.ensureInitialized()
        return DeviceSecret(secret: try! SecureBytes([UInt8](repeating: 7, count: Crypto.keySize)))
    }()

    /// A fixed passcode binding key: its MAC key signs the fuzzed bindings.
    private static let bindingKey: PasscodeBindingKey = {
        Sodium.ensureInitialized()
        return PasscodeBindingKey(
            afterFirstUnlock: GuardedKey(copying: try! SecureBytes([UInt8](repeating: 9, count: Crypto.keySize))))
    }()

    private func keybag(_ input: UnsafeRawBufferPointer) {
        let record = Array(input) + Self.secret.mac("kcfs-keybag-v1", Array(input))
        guard let bag = try? Keybag(decoding: record, secret: Self.secret) else { return }
        check(
            bag.formatVersion >= 1 && bag.formatVersion <= Keybag.passcodeBoundVersion, "accepted an unknown version")
        check(
            (bag.formatVersion >= Keybag.tpmVersion) == (bag.tpmPasscodeObject != nil),
            "a TPM object outside versions 5 and 6")
        check(
            (bag.formatVersion == Keybag.passcodeBoundVersion) == bag.isPasscodeBound,
            "a passcode binding outside version 6")
        if bag.formatVersion >= Keybag.version {
            check(bag.encoded(secret: Self.secret) == record, "an accepted keybag does not re-encode to itself")
        }
    }

    private func lockout(_ input: UnsafeRawBufferPointer) {
        let record = Array(input) + Self.secret.mac("kcfs-lockout-v1", Array(input))
        guard let decoded = try? LockoutRecord(decoding: record, secret: Self.secret) else { return }
        check(decoded.encoded(secret: Self.secret) == record, "an accepted lockout record does not re-encode to itself")
    }

    private func entitlements(_ input: UnsafeRawBufferPointer) {
        let record = Array(input) + Self.secret.mac("kcfs-entitlements-v1", Array(input))
        guard let decoded = try? EntitlementPolicy(decoding: record, secret: Self.secret) else { return }
        check(
            decoded.groups.values.allSatisfy { $0.allSatisfy { $0.digest.count == ExecutableDigest.size } },
            "a digest of the wrong size")
        check(decoded.encoded(secret: Self.secret) == record, "an accepted record does not re-encode to itself")
    }

    private func auditLine(_ input: UnsafeRawBufferPointer) {
        guard let line = AuditLine(parsing: String(decoding: input, as: UTF8.self)) else { return }
        check(line.fields.first?.key == "seq" && line.mac.count == Crypto.macSize, "accepted a line without seq or MAC")
        check(!line.fields.contains { $0.key.contains("\t") }, "a field name holds a tab")
    }

    private func state(_ input: UnsafeRawBufferPointer) {
        let state = ItemSetState(secret: Self.secret)
        for domain in ["kcfs-state-v1", "kcfs-state-v2"] {
            let record = Array(input) + Self.secret.mac(domain, Array(input))
            guard let decoded = try? state.record(from: record) else { continue }
            check(decoded.digest.count == Crypto.macSize, "a digest of the wrong size")
            if let generation = decoded.generation {
                check(generation >= 0, "a negative generation")
                check(state.sealed(decoded) == record, "an accepted state record does not re-encode to itself")
            }
        }
    }

    /// The first byte is taken as this build's protocol version, whatever
    /// it is: the seeds stay requests of every version to come, instead of
    /// only exercising the version check once the version moves on.
    private func request(_ input: UnsafeRawBufferPointer) {
        guard !input.isEmpty else { return }
        let body = [DeviceProtocol.version] + input.dropFirst()
        guard let request = (try? body.withUnsafeBytes { (raw) throws(KeychainError) in try DeviceRequest(body: raw) })
        else { return }
        guard let frame = try? request.frame() else { return check(false, "an accepted request cannot be framed") }
        frame.withUnsafeBytes { bytes in
            check(
                bytes.count == body.count + 4 && bytes[4...].elementsEqual(body),
                "an accepted request does not re-frame to itself")
        }
    }

    /// A backup of one item under "pw", whose header the fuzzed records follow.
    private static let backupHeader: [UInt8] = {
        let item = BackupItem(group: "g", identifier: "i", protectionClass: .always, value: try! SecureBytes("v"))
        let bytes = try! BackupFile.encode([item], password: try! SecureBytes("pw"), kdf: .insecureFastForTests)
        return Array(bytes.prefix(8 + 1 + 8 + 8 + Crypto.saltSize + Crypto.macSize))
    }()
    private static let backupPassword = try! SecureBytes("pw")

    private func backup(_ input: UnsafeRawBufferPointer) {
        var items = 0
        do throws(KeychainError) {
            try BackupFile.decode(Self.backupHeader + Array(input), password: Self.backupPassword) { item in
                check(item.protectionClass.isMigratable, "a backup handed out a ThisDeviceOnly item")
                items += 1
            }
        } catch {
            check(error == .decode, "a damaged backup gave an error other than decode")
            check(items == 0, "items were handed out before the whole backup was checked")
        }
    }

    private func otpauth(_ input: UnsafeRawBufferPointer) {
        guard let value = try? SecureBytes(copying: input) else { return }
        do throws(OneTimePasswordError) {
            let generator = try OneTimePassword(item: value)
            check(OneTimePassword.digitRange.contains(generator.digits), "accepted digits outside 6...8")
            check(OneTimePassword.periodRange.contains(generator.period), "accepted a period outside 1...86400")
            guard let code = try? generator.code(at: 1_234_567_890) else { return }
            check(
                code.count == generator.digits && code.allSatisfy(\.isASCII) && code.allSatisfy(\.isNumber),
                "a code that is not exactly `digits` decimal digits")
        } catch {
            check(!"\(error)".contains("\u{FFFD}"), "an error message quoting undecodable input")
        }
    }

    private func details(_ input: UnsafeRawBufferPointer) {
        guard let details = try? ItemDetails(decoding: Array(input)) else { return }
        check(
            details.encoded().elementsEqual(input),
            "accepted details do not encode to themselves (two encodings of one value)")
        check((try? details.validate()) != nil, "accepted details past their bounds")
        var fields = details.fields[...]
        check(
            ItemDetails(fields: &fields) == details && fields.isEmpty,
            "details do not read back from their reply fields")
    }

    private func check(_ condition: Bool, _ property: StaticString) {
        if !condition { fatalError("\(rawValue): \(property)") }
    }
}

extension FuzzTarget {
    /// The temporary directory of the keychain behind ``fuseSession``.
    private nonisolated(unsafe) static var fuseKeychainRoot: String?

    /// Removes it: the keychain's files (one directory, no subdirectory), then the two directories.
    static func removeFuseKeychain() {
        guard let root = fuseKeychainRoot else { return }
        let keychain = root + "/keychain"
        if let directory = opendir(keychain) {
            while let entry = readdir(directory) {
                let name = entry.name
                if name != "." && name != ".." { unlink(keychain + "/" + name) }
            }
            closedir(directory)
        }
        rmdir(keychain)
        rmdir(root)
    }

    /// A session of the device's operations over a filesystem of a keychain
    /// made for the run; its replies come back on the other end of a
    /// socket pair (`fuseReplies`), one message each. INIT already done.
    private nonisolated(unsafe) static let fuseSession: OpaquePointer = {
        var template = Array("/tmp/kcfs-fuzz-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { fatalError("mkdtemp") }
        fuseKeychainRoot = String(cString: made)
        // Gone when the run ends (libFuzzer exits; a crash leaves it, with the input).
        atexit { FuzzTarget.removeFuseKeychain() }
        let directory = KeychainDirectory(path: String(cString: made) + "/keychain")
        do {
            try Device.createKeychain(at: directory, passcode: nil)
            let device = try Device(directory: directory)
            let fileSystem = try FileSystem(
                manager: PasswordManager(device: device), nodes: NodeTable(following: device))
            var ops = FuseOperations.table()
            var arguments = [strdup("keychainfs")]
            defer { arguments.forEach { free($0) } }
            let session = arguments.withUnsafeMutableBufferPointer { argv -> OpaquePointer? in
                var args = fuse_args(argc: 1, argv: argv.baseAddress, allocated: 0)
                return fuse_session_new(
                    &args, &ops, MemoryLayout<fuse_lowlevel_ops>.size,
                    Unmanaged.passRetained(fileSystem).toOpaque())
            }
            guard let session, fuse_session_mount(session, "/dev/fd/\(fuseEnds[0])") == 0 else {
                fatalError("no session")
            }
            // FUSE_INIT, protocol 7.31, as the kernel sends it.
            var initArgument = [UInt8](repeating: 0, count: 64)
            initArgument.withUnsafeMutableBytes { raw in
                raw.storeBytes(of: UInt32(7), toByteOffset: 0, as: UInt32.self)
                raw.storeBytes(of: UInt32(31), toByteOffset: 4, as: UInt32.self)
            }
            answered(kernelRequest(26, node: 0, initArgument), in: session)
            return session
        } catch {
            fatalError("cannot make the fuzzing keychain: \(error)")
        }
    }()

    /// The session's connection (0) and the kernel's end of it (1).
    private static let fuseEnds: [Int32] = {
        var ends: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue), 0, &ends) == 0 else { fatalError("socketpair") }
        return ends
    }()

    private static func kernelRequest(_ opcode: UInt32, node: UInt64, _ argument: [UInt8]) -> [UInt8] {
        var request = [UInt8](repeating: 0, count: 40) + argument
        request.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: UInt32(raw.count), toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: opcode, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: UInt64(1 << 62), toByteOffset: 8, as: UInt64.self)
            raw.storeBytes(of: node, toByteOffset: 16, as: UInt64.self)
        }
        return request
    }

    /// Processes one request and reads every reply it caused (notifications too).
    @discardableResult
    private static func answered(_ bytes: [UInt8], in session: OpaquePointer) -> [[UInt8]] {
        var copy = bytes
        copy.withUnsafeMutableBytes { raw in
            var buffer = fuse_buf()
            buffer.mem = raw.baseAddress
            buffer.size = raw.count
            fuse_session_process_buf(session, &buffer)
        }
        var replies: [[UInt8]] = []
        var reply = [UInt8](repeating: 0, count: 1 << 17)
        while true {
            let count = reply.withUnsafeMutableBytes {
                recv(fuseEnds[1], $0.baseAddress, $0.count, Int32(MSG_DONTWAIT))
            }
            guard count > 0 else { return replies }
            replies.append(Array(reply[..<count]))
        }
    }

    func fuseRequest(_ input: UnsafeRawBufferPointer) {
        let session = Self.fuseSession
        // A request with its header's length set to what came: the check's
        // first rule would refuse most inputs otherwise, and leave the rest untried.
        var request = Array(input)
        if request.count >= 4 {
            request.withUnsafeMutableBytes {
                $0.storeBytes(of: UInt32(truncatingIfNeeded: input.count), toByteOffset: 0, as: UInt32.self)
            }
        }
        guard request.withUnsafeBytes({ FuseRequestCheck.problem(in: $0) }) == nil else { return }
        check(request.count >= FuseRequestCheck.headerSize, "passed a request shorter than its header")
        let opcode = request.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 4, as: UInt32.self) }
        let node = request.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 16, as: UInt64.self) }
        // What the kernel does after a reply: release what an open handed
        // out, forget what a lookup or create made known. Without it every
        // input would leak (the kernel never does), and the run would end out of memory.
        for reply in Self.answered(request, in: session) where reply.count >= 16 {
            let error = reply.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 4, as: Int32.self) }
            guard error == 0 else { continue }
            func field(_ offset: Int) -> UInt64 {
                reply.count >= offset + 8
                    ? reply.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: offset, as: UInt64.self) } : 0
            }
            func release(_ releaseOpcode: UInt32, node: UInt64, handle: UInt64) {
                Self.answered(
                    Self.kernelRequest(
                        releaseOpcode, node: node,
                        withUnsafeBytes(of: handle, Array.init)
                            + [UInt8](repeating: 0, count: 16)), in: session)
            }
            func forget(_ entry: UInt64) {
                guard entry != 0 else { return }
                Self.answered(
                    Self.kernelRequest(2, node: entry, withUnsafeBytes(of: UInt64(1), Array.init)), in: session)
            }
            switch opcode {
            case 14: release(18, node: node, handle: field(16))  // OPEN: fuse_open_out.fh
            case 27: release(29, node: node, handle: field(16))  // OPENDIR
            case 35:  // CREATE: fuse_entry_out (128 bytes), then fuse_open_out
                forget(field(16))
                release(18, node: field(16), handle: field(16 + 128))
            case 1, 9: forget(field(16))  // LOOKUP, MKDIR: fuse_entry_out.nodeid
            default: break
            }
        }
    }
}
#endif
