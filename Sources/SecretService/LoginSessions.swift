import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The user's login sessions, as logind tells them on the system bus
/// (`org.freedesktop.login1`), followed for the device (docs/FILESYSTEM.md,
/// "`.control`"): the desktop session is the device's lock screen. A per-user
/// device follows its user's; the service follows every user's, each locking
/// that user's keychain.
///
/// - A session of the user that locks (its `Lock` signal, or `LockedHint`
///   becoming true, which screen lockers set) locks the keychain after the
///   auto-lock grace; one that unlocks within the grace (`Unlock`,
///   `LockedHint` false) keeps it unlocked. Nothing here unlocks the
///   keychain: that takes the passcode.
/// - `PrepareForSleep(true)` locks at once, under a delay inhibitor taken
///   beforehand, so that the keys are gone before the machine sleeps; the
///   inhibitor is taken again on resume.
/// - A session of the user that ends (`SessionRemoved`) locks at once.
///
/// Only logind can own its name on the system bus (its bus policy), but
/// any program may send a signal to one connection (Debian's system.conf:
/// `<allow send_type="signal"/>`), and a match rule's `sender=` filters
/// broadcasts only: sd-bus matches a unicast signal to it whoever sent it.
/// So every handler checks the message's sender against logind's unique
/// name, followed through `NameOwnerChanged` (whose sender only the bus
/// daemon can be), and reads a session's `LockedHint` from logind rather
/// than from a signal (docs/SECURITY.md, "Signals only from logind").
public final class LoginSessions: @unchecked Sendable {
    /// What the device does: lock the keychain of `uid` (nil: every one it
    /// holds) after the grace (`afterGrace` false: at once), or call that off.
    public struct Actions: Sendable {
        public var lock: @Sendable (_ uid: UInt32?, _ reason: String, _ afterGrace: Bool) -> Void
        public var cancelLock: @Sendable (_ uid: UInt32) -> Void

        public init(
            lock: @escaping @Sendable (_ uid: UInt32?, _ reason: String, _ afterGrace: Bool) -> Void,
            cancelLock: @escaping @Sendable (_ uid: UInt32) -> Void
        ) {
            self.lock = lock
            self.cancelLock = cancelLock
        }
    }

    static let name = "org.freedesktop.login1"
    static let managerPath = "/org/freedesktop/login1"
    static let managerInterface = "org.freedesktop.login1.Manager"
    static let sessionInterface = "org.freedesktop.login1.Session"
    static let userInterface = "org.freedesktop.login1.User"

    private let bus: BusConnection
    /// The user followed; nil: every user.
    private let uid: UInt32?
    private let actions: Actions
    /// The followed sessions' object paths and their users, as last read (bus thread only).
    private var sessions: [String: UInt32] = [:]
    /// The delay inhibitor held until the next sleep (bus thread only).
    private var inhibitor: FileDescriptor? = nil
    /// logind's unique name on the bus now (nil: none owns its name), the
    /// one sender whose signals are followed (bus thread only).
    private var logind: String?
    /// The senders of signals in logind's name that were not logind,
    /// each logged once, at most ``forgedSendersLogged`` of them.
    private var forgedSenders: Set<String> = []
    private static let forgedSendersLogged = 16
    static let busDaemon = "org.freedesktop.DBus"

    /// The system bus: `$DBUS_SYSTEM_BUS_ADDRESS`, else the standard socket (dbus's own default).
    public static var systemBusAddress: String {
        getenv("DBUS_SYSTEM_BUS_ADDRESS").map { String(cString: $0) } ?? "unix:path=/run/dbus/system_bus_socket"
    }

    /// Follows the sessions of `uid` (nil: of every user); throws when there
    /// is no system bus or no logind on it.
    public init(uid: UInt32?, actions: Actions) throws(BusError) {
        bus = try BusConnection(address: Self.systemBusAddress)
        self.uid = uid
        self.actions = actions
        guard bus.ownerProcess(of: Self.name) != nil else { throw .failed("no logind on the system bus") }
        try bus.watch(
            "type='signal',sender='\(Self.busDaemon)',member='NameOwnerChanged',arg0='\(Self.name)'"
        ) { [unowned self] message in
            guard BusCall(message)?.sender == Self.busDaemon else { return }
            let arguments = BusMessageReader(message: message)
            guard (try? arguments.string()) == Self.name, (try? arguments.string()) != nil,
                let newOwner = try? arguments.string()
            else { return }
            logind = newOwner.isEmpty ? nil : newOwner
        }
        logind = readOwner()
        let from = "type='signal',sender='\(Self.name)',"
        try bus.watch(from + "interface='\(Self.sessionInterface)',member='Lock'") { [unowned self] message in
            guard isFromLogind(message) else { return }
            if let owner = owner(of: BusCall(message)?.path) { actions.lock(owner, "the session locked", true) }
        }
        try bus.watch(from + "interface='\(Self.sessionInterface)',member='Unlock'") { [unowned self] message in
            guard isFromLogind(message), let path = BusCall(message)?.path, let owner = owner(of: path) else { return }
            // A screen locker clears LockedHint itself once it has unlocked;
            // until then the hint's own change (below) calls the lock off.
            if lockedHint(of: path) != true { actions.cancelLock(owner) }
        }
        try bus.watch(
            from + "interface='org.freedesktop.DBus.Properties',member='PropertiesChanged',"
                + "arg0='\(Self.sessionInterface)'"
        ) { [unowned self] message in
            guard isFromLogind(message), let said = Self.lockedHint(in: message), let path = BusCall(message)?.path,
                let owner = owner(of: path)
            else { return }
            // What logind holds now, not what the signal carried (a later change may have overtaken it).
            let locked = lockedHint(of: path) ?? said
            if locked { actions.lock(owner, "the session set LockedHint", true) } else { actions.cancelLock(owner) }
        }
        try bus.watch(from + "interface='\(Self.managerInterface)',member='PrepareForSleep'") {
            [unowned self] message in
            guard isFromLogind(message), let sleeping = try? BusMessageReader(message: message).bool() else { return }
            if sleeping {
                actions.lock(nil, "the machine goes to sleep", false)
                releaseInhibitor()
            } else {
                takeInhibitor()
            }
        }
        try bus.watch(from + "interface='\(Self.managerInterface)',member='SessionRemoved'") {
            [unowned self] message in
            guard isFromLogind(message) else { return }
            let arguments = BusMessageReader(message: message)
            guard (try? arguments.string()) != nil, let path = try? arguments.objectPath(),
                let owner = sessions.removeValue(forKey: path)
            else { return }
            actions.lock(owner, "the session ended", false)
        }
        sessions = readSessions()
        takeInhibitor()
        try bus.start()
    }

