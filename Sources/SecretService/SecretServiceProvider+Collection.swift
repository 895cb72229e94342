import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// The `org.freedesktop.Secret.Collection` objects: one per access group.
extension SecretServiceProvider {
    /// `SearchItems` (a{ss}).
    func searchCollection(_ call: BusCall, group: String, attributes: [String: String]) throws(BusError)
        -> ObjectsReply
    {
        let found = try search(attributes, in: group, caller: call)
        return ObjectsReply(paths: found.unlocked + found.locked)
    }

    /// `Delete` (no arguments).
    func deleteCollection(_ call: BusCall, group: String) throws(BusError) -> ObjectReply {
        // As rmdir: a group that holds items is refused, never emptied by one call.
        let removed = outcome(.removeGroup(group), for: call)
        if case .failure(.keychain(.badRequest, _)) = removed {
            throw .failed(
                "the collection \(group) still holds items (or is mounted): remove them first; nothing was deleted")
        }
        try removed.answer(about: .collection(group: group))
        return ObjectReply(path: ObjectPaths.none)
    }

    /// `CreateItem` (a{sv}(oayays)b), the spec's. With `replace`, the item of the collection
    /// whose lookup attributes are exactly the ones given gets the new
    /// value, label and type (one that also names `keychainfs:identifier`
    /// must be that item; with no attribute of its program's, none is
    /// replaced: an empty set would otherwise pick any item). Otherwise a
    /// new item, named after its label (`keychainfs:identifier` names it
    /// exactly), made unique with " (2)", " (3)"... The class is the one
    /// `keychainfs:accessible` names, else the device's access mode.
    /// The new item belongs to the caller (``ItemDetails/owner``), or to
    /// ``ProgramClaim/unidentified`` when the caller cannot be identified; an item
    /// it replaces keeps its owner, who must be the caller or allow it.
    func createItem(_ call: BusCall, group: String, _ item: NewItem) throws(BusError) -> MethodAnswer {
        let properties = item.properties, replace = item.replace
        let (value, contentType) = try secret(item.secret, of: call)
        var label = "", attributes: [String: String] = [:]
        if case .string(let given)? = properties[Self.itemLabelProperty] { label = given }
        if case .attributes(let given)? = properties[Self.itemAttributesProperty] { attributes = given }
        var protectionClass: ProtectionClass?
        if let name = attributes[Self.accessibleAttribute] {
            guard let named = ItemAttribute.accessible.protectionClass(written: name, over: .whenUnlocked) else {
                throw .invalidArguments("\(Self.accessibleAttribute) names no protection class: \(name)")
            }
            protectionClass = named
        }
        let stored = attributes.filter { !$0.key.hasPrefix(Self.attributePrefix) }
        var details = ItemDetails(
            label: label, contentType: contentType.isEmpty ? ItemDetails.defaultContentType : contentType,
            attributes: stored)
        // A process that cannot be taken for its program makes an item of
        // "unidentified", which every program is asked about
        // (docs/SECRET-SERVICE.md, "Whose an item is"): never one of no
        // program, which every program would use unasked.
        if let caller = callerIdentity(call), caller.distrust == nil, !caller.runsUnidentifiableScript {
            details.owner = ProgramClaim(caller)
        } else {
            details.owner = .unidentified
        }
        try validated(details)
        let named = attributes[Self.identifierAttribute]
        if let named, (try? ItemLimits.validate(identifier: named)) == nil {
            throw .invalidArguments(
                "\(Self.identifierAttribute) is no valid item name: 1 to 255 bytes, names joined by '/' at most")
        }
        if replace, !stored.isEmpty || named != nil,
            let existing = try items(of: group, for: call).first(where: { item in
                (item.details?.attributes ?? [:]) == stored
                    && item.attributes.matches(attributes.filter { $0.key != Self.accessibleAttribute })
            })
        {
            let written = details
            return try withConsent(call, to: "replace", items: [(group, existing.identifier)]) {
                [self] call throws(BusError) in
                try perform(
                    .set(
                        group: group, identifier: existing.identifier, value: value, protectionClass: protectionClass,
                        details: written), for: call, about: .item(path: existing.path))
                return CreatedReply(object: existing.path, prompt: ObjectPaths.none)
            }
        }
        // Names the provider knows taken are skipped: each try of one was a failed write in the audit log,
        // and the hundredth "My item" tried 99 of them. The items it knows follow the device's events, kept
        // for the signals; one made meanwhile is still refused by the create-only write.
        for identifier in ItemLimits.candidateNames(named ?? ItemLimits.name(from: label) ?? "item")
        where named != nil || !knownItems.contains(ObjectPaths.item(group, identifier)) {
            let made = outcome(
                .set(
                    group: group, identifier: identifier, value: value, protectionClass: protectionClass,
                    condition: .ifAbsent, details: details), for: call)
            if case .failure(.keychain(.duplicateItem, _)) = made, named == nil { continue }
            let path = ObjectPaths.item(group, identifier)
            try made.answer(about: .item(path: path))
            if details.owner == .unidentified, let maker = bus.senderProcess(of: call.message) {
                store.noteMaker(ofUnidentified: identifier, inGroup: group, pid: maker.pid)
            }
            return .reply(CreatedReply(object: path, prompt: ObjectPaths.none))
        }
        throw .failed("too many items are named after the label \(label)")
    }
}
