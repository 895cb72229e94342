import ArgumentParser
import KeychainCore

/// Shell completion of item names (GROUP/IDENTIFIER) for get, set, rm,
/// generate, otp and exec --env, and of groups for ls: names from the device when it runs,
/// never a value, and never a device started for a completion (a stopped
/// device means a locked keychain: nothing to offer). A group with an
/// entitlement policy lists its items only to programs it admits, which a
/// shell is not.
enum NameCompletion {
    /// GROUP/ then GROUP/IDENTIFIER.
    static let items = CompletionKind.custom { words, _, prefix in candidates(for: prefix, words: words) }

    /// A group (`ls GROUP`).
    static let groups = CompletionKind.custom { words, _, prefix in
        candidates(for: prefix, words: words).compactMap { $0.hasSuffix("/") ? String($0.dropLast()) : nil }
    }

    /// NAME=GROUP/IDENTIFIER: the part after `=`.
    static let environment = CompletionKind.custom { words, _, prefix in
        guard let equals = prefix.firstIndex(of: "=") else { return [] }
        let name = String(prefix[...equals])
        return candidates(for: String(prefix[prefix.index(after: equals)...]), words: words).map { name + $0 }
    }

    static func candidates(for prefix: String, words: [String]) -> [String] {
        guard let socketPath = try? keychain(in: words).socketPath() else { return [] }
        // Only a device that runs: a completion starts none, and says nothing.
        let device = RunningDevice(listeningAt: socketPath)
        guard let slash = prefix.firstIndex(of: "/") else {
            guard case .success(let list)? = try? device.outcome(.groups) else { return [] }
            return list.groups.map { $0 + "/" }.filter { $0.hasPrefix(prefix) }
        }
        let group = String(prefix[..<slash])
        guard case .success(let list)? = try? device.outcome(.items(inGroup: group)) else { return [] }
        return list.items.map { group + "/" + $0.identifier }.filter { $0.hasPrefix(prefix) }
    }

    /// The keychain the command line being completed names (`--keychain DIR`
    /// or `--keychain=DIR`), else the one a command would use.
    private static func keychain(in words: [String]) -> KeychainPlace {
        var named: String?
        for (index, word) in words.enumerated() {
            if word == "--keychain", index + 1 < words.count { named = words[index + 1] }
            if word.hasPrefix("--keychain=") { named = String(word.dropFirst("--keychain=".count)) }
        }
        return KeychainOptions.place(named: named)
    }
}
