import ArgumentParser
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

extension PasswordGenerator.CharacterClass: ExpressibleByArgument {}

struct GenerateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "generate",
        abstract: "Store a new random password (or passphrase) as an item; prints nothing unless asked.",
        discussion: """
            Characters are drawn uniformly from the classes chosen (all four unless --classes or \
            --no-symbols says otherwise), with at least one of each. --words makes a passphrase of \
            LENGTH words (6 by default) from --wordlist (/usr/share/dict/words by default; a \
            diceware list works too). An existing item is kept unless --force is given. The item \
            gets the device's accessmode and migrate setting, as `set` does.
            """)

    @Argument(help: "The item, as GROUP/IDENTIFIER.", completion: NameCompletion.items, transform: ItemAddress.parsed)
    var item: ItemAddress

    @Argument(help: "Characters (25 by default), or words with --words (6 by default).")
    var length: Int?

    @Option(parsing: .upToNextOption, help: "The character classes to use: lower, upper, digits, symbols.")
    var classes: [PasswordGenerator.CharacterClass] = PasswordGenerator.CharacterClass.allCases

    @Flag(name: [.customShort("n"), .long], help: "Letters and digits only (pass's --no-symbols).")
    var noSymbols = false

    @Flag(help: "A passphrase of words instead of characters.")
    var words = false

    @Option(help: "The word list for --words.")
    var wordlist = "/usr/share/dict/words"

    @Option(help: "What joins the words of --words.")
    var separator = "-"

    @Flag(name: [.customShort("f"), .long], help: "Replace an existing item.")
    var force = false

    @Flag(name: [.customShort("p"), .long], help: "Print the password on standard output.")
    var print = false

    @Flag(name: [.customShort("c"), .long], help: "Copy the password to the clipboard (cleared after 45 s).")
    var clip = false

    @OptionGroup var options: KeychainOptions

    func validate() throws {
        if words && (noSymbols || classes != PasswordGenerator.CharacterClass.allCases) {
            throw ValidationError("--words makes a passphrase; --classes and --no-symbols are for characters.")
        }
    }

    func run() throws {
        let clipboard = clip ? try Clipboard.current() : nil
        let password: SecureBytes
        do {
            if words {
                let text = try readWordList()
                password = try PasswordGenerator.words(
                    count: length ?? 6, from: PasswordGenerator.wordList(from: text), separator: separator)
            } else {
                let chosen = Set(classes).subtracting(noSymbols ? [.symbols] : [])
                password = try PasswordGenerator.characters(length: length ?? 25, classes: chosen)
            }
        } catch let error as GeneratorError {
            throw fail("cannot generate \(item): \(error)")
        }
        try RunningDevice(options.place).store(password, at: item, condition: force ? .always : .ifAbsent)
        if print {
            guard
                password.withUnsafeBytes({ (try? BorrowedDescriptor.standardOutput.writeAll($0)) != nil })
                    && (try? BorrowedDescriptor.standardOutput.writeAll([10])) != nil
            else {
                throw fail("stored \(item), but cannot write it to standard output")
            }
        }
        try clipboard?.copyAndClearLater(password, what: "\(item)")
    }

    /// The word list's text (a word list is no secret: an ordinary read).
    private func readWordList() throws -> String {
        let limit = 64 << 20
        guard let fd = FileDescriptor(open(wordlist, O_RDONLY | O_CLOEXEC)),
            let bytes = try? fd.borrowed.readAll(limit: limit), bytes.count < limit,
            let text = String(validating: bytes, as: UTF8.self)
        else {
            throw fail("cannot read the word list \(wordlist) (install wamerican, or give --wordlist)")
        }
        return text
    }
}
