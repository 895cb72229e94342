import Foundation
@testable import KeychainCore
@testable import KeychainTPM
import Testing
import TestSupport

extension SerialTests {
    /// What someone who holds a keychain's files, and reaches its TPM (root,
    /// a program of the user's where the user reaches it, a live USB boot),
    /// tried against the TPM's promises, each as it was found, with swtpm
    /// and tpm2-tools (docs/SECURITY.md, "Bound to this machine, against
    /// whoever holds the files and the TPM"). Each failed on the code before.
    @Suite(.serialized) struct TPMAttackTests {
        typealias Keys = KeyProtectionTests
        static let passcode = Keys.passcode

        /// The device of `keychain` on `tpm`, unlocked, for `body`; shut down after.
        static func unlocked(
            _ keychain: KeychainDirectory, on tpm: SoftwareTPM, passcode: String = passcode,
            _ body: (Device) throws -> Void
        ) throws {
            let device = try Device(directory: keychain, tcti: tpm.tcti)
            defer { device.shutDown() }
            try device.unlock(passcode: Keys.secure(passcode))
            try body(device)
        }

        /// The attack of item 1: a passcode changed because the old one
        /// leaked, then the old keybag row put back beside the newer ones.
        /// Before, the old passcode then unlocked the current keychain and
        /// read what was written after the change. So too for the lockout
        /// record (the count of wrong passcodes put back to zero) and the
        /// recovery record: every row that decides who opens the keychain
        /// is bound to the counter, and an older one fails beside newer ones.
        @Test func anOlderKeybagLockoutOrRecoveryRowSplicedInIsRefused() throws {
            let scratch = try Keys.Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Keys.sealedKeychain(keychain, on: tpm)
            let older = try scratch.copy(keychain, to: "older")
            try Self.unlocked(keychain, on: tpm) { device in
                try device.changePasscode(from: Keys.secure(Self.passcode), to: Keys.secure("5678"))
                try PasswordManager(device: device).register("after", forIdentifier: "token")
            }
            do {
                // A wrong passcode is counted, then the device stops (a bump).
                let device = try Device(directory: keychain, tcti: tpm.tcti)
                #expect(throws: KeychainError.authFailed) { try device.unlock(passcode: Keys.secure("0000")) }
                device.shutDown()
            }
            let current = try scratch.copy(keychain, to: "current")
            for key in ["keybag", "lockout", "recovery"] {
                try Keys.splice(key, from: older, into: keychain)
                #expect(Self.attempt(keychain, on: tpm, passcode: Self.passcode) == .decode, "the older \(key) row")
                try scratch.restore(current, over: keychain)
            }
            // Untouched, it opens with the new passcode only, and still counts the failure.
            let device = try Device(directory: keychain, tcti: tpm.tcti)
            #expect(device.status.failedAttempts == 1)
            #expect(throws: KeychainError.authFailed) { try device.unlock(passcode: Keys.secure(Self.passcode)) }
            try device.unlock(passcode: Keys.secure("5678"))
            #expect(try PasswordManager(device: device).string(forIdentifier: "token") == "after")
            device.shutDown()
        }

