import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// The `org.freedesktop.Secret.Item` objects: one per item.
extension SecretServiceProvider {
    /// `GetSecret` (o).
    func getSecret(_ call: BusCall, group: String, identifier: String, session sessionPath: String)
        throws(BusError) -> MethodAnswer
    {
        let session = try self.session(sessionPath, of: call)
        return try withConsent(call, to: "read the secret of", items: [(group, identifier)]) {
            [self] call throws(BusError) in
            let value = try perform(
                .get(group: group, identifier: identifier), for: call, about: .item(path: call.path)
            )
            .value
            return SecretReply(
                secret: SecretToSend(
                    item: call.path, value: value, contentType: contentType(of: group, identifier, for: call)),
                session: session)
        }
    }

    /// `SetSecret` ((oayays)).
    func setSecret(_ call: BusCall, group: String, identifier: String, _ sent: SentSecret) throws(BusError)
        -> MethodAnswer
    {
        let (value, contentType) = try secret(sent, of: call)
        // A new content type is kept with the item's details (made for
        // an item that had none); otherwise the item keeps its own.
        let current = try itemDetails(group, identifier, for: call)
        var details: ItemDetails?
        if contentType != current?.contentType ?? ItemDetails.defaultContentType {
            details = current ?? ItemDetails(label: identifier, attributes: [:])
            details?.contentType = contentType
            details?.modified = 0
            try validated(details)
        }
        let written = details
        return try withConsent(call, to: "change the secret of", items: [(group, identifier)]) {
            [self] call throws(BusError) in
            try perform(
                .set(group: group, identifier: identifier, value: value, condition: .ifPresent, details: written),
                for: call, about: .item(path: call.path))
            return EmptyReply()
        }
    }

    /// `Delete` (no arguments).
    func deleteItem(_ call: BusCall, group: String, identifier: String) throws(BusError) -> MethodAnswer {
        try withConsent(call, to: "delete", items: [(group, identifier)]) { [self] call throws(BusError) in
            try perform(.remove(group: group, identifier: identifier), for: call, about: .item(path: call.path))
            return ObjectReply(path: ObjectPaths.none)
        }
    }
}
