import Foundation
import KeychainCore
import KeychainProtocol
import Synchronization
import Testing
import TestSupport
@testable import SecretService

/// It starts processes (a bus daemon, secret-tool): one at a time with the
/// device tests, whose open files a child would inherit for an instant.
extension SerialTests {
    /// A store of the test's own behind the provider (`SecretStore` hides
    /// the device): the provider serves a private bus, and `secret-tool`,
    /// a real client, sees what the store answers, mapped as the spec says.
    /// No keychain, no device.
    @Suite struct FakeStoreProviderTests {
        /// A private session bus for the test, ended with it.
        final class PrivateBus {
            let directory: String
            let daemon: Int32
            let address: String

            init() throws {
                directory = try makeTemporaryDirectory("kcfs-fakebus", in: "/tmp/")
                var ready: [Int32] = [0, 0]
                #expect(pipe(&ready) == 0)
                var options = Spawn.Options()
                options.descriptors = [(1, ready[1])]
                daemon = try #require(
                    Spawn.start(
                        [
                            "/usr/bin/dbus-daemon", "--session", "--nofork", "--print-address=1",
                            "--address=unix:path=\(directory)/bus"
                        ], options: options))
                close(ready[1])
                // The daemon prints its address once it listens: then it is ready.
                let line = FileHandle(fileDescriptor: ready[0], closeOnDealloc: true).readLine()
                address = line.trimmingCharacters(in: .whitespacesAndNewlines)
            }

            deinit {
                kill(daemon, SIGTERM)
                _ = Spawn.wait(daemon)
                try? FileManager.default.removeItem(atPath: directory)
            }

            /// Runs `secret-tool` on this bus: (status, stdout, stderr).
            func secretTool(_ arguments: [String], input: String = "") -> (
                status: Int32, stdout: String, stderr: String
            ) {
                let files = ["in", "out", "err"].map { directory + "/secret-tool." + $0 }
                _ = FileManager.default.createFile(atPath: files[0], contents: Data(input.utf8))
                let descriptors = zip(files, [O_RDONLY, O_WRONLY | O_CREAT | O_TRUNC, O_WRONLY | O_CREAT | O_TRUNC]).map
                { open($0, $1, 0o600) }
                defer { descriptors.forEach { close($0) } }
                var options = Spawn.Options()
                options.descriptors = [(0, descriptors[0]), (1, descriptors[1]), (2, descriptors[2])]
                options.environment = ["DBUS_SESSION_BUS_ADDRESS=\(address)", "PATH=/usr/bin:/bin", "HOME=\(directory)"]
                let status = Spawn.start(["/usr/bin/secret-tool"] + arguments, options: options).map(Spawn.wait) ?? -1
                let read = { (path: String) in (try? String(contentsOfFile: path, encoding: .utf8)) ?? "" }
                return (status, read(files[1]), read(files[2]))
            }
        }

        @Test func whatTheStoreAnswersIsWhatTheClientGets() throws {
            let store = FakeStore(
                get: .success(ItemValue(value: try SecureBytes("from-the-fake"), protectionClass: .whenUnlocked)),
                set: .failure(.keychain(.quotaExceeded, KeychainError.quotaExceeded.description)),
                remove: .failure(.keychain(.missingEntitlement, "not entitled")))
            let bus = try PrivateBus()
            let provider = try SecretServiceProvider(store: store, replace: false, address: bus.address)
            defer { provider.stop() }

            let lookup = bus.secretTool(["lookup", "keychainfs:identifier", "mail"])
            #expect(lookup.status == 0 && lookup.stdout == "from-the-fake", "\(lookup)")
            // The store's sentence, as Failed.
            let store1 = bus.secretTool(
                ["store", "--label", "Mail", "keychainfs:identifier", "mail"], input: "new value")
            #expect(
                store1.status != 0 && store1.stderr.contains("as many items or bytes as its quota allows"), "\(store1)")
            // A group's policy that does not admit the program: AccessDenied, nothing removed.
            let clear = bus.secretTool(["clear", "keychainfs:identifier", "mail"])
            #expect(clear.status != 0 && clear.stderr.contains("not entitled"), "\(clear)")
            #expect(store.asked.withLock { $0 } == ["get", "set", "remove"])
        }
    }
}

extension FileHandle {
    /// One line, without buffering past it.
    func readLine() -> String {
        var line: [UInt8] = []
        var byte: UInt8 = 0
        while Glibc.read(fileDescriptor, &byte, 1) == 1, byte != UInt8(ascii: "\n") { line.append(byte) }
        return String(decoding: line, as: UTF8.self)
    }
}
