import ArgumentParser
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

struct InitCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract: "Create a keychain.",
        discussion: "The passcode (4 characters at least) is read twice, from the terminal or as two lines of standard input."
    )

    @OptionGroup var options: KeychainOptions

    @Flag(name: .long, help: "Create a keychain that unlocks without a passcode.")
    var noPasscode = false

    func run() throws {
        let place = options.place
        guard case .directory(let directory) = place else { return try createInService(place) }
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

    /// Service mode: the service creates the keychain in its state directory.
    private func createInService(_ place: KeychainPlace) throws {
        try place.requireExisting()
        let passcode = noPasscode ? nil : try Passcode.readNew(
            prompt: "New passcode: ", missing: "no passcode given; type one, or use --no-passcode for a keychain without one")
        switch DeviceClient.send(.create(passcode: passcode), to: try place.socketPath()) {
        case .ok?:
            print("created \(place.name)")
        case .keychainError(_, let message)?, .systemError(_, let message)?:
            throw fail(message)
        case .value?, nil:
            throw fail("the keychainfs service did not answer; no keychain was created", status: ExitStatus.noDevice)
        }
    }
}
