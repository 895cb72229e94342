/// A device in another process, as a ``PasswordManager`` that is its client
/// reaches it: each operation carried there, its core errors thrown here as
/// they were thrown there, so that "locked" stays "locked" (docs/PROTOCOL.md).
/// Named here so that the core does not know the wire: the KeychainProtocol
/// target's `DeviceConnection` implements it over the device's socket
/// (docs/CONTRIBUTING.md, "Where a new piece goes").
package protocol RemoteKeychain: Sendable {
    func lock() throws(KeychainError)
    func unlock(passcode: SecureBytes?) throws(KeychainError)
    func status() throws(KeychainError) -> DeviceStatus
    func set(
        group: String, identifier: String, value: SecureBytes, protectionClass: ProtectionClass,
        condition: PasswordManager.WriteCondition, details: ItemDetails?
    ) throws(KeychainError)
    func get(group: String, identifier: String) throws(KeychainError)
        -> (value: SecureBytes, protectionClass: ProtectionClass)
    func remove(group: String, identifier: String) throws(KeychainError)
    func info(group: String, identifier: String) throws(KeychainError) -> ItemInfo
    func setClass(group: String, identifier: String, protectionClass: ProtectionClass) throws(KeychainError)
    func rename(group: String, from identifier: String, to newIdentifier: String, replacing: Bool)
        throws(KeychainError)
    /// The details of `identifier` in `group` (nil: of every item that has them).
    func details(group: String, identifier: String?) throws(KeychainError)
        -> [(identifier: String, details: ItemDetails)]
    func setDetails(group: String, identifier: String, details: ItemDetails) throws(KeychainError)
    func groups() throws(KeychainError) -> [String]
    func items(inGroup group: String) throws(KeychainError) -> [(identifier: String, info: ItemInfo)]
    func createGroup(_ group: String) throws(KeychainError)
    func removeGroup(_ group: String) throws(KeychainError)
    func sync() throws(KeychainError)
}
