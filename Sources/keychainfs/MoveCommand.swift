import ArgumentParser
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// `keychainfs mv SOURCE TARGET`: what `mv` does in a mount, without one
/// (docs/FILESYSTEM.md, "Renaming"). Within a group the device renames the
/// item in one step (re-encrypted under its new name, with its class and
/// details); across groups, where the group is bound into the ciphertext,
/// it is written into the target group and then removed, as `mv` falls
/// back to a copy on EXDEV: killed between the two, both are there, never
/// neither. A target that exists is replaced, unless `--no-clobber`.
struct MoveCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mv", abstract: "Rename or move an item, as mv does in a mount (within a group, in one step).")

    @OptionGroup var items: SourceAndTarget
    @OptionGroup var options: KeychainOptions

    func run() throws {
        let (source, target, noClobber) = (items.source, items.target, items.noClobber)
        guard source.group != target.group || source.identifier != target.identifier else { return }
        let device = try RunningDevice(options.place)
        if source.group == target.group {
            let outcome = try device.outcome(
                .rename(group: source.group, from: source.identifier, to: target.identifier, replacing: !noClobber))
            if case .failure(.keychain(.duplicateItem, _))? = outcome { throw ItemCopy.exists(target) }
            try device.answer(outcome, about: .item("\(source)"))
            return
        }
        try ItemCopy.copy(source, to: target, on: device, replacing: !noClobber, keepingDetails: true)
        try device.call(.remove(group: source.group, identifier: source.identifier), about: .item("\(source)"))
    }
}

/// `keychainfs cp SOURCE TARGET`: what `cp` does in a mount: the value,
/// under the source's class, as a new item of nobody (its label,
/// attributes and owner stay the source's, as `cp` leaves a file's extended
/// attributes behind).
struct CopyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cp", abstract: "Copy an item's value to another item, as cp does in a mount.")

    @OptionGroup var items: SourceAndTarget
    @OptionGroup var options: KeychainOptions

    func run() throws {
        let (source, target, noClobber) = (items.source, items.target, items.noClobber)
        guard source.group != target.group || source.identifier != target.identifier else {
            throw fail("'\(source)' and '\(target)' are the same item")
        }
        try ItemCopy.copy(
            source, to: target, on: try RunningDevice(options.place), replacing: !noClobber, keepingDetails: false)
    }
}

/// What `mv` and `cp` take: the item, the name it goes to, and whether an existing one is kept.
struct SourceAndTarget: ParsableArguments {
    @Argument(help: "The item, as GROUP/IDENTIFIER.", completion: NameCompletion.items, transform: ItemAddress.parsed)
    var source: ItemAddress

    @Argument(
        help: "The name it goes to, as GROUP/IDENTIFIER.", completion: NameCompletion.items,
        transform: ItemAddress.parsed)
    var target: ItemAddress

    @Flag(name: [.customShort("n"), .customLong("no-clobber")], help: "Keep an existing target: fail instead.")
    var noClobber = false
}

/// The copy `mv` across groups and `cp` make.
enum ItemCopy {
    static func copy(
        _ source: ItemAddress, to target: ItemAddress, on device: RunningDevice, replacing: Bool, keepingDetails: Bool
    ) throws {
        let info = try device.call(.info(group: source.group, identifier: source.identifier), about: .item("\(source)"))
        let value = try device.value(of: source)
        let details =
            keepingDetails
            ? try device.call(
                .details(group: source.group, identifier: source.identifier), about: .item("\(source)")
            ).entries.first?.details : nil
        let outcome = try device.outcome(
            .set(
                group: target.group, identifier: target.identifier, value: value,
                protectionClass: info.protectionClass, condition: replacing ? .always : .ifAbsent, details: details))
        if case .failure(.keychain(.duplicateItem, _))? = outcome { throw exists(target) }
        try device.answer(outcome, about: .item("\(target)"))
    }

    /// `--no-clobber` met an existing target.
    static func exists(_ target: ItemAddress) -> ExitCode {
        fail("\(target) exists and was kept (--no-clobber); nothing was moved or copied")
    }
}
