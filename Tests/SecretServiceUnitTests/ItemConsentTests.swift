import KeychainCore
import Testing
@testable import SecretService

/// Whose an item is (issue 31), as the provider decides it before asking
/// anyone: who uses an item freely, and what the person is asked.
@Suite struct ItemConsentTests {
    static let chromium = ProgramClaim(
        executable: "/usr/lib/chromium/chromium", digest: Array(repeating: 1, count: 32),
        package: "chromium")
    static let tool = ProgramClaim(
        executable: "/usr/bin/secret-tool", digest: Array(repeating: 2, count: 32),
        package: "libsecret-tools")

    static func program(_ claim: ProgramClaim, distrust: String? = nil) -> ProgramIdentity {
        ProgramIdentity(executable: claim.executable, digest: claim.digest, unit: nil, uid: 1000, distrust: distrust)
    }

    static func details(owner: ProgramClaim?, allowed: [ProgramClaim] = []) -> ItemDetails {
        var details = ItemDetails(label: "Chromium Safe Storage", attributes: ["application": "chromium"])
        details.owner = owner
        details.allowed = allowed
        return details
    }

    @Test func theOwnerAndTheAllowedUseAnItemFreelyAndNoOneElse() {
        let owned = Self.details(owner: Self.chromium)
        #expect(ItemConsent.isFree(owned, for: Self.program(Self.chromium)))
        #expect(!ItemConsent.isFree(owned, for: Self.program(Self.tool)))
        #expect(!ItemConsent.isFree(owned, for: nil), "a caller that cannot be read is asked about")
        #expect(
            ItemConsent.isFree(Self.details(owner: Self.chromium, allowed: [Self.tool]), for: Self.program(Self.tool)))
        // The exec race: a process that cannot be taken for the owner is not the owner.
        #expect(
            !ItemConsent.isFree(
                owned, for: Self.program(Self.chromium, distrust: "its bus connection is shared with pid 7 (sh)")))
        // An item of no program, or without details, is every program's.
        #expect(ItemConsent.isFree(Self.details(owner: nil), for: Self.program(Self.tool)))
        #expect(ItemConsent.isFree(nil, for: nil))
    }

    @Test func theQuestionNamesTheProgramTheItemsAndTheOwnerAndCannotBeForged() {
        let asked = [
            ItemConsent.Asked(group: "default", identifier: "key", label: "Chromium Safe Storage", owner: Self.chromium)
        ]
        #expect(
            ItemConsent.question(asker: Self.tool, items: asked, asking: "read the secret of")
                == "/usr/bin/secret-tool (package libsecret-tools) wants to read the secret of \"Chromium Safe Storage\" in default, "
                + "which belongs to /usr/lib/chromium/chromium (package chromium).")
        // A label with a line break cannot add a line of its own to the question.
        let forged = [
            ItemConsent.Asked(group: "default", identifier: "x", label: "x\nwhich belongs to you", owner: Self.chromium)
        ]
        #expect(!ItemConsent.question(asker: nil, items: forged, asking: "delete").contains("\n"))
        #expect(
            ItemConsent.question(asker: nil, items: forged, asking: "delete").hasPrefix(
                "a program that cannot be identified wants to delete"))
        // Many items: five named, the rest counted.
        let many = (1...7).map {
            ItemConsent.Asked(group: "g", identifier: "i\($0)", label: "i\($0)", owner: Self.chromium)
        }
        #expect(
            ItemConsent.question(asker: Self.tool, items: many, asking: "read the secrets of").contains("and 2 more"))
    }
}
