internal import CSystemd
import KeychainCore
#if canImport(Glibc)
import Glibc
#endif

/// A method call made and sealed in this process, to be read as a received
/// one is: what the reader's unit tests and its fuzz target feed it.
///
/// sd-bus makes messages only on a started bus. One end of a socketpair,
/// started and never answered, is one: its handshake never completes, so
/// nothing is ever sent, and no bus daemon is needed. Each message has a
/// bus of its own (an sd-bus bus is not for several threads), which goes
/// with the message.
final class LocalBusMessage {
    let message: OpaquePointer

    /// A call of `member` with the arguments `build` appends; nil when
    /// libsystemd is missing or refuses.
    init?(member: String = "Test", _ build: (BusMessageWriter) throws(BusError) -> Void) throws(BusError) {
        var ends: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &ends) == 0,
            let ours = FileDescriptor(ends[0]), let other = FileDescriptor(ends[1])
        else { return nil }
        // The handshake's first bytes go to the other end while the bus starts.
        defer { extendLifetime(other) }
        var bus: OpaquePointer?
        guard CSystemd_sd_bus_new(&bus) >= 0, let bus else { return nil }
        // The message holds the bus (and the bus its end of the pair) from here.
        defer { _ = CSystemd_sd_bus_unref(bus) }
        let end = ours.release()
        var made: OpaquePointer?
        guard CSystemd_sd_bus_set_fd(bus, end, end) >= 0, CSystemd_sd_bus_start(bus) >= 0,
            CSystemd_sd_bus_message_new_method_call(
                bus, &made, "org.freedesktop.secrets", "/org/freedesktop/secrets",
                "org.freedesktop.Secret.Service", member) >= 0,
            let made
        else { return nil }
        message = made
        try build(BusMessageWriter(message: made))
        guard CSystemd_sd_bus_message_seal(made, 1, 0) >= 0, CSystemd_sd_bus_message_rewind(made, 1) >= 0 else {
            return nil
        }
    }

    deinit { _ = CSystemd_sd_bus_message_unref(message) }

    var arguments: BusMessageReader { BusMessageReader(message: message, owner: self) }
    var signature: String { CSystemd_sd_bus_message_get_signature(message, 1).map { String(cString: $0) } ?? "" }
}
