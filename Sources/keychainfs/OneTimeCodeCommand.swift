import ArgumentParser
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

struct OneTimeCodeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "otp",
        abstract: "Print the current one-time code (TOTP, RFC 6238) of an item holding an otpauth:// URI.",
        discussion: """
            The URI may be any line of the item's value (as pass-otp keeps it under the password): \
            otpauth://totp/LABEL?secret=BASE32[&algorithm=SHA1|SHA256|SHA512][&digits=6|7|8][&period=30]. \
            Store one with: printf '%s' 'otpauth://totp/...' | keychainfs set GROUP/ID
            """)

    @Argument(help: "The item, as GROUP/IDENTIFIER.", completion: NameCompletion.items, transform: ItemAddress.parsed)
    var item: ItemAddress

    @Flag(name: [.customShort("c"), .long], help: "Copy the code to the clipboard instead of printing it.")
    var clip = false

    @Option(help: "The code at this Unix time (seconds) instead of now.")
    var at: Int64?

    @OptionGroup var options: KeychainOptions

    func run() throws {
        let clipboard = clip ? try Clipboard.current() : nil
        let value = try RunningDevice(options.place).value(of: item)
        let code: String
        do { code = try OneTimePassword(item: value).code(at: at ?? Int64(time(nil))) } catch {
            throw fail("\(item) \(error)")
        }
        if let clipboard {
            try clipboard.copyAndClearLater(try SecureBytes(code), what: "the code of \(item)")
        } else {
            print(code)
        }
    }
}
