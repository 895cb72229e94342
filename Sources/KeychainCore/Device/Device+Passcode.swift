import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Passcode checks and changes, and the lockout after wrong passcodes.
extension Device {
    /// Runs `body` and records its outcome in the audit log.
    func audited<R>(
        _ operation: String, group: String? = nil, detail: String? = nil, by subject: AuditSubject?,
        _ body: () throws(KeychainError) -> R
    ) throws(KeychainError) -> R {
        do throws(KeychainError) {
            let result = try body()
            audit.record(AuditEvent(operation: operation, result: "ok", group: group, subject: subject, detail: detail))
            return result
        } catch {
            audit.record(
                AuditEvent(
                    operation: operation, result: AuditEvent.result(of: error), group: group,
                    subject: subject, detail: detail))
            throw error
        }
    }

    /// Changes the passcode: `old` is the current one (nil for a keychain
    /// without one), `new` the next (nil: none from now on). Needs no
    /// unlock, only the current passcode; a wrong one is a failed attempt
    /// like a wrong unlock (``KeychainError/authFailed``, counted, and
    /// refused during a lockout). The class keys are wrapped again under the
    /// new passcode and the keybag record replaced in one transaction: after
    /// a crash at any point, either the old or the new passcode works.
    public func changePasscode(from old: SecureBytes?, to new: SecureBytes?) throws(KeychainError) {
        if let new, new.count == 0 { throw .param }
        let tpm = sealingTPM.withLock { $0 }
        try passcodeAttempt(
            { () throws(KeychainError) -> ([ProtectionClass: GuardedKey], Keybag) in
                let bag = keybag, secret = secret
                return try SecretThread.run { () throws(KeychainError) -> ([ProtectionClass: GuardedKey], Keybag) in
                    let keys = try bag.unwrapPasscodeClasses(secret: secret, passcode: old, tpm: tpm)
                    return (
                        keys, try bag.rewrapped(secret: secret, classKeys: keys, newPasscode: new, sealingTPM: tpm)
                    )
                }
            },
            then: { (derived) throws(KeychainError) in
                let (keys, changed) = derived
                // The binding checked (or made) with the old passcode first.
                try keyPasscodeBinding(classKeys: keys, passcode: old, upgrade: false)
                try writeBound(Keybag.recordKey) { changed.encoded(secret: secret) }
                currentKeybag.withLock { $0 = changed }
                if !changed.isPasscodeBound, let counter = passcodeCounter, let tpm {
                    // No passcode any more: nothing is bound to one.
                    try store.unbind()
                    tpm.release(counter)
                } else if changed.isBindable, !changed.isPasscodeBound {
                    // A first passcode is bound at once, as `init` binds one:
                    // a copy taken before the next unlock would otherwise be
                    // unbound, and deleting its binding's counter (the owner
                    // hierarchy's empty auth can) would make it pass for
                    // never bound (docs/SECURITY.md, "A missing counter is a
                    // rollback"). A failure leaves it to the next unlock.
                    do throws(KeychainError) {
                        try bindToPasscode(classKeys: keys, passcode: new)
                    } catch {
                        Diagnostics.log("could not bind the keychain to its new passcode: \(error)")
                    }
                }
            })
        bumpRollbackCounter("passcode change")
    }

    /// Runs `body` if `passcode` is the keychain's (nil for one without a
    /// passcode): a wrong one is a failed attempt like a wrong unlock
    /// (``KeychainError/authFailed``, counted, refused during a lockout).
    func withPasscode<R>(_ passcode: SecureBytes?, _ body: () throws(KeychainError) -> R) throws(KeychainError) -> R {
        try passcodeAttempt(
            { () throws(KeychainError) in try unwrapPasscodeClasses(passcode) },
            then: { (keys) throws(KeychainError) -> R in
                try keyPasscodeBinding(classKeys: keys, passcode: passcode)
                return try body()
            })
    }

    /// Checks `passcode` where a policed group needs the keychain's:
    /// ``KeychainError/missingEntitlement`` when none is given to a keychain
    /// that has one (not counted), a counted ``KeychainError/authFailed``
    /// when it is wrong.
    func confirmPasscode(_ passcode: SecureBytes?) throws(KeychainError) {
        guard passcode != nil || !status.hasPasscode else { throw .missingEntitlement }
        try withPasscode(passcode) { () throws(KeychainError) in }
    }