        /// The attack of item 2: the device secret's TPM object has an empty
        /// auth (so `always` items open while locked), so whoever reaches
        /// the TPM unseals it, puts back an older copy of the files and MACs
        /// every record bound to the rollback counter again for the
        /// counter's value now, as docs/FORMAT.md lets anyone do who holds
        /// that secret. Before, the copy booted as current and the passcode
        /// opened it. Now it still boots (its `always` items are what the
        /// device secret alone gives), but the passcode binding refuses it at
        /// the unlock: its counter moved on with the change. A newer binding
        /// spliced into it does not match its rows, a re-signed older policy
        /// does not match the binding; and the person, with the passcode,
        /// can accept it on purpose.
        @Test func anOlderCopyReSignedWithoutThePasscodeIsRefusedAtTheUnlock() throws {
            let scratch = try Keys.Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Keys.sealedKeychain(keychain, on: tpm)
            let older = try scratch.copy(keychain, to: "older")
            try Self.unlocked(keychain, on: tpm) { device in
                try PasswordManager(device: device).register("rotated", forIdentifier: "token")
                try device.grant(
                    EntitlementRule(executable: "/usr/bin/true", digest: [UInt8](repeating: 1, count: 32)),
                    toGroup: "default",
                    passcode: Keys.secure(Self.passcode))
                device.lock()
            }
            #expect(try Keys.read(keychain, on: tpm) == "rotated")
            let current = try scratch.copy(keychain, to: "current")

            try scratch.restore(older, over: keychain)
            try Self.reSign(keychain, on: tpm)
            #expect(Keys.boot(keychain, on: tpm) == nil, "what the device secret alone gives still boots")
            #expect(Self.attempt(keychain, on: tpm, passcode: Self.passcode) == .rolledBack)

            try Keys.splice(PasscodeBinding.recordKey, from: current, into: keychain)
            #expect(Self.attempt(keychain, on: tpm, passcode: Self.passcode) == .decode, "a newer binding spliced in")

            try scratch.restore(current, over: keychain)
            try Keys.splice(EntitlementPolicy.recordKey, from: older, into: keychain)
            try Self.reSign(keychain, on: tpm)
            #expect(Self.attempt(keychain, on: tpm, passcode: Self.passcode) == .decode, "an older policy re-signed")

            // The re-signed copy, accepted with the passcode, opens as it was.
            try scratch.restore(older, over: keychain)
            try Self.reSign(keychain, on: tpm)
            #expect(throws: KeychainError.authFailed) {
                try Device.acceptRollback(at: keychain, passcode: Keys.secure("0000"), tcti: tpm.tcti)
            }
            try Device.acceptRollback(at: keychain, passcode: Keys.secure(Self.passcode), tcti: tpm.tcti)
            #expect(try Keys.read(keychain, on: tpm) == "first")
        }

