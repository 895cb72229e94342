/// The set-up of the entitlement tests, shared with the tests of the audit
/// log and the events that need a policed group.
extension MountHarness {
    /// A mounted, unlocked keychain with `secure/token` and `default/open`,
    /// and `$R/granted-cat` and `$R/other-cat`.
    package static func withPolicedGroup() throws -> (MountHarness, String) {
        let (harness, mnt) = try MountHarness.unlockedMount()
        let setup = harness.sh(
            """
            mkdir "$1/secure" && printf s3cret > "$1/secure/token" && printf open > "$1/default/open" &&
            cp /usr/bin/cat "$R/granted-cat" && cp /usr/bin/cat "$R/other-cat" && printf '\\0' >> "$R/other-cat"
            """, arguments: [mnt])
        guard setup.succeeded else { throw HarnessError("setup failed: \(setup)") }
        return (harness, mnt)
    }

    package func grant(
        _ group: String, exe: String, options: String = "",
        passcode: String = MountHarness.passcode
    ) -> ShellResult {
        sh(
            "\"$K\" grant \"$1\" --exe \"$2\"" + keychainOption + " \(options)", arguments: [group, exe],
            stdin: passcode + "\n")
    }

    package func run(_ program: String, _ path: String) -> ShellResult {
        sh("\"$R/\(program)\" \"$1\"", arguments: [path])
    }
}