    deinit {
        bus.stop()
    }

    /// Whether logind sent `message`: its sender is logind's unique name
    /// now. Any other sender is logged, once each, at most
    /// ``forgedSendersLogged`` of them (a flood of forgeries is no flood of logs).
    private func isFromLogind(_ message: OpaquePointer) -> Bool {
        let sender = BusCall(message)?.sender ?? ""
        if let logind, sender == logind { return true }
        if forgedSenders.count < Self.forgedSendersLogged, forgedSenders.insert(sender).inserted {
            let who = bus.senderProcess(of: message).map { "process \($0.pid) of uid \($0.uid)" } ?? "a process gone"
            Diagnostics.log("ignored a signal in logind's name sent by \(sender), \(who), not by logind")
        }
        return false
    }

    /// logind's unique name, as the bus daemon says (nil: none owns its name).
    private func readOwner() -> String? {
        guard
            let reply = try? bus.call(
                Self.busDaemon, "/org/freedesktop/DBus", Self.busDaemon, "GetNameOwner",
                { (call) throws(BusError) in try call.string(Self.name) })
        else { return nil }
        return try? reply.arguments.string()
    }

    /// The session's `LockedHint` as logind holds it (nil: logind does not say).
    private func lockedHint(of path: String) -> Bool? {
        guard
            let reply = try? bus.call(
                Self.name, path, "org.freedesktop.DBus.Properties", "Get",
                { (call) throws(BusError) in
                    try call.string(Self.sessionInterface)
                    try call.string("LockedHint")
                })
        else { return nil }
        let arguments = reply.arguments
        do throws(BusError) {
            try arguments.enter("v", "b")
            return try arguments.bool()
        } catch {
            return nil
        }
    }

    /// The user of `path` when it is a followed session: the sessions read
    /// at the start, read again for a path not among them (a session begun since).
    private func owner(of path: String?) -> UInt32? {
        guard let path else { return nil }
        if let owner = sessions[path] { return owner }
        sessions = readSessions()
        return sessions[path]
    }

    /// The followed sessions (`ListSessions`: those of `uid`, or all) and
    /// their users; none when logind does not say.
    private func readSessions() -> [String: UInt32] {
        guard let reply = try? bus.call(Self.name, Self.managerPath, Self.managerInterface, "ListSessions") else {
            return [:]
        }
        // a(susso): id, uid, user name, seat, object path.
        let arguments = reply.arguments
        var found: [String: UInt32] = [:]
        do throws(BusError) {
            try arguments.enter("a", "(susso)")
            while try arguments.enterElement("r", "susso") {
                _ = try arguments.string()
                let owner = try arguments.uint32()
                _ = try arguments.string()
                _ = try arguments.string()
                let path = try arguments.objectPath()
                if uid == nil || owner == uid { found[path] = owner }
                try arguments.exit()
            }
        } catch {
            return found
        }
        return found
    }

    /// `LockedHint` among the changed properties of a PropertiesChanged
    /// (s interface, a{sv} changed, as invalidated); nil when it is not there.
    private static func lockedHint(in message: OpaquePointer) -> Bool? {
        let arguments = BusMessageReader(message: message)
        do throws(BusError) {
            _ = try arguments.string()
            try arguments.enter("a", "{sv}")
            while try arguments.enterElement("e", "sv") {
                let name = try arguments.string()
                if name == "LockedHint" {
                    try arguments.enter("v", "b")
                    return try arguments.bool()
                }
                try arguments.skip("v")
                try arguments.exit()
            }
        } catch {
            return nil
        }
        return nil
    }

    /// A delay inhibitor of sleep: logind waits (up to its InhibitDelayMaxSec)
    /// until it is closed, which the device does once it has locked.
    private func takeInhibitor() {
        guard inhibitor.raw == nil,
            let reply = try? bus.call(
                Self.name, Self.managerPath, Self.managerInterface, "Inhibit",
                { (call) throws(BusError) in
                    try call.string("sleep")
                    try call.string("KeychainFS")
                    try call.string("Lock the keychain before the machine sleeps")
                    try call.string("delay")
                }),
            let fd = try? reply.arguments.unixFD()
        else { return }
        inhibitor = FileDescriptor(fcntl(fd.raw, F_DUPFD_CLOEXEC, 3))
    }

    private func releaseInhibitor() {
        inhibitor = nil  // closed: logind lets the machine sleep
    }
}
