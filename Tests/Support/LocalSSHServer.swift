import Foundation
import KeychainCore

/// A real OpenSSH server on localhost for one test: its own host key, an
/// ordinary account that holds the repositories, and a key of the person's
/// that only an ssh-agent holds (its file is removed once the agent has it),
/// so that git reaches the remote as a person's does: `ssh -F CONFIG` with
/// the agent's socket. Stopped with the test (sshd and the agent killed).
package final class LocalSSHServer: @unchecked Sendable {
    package let host: OrdinaryUser
    package let directory: String
    package let port: Int
    /// What a person's environment gives git: the agent and the ssh configuration.
    package let environment: [String: String]
    /// The alias that `ssh -F` resolves to this server and the host account.
    package static let alias = "keychain-remote"
    private let server: pid_t
    private let agent: pid_t

    package init(in parent: String) throws {
        host = try OrdinaryUser()
        // A locked password ("!") makes sshd refuse the account without PAM: no password at all instead.
        _ = Spawn.run(["/usr/sbin/usermod", "-p", "*", host.name])
        directory = parent + "/ssh"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try Self.run(["/usr/bin/ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", directory + "/host"])
        try Self.run([
            "/usr/bin/ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "person", "-f", directory + "/person"
        ])
        let ssh = host.home + "/.ssh"
        try FileManager.default.createDirectory(atPath: ssh, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: directory + "/person.pub", toPath: ssh + "/authorized_keys")
        try host.own(ssh)
        chmod(ssh, 0o700)
        chmod(ssh + "/authorized_keys", 0o600)
        port = Int.random(in: 20_000...40_000)
        let config = """
            Port \(port)
            ListenAddress 127.0.0.1
            HostKey \(directory)/host
            PidFile \(directory)/sshd.pid
            UsePAM no
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            PubkeyAuthentication yes
            AuthorizedKeysFile .ssh/authorized_keys
            StrictModes no
            """
        try config.write(toFile: directory + "/sshd_config", atomically: true, encoding: .utf8)
        try? FileManager.default.createDirectory(atPath: "/run/sshd", withIntermediateDirectories: true)
        var quiet = Spawn.Options()
        quiet.nullStandardStreams = true
        guard let server = Spawn.start(["/usr/sbin/sshd", "-D", "-f", directory + "/sshd_config"], options: quiet)
        else { throw HarnessError("sshd could not start") }
        self.server = server
        // The agent, in the foreground of its own process (-D), on a socket of ours.
        let socket = directory + "/agent.sock"
        guard let agent = Spawn.start(["/usr/bin/ssh-agent", "-D", "-a", socket], options: quiet) else {
            kill(server, SIGKILL)
            throw HarnessError("ssh-agent could not start")
        }
        self.agent = agent
        let hostKey = try String(contentsOfFile: directory + "/host.pub", encoding: .utf8)
        try "[127.0.0.1]:\(port) \(hostKey)".write(
            toFile: directory + "/known_hosts", atomically: true, encoding: .utf8)
        let client = """
            Host \(Self.alias)
                HostName 127.0.0.1
                Port \(port)
                User \(host.name)
                UserKnownHostsFile \(directory)/known_hosts
                StrictHostKeyChecking yes
                BatchMode yes
                IdentityFile none
            """
        try client.write(toFile: directory + "/config", atomically: true, encoding: .utf8)
        environment = ["SSH_AUTH_SOCK": socket, "GIT_SSH_COMMAND": "ssh -F \(directory)/config"]
        // Both are listening once they answer: the agent to ssh-add, sshd to a connection.
        try Self.waitFor { access(socket, F_OK) == 0 }
        var added = Spawn.Options()
        added.environment = ["SSH_AUTH_SOCK=" + socket]
        added.nullStandardStreams = true
        guard Spawn.run(["/usr/bin/ssh-add", directory + "/person"], options: added) == 0 else {
            throw HarnessError("ssh-add failed")
        }
        // From now on only the agent holds the person's key.
        unlink(directory + "/person")
        try Self.waitFor { MachineFixtures.loopbackAccepts(port: self.port) }
    }

    deinit {
        kill(server, SIGTERM)
        kill(agent, SIGTERM)
        _ = Spawn.wait(server)
        _ = Spawn.wait(agent)
    }

    /// A bare repository in the host account's home; its URL as git on the person's side names it.
    package func bareRepository(_ name: String) throws -> String {
        guard
            Spawn.run([
                "/usr/sbin/runuser", "-u", host.name, "--", "/usr/bin/git", "init", "--bare", "--quiet",
                host.home + "/" + name
            ]) == 0
        else { throw HarnessError("git init --bare failed") }
        // A push may start `gc --auto`: in the foreground, so that nothing outlives the test.
        _ = Spawn.run([
            "/usr/sbin/runuser", "-u", host.name, "--", "/usr/bin/git", "--git-dir=" + host.home + "/" + name, "config",
            "gc.autoDetach", "false"
        ])
        return "\(Self.alias):\(name)"
    }

    private static func run(_ arguments: [String]) throws {
        var quiet = Spawn.Options()
        quiet.nullStandardStreams = true
        guard Spawn.run(arguments, options: quiet) == 0 else { throw HarnessError("\(arguments[0]) failed") }
    }

    /// Polls `ready` (a process starting up has no other signal) for at most 10 s.
    private static func waitFor(_ ready: () -> Bool) throws {
        let deadline = Date().addingTimeInterval(10)
        while !ready() {
            guard Date() < deadline else { throw HarnessError("sshd or ssh-agent did not start within 10 s") }
            usleep(20_000)
        }
    }
}
