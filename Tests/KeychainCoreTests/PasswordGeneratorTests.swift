import Testing
@testable import KeychainCore

@Suite struct PasswordGeneratorTests {
    typealias Class = PasswordGenerator.CharacterClass

    @Test(
        arguments: [
            (4, Set(Class.allCases)), (25, Set(Class.allCases)), (25, [.lower, .upper, .digits]), (12, [.digits]),
            (4096, [.symbols, .lower])
        ] as [(Int, Set<Class>)])
    func aPasswordHasTheLengthAndEveryClassAskedForAndNothingElse(length: Int, classes: Set<Class>) throws {
        for _ in 0..<(length > 100 ? 5 : 200) {
            let password = try PasswordGenerator.characters(length: length, classes: classes).bytes()
            #expect(password.count == length)
            for characterClass in Class.allCases {
                let present = password.contains { characterClass.characters.contains($0) }
                #expect(present == classes.contains(characterClass), "\(characterClass)")
            }
        }
    }

    @Test func everyCharacterOfTheAlphabetTurnsUp() throws {
        var seen = Set<UInt8>()
        for _ in 0..<100 {
            seen.formUnion(try PasswordGenerator.characters(length: 100, classes: Set(Class.allCases)).bytes())
        }
        #expect(seen.count == 26 + 26 + 10 + 32)
    }

    @Test func twoPasswordsDiffer() throws {
        let classes = Set(Class.allCases)
        #expect(
            try PasswordGenerator.characters(length: 25, classes: classes)
                != PasswordGenerator.characters(length: 25, classes: classes))
    }

    @Test(
        arguments: [
            (3, Set(Class.allCases), GeneratorError.badLength), (4097, [.lower], .badLength),
            (10, [], .noClasses), (5, Set(Class.allCases).subtracting([.lower, .upper]), nil),
            (4, Set(Class.allCases), nil)
        ] as [(Int, Set<Class>, GeneratorError?)])
    func impossibleRequestsSaySo(length: Int, classes: Set<Class>, expected: GeneratorError?) {
        if let expected {
            #expect(throws: expected) { try PasswordGenerator.characters(length: length, classes: classes) }
        } else {
            #expect(throws: Never.self) { try PasswordGenerator.characters(length: length, classes: classes) }
        }
    }

    @Test func aPassphraseIsWordsOfTheListJoinedBySeparator() throws {
        let words = PasswordGenerator.wordList(
            from: (0..<1500).map {
                "word" + String($0, radix: 5).map { ["a", "b", "c", "d", "e"][$0.wholeNumberValue!] }.joined()
            }.joined(separator: "\n"))
        let phrase = try #require(try PasswordGenerator.words(count: 6, from: words, separator: "-").string())
        let parts = phrase.split(separator: "-", omittingEmptySubsequences: false).map(String.init)
        #expect(parts.count == 6)
        #expect(parts.allSatisfy(words.contains))
    }

    @Test func aWordListKeepsPlainLowercaseWordsOnce() {
        let text = "11111\tabacus\nAlice\nalice's\nab\nzebra\nzebra\nsupercalifragilistic\r\nnaïve\n11112\tabdomen\n"
        #expect(PasswordGenerator.wordList(from: text) == ["abacus", "zebra", "abdomen"])
    }

    @Test func aShortListIsRefused() {
        #expect(throws: GeneratorError.shortWordList(3)) {
            try PasswordGenerator.words(count: 6, from: ["abc", "def", "ghi"], separator: " ")
        }
    }
}
