// FoundationEssentials has Data and the JSON coders without ICU: Foundation
// would make every keychainfs process load 40 MB more and start 4 ms later.
import FoundationEssentials
internal import CSodium

/// One access group as a dictionary of typed values, in the manner of
/// FXKeychain. Strings are stored as their UTF-8 bytes and `Data` as is (so
/// `cat` shows them); other `Codable` values as JSON, decoded only into the
/// type the caller names, never into whatever type the stored bytes claim.
///
/// Reads return nil only for an absent key; a locked item throws
/// ``KeychainError/interactionNotAllowed``. Writes are methods rather than
/// subscript setters because Swift setters cannot throw, and a write that
/// fails silently (locked, too large) is the data loss this design exists to
/// prevent.
public struct TypedKeychain: Sendable {
    /// The manager whose device and settings are used.
    public let manager: PasswordManager
    /// The access group this view covers.
    public let group: String

    /// A view of `group` (`default` when nil).
    public init(manager: PasswordManager, group: String? = nil) throws(KeychainError) {
        let group = group ?? ItemLimits.defaultGroup
        try ItemLimits.validate(name: group)
        self.manager = manager
        self.group = group
    }

    /// The string stored for `key`, or nil if there is none.
    public subscript(key: String) -> String? {
        get throws(KeychainError) { try string(forKey: key) }
    }

    /// The value stored for `key` decoded as `type`, or nil if there is none.
    public subscript<Value: Decodable>(key: String, as type: Value.Type) -> Value? {
        get throws(KeychainError) { try value(forKey: key, as: type) }
    }

    /// The string stored for `key`; ``KeychainError/decode`` if it is not UTF-8.
    public func string(forKey key: String) throws(KeychainError) -> String? {
        guard let bytes = try secret(forKey: key) else { return nil }
        guard let string = bytes.string() else { throw .decode }
        return string
    }

    /// The bytes stored for `key`, or nil.
    public func data(forKey key: String) throws(KeychainError) -> Data? {
        try secret(forKey: key)?.withUnsafeBytes { Data($0) }
    }

    /// The value for `key` as `type`: strings and `Data` as stored, other types
    /// decoded from JSON. ``KeychainError/decode`` if the bytes are not a `type`.
    public func value<Value: Decodable>(forKey key: String, as type: Value.Type) throws(KeychainError) -> Value? {
        if type == String.self { return try string(forKey: key) as? Value }
        if type == Data.self { return try data(forKey: key) as? Value }
        guard let bytes = try secret(forKey: key) else { return nil }
        do {
            return try bytes.withUnsafeBytes { raw in
                try JSONDecoder().decode(
                    Value.self,
                    from: Data(
                        bytesNoCopy: UnsafeMutableRawPointer(
                            mutating: raw.baseAddress ?? UnsafeRawPointer(bitPattern: 1)!),
                        count: raw.count, deallocator: .none))
            }
        } catch {
            throw .decode
        }
    }

    /// Stores a string as its UTF-8 bytes.
    public func set(_ string: String, forKey key: String) throws(KeychainError) {
        try manager.register(try SecureBytes(string), forIdentifier: key, inGroup: group)
    }

    /// Stores bytes as they are.
    public func set(_ data: Data, forKey key: String) throws(KeychainError) {
        let bytes = data.withUnsafeBytes { raw in Result { () throws(KeychainError) in try SecureBytes(copying: raw) } }
        try manager.register(try bytes.get(), forIdentifier: key, inGroup: group)
    }

    /// Stores any `Encodable` value as JSON (strings and `Data` as themselves).
    public func set<Value: Encodable>(_ value: Value, forKey key: String) throws(KeychainError) {
        if let string = value as? String { return try set(string, forKey: key) }
        if let data = value as? Data { return try set(data, forKey: key) }
        var json: Data
        do {
            json = try JSONEncoder().encode(value)
        } catch {
            throw .param
        }
        // The encoder's buffer is ordinary heap memory: copy it into secret
        // memory, then wipe it.
        defer { json.withUnsafeMutableBytes { sodium_memzero($0.baseAddress, $0.count) } }
        try set(json, forKey: key)
    }

    /// Removes the value for `key`; false if there was none. Works while locked.
    @discardableResult
    public func removeValue(forKey key: String) throws(KeychainError) -> Bool {
        do {
            try manager.deleteKey(forIdentifier: key, inGroup: group)
            return true
        } catch .itemNotFound {
            return false
        }
    }

    /// Every key of the group, sorted. Works while locked.
    public func allKeys() throws(KeychainError) -> [String] {
        do {
            return try manager.identifiers(inGroup: group)
        } catch .itemNotFound {
            return []  // a group nobody has written to yet is empty, not an error
        }
    }

    private func secret(forKey key: String) throws(KeychainError) -> SecureBytes? {
        do {
            return try manager.key(forIdentifier: key, inGroup: group)
        } catch .itemNotFound {
            return nil
        }
    }
}
