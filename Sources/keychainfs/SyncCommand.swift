import ArgumentParser
import KeychainCore
import KeychainProtocol
#if canImport(Glibc)
import Glibc
#endif

/// `keychainfs sync`: the keychain's migratable items on every machine of
/// the person's, through a git remote, end to end encrypted (docs/SYNC.md).
struct SyncCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sync",
        abstract: "Sync migratable items with your other machines through a git remote.",
        discussion: """
            The remote is any repository git reaches (ssh, https, a path), with your ssh agent, \
            credential helpers and insteadOf rules; it sees only padded, sealed records on a branch \
            named keychainfs. Items of the ThisDeviceOnly classes never leave this machine. Start a \
            circle with `sync init REMOTE` on one machine and `sync join REMOTE` on the next, approved \
            on the first with `sync approve` once both show the same code. The device then syncs by \
            itself a few seconds after a change, at unlock and every 15 minutes; `sync` alone syncs \
            now. See docs/SYNC.md.
            """,
        subcommands: [
            SyncNowCommand.self, SyncInitCommand.self, SyncJoinCommand.self, SyncApproveCommand.self,
            SyncStatusCommand.self, SyncDevicesCommand.self, SyncGroupsCommand.self, SyncRemoveCommand.self,
            SyncLeaveCommand.self
        ],
        defaultSubcommand: SyncNowCommand.self)
}

/// The keychain's device, for every sync subcommand: sync runs in a
/// per-user device (git runs as the person).
private func syncDevice(_ options: KeychainOptions) throws -> RunningDevice {
    let place = options.place
    if case .service = place {
        throw fail(
            "sync runs in your own device, not in the keychainfs service: name your keychain with --keychain "
                + "(docs/SYNC.md)")
    }
    try place.requireExisting()
    return try RunningDevice(place)
}

private func describe(_ summary: SyncSummary) {
    var parts = ["\(summary.received) received", "\(summary.sent) sent"]
    if summary.waiting > 0 { parts.append("\(summary.waiting) waiting for unlock") }
    print("synced: " + parts.joined(separator: ", "))
    for conflict in summary.conflicts {
        print("conflict: both machines changed an item; the other version is kept as \(conflict)")
    }
}

struct SyncNowCommand: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "now", abstract: "Sync now.")

    @OptionGroup var options: KeychainOptions

    func run() throws {
        describe(try syncDevice(options).call(.syncNow, about: .action("cannot sync")))
    }
}

struct SyncInitCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract: "Start a circle at REMOTE with this keychain's migratable items.",
        discussion: """
            REMOTE must hold no circle yet (an empty repository, or one without a keychainfs \
            branch). The circle's recovery key is printed once: with it, `sync join --recovery-key` \
            joins a machine when no other is at hand.
            """)

    @Argument(help: "A git remote URL or path.")
    var remote: String

    @Option(name: .customLong("group"), help: "Sync only this group (repeat for more; default: every group).")
    var groups: [String] = []

    @OptionGroup var options: KeychainOptions

    func run() throws {
        let device = try syncDevice(options)
        let started = try device.call(
            .syncStart(remote: remote, groups: groups), about: .action("cannot start a circle"))
        print("circle started at \(remote)")
        print("the circle's recovery key (shown once; keep it apart from your machines):")
        fflush(nil)
        started.recoveryKey.withUnsafeBytes { _ = try? BorrowedDescriptor.standardOutput.writeAll($0) }
        _ = try? BorrowedDescriptor.standardOutput.writeAll([UInt8(ascii: "\n")])
        if let status = try? device.call(.syncStatus, about: .device),
            let synced = status.lines.first(where: { $0.name == "synced-items" })
        {
            print("synced items: \(synced.value)")
        }
    }
}

