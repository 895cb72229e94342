import KeychainCore
/// A `details` reply: per item its identifier, then ``ItemDetails/fields``.
/// Its one encoder and decoder, for the device and every client.
extension ItemDetails {
    package static func listingFields(_ found: [(identifier: String, details: ItemDetails)]) -> [String] {
        found.flatMap { [$0.identifier] + $0.details.fields }
    }

    /// The items and details a reply's fields list; `.io` for fields that
    /// do not read as such (another build answered).
    package static func listed(fromFields fields: [String]) throws(KeychainError) -> [(
        identifier: String, details: ItemDetails
    )] {
        var rest = fields[...]
        var found: [(identifier: String, details: ItemDetails)] = []
        while let identifier = rest.popFirst() {
            guard let details = ItemDetails(fields: &rest) else { throw .io }
            found.append((identifier, details))
        }
        return found
    }
}
