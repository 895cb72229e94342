import KeychainCore
/// One item of a group's listing, as the device answers `list(group:)`:
/// its identifier, class and size (all known while locked). The one
/// encoder and decoder of the reply's fields, for every client (the
/// library, the command line, the Secret Service).
public struct ItemListing: Equatable, Sendable {
    public let identifier: String
    public let info: ItemInfo

    public init(identifier: String, info: ItemInfo) {
        self.identifier = identifier
        self.info = info
    }

    /// The reply's fields: identifier, class name and size in decimal, per item.
    public static func fields(_ items: [ItemListing]) -> [String] {
        items.flatMap { [$0.identifier, $0.info.protectionClass.name, String($0.info.size)] }
    }

    /// The items a reply's fields list. Fields that are not whole triples
    /// of a name, a class and a size came from another build: `.io`, never
    /// a listing cut short or an item with a made-up class.
    public static func items(fromFields fields: [String]) throws(KeychainError) -> [ItemListing] {
        guard fields.count % 3 == 0 else { throw .io }
        return try stride(from: 0, to: fields.count, by: 3).map { (index) throws(KeychainError) in
            guard let protectionClass = ProtectionClass(name: fields[index + 1]), let size = Int(fields[index + 2]),
                size >= 0
            else { throw .io }
            return ItemListing(identifier: fields[index], info: ItemInfo(protectionClass: protectionClass, size: size))
        }
    }
}
