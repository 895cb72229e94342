internal import CSodium
#if canImport(Glibc)
import Glibc
#endif

/// New passwords, made in secret memory from the system's CSPRNG
/// (randombytes_uniform: no modulo bias), so that a generated value is never
/// an ordinary `String` or array.
public enum PasswordGenerator {
    /// The character classes a password may draw from (ASCII only, so that
    /// every site and every terminal accepts it).
    public enum CharacterClass: String, Sendable, CaseIterable {
        case lower, upper, digits, symbols

        var characters: [UInt8] {
            switch self {
            case .lower: Array(UInt8(ascii: "a")...UInt8(ascii: "z"))
            case .upper: Array(UInt8(ascii: "A")...UInt8(ascii: "Z"))
            case .digits: Array(UInt8(ascii: "0")...UInt8(ascii: "9"))
            // POSIX [:punct:] in the C locale, as pass uses.
            case .symbols: Array("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~".utf8)
            }
        }
    }

    public static let lengthRange = 4...4096
    public static let wordCountRange = 3...64
    /// A list shorter than this gives words too guessable to be worth the name (10 bits each).
    public static let minimumWordListSize = 1024

    /// `length` characters drawn uniformly from the union of `classes`,
    /// containing at least one of each (the rule sites impose): a draw that
    /// misses a class is thrown away whole, which keeps the result uniform
    /// over the passwords that satisfy the rule.
    public static func characters(length: Int, classes: Set<CharacterClass>) throws(GeneratorError) -> SecureBytes {
        guard lengthRange.contains(length) else { throw .badLength }
        guard !classes.isEmpty else { throw .noClasses }
        guard length >= classes.count else { throw .tooShortForClasses }
        let chosen = CharacterClass.allCases.filter(classes.contains)
        let alphabet = chosen.flatMap(\.characters)
        let members = chosen.map { Set($0.characters) }
        guard let password = try? SecureBytes(count: length) else { throw .badLength }
        Sodium.ensureInitialized()
        while true {
            for index in 0..<length {
                password.mutableBytes[index] = alphabet[Int(randombytes_uniform(UInt32(alphabet.count)))]
            }
            let bytes = UnsafeRawBufferPointer(password.mutableBytes)
            if members.allSatisfy({ member in bytes.contains(where: member.contains) }) { return password }
        }
    }

    /// `count` words drawn uniformly from `words`, joined by `separator`
    /// (diceware, with the computer's dice).
    public static func words(count: Int, from words: [String], separator: String) throws(GeneratorError) -> SecureBytes
    {
        guard wordCountRange.contains(count) else { throw .badWordCount }
        guard words.count >= minimumWordListSize else { throw .shortWordList(words.count) }
        Sodium.ensureInitialized()
        let picks = (0..<count).map { _ in Int(randombytes_uniform(UInt32(words.count))) }
        let length = picks.reduce(0) { $0 + words[$1].utf8.count } + separator.utf8.count * (count - 1)
        guard let phrase = try? SecureBytes(count: length) else { throw .badWordCount }
        var offset = 0
        for (position, pick) in picks.enumerated() {
            for part in position == 0 ? [words[pick]] : [separator, words[pick]] {
                for byte in part.utf8 {
                    phrase.mutableBytes[offset] = byte
                    offset += 1
                }
            }
        }
        return phrase
    }

    /// The words of a list file: a plain list (one word per line, as
    /// /usr/share/dict/words) or a diceware list ("11111<TAB>abacus"), kept
    /// when they are 3 to 9 lowercase ASCII letters (no names, no
    /// possessives, nothing a keyboard layout could garble), without repeats.
    public static func wordList(from text: String) -> [String] {
        var seen = Set<String>()
        return text.split(whereSeparator: \.isNewline).compactMap { line in
            guard let word = line.split(whereSeparator: { $0 == " " || $0 == "\t" }).last.map(String.init),
                (3...9).contains(word.utf8.count),
                word.utf8.allSatisfy({ (UInt8(ascii: "a")...UInt8(ascii: "z")).contains($0) }),
                seen.insert(word).inserted
            else { return nil }
            return word
        }
    }

    /// Bits of entropy of a password of `length` from `classes` (an upper bound:
    /// the at-least-one-of-each rule removes a little).
    public static func entropyBits(length: Int, classes: Set<CharacterClass>) -> Double {
        Double(length) * log2(Double(CharacterClass.allCases.filter(classes.contains).flatMap(\.characters).count))
    }

    /// Bits of entropy of `count` words from a list of `listSize`.
    public static func entropyBits(words count: Int, listSize: Int) -> Double {
        Double(count) * log2(Double(listSize))
    }
}

public enum GeneratorError: Error, Equatable, CustomStringConvertible {
    case badLength, badWordCount, noClasses, tooShortForClasses, shortWordList(Int)

    public var description: String {
        switch self {
        case .badLength:
            "the length must be from \(PasswordGenerator.lengthRange.lowerBound) to \(PasswordGenerator.lengthRange.upperBound) characters"
        case .badWordCount:
            "the number of words must be from \(PasswordGenerator.wordCountRange.lowerBound) to \(PasswordGenerator.wordCountRange.upperBound)"
        case .noClasses: "no character class left to draw from"
        case .tooShortForClasses: "the length is shorter than the number of character classes it must contain"
        case .shortWordList(let count):
            "the word list has \(count) usable words (3 to 9 lowercase letters); at least \(PasswordGenerator.minimumWordListSize) are needed"
        }
    }
}