struct SyncJoinCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "join",
        abstract: "Join the circle at REMOTE, approved from one of its machines.",
        discussion: """
            Asks to join and waits: on a machine of the circle, run `keychainfs sync approve`; both \
            then show the same six digits, and approving there lets this machine in. With \
            --recovery-key, the circle's recovery key (typed, or on standard input) lets it in at once.
            """)

    @Argument(help: "The circle's git remote (omit to go on with a request made before).")
    var remote: String?

    @Flag(name: .long, help: "Join with the circle's recovery key instead of an approval.")
    var recoveryKey = false

    @Flag(name: .long, help: "Stop asking to join.")
    var cancel = false

    @Option(name: .long, help: "How long to wait for the approval, in seconds.")
    var wait: Int = 600

    @Option(name: .customLong("group"), help: "Sync only this group (repeat for more; default: every group).")
    var groups: [String] = []

    @Option(name: .long, help: "The code the approving machine shows (123456 or \"123 456\"), instead of asking.")
    var code: String?

    @OptionGroup var options: KeychainOptions

    func run() throws {
        let device = try syncDevice(options)
        if cancel {
            try device.call(.syncCancelJoin, about: .action("cannot cancel"))
            return
        }
        if recoveryKey {
            guard let remote else { throw fail("name the circle's remote", status: ExitCode.validationFailure) }
            guard let typed = Passcode.read(prompt: "The circle's recovery key: ") else {
                throw fail("no recovery key given")
            }
            describe(
                try device.call(
                    .syncJoin(remote: remote, recoveryKey: typed, groups: groups), about: .action("cannot join")))
            return
        }
        var shown: String? = nil
        var asked = remote
        let deadline = MonotonicClock.seconds() + Double(wait)
        while true {
            let step = try device.call(.syncJoin(remote: asked, groups: groups), about: .action("cannot join"))
            asked = nil
            switch step {
            case .asked:
                if shown == nil {
                    // Its id, for `approve --device` when several machines ask at once.
                    let me = (try? device.call(.syncStatus, about: .action("cannot read the status")))?.lines
                        .first { $0.name == "device" }?.value
                    print(
                        "asked to join\(me.map { " as " + $0 } ?? ""); on a machine of the circle, run: "
                            + "keychainfs sync approve")
                    shown = ""
                }
            case .code(let shownHere):
                if shown != shownHere {
                    print("this machine's code: \(shownHere)")
                    fflush(nil)
                    shown = shownHere
                    // Both sides compare: this machine takes a key only from the machine whose code
                    // the person saw match (the answer comes through the remote, which could forge it).
                    let typed: String
                    if let code {
                        typed = code
                    } else {
                        printError("Type the code the approving machine shows: ")
                        guard let line = readLine(), !line.isEmpty else { throw fail("not confirmed") }
                        typed = line
                    }
                    try device.call(.syncConfirmJoin(code: typed), about: .action("not joined"))
                    print("confirmed; approve on the other machine if it has not been")
                }
            case .joined(let summary):
                print("joined the circle")
                describe(summary)
                return
            }
            fflush(nil)
            guard MonotonicClock.seconds() < deadline else {
                throw fail("no approval within \(wait) s; run `keychainfs sync join` again to go on waiting")
            }
            sleep(1)
        }
    }
}

struct SyncApproveCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "approve",
        abstract: "Let a machine that asks to join into the circle, once both show the same code.",
        discussion: """
            Answers the machines asking to join, waits until the one named (or the only one) shows \
            its code, and asks whether it is the code that machine shows. With --code, the code \
            typed here is compared instead of asking. A different code grants nothing: the request \
            did not come unchanged from that machine.
            """)

    @Option(name: .long, help: "The code the joining machine shows (123456 or \"123 456\").")
    var code: String?

    @Option(name: .long, help: "The machine to approve, by the id shown here (when several ask).")
    var device: String?

    @Option(name: .long, help: "How long to wait for the joining machine's code, in seconds.")
    var wait: Int = 300

    @OptionGroup var options: KeychainOptions

    func run() throws {
        let running = try syncDevice(options)
        let askers = try running.call(.syncJoinRequests(), about: .action("cannot read the requests")).devices
        let chosen = askers.filter { device == nil || $0.name == device?.lowercased() || $0.value == device }
        guard let asker = chosen.first else {
            throw fail(
                askers.isEmpty
                    ? "no machine asks to join (run `keychainfs sync join REMOTE` on it first)"
                    : "no machine with id \(device ?? "") asks to join", status: ExitStatus.absent)
        }
        guard chosen.count == 1 else {
            // A flood of requests is one line, not thousands.
            for asker in chosen.prefix(20) { print("\(asker.name)  \(asker.value)") }
            if chosen.count > 20 { print("and \(chosen.count - 20) more") }
            throw fail(
                "several machines ask to join: name one with --device ID (the joining machine shows its id)")
        }
        // Only the machine chosen is answered (one asking alone was already).
        _ = try running.call(.syncJoinRequests(answering: asker.name), about: .action("cannot answer the request"))
        print("\(asker.value) (\(asker.name)) asks to join")
        let deadline = MonotonicClock.seconds() + Double(wait)
        var shown: String? = nil
        while shown == nil {
            shown = try running.call(.syncJoinCode(device: asker.name), about: .action("cannot approve")).code
            if shown != nil { break }
            guard MonotonicClock.seconds() < deadline else {
                throw fail("\(asker.value) showed no code within \(wait) s; is `keychainfs sync join` running there?")
            }
            sleep(1)
        }
        let expected = shown ?? ""
        let answer: String
        if let code {
            answer = code
        } else {
            print("code: \(expected)")
            fflush(nil)
            printError("Does \(asker.value) show \(expected)? Type the code it shows to approve: ")
            guard let line = readLine(), !line.isEmpty else { throw fail("not approved") }
            answer = line
        }
        try running.call(.syncApprove(device: asker.name, code: answer), about: .action("not approved"))
        print("approved: \(asker.value) is in the circle")
    }
}

