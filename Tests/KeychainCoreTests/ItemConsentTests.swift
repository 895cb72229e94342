import Synchronization
import TestSupport
import Testing
@testable import KeychainCore

#if canImport(Glibc)
import Glibc
#endif

/// Whose an item is (issues 31 and 37), as the core decides it for every
/// door before asking anyone: who uses an item freely, what the person is
/// asked, and how many questions may be open at once.
@Suite struct ItemConsentTests {
    static let chromium = ProgramClaim(
        program: .executable("/usr/lib/chromium/chromium"), digest: Array(repeating: 1, count: 32),
        package: "chromium")
    static let tool = ProgramClaim(
        program: .executable("/usr/bin/secret-tool"), digest: Array(repeating: 2, count: 32),
        package: "libsecret-tools")

    static func program(_ claim: ProgramClaim, distrust: String? = nil) -> ProgramIdentity {
        ProgramIdentity(program: claim.program, digest: claim.digest, unit: nil, uid: 1000, distrust: distrust)
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

    static func question(
        asker: ProgramClaim?, items: [ItemConsent.Asked], asking verb: String, chain: [ChainLink] = [],
        deputy: Bool = false
    ) -> String {
        ItemConsent.question(
            asker: asker, unidentified: nil, chain: chain, deputy: deputy, items: items, asking: verb)
    }

    @Test func theQuestionNamesTheProgramWhoRanItTheItemsAndTheOwner() {
        let asked = [
            ItemConsent.Asked(group: "default", identifier: "key", label: "Chromium Safe Storage", owner: Self.chromium)
        ]
        #expect(
            Self.question(asker: Self.tool, items: asked, asking: "read the secret of")
                == "/usr/bin/secret-tool (package libsecret-tools) wants to read the secret of \"Chromium Safe Storage\" in default, "
                + "which belongs to /usr/lib/chromium/chromium (package chromium).")
        // Who ran it, so that a person tells their own typing from a script's; a deputy is said to be one.
        #expect(
            Self.question(
                asker: Self.tool, items: asked, asking: "read the secret of",
                chain: [
                    ChainLink(path: "/usr/bin/secret-tool", name: "secret-tool", provenance: "package libsecret-tools"),
                    ChainLink(path: "/usr/bin/bash", name: "bash", provenance: "package bash"),
                    ChainLink(path: nil, name: "gnome-terminal-", provenance: "")
                ], deputy: true
            ).hasSuffix(
                "It was started by \"/usr/bin/bash\" (package bash) ← a program named \"gnome-terminal-\" that cannot be "
                    + "read. It acts for whatever ran it, so it can be allowed only once."
            ))
        // Many items: three named, the rest counted.
        let many = (1...7).map {
            ItemConsent.Asked(group: "g", identifier: "i\($0)", label: "i\($0)", owner: Self.chromium)
        }
        #expect(Self.question(asker: Self.tool, items: many, asking: "read the secrets of").contains("and 4 more"))
    }

    /// The attacks on the question's text in docs/SECURITY.md,
    /// "An application's secrets on every door": a line break of any kind
    /// (C0, U+2028, U+2029), a bidi override, a quote that ends the label
    /// early, and a text so long that the true sentence scrolls away. None
    /// of them changes the first sentence.
    @Test func noLabelOrPathForgesTheQuestion() {
        let forgedOwner =
            "x\" in default, which belongs to /usr/bin/secret-tool (package libsecret-tools). Allow"
        let forged = [
            ItemConsent.Asked(group: "default", identifier: "x", label: forgedOwner, owner: Self.chromium),
            ItemConsent.Asked(
                group: "default", identifier: "y", label: "a\nb\u{2028}c\u{2029}d\u{202E}e\u{200B}f\u{00A0}g",
                owner: Self.chromium)
        ]
        let text = Self.question(asker: nil, items: forged, asking: "delete")
        #expect(text.hasPrefix("a program that cannot be identified wants to delete \"x\\\" in default, which"))
        #expect(text.contains("\"a\\u{a}b\\u{2028}c\\u{2029}d\\u{202e}e\\u{200b}f\\u{a0}g\""), "\(text)")
        #expect(text.hasSuffix("which belongs to /usr/lib/chromium/chromium (package chromium)."), "\(text)")
        for scalar in text.unicodeScalars {
            #expect(scalar == " " || !scalar.properties.generalCategory.isHidden, "\(scalar.value)")
        }
        // A path with 140 paragraph breaks and a forged sentence: escaped, cut, and the true sentence first.
        let sneaky = ProgramClaim(
            program: .executable(
                "/tmp/x" + String(repeating: "\u{2029}", count: 140)
                    + "/usr/lib/chromium/chromium (package chromium) wants"),
            digest: Array(repeating: 3, count: 32))
        let long = Self.question(asker: sneaky, items: Array(forged.prefix(1)), asking: "read the secret of")
        #expect(long.count <= ItemConsent.maximumQuestion)
        #expect(long.hasPrefix("/tmp/x\\u{2029}\\u{2029}"), "\(long)")
        #expect(long.contains("wants to read the secret of \"x\\\" in default"), "\(long)")
        #expect(!long.unicodeScalars.contains("\u{2029}"))
    }

    /// Concurrent calls of one program about the same items wait for one
    /// answer; a program gets a few questions open at once, and everyone a
    /// few more; past that, calls are denied without asking (a flood of 200
    /// calls started 200 pinentries).
    @Test func concurrentCallsShareOneQuestionAndAFloodIsDeniedUnasked() throws {
        let gate = Gate()
        let (questions, shown) = Self.questionsAllowedOnce(after: gate)
        let answers = Mutex<[String]>([])
        var threads: [pthread_t] = []
        // 20 calls about one item, then 4 more items of the same program, then 6 other programs.
        let calls =
            Array(repeating: ("/usr/bin/a", "one"), count: 20) + [("/usr/bin/a", "two"), ("/usr/bin/a", "three")]
            + [("/usr/bin/a", "four"), ("/usr/bin/a", "five")] + (1...6).map { ("/usr/bin/p\($0)", "one") }
        for (program, item) in calls {
            let started = Threads.start {
                let (answer, unasked) = questions.ask(Self.question(program, item))
                answers.withLock {
                    $0.append(program + " " + item + " " + answer.rawValue + (unasked.map { " " + $0 } ?? ""))
                }
            }
            threads.append(try #require(started))
            // Each call is placed (asked, waiting or refused) before the next: the order above is the experiment.
            while questions.arrivals < threads.count { sched_yield() }
        }
        for _ in calls { gate.post() }
        for thread in threads { pthread_join(thread, nil) }
        let all = answers.withLock { $0 }
        #expect(all.count == calls.count)
        #expect(all.filter { $0 == "/usr/bin/a one allowed-once" }.count == 20, "\(all)")
        // Three questions for /usr/bin/a (one, two, three: the first three open), eight in all.
        #expect(shown.count.load(ordering: .relaxed) == ConsentQuestions.overall, "\(all)")
        #expect(all.contains("/usr/bin/a four denied this program has too many questions open"), "\(all)")
        #expect(all.filter { $0.hasSuffix("too many questions are open") }.count == 1, "\(all)")
    }

    /// A question is abandoned once every caller waiting for it has left,
    /// not when the first one does: another caller of the same program
    /// about the same items still wants the answer.
    @Test func aQuestionIsAbandonedOnlyWhenEveryCallerLeft() throws {
        let first = Atomic<Bool>(true), second = Atomic<Bool>(true)
        let seen = Mutex<[Bool]>([])
        let placed = Gate(), release = Gate()
        let questions = ConsentQuestions { _, _, _, abandoned in
            placed.wait()
            seen.withLock { $0.append(abandoned()) }
            first.store(false, ordering: .relaxed)
            seen.withLock { $0.append(abandoned()) }
            second.store(false, ordering: .relaxed)
            seen.withLock { $0.append(abandoned()) }
            return .denied
        }
        var asker = Self.question("/usr/bin/a", "one"), waiter = asker
        asker.waiting = { first.load(ordering: .relaxed) }
        waiter.waiting = { second.load(ordering: .relaxed) }
        let asking = asker, waiting = waiter
        let threads = [
            try #require(Threads.start { _ = questions.ask(asking) }),
            try #require(
                Threads.start {
                    while questions.arrivals < 1 { sched_yield() }
                    _ = questions.ask(waiting)
                    release.post()
                })
        ]
        while questions.arrivals < 2 { sched_yield() }
        placed.post()
        release.wait()
        for thread in threads { pthread_join(thread, nil) }
        #expect(seen.withLock { $0 } == [false, false, true])
    }

    /// Nobody waits any more: the pinentry is ended at once (its next
    /// look, a quarter of a second), long before its 60 s, and the answer is cancel.
    @Test func aPinentryIsEndedOnceNobodyWaitsForItsAnswer() throws {
        let directory = try Self.silentPinentry()
        defer { _ = Spawn.run(["/bin/rm", "-rf", directory]) }
        let script = directory + "/silent"
        signal(SIGPIPE, SIG_IGN)
        let pinentry = try Pinentry(program: script, endingAfter: 60, unless: { true })
        let started = MonotonicClock.seconds()
        #expect(pinentry.confirm(description: "d", ok: "o", notOK: nil, cancel: "c", timeout: 60) == .cancel)
        #expect(MonotonicClock.seconds() - started < 10)
        pinentry.end()
        #expect(kill(pinentry.pid, 0) != 0, "the pinentry is gone")
    }

    /// A directory holding `silent`, a pinentry that never answers CONFIRM
    /// and ignores SETTIMEOUT; the caller removes it.
    static func silentPinentry() throws -> String {
        let directory = try makeTemporaryDirectory("kcfs-pinentry", in: "/tmp/")
        let text = "#!/bin/sh\necho OK\nwhile read -r command rest; do [ \"$command\" = CONFIRM ] || echo OK; done\n"
        let fd = open(directory + "/silent", O_WRONLY | O_CREAT | O_TRUNC, 0o755)
        _ = text.withCString { write(fd, $0, strlen($0)) }
        close(fd)
        return directory
    }

    /// How many questions were shown.
    private final class Shown: Sendable {
        let count = Atomic<Int>(0)
    }

    /// Questions the person allows once, each counted when shown and answered once `gate` opens.
    private static func questionsAllowedOnce(after gate: Gate) -> (ConsentQuestions, Shown) {
        let shown = Shown()
        let questions = ConsentQuestions { _, _, _, _ in
            shown.count.add(1, ordering: .relaxed)
            gate.wait()
            return .allowedOnce
        }
        return (questions, shown)
    }

    /// A question of `program` about `item`, asked by the process `process` (this one unless named).
    static func question(_ program: String, _ item: String, process: pid_t = getpid()) -> ConsentQuestion {
        PasswordManager.question(
            asked: [ItemConsent.Asked(group: "g", identifier: item, label: item, owner: Self.chromium)],
            verb: "read the secret of",
            program: ProgramIdentity(
                program: .executable(program), digest: Array(repeating: 9, count: 32), unit: nil, uid: 1000),
            subject: AuditSubject(pid: process, uid: getuid(), executable: nil, unit: nil))
    }

    /// The forged chain: the question named the processes that started the
    /// caller by basename, so a copy of a shell at `~/.cache/x/gnome-terminal-server`
    /// read as the real terminal. Now each is its full path and who could
    /// have written it: a package's program says so, a copy in a directory
    /// others may write is "written by a program of yours".
    @Test func theQuestionNamesEachStarterByPathAndWhoCouldHaveWrittenIt() throws {
        let directory = try makeTemporaryDirectory("kcfs-chain")
        defer { _ = Spawn.run(["/bin/rm", "-rf", directory]) }
        let terminal = directory + "/gnome-terminal-server"
        #expect(Spawn.run(["/bin/cp", "/bin/sh", terminal]) == 0)
        // `; :` keeps the shell from exec'ing sleep in its own place.
        let shell = try #require(Spawn.start([terminal, "-c", "/bin/sleep 30; :"]))
        defer {
            kill(shell, SIGKILL)
            _ = Spawn.wait(shell)
        }
        var caller: pid_t?
        let deadline = MonotonicClock.seconds() + 10
        while caller == nil && MonotonicClock.seconds() < deadline {
            let children = (try? String(contentsOfFile: "/proc/\(shell)/task/\(shell)/children", encoding: .utf8)) ?? ""
            // The child is listed from its fork, still the shell until it execs sleep: wait for the exec.
            caller = children.split(separator: " ").first.flatMap { pid_t($0) }.flatMap { child in
                var image = [UInt8](repeating: 0, count: 4096)
                let length = readlink("/proc/\(child)/exe", &image, image.count)
                return length > 0 && String(decoding: image[..<length], as: UTF8.self).hasSuffix("/sleep") ? child : nil
            }
            if caller == nil { sched_yield() }
        }
        let sleeper = try #require(caller)
        defer { kill(sleeper, SIGKILL) }
        let chain = ProcessChain.described(from: sleeper)
        #expect(chain.first?.logged == "/usr/bin/sleep (package coreutils)", "\(chain)")
        #expect(chain.dropFirst().first?.logged == terminal + " (written by a program of yours)", "\(chain)")
        let question = PasswordManager.question(
            asked: [ItemConsent.Asked(group: "default", identifier: "x", label: "x", owner: Self.chromium)],
            verb: "read the secret of",
            program: ProgramIdentity(
                program: .executable("/usr/bin/sleep"), digest: Array(repeating: 9, count: 32), unit: nil, uid: getuid()
            ),
            subject: AuditSubject(pid: sleeper, uid: getuid(), executable: nil, unit: nil))
        #expect(
            question.text.contains("It was started by \"\(terminal)\" (written by a program of yours) ← "),
            "\(question.text)")
    }

    /// A starter's path cannot forge who wrote it: `~/.cache/x/gnome-terminal-server
    /// (package gnome-terminal)/` and 2,800 spaces, a copy of bash there,
    /// was cut after its forged "(package gnome-terminal)" and lost its
    /// real "(written by a program of yours)". Now each path is quoted
    /// (a quote in it escaped) and cut inside its quotes, and its
    /// provenance follows; a whole link is dropped rather than cut. An
    /// interpreter that started the asker is said with the script it runs.
    @Test func aStartersPathForgesNoProvenanceAndAnInterpreterIsItsScript() {
        let asked = [ItemConsent.Asked(group: "default", identifier: "x", label: "x", owner: Self.chromium)]
        let forged =
            "/home/u/.cache/x/gnome-terminal-server (package gnome-terminal)/"
            + String(repeating: String(repeating: " ", count: 200) + "/", count: 14) + "bash\" (package bash"
        let question = Self.question(
            asker: Self.tool, items: asked, asking: "read the secret of",
            chain: [
                ChainLink(path: "/usr/bin/secret-tool", name: "secret-tool", provenance: "package libsecret-tools"),
                ChainLink(path: forged, name: "bash", provenance: "written by a program of yours"),
                {
                    var python = ChainLink(
                        path: "/usr/bin/python3.11", name: "python3.11", provenance: "package python3.11-minimal")
                    python.script = ("/home/u/.cache/evil/g.py", "written by a program of yours")
                    return python
                }()
            ])
        #expect(question.count <= ItemConsent.maximumQuestion)
        #expect(
            question.contains(
                "It was started by \"/home/u/.cache/x/gnome-terminal-server (package gnome-terminal)/    "),
            "\(question)")
        #expect(question.contains("…\" (written by a program of yours) ← "), "\(question)")
        #expect(
            question.hasSuffix(
                "← \"/usr/bin/python3.11\" (package python3.11-minimal) running \"/home/u/.cache/evil/g.py\" "
                    + "(written by a program of yours)."), "\(question)")
    }

    /// The command a refusal suggests can be pasted as it is: a name with a
    /// space (or a quote) was printed bare, two words for the shell.
    @Test func theSuggestedCommandQuotesANameAShellWouldSplit() {
        #expect(
            ItemConsent.deniedSentence(item: "default/App a", owner: Self.chromium).contains(
                "`keychainfs acl 'default/App a' --add PROGRAM`"))
        #expect(
            ItemConsent.deniedSentence(item: "default/token", owner: Self.chromium).contains(
                "`keychainfs acl default/token --add PROGRAM`"))
        #expect("it's".shellWord == "'it'\\''s'")
        #expect("".shellWord == "''")
    }

    /// The ride-along: the person runs `keychainfs get default/x` and is
    /// asked once; a hidden process of the same program, started a moment
    /// later, used to join that question, unnamed in it, and got the secret
    /// when the person allowed. Now a question answers its own process: the
    /// other process is asked a question of its own, while the first is
    /// still shown. Calls of one process still share one question.
    @Test func anotherProcessOfTheSameProgramIsAskedItsOwnQuestion() throws {
        let hidden = try #require(Spawn.start(["/bin/sleep", "30"]))
        defer {
            kill(hidden, SIGKILL)
            _ = Spawn.wait(hidden)
        }
        let gate = Gate()
        let (questions, shown) = Self.questionsAllowedOnce(after: gate)
        var threads: [pthread_t] = []
        for process in [getpid(), hidden, getpid()] {
            let question = Self.question("/usr/bin/keychainfs", "x", process: process)
            threads.append(try #require(Threads.start { _ = questions.ask(question) }))
            while questions.arrivals < threads.count { sched_yield() }
        }
        // Two questions shown (the person's process's, the hidden one's), not one.
        let deadline = MonotonicClock.seconds() + 10
        while shown.count.load(ordering: .relaxed) < 2 && MonotonicClock.seconds() < deadline { sched_yield() }
        gate.post()
        gate.post()
        for thread in threads { pthread_join(thread, nil) }
        #expect(shown.count.load(ordering: .relaxed) == 2)
    }

    /// A pinentry that ignores SETTIMEOUT and never answers is ended at the
    /// device's own deadline: the question is Deny, and no process is left.
    @Test func aPinentryThatNeverAnswersIsEndedAtTheDeadline() throws {
        let directory = try Self.silentPinentry()
        defer { _ = Spawn.run(["/bin/rm", "-rf", directory]) }
        let script = directory + "/silent"
        // As in the device (DeviceProcess): a pinentry gone is an error, not a signal.
        signal(SIGPIPE, SIG_IGN)
        let pinentry = try Pinentry(program: script, endingAfter: 1)
        let started = MonotonicClock.seconds()
        let choice = pinentry.confirm(description: "d", ok: "o", notOK: nil, cancel: "c", timeout: 1)
        #expect(choice == .cancel)
        #expect(MonotonicClock.seconds() - started < 10)
        pinentry.end()
        #expect(kill(pinentry.pid, 0) != 0, "the pinentry is gone")
    }
}

/// A semaphore the test's stand-in for the person waits on.
private final class Gate: @unchecked Sendable {
    private let semaphore = UnsafeMutablePointer<sem_t>.allocate(capacity: 1)
    init() { sem_init(semaphore, 0, 0) }
    deinit {
        sem_destroy(semaphore)
        semaphore.deallocate()
    }
    func wait() { while sem_wait(semaphore) != 0 {} }
    func post() { sem_post(semaphore) }
}

extension Unicode.GeneralCategory {
    /// What the question escapes: controls, formats, separators.
    fileprivate var isHidden: Bool {
        switch self {
        case .control, .format, .surrogate, .privateUse, .unassigned, .spaceSeparator, .lineSeparator,
            .paragraphSeparator:
            true
        default: false
        }
    }
}
