import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// The `org.freedesktop.Secret.Service` object (`/org/freedesktop/secrets`).
extension SecretServiceProvider {
    /// `OpenSession` (sv).
    func openSession(_ call: BusCall, algorithm: String, input: PropertyValue?) throws(BusError) -> OpenedSession {
        let path = ObjectPaths.sessionPrefix + String(nextSession)
        let (session, output) = try TransferSession.open(
            algorithm: algorithm, input: input, owner: call.sender, path: path)
        nextSession += 1
        sessions[path] = session
        return OpenedSession(output: output, path: path)
    }

    /// `SearchItems` (a{ss}).
    func searchItems(_ call: BusCall, attributes: [String: String]) throws(BusError) -> SearchReply {
        let found = try search(attributes, in: nil, caller: call)
        return SearchReply(unlocked: found.unlocked, locked: found.locked)
    }

    /// `GetSecrets` (aoo).
    func getSecrets(_ call: BusCall, items paths: [String], session sessionPath: String) throws(BusError)
        -> MethodAnswer
    {
        let session = try self.session(sessionPath, of: call)
        let items = paths.compactMap { path -> (group: String, identifier: String)? in
            guard case .item(let group, let identifier)? = ObjectPaths.object(at: path) else { return nil }
            return (group, identifier)
        }
        // Items of other programs the person denied are left out, as locked ones are.
        return try withConsent(
            call, to: "read the secrets of", items: items,
            denied: { [self] call, asked in
                let refused = Set(asked.map { ObjectPaths.item($0.group, $0.identifier) })
                return secrets(
                    call, items.filter { !refused.contains(ObjectPaths.item($0.group, $0.identifier)) },
                    session: session)
            }
        ) { [self] call in secrets(call, items, session: session) }
    }

    /// `CreateCollection` (a{sv}s).
    func createCollection(_ call: BusCall, properties: [String: PropertyValue], alias: String) throws(BusError)
        -> CreatedReply
    {
        let label: String
        if case .string(let given)? = properties[Self.collectionLabelProperty] {
            label = given
        } else {
            label = ""
        }
        let group: String
        if !alias.isEmpty {
            // The spec: a collection for a well-known alias that exists is returned as it is.
            guard let aliased = Self.group(ofAlias: alias) else {
                throw .notSupported("aliases other than default and login cannot be made (they name the group default)")
            }
            group = aliased
        } else {
            guard (try? ItemLimits.validate(name: label)) != nil else {
                throw .invalidArguments("a collection's label is its access group's name: 1 to 255 bytes, no '/'")
            }
            group = label
            // An existing group of that name is that collection.
            let made = outcome(.createGroup(group), for: call)
            if case .failure(.keychain(.duplicateItem, _)) = made {
            } else {
                try made.answer(about: .collection(group: group))
            }
        }
        return CreatedReply(object: ObjectPaths.collection(group), prompt: ObjectPaths.none)
    }

    /// `ReadAlias` (s).
    func readAlias(_ call: BusCall, alias: String) throws(BusError) -> ObjectReply {
        ObjectReply(path: Self.group(ofAlias: alias).map(ObjectPaths.collection) ?? ObjectPaths.none)
    }

    /// `SetAlias` (so).
    func setAlias(_ call: BusCall, alias: String, path: String) throws(BusError) -> EmptyReply {
        // Aliases are fixed: `default` and `login` name the group
        // default. Setting one to what it names already is done;
        // anything else would have to outlive the device and is refused.
        guard let group = Self.group(ofAlias: alias), path == ObjectPaths.collection(group) else {
            throw .notSupported("aliases are fixed: default and login name the collection default")
        }
        return EmptyReply()
    }

    /// `Lock` (ao).
    func lock(_ call: BusCall, objects paths: [String]) throws(BusError) -> ObjectsAndPrompt {
        _ = outcome(.lock, for: call)
        return ObjectsAndPrompt(objects: paths, prompt: ObjectPaths.none)
    }

    /// `Unlock` (ao).
    func unlock(_ call: BusCall, objects paths: [String]) throws(BusError) -> ObjectsAndPrompt {
        guard store.isLocked else { return ObjectsAndPrompt(objects: paths, prompt: ObjectPaths.none) }
        // Locked: the passcode is asked for when the client calls Prompt.
        let path = ObjectPaths.promptPrefix + String(nextPrompt)
        nextPrompt += 1
        prompts[path] = UnlockPrompt(owner: call.sender, objects: paths)
        return ObjectsAndPrompt(objects: [], prompt: path)
    }

    /// GetSecrets' reply: the secrets of the items that are unlocked and
    /// whose group admits the caller; locked, absent or not entitled ones
    /// left out, as the spec's "secrets of the unlocked items".
    func secrets(
        _ call: BusCall, _ items: [(group: String, identifier: String)],
        session: TransferSession
    ) -> SecretsReply {
        var secrets: [SecretToSend] = []
        for (group, identifier) in items {
            if case .success(let item) = outcome(.get(group: group, identifier: identifier), for: call) {
                secrets.append(
                    SecretToSend(
                        item: ObjectPaths.item(group, identifier), value: item.value,
                        contentType: contentType(of: group, identifier, for: call)))
            }
        }
        return SecretsReply(secrets: secrets, session: session)
    }
}