struct SyncStatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status", abstract: "The circle, the last sync, and when each machine was last heard from.")

    @OptionGroup var options: KeychainOptions

    func run() throws {
        let status = try syncDevice(options).call(.syncStatus, about: .action("cannot read the sync status"))
        for line in status.lines { print("\(line.name): \(line.value)") }
    }
}

struct SyncDevicesCommand: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "devices", abstract: "The machines of the circle.")

    @OptionGroup var options: KeychainOptions

    func run() throws {
        let status = try syncDevice(options).call(.syncStatus, about: .action("cannot read the circle"))
        for line in status.lines where line.name == "device" { print(line.value + " (this machine)") }
        for line in status.lines where line.name == "member" { print(line.value) }
    }
}

struct SyncGroupsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "groups",
        abstract: "Which groups this machine syncs; with GROUP..., sync only those (--all: every group).",
        discussion: """
            The choice is this machine's (another may sync more). Items of a group left out stay \
            here and in the circle; a group taken in is read from the circle at the next sync.
            """)

    @Argument(help: "The groups to sync from now on.")
    var groups: [String] = []

    @Flag(name: .long, help: "Sync every group.")
    var all = false

    @OptionGroup var options: KeychainOptions

    func validate() throws {
        if all && !groups.isEmpty { throw ValidationError("name groups or --all, not both") }
    }

    func run() throws {
        let set: [String]? = all ? [] : groups.isEmpty ? nil : groups
        let answer = try syncDevice(options).call(.syncGroups(set: set), about: .action("cannot choose the groups"))
        for line in answer.lines { print("\(line.name): \(line.value)") }
    }
}

struct SyncRemoveCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "remove",
        abstract: "Remove a machine from the circle: the circle's key changes, so it reads nothing written after.",
        discussion: """
            DEVICE is a machine's name or id, as `sync devices` shows them. What the machine synced \
            before stays in its own keychain. The circle's recovery key changes too (the removed machine \
            knew enough of the old one to offer a circle of its own to a machine joining with it): the \
            new one is printed once.
            """)

    @Argument(help: "The machine's name or id.")
    var device: String

    @OptionGroup var options: KeychainOptions

    func run() throws {
        let removed = try syncDevice(options).call(.syncRemove(device: device), about: .action("cannot remove"))
        print("removed \(device); the circle has a new key, and a new recovery key")
        print("the circle's new recovery key (shown once; the old one opens nothing written from now on):")
        fflush(nil)
        removed.recoveryKey.withUnsafeBytes { _ = try? BorrowedDescriptor.standardOutput.writeAll($0) }
        _ = try? BorrowedDescriptor.standardOutput.writeAll([UInt8(ascii: "\n")])
    }
}

struct SyncLeaveCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "leave",
        abstract: "Forget the circle on this machine (its items stay; remove it from another machine too).")

    @OptionGroup var options: KeychainOptions

    func run() throws {
        try syncDevice(options).call(.syncLeave, about: .action("cannot leave"))
    }
}
