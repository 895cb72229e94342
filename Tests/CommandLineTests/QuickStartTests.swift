import Foundation
import KeychainCore
import Testing
import TestSupport

extension SerialTests {
    /// The README's quick start, run verbatim as a new user would follow it:
    /// from the repository, on a fresh home directory without ~/.local, every
    /// line in order, stopping at the first that fails.
    @Suite struct QuickStartTests {
        static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path

        /// The block between `<!-- quickstart -->` and `<!-- /quickstart -->`.
        static func quickStart() throws -> String {
            let readme = try String(contentsOfFile: repository + "/README.md", encoding: .utf8)
            let start = try #require(readme.range(of: "<!-- quickstart -->\n```sh\n"))
            let end = try #require(
                readme.range(of: "```\n<!-- /quickstart -->", range: start.upperBound..<readme.endIndex))
            return String(readme[start.upperBound..<end.lowerBound])
        }

        @Test func theReadmeQuickStartRunsAsWritten() throws {
            try Self.runQuickStart(binary: nil)
        }

        /// Runs the quick start with `K` the installed `binary` (nil: as
        /// written, the repository's build) and checks what its comments promise.
        static func runQuickStart(binary: String?) throws {
            let harness = try MountHarness(passcode: nil)
            let home = harness.root + "/home"
            try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: false)
            var script = try Self.quickStart()
            if let binary {
                let line = "K=\"$PWD/.build/release/keychainfs\"\n"
                try #require(script.hasPrefix(line), "the quick start no longer starts with \(line)")
                script = "K=\(binary)\n" + script.dropFirst(line.count)
            }
            try script.write(toFile: harness.root + "/quickstart.sh", atomically: true, encoding: .utf8)
            defer {
                // Whatever the script got to: no mount and no device left behind.
                _ = harness.sh(
                    """
                    for m in "$1/shared" "$1/kc"; do fusermount3 -u -z "$m" 2>/dev/null; done
                    HOME="$1" "$K" stop; "$K" stop --keychain "$1/other-kc"
                    """, arguments: [home])
            }
            // The passcodes and passwords the commands ask for, in order: init
            // (twice), unlock, the backup password (twice), unlock, grant, the
            // other keychain's init (twice), then restore: its passcode, the backup password.
            let answers = [
                "1234", "1234", "1234", "backup-pw", "backup-pw", "1234", "1234", "5678", "5678", "5678", "backup-pw"
            ]
            let run = harness.sh(
                """
                cd "$1" && env -u XDG_DATA_HOME -u KEYCHAINFS_KEYCHAIN HOME="$2" bash -e "$R/quickstart.sh"
                """, arguments: [Self.repository, home], stdin: answers.joined(separator: "\n") + "\n")
            #expect(run.succeeded, "\(run)")
            // What the comments promise.
            let out = run.stdout
            #expect(out.contains("s3cret"))
            #expect(out.contains("user.keychain.accessible=\"whenUnlocked\""))
            #expect(out.contains("state: unlocked") && out.contains("mode: per-user"))
            #expect(run.stderr.contains("Permission denied"))
            #expect(out.contains("api-token"))
            #expect(out.contains("default/example.org\n"))
            #expect(
                out.split(separator: "\n").contains { $0.count == 6 && $0.allSatisfy(\.isNumber) }, "a one-time code")
            #expect(run.stderr.contains("Operation not permitted"))
            #expect(out.contains("the audit log is intact"))
            #expect(out.contains("restored from") && out.contains("added"))
            #expect(!harness.sh("grep -q \" $1/kc \" /proc/mounts", arguments: [home]).succeeded)
            #expect(!FileManager.default.fileExists(atPath: home + "/.local/bin"))
        }
    }
}
