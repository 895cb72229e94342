import KeychainCore

/// What a method answers, typed: its handler returns it, the dispatcher
/// alone writes it to the bus (``SecretServiceProvider/send(_:to:)``),
/// and a test reads it as it is, with no message in between.
protocol MethodReply {
    /// Whether it carries a secret: sd-bus then wipes the message's memory when it frees it.
    var isSensitive: Bool { get }
    func write(to reply: BusMessageWriter) throws(BusError)
}

extension MethodReply {
    var isSensitive: Bool { false }
}

/// How a handler ends: with its reply, or with the call kept until the
/// person answers an owner question (``SecretServiceProvider/withConsent(_:to:items:denied:_:)``),
/// whose continuation sends the reply then.
enum MethodAnswer {
    case reply(any MethodReply)
    case waitingForConsent
}

/// A method with no out-arguments (`SetAlias`, `Close`, `SetSecret`, `Dismiss`, `Properties.Set`).
struct EmptyReply: MethodReply {
    func write(to reply: BusMessageWriter) throws(BusError) {}
}

/// One object path (`ReadAlias`; `Delete`'s prompt, always `/`).
struct ObjectReply: MethodReply, Equatable {
    let path: String
    func write(to reply: BusMessageWriter) throws(BusError) { try reply.objectPath(path) }
}

/// Object paths (`Collection.SearchItems`).
struct ObjectsReply: MethodReply, Equatable {
    let paths: [String]
    func write(to reply: BusMessageWriter) throws(BusError) { try reply.objectPaths(paths) }
}

/// `Service.SearchItems`: the unlocked and the locked matches apart.
struct SearchReply: MethodReply, Equatable {
    let unlocked: [String]
    let locked: [String]
    func write(to reply: BusMessageWriter) throws(BusError) {
        try reply.objectPaths(unlocked)
        try reply.objectPaths(locked)
    }
}

/// `Lock` and `Unlock`: the objects done at once, and a prompt for the rest (`/`: none).
struct ObjectsAndPrompt: MethodReply, Equatable {
    let objects: [String]
    let prompt: String
    func write(to reply: BusMessageWriter) throws(BusError) {
        try reply.objectPaths(objects)
        try reply.objectPath(prompt)
    }
}

/// `CreateCollection` and `CreateItem`: the object made, and a prompt (`/`: none).
struct CreatedReply: MethodReply, Equatable {
    let object: String
    let prompt: String
    func write(to reply: BusMessageWriter) throws(BusError) {
        try reply.objectPath(object)
        try reply.objectPath(prompt)
    }
}

/// `OpenSession`: the key exchange's output (nil: a `plain` session, whose
/// output is an empty string) and the session's path.
struct OpenedSession: MethodReply, Equatable {
    let output: [UInt8]?
    let path: String
    func write(to reply: BusMessageWriter) throws(BusError) {
        try reply.open("v", output == nil ? "s" : "ay")
        if let output {
            try reply.bytes(output)
        } else {
            try reply.string("")
        }
        try reply.close()
        try reply.objectPath(path)
    }
}

/// One secret as a reply carries it: sealed in the caller's session only when written.
struct SecretToSend {
    let item: String
    let value: SecureBytes
    let contentType: String
}

/// `Item.GetSecret`: the secret struct, sealed in the caller's session.
struct SecretReply: MethodReply {
    let secret: SecretToSend
    let session: TransferSession
    var isSensitive: Bool { true }
    func write(to reply: BusMessageWriter) throws(BusError) {
        try session.append(secret.value, contentType: secret.contentType, to: reply)
    }
}

/// `Service.GetSecrets`: each item's secret struct, by its path.
struct SecretsReply: MethodReply {
    let secrets: [SecretToSend]
    let session: TransferSession
    var isSensitive: Bool { true }
    func write(to reply: BusMessageWriter) throws(BusError) {
        try reply.open("a", "{o(oayays)}")
        for secret in secrets {
            try reply.open("e", "o(oayays)")
            try reply.objectPath(secret.item)
            try session.append(secret.value, contentType: secret.contentType, to: reply)
            try reply.close()
        }
        try reply.close()
    }
}

/// `Properties.Get`: one property's value.
struct PropertyReply: MethodReply, Equatable {
    let value: PropertyValue
    func write(to reply: BusMessageWriter) throws(BusError) { try reply.variant(value) }
}

/// `Properties.GetAll`: every property of the interface, by name (written in name order).
struct PropertiesReply: MethodReply, Equatable {
    let properties: [String: PropertyValue]
    func write(to reply: BusMessageWriter) throws(BusError) {
        try reply.open("a", "{sv}")
        for (name, value) in properties.sorted(by: { $0.key < $1.key }) {
            try reply.open("e", "sv")
            try reply.string(name)
            try reply.variant(value)
            try reply.close()
        }
        try reply.close()
    }
}

/// The Secret portal's `RetrieveSecret`: the request's response code and no results.
struct PortalReply: MethodReply, Equatable {
    let response: SecretServiceProvider.PortalResponse
    func write(to reply: BusMessageWriter) throws(BusError) {
        var code = UInt64(response.rawValue)
        try reply.basic("u", &code)
        try reply.open("a", "{sv}")
        try reply.close()
    }
}