    /// One attempt with a passcode (unlock, passcode change, grant, revoke):
    /// refused without trying while a lockout from earlier failures lasts;
    /// `derive` uses the passcode, and its failure to unwrap a key is a
    /// wrong passcode (the keybag record is authenticated at boot), counted
    /// towards the lockout; then `body` gets what `derive` made. All of it
    /// under `unlockAttempt`, so that concurrent attempts cannot all pass
    /// the check before any failure is counted.
    func passcodeAttempt<Derived, R>(
        _ derive: () throws(KeychainError) -> Derived,
        then body: (Derived) throws(KeychainError) -> R
    ) throws(KeychainError) -> R {
        try unlockAttempt.withLock { _ throws(KeychainError) -> R in
            let now = clock()
            if try lockoutRecord().deadline > now { throw .authFailed }
            let derived: Derived
            do throws(KeychainError) {
                derived = try derive()
            } catch .decode, .authFailed {
                try recordFailure(now: now)
                try noteTPMFailures(now: now)
                throw .authFailed
            }
            try resetFailures()
            return try body(derived)
        }
    }

    /// The class keys a passcode unwraps. Derived on a ``SecretThread``: no
    /// copy of the stretched passcode or of the keys stays on any stack.
    func unwrapPasscodeClasses(_ passcode: SecureBytes?) throws(KeychainError) -> [ProtectionClass: GuardedKey] {
        let bag = keybag, secret = secret, tpm = sealingTPM.withLock { $0 }
        return try SecretThread.run { () throws(KeychainError) -> [ProtectionClass: GuardedKey] in
            try bag.unwrapPasscodeClasses(secret: secret, passcode: passcode, tpm: tpm)
        }
    }

    func lockoutRecord() throws(KeychainError) -> LockoutRecord {
        try boundWrites.withLock { _ throws(KeychainError) in try readLockoutRecord() }
    }

    /// The lockout record, for a holder of ``boundWrites`` (it is bound to the rollback counter).
    private func readLockoutRecord() throws(KeychainError) -> LockoutRecord {
        if let unsaved = unsavedLockout.withLock({ $0 }) { return unsaved }
        guard let raw = try store.metadata(LockoutRecord.recordKey) else {
            // Deleting it would reset the count of wrong passcodes.
            Diagnostics.log("the lockout record is missing")
            throw .decode
        }
        do throws(KeychainError) {
            return try LockoutRecord(decoding: raw, secret: secret)
        } catch {
            Diagnostics.log("the lockout record failed authentication")
            throw error
        }
    }

    func recordFailure(now: Int64) throws(KeychainError) {
        try updateLockoutRecord { record in
            record.failures += 1
            record.deadline = now + policy.delay(afterFailures: record.failures)
        }
    }

    /// After a wrong passcode that went through the TPM: its count of
    /// wrong auths as it stands now (``TPMFailuresSeen``), the mark below
    /// which a later count says someone reset it.
    private func noteTPMFailures(now: Int64) throws(KeychainError) {
        guard !store.isReadOnly, let tpm = sealingTPM.withLock({ $0 }), keybag.tpmPasscodeObject != nil,
            let lockout = tpm.lockout()
        else {
            return
        }
        let seen = TPMFailuresSeen(count: lockout.failures, at: now, recoverySeconds: lockout.recoverySeconds)
        try writeBound(TPMFailuresSeen.recordKey) { seen.encoded(secret: secret) }
    }

    /// The TPM's count of wrong auths as this keychain last saw it, if it has.
    func tpmFailuresSeen() throws(KeychainError) -> TPMFailuresSeen? {
        try boundWrites.withLock { _ throws(KeychainError) -> TPMFailuresSeen? in
            guard let raw = try store.metadata(TPMFailuresSeen.recordKey) else { return nil }
            do throws(KeychainError) {
                return try TPMFailuresSeen(decoding: raw, secret: secret)
            } catch {
                Diagnostics.log("the record of the TPM's count of wrong passcodes failed authentication")
                throw error
            }
        }
    }

    func resetFailures() throws(KeychainError) {
        try updateLockoutRecord { $0 = LockoutRecord() }
    }

    /// Reads, changes and writes the lockout record under ``boundWrites``
    /// (nothing is written when `change` leaves it as it was).
    private func updateLockoutRecord(_ change: (inout LockoutRecord) -> Void) throws(KeychainError) {
        try boundWrites.withLock { _ throws(KeychainError) in
            var record = try readLockoutRecord()
            let before = record
            change(&record)
            guard record != before else { return }
            // A read-only keychain counts its wrong passcodes for as long as its device runs.
            if store.isReadOnly { return unsavedLockout.withLock { $0 = record } }
            try store.setMetadata(LockoutRecord.recordKey, record.encoded(secret: secret))
        }
    }
}
