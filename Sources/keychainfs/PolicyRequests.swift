import ArgumentParser
import KeychainCore
import KeychainProtocol
import KeychainDevice
import KeychainFS
#if canImport(Glibc)
import Glibc
#endif

/// Sends a policy call to the keychain's running device, or, when none
/// runs, carries it out on the keychain directly (as `passcode` does).
func policyAnswer<Result>(
    _ policy: PolicyCall<Result>, keychain place: KeychainPlace, passing file: BorrowedDescriptor? = nil
)
    throws -> Result
{
    let request = policy.request, call = policy.call
    try place.requireExisting()
    let outcome: DeviceOutcome<Result>
    if let answer = try RunningDevice(listeningAt: try place.socketPath()).outcome(call, passing: file) {
        outcome = answer
    } else {
        guard case .directory(let keychain) = place else {
            throw fail("the keychainfs service went away", status: ExitStatus.noDevice)
        }
        let device = try DeviceAccess.openDirectly(keychain)
        outcome = device.answer(policyRequest: request, by: nil).outcome(of: call)
        // The log's newest line is anchored in the keychain, as a device anchors it when it stops.
        device.shutDown()
    }
    switch outcome {
    case .success(let result):
        return result
    case .failure(.keychain(.authFailed, _)):
        throw fail(
            "the passcode is wrong (or wrong passcodes have locked changes out for now); nothing was changed",
            status: ExitStatus.denied)
    case .failure(.keychain(.itemNotFound, let message)):
        if case .revoke = request { throw fail("no such rule: nothing was revoked", status: ExitStatus.absent) }
        throw fail(message, status: ExitStatus.absent)
    case .failure(let refusal):
        throw DeviceAccess.failure(refusal, about: .device)
    }
}

/// The passcode that authorises a change of policy (an empty line for a keychain without one).
func policyPasscode() throws -> SecureBytes? {
    guard let passcode = Passcode.read(prompt: "Passcode (empty if none): ") else {
        throw fail("no passcode given (an empty line if the keychain has none); nothing was changed")
    }
    return passcode.count > 0 ? passcode : nil
}

/// Who a rule is for, as `grant` and `revoke` take it.
struct ProgramOptions: ParsableArguments {
    @Option(name: .customLong("exe"), help: "The program's executable (symlinks are resolved; its SHA-256 is pinned).")
    var executable: String?

    @Option(name: .long, help: "Only when the program runs in this systemd unit (e.g. backup.service).")
    var unit: String?

    @Option(name: .long, help: "Only when the program runs as this uid.")
    var uid: UInt32?

    var absoluteExecutable: String? { executable.map(absolutePath) }
}
