#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// A cgroup named like a systemd scope, removed when the test ends.
package struct CgroupScope: ~Copyable {
    package let name = "kcfs-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).scope"
    package let path: String

    /// Where cgroup2 is mounted writable (pure v2, or a hybrid host's unified hierarchy).
    package static let hierarchy: String? = {
        let mounts = (try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8)) ?? ""
        for line in mounts.split(separator: "\n") {
            let fields = line.split(separator: " ").map(String.init)
            guard fields.count > 3, fields[2] == "cgroup2", fields[3].hasPrefix("rw") else { continue }
            if access(fields[1], W_OK) == 0 { return fields[1] }
        }
        return nil
    }()
    package static var isAvailable: Bool { hierarchy != nil }

    package init() throws {
        path = Self.hierarchy! + "/" + name
        guard mkdir(path, 0o755) == 0 else { throw HarnessError("cannot create the cgroup \(path): errno \(errno)") }
    }

    deinit { rmdir(path) }
}
