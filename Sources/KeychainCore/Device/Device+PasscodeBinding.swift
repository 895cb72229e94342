/// The passcode binding (``PasscodeBinding``; docs/FORMAT.md, "The passcode
/// binding"): checked at the first passcode of a boot, kept by writes, moved
/// with the rollback counter.
extension Device {
    /// After the passcode proved right (unlock, passcode change, grant,
    /// ...), with the class keys it unwrapped: the binding is checked and
    /// its key kept, the first time in this boot; a sealed keychain with a
    /// passcode and no binding yet gets one (from `passcode`) when `upgrade`
    /// says so (a passcode change leaves it to the next unlock: the keybag
    /// it writes is wrapped from the one it read).
    /// ``KeychainError/rolledBack`` or ``KeychainError/decode`` when the
    /// keychain was re-signed from an older copy by someone without it.
    func keyPasscodeBinding(
        classKeys: [ProtectionClass: GuardedKey], passcode: SecureBytes?, upgrade: Bool = true
    ) throws(KeychainError) {
        switch store.binding.withLock({ $0.state }) {
        case .keyed:
            return
        case .awaitingKey:
            guard let key = PasscodeBindingKey(classKeys: classKeys), let tpm = sealingTPM.withLock({ $0 }) else {
                Diagnostics.log("the keybag says the keychain has a passcode binding, but no TPM seals it")
                throw .decode
            }
            try boundWrites.withLock { _ throws(KeychainError) in
                try store.checkBinding(
                    key: key,
                    checkCounter: { (record) throws(KeychainError) in try Self.check(record, key: key, on: tpm) })
            }
        case .none:
            try refuseUnboundCopyOfBoundKeychain(classKeys: classKeys)
            guard upgrade else { return }
            do throws(KeychainError) {
                try bindToPasscode(classKeys: classKeys, passcode: passcode)
            } catch {
                // The keychain stays as it was (bound to the device secret
                // alone), and the next unlock tries again.
                Diagnostics.log("could not bind the keychain to its passcode: \(error)")
            }
        }
    }

    /// A sealed keychain with a passcode and no binding: the TPM is asked
    /// whether it was bound all the same. Its binding's counter is defined
    /// at indexes only the binding key gives (``PasscodeBindingKey/counterCandidates``),
    /// which the passcode unwraps and a copy from before the binding has
    /// too: one there that the key reads means the keychain was bound since,
    /// and this is an older copy, re-signed by someone without the passcode
    /// (``KeychainError/rolledBack``; `recover --accept-rollback` takes it on purpose).
    private func refuseUnboundCopyOfBoundKeychain(classKeys: [ProtectionClass: GuardedKey]) throws(KeychainError) {
        guard keybag.isBindable, let tpm = sealingTPM.withLock({ $0 }),
            let key = PasscodeBindingKey(classKeys: classKeys),
            let found = try tpm.bindingCounter(of: key)
        else { return }
        Diagnostics.log(
            "the keychain has no passcode binding, but the TPM holds its binding's counter (NV index 0x"
                + String(found.index, radix: 16) + "): an older copy of its files, from before it was bound, "
                + "re-signed by someone without the passcode")
        throw .rolledBack
    }

    /// The binding's value checked against its counter, as the rollback
    /// record's is (``RollbackRecord/check(against:secret:)``): behind it
    /// is an older copy re-signed; one ahead, a bump interrupted before the
    /// increment, which this completes.
    static func check(_ record: PasscodeBinding, key: PasscodeBindingKey, on tpm: any KeyProtector)
        throws(KeychainError)
    {
        let counter = record.counter(key: key)
        let value = try tpm.value(of: counter)
        if record.value < value {
            Diagnostics.log(
                "the keychain's passcode binding is from counter \(record.value), but its TPM counter is at "
                    + "\(value): an older copy of its files, re-signed by someone without the passcode")
            throw .rolledBack
        }
        if record.value == value + 1 {
            try tpm.increment(counter)
        } else if record.value != value {
            Diagnostics.log("the keychain's passcode binding (\(record.value)) is ahead of its TPM counter (\(value))")
            throw .decode
        }
    }

    /// Gives a sealed keychain with a passcode, made before the binding, one:
    /// a counter only the binding key moves, the binding of what it holds
    /// now, and the keybag marked bound (wrapped again with `passcode`),
    /// in one transaction.
    func bindToPasscode(classKeys: [ProtectionClass: GuardedKey], passcode: SecureBytes?)
        throws(KeychainError)
    {
        let bag = keybag, secret = secret
        guard let tpm = sealingTPM.withLock({ $0 }), let passcode, bag.isBindable,
            let key = PasscodeBindingKey(classKeys: classKeys)
        else { return }
        let bound = try SecretThread.run { () throws(KeychainError) -> Keybag in
            try bag.rewrapped(secret: secret, classKeys: classKeys, newPasscode: passcode, sealingTPM: tpm, bound: true)
        }
        let (counter, value) = try tpm.defineBindingCounter(of: key)
        try boundWrites.withLock { _ throws(KeychainError) in
            try store.bind(
                key: key, counter: counter, value: value,
                writing: [(Keybag.recordKey, bound.encoded(secret: secret))])
            currentKeybag.withLock { $0 = bound }
        }
        try store.sync()
    }

    /// Moves the binding's counter when the binding changed since it last
    /// moved, in the order of a bump (commit, then increment). Called by
    /// ``bumpRollbackCounter(_:)`` under ``boundWrites``.
    func moveBindingCounter(on tpm: any KeyProtector) throws(KeychainError) {
        guard store.binding.withLock({ $0.changed }), let (current, key) = try store.currentBinding() else { return }
        let counter = current.counter(key: key)
        var counted = try tpm.value(of: counter)
        if counted + 1 == current.value {
            try tpm.increment(counter)  // an earlier move committed, but its increment failed
            counted += 1
        }
        guard counted == current.value else {
            Diagnostics.log("the passcode binding's TPM counter (\(counted)) does not match the keychain's")
            return
        }
        guard try store.moveBinding(to: { $0.value + 1 }) != nil else { return }
        try store.sync()
        CrashPoint.reach("binding-committed")
        try tpm.increment(counter)
    }

    /// The binding's TPM counter, when its key is in memory (to free it).
    var passcodeCounter: CounterReference? {
        guard let (record, key) = try? store.currentBinding() else { return nil }
        return record.counter(key: key)
    }

    /// Writes the entitlement policy, and its digest into the binding.
    func writePolicy(_ policy: EntitlementPolicy) throws(KeychainError) {
        try boundWrites.withLock { _ throws(KeychainError) in try store.writePolicy(policy.encoded(secret: secret)) }
    }
}