        /// A keychain that gets its passcode after it was made is bound to it
        /// at once, as `init` binds one. Before, the binding waited for the
        /// next unlock: a copy taken in between was unbound, and once the
        /// binding's counter was deleted (`tpm2_nvundefine -C o`: the owner
        /// hierarchy's auth is empty on most machines, and a counter the
        /// owner defines cannot be kept from it) that copy, re-signed with
        /// the device secret, opened with the passcode as never bound. Now the
        /// copy is bound: behind its counter it is refused, and with its
        /// counter gone it is refused too, even to `--accept-rollback`:
        /// `recover` with the recovery key is the way out.
        @Test func aCopyFromRightAfterTheFirstPasscodeIsRefusedEvenWithItsCounterDeleted() throws {
            let scratch = try Keys.Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            try Device.createKeychain(
                at: keychain, passcode: nil, kdf: .insecureFastForTests, tpm: .required, tcti: tpm.tcti)
            let beforePasscode = try TPMTools.counterIndexes(on: tpm)
            do {
                let device = try Device(directory: keychain, tcti: tpm.tcti)
                defer { device.shutDown() }
                try device.unlock(passcode: nil)
                try PasswordManager(device: device).register("first", forIdentifier: "token")
                try device.changePasscode(from: nil, to: Keys.secure(Self.passcode))
                #expect(device.keyProtection.passcodeBound == true, "the change binds it")
            }
            let copied = try scratch.copy(keychain, to: "copied")
            let bound = try TPMTools.counterIndexes(on: tpm)
            #expect(bound.count == beforePasscode.count + 1, "\(bound) after \(beforePasscode)")
            // Its name, as tpm2-tools reads it, is the one computed without asking the TPM.
            let binding = try #require(Set(bound).subtracting(beforePasscode).first)
            let name = try TPMTools.run("tpm2_nvreadpublic 0x\(String(binding, radix: 16))", on: tpm)
            #expect(name.output.contains("name: " + Hex.string(TPMObjects.counterName(at: binding))), "\(name.output)")
            try Self.unlocked(keychain, on: tpm) { device in
                try PasswordManager(device: device).register("rotated", forIdentifier: "token")
                device.lock()
            }

            try scratch.restore(copied, over: keychain)
            try Self.reSign(keychain, on: tpm)
            #expect(Keys.boot(keychain, on: tpm) == nil, "what the device secret alone gives still boots")
            #expect(Self.attempt(keychain, on: tpm, passcode: Self.passcode) == .rolledBack)
            // The binding's counter deleted with the owner's empty auth: still refused, never taken for unbound.
            let undefined = try TPMTools.run("tpm2_nvundefine -C o 0x\(String(binding, radix: 16))", on: tpm)
            #expect(undefined.status == 0, "\(undefined.output)")
            let refused = Self.attempt(keychain, on: tpm, passcode: Self.passcode)
            #expect(refused == .rollbackCounterGone || refused == .rolledBack, "\(String(describing: refused))")

            // Not even accepted on purpose with the passcode alone: the way out is `recover`, with the recovery key.
            #expect(throws: KeychainError.rollbackCounterGone) {
                try Device.acceptRollback(at: keychain, passcode: Keys.secure(Self.passcode), tcti: tpm.tcti)
            }
        }

        /// An item's access list is in its details, sealed under a key of the
        /// device secret: whoever unseals that secret could add their own
        /// program to it (no rollback needed, the item-set state does not
        /// cover details). Before, the passcode then opened the keychain
        /// with the forged list in force; now the binding covers each row's
        /// details, and the unlock refuses it.
        @Test func anAccessListRewrittenWithTheDeviceSecretIsRefusedAtTheUnlock() throws {
            let scratch = try Keys.Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Keys.sealedKeychain(keychain, on: tpm)
            let owner = ProgramClaim(program: .executable("/usr/bin/owner"), digest: [UInt8](repeating: 1, count: 32))
            try Self.unlocked(keychain, on: tpm) { device in
                var details = ItemDetails(label: "mail", attributes: ["service": "mail"])
                details.owner = owner
                try PasswordManager(device: device).write(
                    Keys.secure("hunter2"), identifier: "mail", group: "default", protectionClass: .whenUnlocked,
                    details: details)
            }
            // The attacker's program put on the item's access list, sealed as the device would.
            let (secret, _) = try keychain.openDeviceSecret(tcti: tpm.tcti)
            let store = try ItemStore(path: keychain.databasePath, create: false, state: ItemSetState(secret: secret))
            let rollback = try RollbackRecord(
                decoding: try #require(try store.metadata(RollbackRecord.recordKey)), secret: secret)
            secret.epoch.state = (rollback.epoch, true)
            try store.verifyItemSet(legacy: false)
            let row = try #require(try store.item(group: "default", identifier: "mail"))
            var forged = try #require(try ItemCipher.openDetails(row, key: secret.detailsKey))
            forged.allowed.append(
                ProgramClaim(program: .executable("/tmp/attacker"), digest: [UInt8](repeating: 2, count: 32)))
            let sealed = ItemCipher.sealDetails(forged, of: row, key: secret.detailsKey)
            try store.closeLog()
            let script = """
                import sqlite3, sys
                db = sqlite3.connect(sys.argv[1])
                db.execute("UPDATE items SET details = ? WHERE grp = 'default' AND ident = 'mail'",
                           (bytes.fromhex(sys.argv[2]),))
                db.commit()
                """
            #expect(Spawn.run(["/usr/bin/python3", "-c", script, keychain.databasePath, Hex.string(sealed)]) == 0)
            #expect(Keys.boot(keychain, on: tpm) == nil, "the device secret alone does not see it")
            #expect(Self.attempt(keychain, on: tpm, passcode: Self.passcode) == .decode)
        }

        /// The attacker of item 2, as docs/FORMAT.md describes the records:
        /// the device secret unsealed (its auth is empty), and every record
        /// bound to the rollback counter MACed again for the counter's value
        /// now, from whichever value it carried.
        static func reSign(_ keychain: KeychainDirectory, on tpm: SoftwareTPM) throws {
            let (secret, sealedBy) = try keychain.openDeviceSecret(tcti: tpm.tcti)
            let module = try #require(sealedBy)
            let store = try ItemStore(path: keychain.databasePath, create: false, state: ItemSetState(secret: secret))
            let record = try RollbackRecord(
                decoding: try #require(try store.metadata(RollbackRecord.recordKey)), secret: secret)
            let now = try module.value(of: record.counter(secret: secret))
            for (key, domain) in RollbackRecord.boundRecords {
                guard let raw = try store.metadata(key) else { continue }
                let body = (0...now).lazy.compactMap { epoch in
                    try? secret.authenticatedBody(DeviceSecret.boundDomain(domain, epoch: epoch), raw)
                }.first
                try store.setMetadata(
                    key,
                    secret.authenticatedRecord(DeviceSecret.boundDomain(domain, epoch: now), try #require(body)))
            }
            try store.setMetadata(
                RollbackRecord.recordKey,
                RollbackRecord(counter: record.counter(secret: secret), epoch: now).encoded(secret: secret))
            try store.closeLog()
        }

        /// Rows of a passcode class removed before the first unlock of a boot
        /// (`rm` works while locked, when the binding's key is not in memory)
        /// are noted beside the binding, and the unlock after them passes
        /// and folds them in: the keychain stays bound, so the copy from
        /// before the removal, re-signed, is still refused.
        @Test func itemsRemovedBeforeTheFirstUnlockStillUnlock() throws {
            let scratch = try Keys.Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Keys.sealedKeychain(keychain, on: tpm)
            try Self.unlocked(keychain, on: tpm) { device in
                try PasswordManager(device: device).register("second", forIdentifier: "other")
            }
            let both = try scratch.copy(keychain, to: "both")
            do {
                let device = try Device(directory: keychain, tcti: tpm.tcti)
                try PasswordManager(device: device).deleteKey(forIdentifier: "other")
                device.shutDown()
            }
            try Self.unlocked(keychain, on: tpm) { device in
                #expect(throws: KeychainError.itemNotFound) {
                    try PasswordManager(device: device).string(forIdentifier: "other")
                }
                try PasswordManager(device: device).register("third", forIdentifier: "token")
            }
            try scratch.restore(both, over: keychain)
            try Self.reSign(keychain, on: tpm)
            #expect(Self.attempt(keychain, on: tpm, passcode: Self.passcode) == .rolledBack)
        }

        /// Boots `keychain` and unlocks it with `passcode`: nil when that
        /// read the item written last, else the error it got.
        static func attempt(_ keychain: KeychainDirectory, on tpm: SoftwareTPM, passcode: String) -> KeychainError? {
            do {
                try unlocked(keychain, on: tpm, passcode: passcode) { device in
                    _ = try PasswordManager(device: device).string(forIdentifier: "token")
                }
                return nil
            } catch let error as KeychainError {
                return error
            } catch {
                return .io
            }
        }

        /// The NV indexes of `keychain`'s rollback counter and of its
        /// passcode binding's, as its device knows them once unlocked.
        static func counterIndexes(_ keychain: KeychainDirectory, on tpm: SoftwareTPM, passcode: String = passcode)
            throws -> (rollback: UInt32, binding: UInt32)
        {
            var indexes: (UInt32?, UInt32?)
            try unlocked(keychain, on: tpm, passcode: passcode) { device in
                indexes = (device.rollbackCounter.withLock { $0 }?.index, device.passcodeCounter?.index)
            }
            return (try #require(indexes.0), try #require(indexes.1))
        }

        /// The attack of item 3: the counter undefined and defined again as
        /// an ordinary index holding the older copy's value; before, the
        /// older copy then booted as current. The index is not the counter
        /// the keychain made (its name differs), so nothing boots on it, and
        /// the message points to `recover`.
        @Test func anIndexDefinedAgainWithAnOlderValueIsNotTheKeychainsCounter() throws {
            let scratch = try Keys.Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Keys.sealedKeychain(keychain, on: tpm)
            let older = try scratch.copy(keychain, to: "older")
            var olderValue: UInt64 = 0
            try Self.unlocked(keychain, on: tpm) { device in
                olderValue = try #require(device.keyProtection.rollbackCounter)
                try PasswordManager(device: device).register("rotated", forIdentifier: "token")
                device.lock()
            }
            let index = try Self.counterIndexes(keychain, on: tpm).rollback
            let hex = "0x" + String(index, radix: 16)
            let value = (0..<8).map { String(format: "\\%03o", UInt8(truncatingIfNeeded: olderValue >> (56 - 8 * $0))) }
                .joined()
            let forged = try TPMTools.run(
                """
                tpm2_nvundefine \(hex) -C o && \
                tpm2_nvdefine \(hex) -C o -s 8 -a "ownerread|ownerwrite|authread|authwrite|no_da" && \
                printf '\(value)' | tpm2_nvwrite \(hex) -C o -i -
                """, on: tpm)
            #expect(forged.status == 0, "\(forged.output)")
            try scratch.restore(older, over: keychain)
            #expect(Keys.boot(keychain, on: tpm) == .rollbackCounterGone)
            #expect(KeychainError.rollbackCounterGone.description.contains("keychainfs recover"))
        }

        /// Item 7: anyone could increment the counter (its auth was empty,
        /// and the owner's too), and the keychain was then refused. Now only
        /// the device secret's auth moves or reads it; the owner cannot. A
        /// counter undefined is said with a pointer to `recover`, which
        /// makes a new one and frees the one it leaves.
        @Test func onlyTheDeviceMovesItsCounterAndRecoverFreesTheOneItLeaves() throws {
            let scratch = try Keys.Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            let recovery = try Keys.sealedKeychain(keychain, on: tpm)
            let (index, bindingIndex) = try Self.counterIndexes(keychain, on: tpm)
            for counter in [index, bindingIndex] {
                let hex = "0x" + String(counter, radix: 16)
                for hierarchy in ["-C o", "", "-C o -P ''", "-P ''"] {
                    let moved = try TPMTools.run("tpm2_nvincrement \(hex) \(hierarchy)", on: tpm)
                    #expect(moved.status != 0, "tpm2_nvincrement \(hierarchy): \(moved.output)")
                }
                #expect(try TPMTools.run("tpm2_nvread \(hex) -C o -s 8", on: tpm).status != 0)
            }
            #expect(try Keys.read(keychain, on: tpm) == "first")
            // Recovered on the same TPM (a forgotten passcode): a new counter, the old one freed.
            let renewed = try Device.recover(
                at: keychain, recoveryKey: recovery, newPasscode: Keys.secure("5678"), kdf: .insecureFastForTests,
                tcti: tpm.tcti)
            let now = try TPMTools.counterIndexes(on: tpm)
            #expect(now.count == 2 && !now.contains(index) && !now.contains(bindingIndex), "indexes \(now)")
            // Undefined by the owner: said, with what to do, and `recover` works.
            let newHex = "0x" + String(try Self.counterIndexes(keychain, on: tpm, passcode: "5678").rollback, radix: 16)
            #expect(try TPMTools.run("tpm2_nvundefine \(newHex) -C o", on: tpm).status == 0)
            #expect(Keys.boot(keychain, on: tpm) == .rollbackCounterGone)
            // The recovery key from before the recovery opens nothing now (new keys); the new one does.
            #expect(throws: KeychainError.authFailed) {
                try Device.recover(
                    at: keychain, recoveryKey: recovery, newPasscode: Keys.secure("5678"), kdf: .insecureFastForTests,
                    tcti: tpm.tcti)
            }
            _ = try Device.recover(
                at: keychain, recoveryKey: try #require(renewed), newPasscode: Keys.secure("5678"),
                kdf: .insecureFastForTests,
                tcti: tpm.tcti)
            #expect(try Keys.read(keychain, on: tpm, passcode: "5678") == "first")
            #expect(try TPMTools.counterIndexes(on: tpm).count == 2)
        }

        /// Item 6: the storage key was made afresh at every use and never
        /// checked, so something in between substituted its own, read the
        /// salted session's key and with it one unlock's passcode-derived
        /// auth, for an offline search. Now its name is pinned at `init`
        /// and checked before any session is salted with it: here another
        /// TPM answers both for the persistent storage key (its own, kept
        /// there by a keychain of its own) and TPM2_CreatePrimary, and no
        /// session is started at all.
        @Test func aSubstitutedStorageKeyIsSaidAndNoSessionIsSaltedWithIt() throws {
            let scratch = try Keys.Scratch(), tpm = try SoftwareTPM(), other = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Keys.sealedKeychain(keychain, on: tpm)
            _ = try Keys.sealedKeychain(scratch.keychain("on-the-other"), on: other)
            #expect(try TPMTools.persistentHandles(on: other) == [TrustedPlatformModule.persistentStorageKey])
            let proxy = try #require(
                Bundle.module.path(forResource: "tpm-proxy.py", ofType: nil, inDirectory: "Fixtures"))
            let log = scratch.root + "/commands"
            let between = "cmd:/usr/bin/python3 \(proxy) substitute \(tpm.port) \(other.port) \(log)"
            #expect(Keys.boot(keychain, tcti: between) == .tpmStorageKeyChanged)
            let sent = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n")
            #expect(sent.contains("131"), "CreatePrimary was asked: \(sent)")
            #expect(!sent.contains("176"), "no StartAuthSession after a substituted key: \(sent)")
            #expect(!sent.contains("15e"), "nothing unsealed: \(sent)")
            #expect(KeychainError.tpmStorageKeyChanged.description.contains("something in between"))
            // On its own TPM, untouched.
            #expect(try Keys.read(keychain, on: tpm) == "first")
        }

        /// The storage key is kept where TCG and systemd keep it (0x81000001)
        /// when that place is free, and used from there once its name is the
        /// pinned one: a boot no longer makes it again (TPM2_CreatePrimary,
        /// tens of milliseconds on a real TPM). A key of another template
        /// there (tpm2-tools' RSA key here) is left alone, and made afresh
        /// each time as before.
        @Test func theStorageKeyIsKeptWhereSystemdKeepsItAndAnotherKeyThereIsLeftAlone() throws {
            let scratch = try Keys.Scratch(), tpm = try SoftwareTPM(), occupied = try SoftwareTPM()
            let proxy = try #require(
                Bundle.module.path(forResource: "tpm-proxy.py", ofType: nil, inDirectory: "Fixtures"))
            let keychain = scratch.keychain()
            _ = try Keys.sealedKeychain(keychain, on: tpm)
            #expect(try TPMTools.persistentHandles(on: tpm) == [TrustedPlatformModule.persistentStorageKey])
            let log = scratch.root + "/commands"
            #expect(Keys.boot(keychain, tcti: "cmd:/usr/bin/python3 \(proxy) log \(tpm.port) \(log)") == nil)
            let sent = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n")
            #expect(sent.contains("173") && !sent.contains("131"), "read, not made again: \(sent)")
            // The boot's unseal and counter read share one salted session.
            #expect(sent.filter { $0 == "176" }.count == 1, "one StartAuthSession: \(sent)")

            let rsa = "tpm2_createprimary -Q -C o -G rsa -c \(scratch.root)/rsa.ctx"
            let keep = "tpm2_evictcontrol -Q -C o -c \(scratch.root)/rsa.ctx 0x81000001"
            let name = "tpm2_readpublic -c 0x81000001 -o /dev/null | grep '^name:'"
            // swtpm has no resource manager: tpm2-tools' transient objects stay loaded until flushed.
            #expect(try TPMTools.run("\(rsa) && \(keep) && tpm2_flushcontext -t", on: occupied).status == 0)
            let before = try TPMTools.run(name, on: occupied).output
            let other = scratch.keychain("other")
            _ = try Keys.sealedKeychain(other, on: occupied)
            #expect(try Keys.read(other, on: occupied) == "first")
            #expect(try TPMTools.run(name, on: occupied).output == before, "the RSA key is still there")
        }

        /// Item 4: `passcode --tpm` sealed the same device secret and kept the
        /// class keys, so a copy taken while the keychain was kept in a file
        /// opened the sealed one with no TPM: its device-secret file beside
        /// the sealed keychain's database read `always` items at once. Now
        /// the move makes new keys: the old file opens nothing of it, nor
        /// does the old passcode with the old database's keybag.
        @Test func aCopyTakenBeforeTheMoveToTheTPMOpensNothingOfIt() throws {
            let scratch = try Keys.Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            try Device.createKeychain(
                at: keychain, passcode: Keys.secure(Self.passcode), kdf: .insecureFastForTests, tpm: .declined,
                tcti: tpm.tcti)
            try Self.unlocked(keychain, on: tpm) { device in
                try PasswordManager(device: device).write(
                    Keys.secure("always-value"), identifier: "pin", group: "default", protectionClass: .always)
            }
            let before = try scratch.copy(keychain, to: "before")
            _ = try Device.moveToTPM(at: keychain, passcode: Keys.secure(Self.passcode), tcti: tpm.tcti)
            try Self.unlocked(keychain, on: tpm) { device in
                try PasswordManager(device: device).register("after", forIdentifier: "token")
                #expect(try PasswordManager(device: device).string(forIdentifier: "pin") == "always-value")
            }
            // The old device secret beside the sealed keychain's database.
            let attacked = try scratch.copy(keychain, to: "attacked")
            try FileManager.default.removeItem(atPath: attacked.path + "/device-secret")
            try FileManager.default.copyItem(
                atPath: before.path + "/device-secret", toPath: attacked.path + "/device-secret")
            #expect(Keys.boot(attacked, on: tpm) == .decode)
            // The old keybag with the old passcode beside the new rows: no class key of the old opens them.
            let spliced = try scratch.copy(before, to: "spliced")
            for table in ["items", "groups"] {
                try Self.copyTable(table, from: keychain, into: spliced)
            }
            #expect(Self.attempt(spliced, on: tpm, passcode: Self.passcode) != nil)
        }

        /// Replaces `target`'s rows of `table` with `source`'s, as someone with both copies can.
        static func copyTable(_ table: String, from source: KeychainDirectory, into target: KeychainDirectory) throws {
            let script = """
                import sqlite3, sys
                db = sqlite3.connect(sys.argv[1])
                db.execute("ATTACH DATABASE ? AS other", (sys.argv[2],))
                db.execute("DELETE FROM main.%s" % sys.argv[3])
                db.execute("INSERT INTO main.%s SELECT * FROM other.%s" % (sys.argv[3], sys.argv[3]))
                db.commit()
                """
            let result = Spawn.run([
                "/usr/bin/python3", "-c", script, target.path + "/keychain.db", source.path + "/keychain.db", table
            ])
            guard result == 0 else { throw HarnessError("python3's sqlite3 failed (\(result))") }
        }

        /// Item 8: a write was bound to the counter only by a lock, a stop,
        /// or a write five minutes after the last bump: a write, then the
        /// device killed while idle, and the copy from before the write
        /// booted without it. Now writes are bound once they pause for 10 s
        /// (60 s at most while they go on), by the device on its own.
        @Test func aWriteIsBoundToTheCounterSoonAfterwardsWithoutALock() throws {
            let scratch = try Keys.Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Keys.sealedKeychain(keychain, on: tpm)
            let older = try scratch.copy(keychain, to: "older")
            var device: Device? = try Device(directory: keychain, tcti: tpm.tcti)
            try device?.unlock(passcode: Keys.secure(Self.passcode))
            let before = try #require(device?.keyProtection.rollbackCounter)
            try device.map { try PasswordManager(device: $0).register("rotated", forIdentifier: "token") }
            let written = Date()
            // Waited for as a user would notice it: `status` shows the counter moved.
            while device?.keyProtection.rollbackCounter == before, Date().timeIntervalSince(written) < 30 {
                usleep(100_000)
            }
            #expect(device?.keyProtection.rollbackCounter == before + 1)
            #expect(Date().timeIntervalSince(written) >= 9, "bound after the writes paused, not at once")
            // Killed, as `kill -9` would: no lock, no stop, no bump of its own.
            device = nil
            try scratch.restore(older, over: keychain)
            #expect(Keys.boot(keychain, on: tpm) == .rolledBack)
        }

        /// Item 5, the cheapest way around the lockout while its auth is
        /// empty: guess, then `tpm2_dictionarylockout --clear-lockout`, then
        /// guess again. The TPM's count cannot tell; the keychain can: it
        /// keeps the count it saw after its own last wrong passcode, bound to
        /// the counter, and the TPM forgets no faster than one per recovery
        /// interval. Before, `status` went on saying guesses were limited.
        @Test func aCountOfWrongPasscodesResetBetweenGuessesIsSaid() throws {
            let scratch = try Keys.Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Keys.sealedKeychain(keychain, on: tpm)
            do {
                let device = try Device(directory: keychain, tcti: tpm.tcti)
                defer { device.shutDown() }
                for _ in 0..<2 {
                    #expect(throws: KeychainError.authFailed) { try device.unlock(passcode: Keys.secure("0000")) }
                }
                let status = device.keyProtection
                #expect(status.tpmFailures == 2 && status.tpmFailuresExpected == 1, "\(status)")
                #expect(!status.tpmLockoutWasReset && !status.lines.contains { $0.hasPrefix("tpm-lockout-reset") })
            }
            let cleared = try TPMTools.run("tpm2_dictionarylockout --clear-lockout", on: tpm)
            #expect(cleared.status == 0, "\(cleared.output)")
            // Said by the next device too: what it saw is in the keychain, not in a process.
            let device = try Device(directory: keychain, tcti: tpm.tcti)
            defer { device.shutDown() }
            let status = device.keyProtection
            #expect(status.tpmFailures == 0 && status.tpmLockoutWasReset, "\(status)")
            #expect(status.lines.contains { $0.hasPrefix("tpm-lockout-reset: the TPM counts 0 wrong passcodes") })
            #expect(status.lines.contains { $0.contains("its count of wrong ones was reset") }, "\(status.lines)")
            #expect(!status.lines.contains { $0.contains("go through the TPM and its lockout") }, "\(status.lines)")
            // As `keychainfs status` receives it over the socket.
            var served = device.status
            served.keyProtection = status
            #expect(try DeviceStatus(fields: served.fields).keyProtection == status)
        }

        /// Item 5: with an empty lockout auth, anyone who reaches the TPM
        /// stops its counting, and `status` still said guesses went through
        /// its lockout. Now it says what holds, and root can take the
        /// lockout hierarchy (as the service does where it can).
        @Test func aLockoutSwitchedOffOrOpenToAnyoneIsSaidAsSuch() throws {
            let scratch = try Keys.Scratch(), tpm = try SoftwareTPM()
            let keychain = scratch.keychain()
            _ = try Keys.sealedKeychain(keychain, on: tpm)
            let device = try Device(directory: keychain, tcti: tpm.tcti)
            defer { device.shutDown() }
            var lines = device.keyProtection.lines
            #expect(lines.contains("tpm-lockout-auth: empty"), "\(lines)")
            #expect(lines.contains { $0.contains("which anyone who reaches the TPM can reset") }, "\(lines)")
            let off = try TPMTools.run(
                "tpm2_dictionarylockout --setup-parameters --max-tries=4294967295 --recovery-time=0 "
                    + "--lockout-recovery-time=0", on: tpm)
            #expect(off.status == 0, "\(off.output)")
            lines = device.keyProtection.lines
            #expect(lines.contains("tpm-lockout: 0 of 4294967295"), "\(lines)")
            #expect(lines.contains { $0.contains("its lockout is switched off") }, "\(lines)")
            #expect(!lines.contains { $0.contains("go through the TPM and its lockout") }, "\(lines)")
            // Root takes the lockout hierarchy: counting again, and nobody else can stop it or reset it.
            let state = try TPMLockoutHierarchy.take(stateDirectory: scratch.root, tcti: tpm.tcti)
            #expect(state.lockoutAuthSet && state.limitsGuesses && state.maximum == 32, "\(state)")
            #expect(throws: KeychainError.badRequest) {
                try TPMLockoutHierarchy.take(stateDirectory: scratch.root, tcti: tpm.tcti)
            }
            lines = device.keyProtection.lines
            #expect(lines.contains("tpm-lockout-auth: set") && lines.contains("tpm-lockout: 0 of 32"), "\(lines)")
            #expect(lines.contains { $0.contains("passcode guesses go through the TPM and its lockout;") }, "\(lines)")
            // The file alone is not the auth: it is the TPM's blob, and opens on no other TPM.
            let sealed = try Data(contentsOf: URL(fileURLWithPath: scratch.root + "/tpm-lockout-auth"))
            #expect(sealed.prefix(8) == Data("KCFSTPM2".utf8) && sealed.count > 100)
            // Given back, and taken again: a new auth each time.
            try TPMLockoutHierarchy.release(stateDirectory: scratch.root, tcti: tpm.tcti)
            #expect(device.keyProtection.tpmLockoutAuthSet == false)
            #expect(!FileManager.default.fileExists(atPath: scratch.root + "/tpm-lockout-auth"))
            #expect(throws: KeychainError.noSuchKeychain) {
                try TPMLockoutHierarchy.release(stateDirectory: scratch.root, tcti: tpm.tcti)
            }
            _ = try TPMLockoutHierarchy.take(stateDirectory: scratch.root, tcti: tpm.tcti)
            // Root, with the sealed auth, clears the count for a user it locked out.
            #expect(throws: KeychainError.authFailed) { try device.unlock(passcode: Keys.secure("0000")) }
            #expect(device.keyProtection.tpmFailures == 1)
            try TPMLockoutHierarchy.resetCount(stateDirectory: scratch.root, tcti: tpm.tcti)
            #expect(device.keyProtection.tpmFailures == 0)
            // Anyone else who reaches the TPM: refused, and the count stays.
            #expect(throws: KeychainError.authFailed) { try device.unlock(passcode: Keys.secure("0000")) }
            for attack in [
                "tpm2_dictionarylockout --clear-lockout",
                "tpm2_dictionarylockout --setup-parameters --max-tries=4294967295 --recovery-time=0",
                "tpm2_changeauth -c lockout new"
            ] {
                let refused = try TPMTools.run(attack, on: tpm)
                #expect(refused.status != 0, "\(attack): \(refused.output)")
            }
            #expect(device.keyProtection.tpmFailures == 1)
            #expect(device.keyProtection.tpmMaximumFailures == 32)
            // A wrong lockout auth locks the lockout hierarchy itself for its recovery time (24 h): root
            // too is refused until then, which is said (a TPM clear in the firmware is the other way).
            #expect(throws: KeychainError.tpmLockedOut) {
                try TPMLockoutHierarchy.resetCount(stateDirectory: scratch.root, tcti: tpm.tcti)
            }
        }
    }
}
