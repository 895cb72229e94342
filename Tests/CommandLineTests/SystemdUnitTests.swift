import KeychainCore
import Foundation
import KeychainFS
import Testing
import TestSupport

extension SerialTests {
    /// The systemd units shipped in scripts/systemd, and what they rely on.
    @Suite struct SystemdUnitTests {
        private static let unitDirectory = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("scripts/systemd").path

        /// `systemd-analyze verify` of each unit, instantiated for a mount
        /// point; the copies name the built binary instead of the installed
        /// /usr/bin/keychainfs that the shipped units run.
        @Test func theShippedUnitsVerify() throws {
            let harness = try MountHarness()
            guard harness.sh("command -v systemd-analyze").succeeded else {
                // Debian's systemd package is part of the machines this runs on; say so if it is not.
                Issue.record("systemd-analyze is not installed; ./scripts/setup installs systemd")
                return
            }
            let script = """
                export HOME="$R/home"
                mkdir -p "$HOME/.local/bin" "$R/units"
                printf '#!/bin/sh\\n' > "$HOME/.local/bin/my-app" && chmod 700 "$HOME/.local/bin/my-app"
                instance=$(systemd-escape --path "$R/kc")
                built() { sed "s|/usr/bin/keychainfs |$K |" "$1/$2"; }
                built "$1" keychainfs@.service > "$R/units/keychainfs@$instance.service"
                built "$1" keychainfs-exec-example@.service > "$R/units/keychainfs-exec-example@$instance.service"
                built "$1" keychainfs-secrets.service > "$R/units/keychainfs-secrets.service"
                cd "$R/units" && systemd-analyze verify --man=no ./*.service
                """
            let verified = harness.sh(script, arguments: [Self.unitDirectory])
            #expect(verified.succeeded && verified.stderr.isEmpty, "\(verified)")
            // The unit really names the binary and mount point it is verified with.
            #expect(
                harness.sh(
                    "grep -x 'ExecStart=/usr/bin/keychainfs mount --foreground %f' \"$1/keychainfs@.service\"",
                    arguments: [Self.unitDirectory]
                ).succeeded)
        }

        /// A datagram socket at `path`, as systemd's `$NOTIFY_SOCKET` is.
        static func notifySocket(at path: String) throws -> Int32 {
            let listener = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
                }
            }
            guard bound == 0 else {
                close(listener)
                throw HarnessError("cannot bind \(path)")
            }
            return listener
        }

        /// `Type=notify`: the device says READY=1 once the mount answers, and
        /// SIGTERM (systemctl stop) unmounts and exits cleanly.
        @Test func theDeviceNotifiesSystemdAndStopsOnSigterm() throws {
            let harness = try MountHarness()
            let socketPath = harness.root + "/notify"
            let listener = try Self.notifySocket(at: socketPath)
            defer { close(listener) }

            let pid = try harness.mountForeground(environment: ["NOTIFY_SOCKET=" + socketPath])
            // The ready pipe said "ok"; the notification was sent before it.
            var buffer = [UInt8](repeating: 0, count: 64)
            let received = recv(listener, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            #expect(received > 0 && String(decoding: buffer[0..<max(received, 0)], as: UTF8.self) == "READY=1")
            let mountpoint = harness.root + "/mnt"
            #expect(harness.isMounted(mountpoint))

            #expect(kill(pid, SIGTERM) == 0)
            #expect(Spawn.wait(pid) == 0)
            #expect(!harness.isMounted(mountpoint))
        }

        /// Under `WatchdogSec=`, the service's accept loop says WATCHDOG=1 at
        /// half the interval systemd gives (`$WATCHDOG_USEC`): a loop that
        /// stops (as a flood once stopped it) gets the service restarted.
        @Test func theServiceTellsTheWatchdogItIsAlive() throws {
            let service = try ServiceHarness(started: false)
            let socketPath = service.root + "/notify"
            let listener = try Self.notifySocket(at: socketPath)
            defer { close(listener) }
            // The service sends as its own account, as under systemd.
            chmod(socketPath, 0o666)
            var wait = timeval(tv_sec: 2, tv_usec: 0)
            setsockopt(listener, SOL_SOCKET, SO_RCVTIMEO, &wait, socklen_t(MemoryLayout<timeval>.size))
            let environment = ProcessInfo.processInfo.environment.merging(
                ["NOTIFY_SOCKET": socketPath, "WATCHDOG_USEC": "200000"]) { $1 }.map { "\($0.key)=\($0.value)" }
            let pid = try MountHarness.startReady(
                [
                    service.binary, "service", "--state-directory", service.stateDirectory,
                    "--socket", service.socket
                ], environment: environment)
            defer {
                kill(pid, SIGTERM)
                _ = Spawn.wait(pid)
            }
            var messages: [String] = []
            var buffer = [UInt8](repeating: 0, count: 64)
            while messages.filter({ $0 == "WATCHDOG=1" }).count < 3 {
                let received = recv(listener, &buffer, buffer.count, 0)
                guard received > 0 else { break }
                messages.append(String(decoding: buffer[0..<received], as: UTF8.self))
            }
            #expect(messages.contains("READY=1") && messages.filter { $0 == "WATCHDOG=1" }.count == 3, "\(messages)")
        }
    }
}
