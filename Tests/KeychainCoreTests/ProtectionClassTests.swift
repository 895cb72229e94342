import Testing
@testable import KeychainCore

/// Each class across lock, first unlock and restart (iOS data protection).
@Suite struct ProtectionClassTests {
    enum Phase: CaseIterable { case unlocked, lockedAfterUnlock, rebootedBeforeUnlock }

    static func readable(_ protectionClass: ProtectionClass, in phase: Phase) -> Bool {
        switch (protectionClass.mode, phase) {
        case (_, .unlocked): return true
        case (.whenUnlocked, _): return false
        case (.afterFirstUnlock, .lockedAfterUnlock): return true
        case (.afterFirstUnlock, .rebootedBeforeUnlock): return false
        case (.always, _): return true
        }
    }

    @Test(arguments: ProtectionClass.allCases)
    func eachClassIsReadableExactlyWhenItsKeyIsAvailable(_ protectionClass: ProtectionClass) throws {
        let keychain = try TemporaryKeychain()
        let value = "value of \(protectionClass.name)"
        do {
            let manager = try keychain.manager()
            try manager.localDevice.unlock(passcode: secure(TemporaryKeychain.passcode))
            try manager.write(secure(value), identifier: "item", group: "g", protectionClass: protectionClass)
            #expect(try manager.string(forIdentifier: "item", inGroup: "g") == value)
            manager.localDevice.lock()
            try check(manager, protectionClass, .lockedAfterUnlock, value)
        }
        let rebooted = try keychain.manager()
        try check(rebooted, protectionClass, .rebootedBeforeUnlock, value)
        try rebooted.device.unlock(passcode: secure(TemporaryKeychain.passcode))
        try check(rebooted, protectionClass, .unlocked, value)
    }

    private func check(
        _ manager: PasswordManager, _ protectionClass: ProtectionClass, _ phase: Phase,
        _ value: String
    ) throws {
        // Listing and size work whatever the lock state.
        #expect(
            try manager.info(forIdentifier: "item", inGroup: "g")
                == ItemInfo(protectionClass: protectionClass, size: value.utf8.count))
        #expect(try manager.identifiers(inGroup: "g") == ["item"])
        if Self.readable(protectionClass, in: phase) {
            #expect(try manager.string(forIdentifier: "item", inGroup: "g") == value)
            try manager.write(secure(value), identifier: "item", group: "g", protectionClass: protectionClass)
        } else {
            expectError(.interactionNotAllowed) { try manager.key(forIdentifier: "item", inGroup: "g") }
            expectError(.interactionNotAllowed) {
                try manager.write(secure("new"), identifier: "item", group: "g", protectionClass: protectionClass)
            }
        }
    }

    @Test func classNamesRoundTripAndMigrationFollowsThisDeviceOnly() {
        for protectionClass in ProtectionClass.allCases {
            #expect(ProtectionClass(name: protectionClass.name) == protectionClass)
            #expect(protectionClass.isMigratable == !protectionClass.name.hasSuffix("ThisDeviceOnly"))
            #expect(
                ProtectionClass(mode: protectionClass.mode, migratable: protectionClass.isMigratable) == protectionClass
            )
        }
        #expect(ProtectionClass(name: "sometimes") == nil)
    }
}

/// The one table of an item's attributes (``ItemAttribute``): every door's
/// names are its own and distinct, and what a writable attribute reads back
/// is what writing it gives.
@Suite struct ItemAttributeTests {
    @Test func eachNameIsOneAttributeAndAWrittenValueReadsBack() {
        let xattrs = ItemAttribute.allCases.compactMap(\.extendedAttributeName)
        let bus = ItemAttribute.allCases.compactMap(\.busName)
        let properties = ItemAttribute.allCases.compactMap(\.busProperty)
        #expect(Set(xattrs).count == xattrs.count && Set(bus).count == bus.count)
        #expect(Set(properties).count == properties.count && !properties.contains("Attributes"))
        #expect(xattrs.allSatisfy { $0.hasPrefix("user.keychain.") } && bus.allSatisfy { $0.hasPrefix("keychainfs:") })
        let kept = ItemDetails(label: "Mail at work", contentType: "application/json", attributes: ["app": "mail"])
        for attribute in ItemAttribute.allCases {
            if let name = attribute.extendedAttributeName {
                #expect(ItemAttribute(extendedAttributeName: name) == attribute)
            }
            if let name = attribute.busProperty { #expect(ItemAttribute(busProperty: name) == attribute) }
            for current in ProtectionClass.allCases {
                for details in [nil, kept] {
                    let item = ItemView(group: "g", identifier: "i", protectionClass: current, details: details)
                    let shown = attribute.value(of: item)
                    let change = attribute.change(written: shown, to: item)
                    #expect(attribute.isWritable == (change != nil), "\(attribute) \(current)")
                    switch change {
                    case .protectionClass(let written): #expect(written == current, "\(attribute) \(current)")
                    case .details(let written):
                        let after = ItemView(group: "g", identifier: "i", protectionClass: current, details: written)
                        #expect(attribute.value(of: after) == shown, "\(attribute)")
                        // The other details stay.
                        #expect(written.attributes == (details?.attributes ?? [:]), "\(attribute)")
                    case nil: break
                    }
                }
            }
        }
        let item = ItemView(group: "g", identifier: "i", protectionClass: .always, details: nil)
        #expect(ItemAttribute.migratable.change(written: "no", to: item) == .protectionClass(.alwaysThisDeviceOnly))
        #expect(ItemAttribute.accessible.change(written: "sometimes", to: item) == nil)
        #expect(ItemAttribute.label.value(of: item) == "i" && ItemAttribute.contentType.value(of: item) == "text/plain")
    }
}
