import KeychainCore
import Testing
@testable import SecretService

/// The Secret Service's object paths name the keychain's groups and items
/// one way each, and read back (any program of the user can send a path).
@Suite struct ObjectPathTests {
    @Test(arguments: ["default", "TEAMID.com.example.shared", "GitHub token", "_", "café", "a_5fb", "x-y"])
    func everyNameHasOnePathAndReadsBack(_ name: String) {
        let item = ObjectPaths.item(name, name + " 2")
        #expect(ObjectPaths.object(at: item) == .item(group: name, identifier: name + " 2"))
        #expect(ObjectPaths.object(at: ObjectPaths.collection(name)) == .collection(name))
        #expect(
            ObjectPaths.element(name).utf8.allSatisfy {
                $0 == UInt8(ascii: "_") || ($0 < 0x80 && Character(UnicodeScalar($0)).isLetter)
                    || ($0 >= 0x30 && $0 <= 0x39)
            })
    }

    @Test(arguments: [
        "/org/freedesktop/secrets/collection/",  // no name
        "/org/freedesktop/secrets/collection/a/b/c",  // too deep
        "/org/freedesktop/secrets/collection/_5F",  // an upper-case escape: a second spelling of "_"
        "/org/freedesktop/secrets/collection/a_",  // a cut escape
        "/org/freedesktop/secrets/collection/_61",  // "a" escaped: a second spelling
        "/org/freedesktop/secrets/collection/_ff",  // not UTF-8
        "/org/freedesktop/secrets/session/",
        "/org/freedesktop/secrets/prompt/1/2",
        "/org/freedesktop/secretsx",
        "/"
    ])
    func aPathThatIsNotExactlyOnesIsNoObject(_ path: String) {
        #expect(ObjectPaths.object(at: path) == nil)
    }

    @Test func servicesSessionsAliasesAndPromptsAreRead() {
        #expect(ObjectPaths.object(at: "/org/freedesktop/secrets") == .service)
        #expect(ObjectPaths.object(at: "/org/freedesktop/secrets/session/7") == .session("7"))
        #expect(ObjectPaths.object(at: "/org/freedesktop/secrets/aliases/default") == .alias("default"))
        #expect(ObjectPaths.object(at: "/org/freedesktop/secrets/prompt/3") == .prompt("3"))
    }
}
