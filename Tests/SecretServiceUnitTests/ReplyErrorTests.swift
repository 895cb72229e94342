import KeychainCore
import KeychainProtocol
import Testing
@testable import SecretService

/// What a client of the bus is told when the device says no: one mapping
/// for every method (docs/CONTRIBUTING.md, "Errors"), tested here without
/// a bus or a device.
@Suite struct ReplyErrorTests {
    static let itemPath = "/org/freedesktop/secrets/collection/work/mail"
    static let item = BusErrorSubject.item(path: itemPath)

    @Test func aLockedItemIsIsLockedAndNamesThePath() {
        let error = BusError(refusal: .keychain(.interactionNotAllowed, "the keychain is locked"), about: Self.item)
        #expect(error.name == "org.freedesktop.Secret.Error.IsLocked")
        #expect(error.message == "item at \(Self.itemPath) is locked")
    }

    @Test func anAbsentItemOrCollectionIsNoSuchObject() {
        let item = BusError(refusal: .keychain(.itemNotFound, ""), about: Self.item)
        let collection = BusError(refusal: .keychain(.itemNotFound, ""), about: .collection(group: "work"))
        #expect(item == BusError("org.freedesktop.Secret.Error.NoSuchObject", "no item at \(Self.itemPath)"))
        #expect(collection == BusError("org.freedesktop.Secret.Error.NoSuchObject", "no collection work"))
    }

    /// A policed group that does not admit the program: AccessDenied, never
    /// NoSuchObject (the item is there; this program may not have it).
    @Test func aProgramNotAdmittedIsAccessDenied() {
        let item = BusError(refusal: .keychain(.missingEntitlement, "not entitled"), about: Self.item)
        let collection = BusError(
            refusal: .keychain(.missingEntitlement, "not entitled"), about: .collection(group: "work"))
        #expect(item.name == "org.freedesktop.DBus.Error.AccessDenied")
        #expect(collection.message == "this program is not entitled to the access group work")
    }

    /// Every other refusal is Failed with the device's own sentence, which
    /// says what happened (a wrong passcode, a full quota, a TPM gone).
    @Test(arguments: [
        KeychainError.authFailed, .decode, .param, .nameTooLong, .valueTooLarge, .badRequest, .io,
        .duplicateItem, .quotaExceeded, .tpmUnavailable, .rolledBack
    ])
    func otherRefusalsAreFailedWithTheDevicesSentence(_ code: KeychainError) {
        let error = BusError(refusal: .keychain(code, code.description), about: Self.item)
        #expect(error == BusError("org.freedesktop.DBus.Error.Failed", code.description))
        let system = BusError(refusal: .system(28, "no space left on the device"), about: .collections)
        #expect(system == BusError("org.freedesktop.DBus.Error.Failed", "no space left on the device"))
    }

    /// A reply of the wrong kind (another build at the other end) is
    /// Failed, and a value it carried is not in the message.
    @Test func anUnexpectedValueIsFailedWithoutTheValue() throws {
        let reply = DeviceReply.value(try SecureBytes("hunter2-secret"), .whenUnlocked)
        let outcome = reply.outcome(GroupList.self)
        #expect(outcome == .failure(.unexpected))
        #expect(throws: BusError.unexpectedReply) { try outcome.answer(about: Self.item) }
        let error = BusError(refusal: .unexpected, about: Self.item)
        #expect(error.name == "org.freedesktop.DBus.Error.Failed" && !error.description.contains("hunter2"))
        #expect(throws: BusError.unexpectedReply) {
            try DeviceReply.ok(["x"]).outcome(ItemValue.self).answer(about: Self.item)
        }
    }

    @Test func theAnswerWantedIsReturned() throws {
        let value = try DeviceReply.value(try SecureBytes("s3cret"), .always).outcome(ItemValue.self)
            .answer(about: Self.item).value
        #expect(value.bytes() == Array("s3cret".utf8))
        #expect(try DeviceReply.ok(["a", "b"]).outcome(GroupList.self).answer(about: .collections).groups == ["a", "b"])
    }
}
