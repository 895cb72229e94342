import ArgumentParser
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

struct InitCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract: "Create a keychain.",
        discussion: "The passcode is read from the terminal (twice) or from one line of standard input."
    )

    @OptionGroup var options: KeychainOptions

    @Flag(name: .long, help: "Create a keychain that unlocks without a passcode.")
    var noPasscode = false

    func run() throws {
        let directory = options.directory
        if directory.exists {
            throw fail("a keychain already exists at \(directory.path)")
        }
        let passcode = noPasscode ? nil : try Passcode.readNew(
            prompt: "New passcode: ", missing: "no passcode given; type one, or use --no-passcode for a keychain without one")
        do {
            try Device.createKeychain(at: directory, passcode: passcode)
        } catch .io {
            // The core has just said which path failed, and why.
            throw fail("no keychain was created at \(directory.path)")
        } catch {
            throw fail("cannot create the keychain at \(directory.path): \(error)")
        }
        print("created a keychain at \(directory.path)")
    }
}
