import Foundation
import KeychainCore
import Testing
import TestSupport

extension SerialTests {
    /// The release build's two links of one program (for a `get`
    /// within 1.5x of `cat`; docs/SECURITY.md, "Two builds of one
    /// program"): `bin/keychainfs` at fixed addresses answers the commands
    /// that only ask a device; every other command, and every device, runs
    /// in `libexec/keychainfs/keychainfs`, position-independent. Copies of
    /// the release build, as ./scripts/setup makes it, laid out as installed.
    @Suite struct BuildChoiceTests {
        @Test func aFixedBuildOnlyAsksAndEveryDeviceRunsPositionIndependent() throws {
            let release = MachineFixtures.repository + "/.build/release/keychainfs"
            let served = MountHarness.positionIndependentHalf(of: release)
            try #require(
                MachineFixtures.elfType(release) == MachineFixtures.fixedAddresses
                    && MachineFixtures.elfType(served) == MachineFixtures.positionIndependent,
                "the release build is not two links")
            let harness = try MountHarness(creating: false)
            let installed = harness.root + "/usr"
            let fixed = installed + "/bin/keychainfs"
            let independent = installed + "/libexec/keychainfs/keychainfs"
            try FileManager.default.createDirectory(
                atPath: installed + "/bin", withIntermediateDirectories: true)
            try FileManager.default.copyItem(atPath: release, toPath: fixed)
            func k(_ arguments: String, stdin: String? = nil) -> ShellResult {
                harness.sh("\"$1\" \(arguments) --keychain \"$KC\"", arguments: [fixed], stdin: stdin)
            }

            // Without its other half, the fixed build still answers what
            // only asks, and serves nothing: init is refused, and says why.
            #expect(harness.sh("\"$1\" --version", arguments: [fixed]).stdout.hasPrefix("keychainfs "))
            let absent = k("get default/token")
            #expect(absent.status == 2 && !absent.stderr.contains("position-independent"), "\(absent)")
            let alone = k("init --no-tpm", stdin: "1234\n1234\n")
            #expect(
                alone.status == 1 && alone.stderr.contains("position-independent build, \(independent),")
                    && alone.stderr.contains("cannot be run"), "\(alone)")
            #expect(!FileManager.default.fileExists(atPath: harness.keychain))
            // A fixed build in the other's place is no way around it: it
            // looks for its own other half, and serves nothing either.
            try FileManager.default.createDirectory(
                atPath: installed + "/libexec/keychainfs", withIntermediateDirectories: true)
            try FileManager.default.copyItem(atPath: release, toPath: independent)
            let impostor = k("init --no-tpm", stdin: "1234\n1234\n")
            #expect(impostor.status == 1 && impostor.stderr.contains("cannot be run"), "\(impostor)")
            #expect(!FileManager.default.fileExists(atPath: harness.keychain))

            // Laid out whole: init runs, the first `set` starts the device,
            // and the device is the position-independent build.
            try FileManager.default.removeItem(atPath: independent)
            try FileManager.default.copyItem(atPath: served, toPath: independent)
            #expect(k("init --no-tpm", stdin: "1234\n1234\n").succeeded)
            #expect(k("unlock", stdin: "1234\n").succeeded)
            #expect(k("set default/token", stdin: "s3cret").succeeded)
            #expect(k("get default/token").stdout == "s3cret")
            #expect(k("get --json default/token").stdout.contains("\"value\": \"s3cret\""))
            let pid = try #require(
                k("status").stdout.split(separator: "\n").first { $0.hasPrefix("pid: ") }.map {
                    String($0.dropFirst(5))
                })
            let device = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe")
            #expect(
                device == independent
                    && MachineFixtures.elfType("/proc/\(pid)/exe") == MachineFixtures.positionIndependent, "\(device)")
            #expect(k("stop").succeeded)
            // `start` asks, or starts the device directly as the other half;
            // with that half gone, it says which file it needed.
            try FileManager.default.moveItem(atPath: independent, toPath: independent + ".aside")
            let noHalf = k("start")
            #expect(
                noHalf.status != 0 && noHalf.stderr.contains("position-independent build, \(independent),"),
                "\(noHalf)")
            try FileManager.default.moveItem(atPath: independent + ".aside", toPath: independent)
            #expect(k("start").succeeded)
            let started = try #require(
                k("status").stdout.split(separator: "\n").first { $0.hasPrefix("pid: ") }.map {
                    String($0.dropFirst(5))
                })
            #expect(
                (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(started)/exe")) == independent)
            #expect(k("stop").succeeded)
        }

        /// A harness, and the release build copied into its `usr` as installed.
        private func installedRelease() throws -> (harness: MountHarness, installed: String) {
            let release = MachineFixtures.repository + "/.build/release/keychainfs"
            try #require(MachineFixtures.elfType(release) == MachineFixtures.fixedAddresses, "no release build")
            let harness = try MountHarness(creating: false)
            try MountHarness.copyBuild(release, into: harness.root + "/usr")
            return (harness, harness.root + "/usr")
        }

        /// The fixed build is linked statically: there is no loader to run,
        /// and it must never load a library (sd-bus, libcrypto, tpm2-tss
        /// would bring a second libc into it). Every command it answers,
        /// traced, opens no shared object; a command that needs one runs
        /// in the other half.
        @Test func theFixedBuildLoadsNoLibrary() throws {
            let (harness, installed) = try installedRelease()
            let traced = harness.sh(
                """
                k() { strace -f -qq -e trace=open,openat -o "$(mktemp "$R/trace.XXXXXX")" "$K" "$@" >/dev/null; }
                K=$1/bin/keychainfs
                printf '1234\n1234\n' | "$K" init --no-tpm --keychain "$KC" >/dev/null || exit 1
                printf '1234\n' | "$1/libexec/keychainfs/keychainfs" unlock --keychain "$KC" || exit 1
                printf s3cret | k set default/token --keychain "$KC" && k get default/token --keychain "$KC" \
                    && k get --json default/token --keychain "$KC" && k show default/token --keychain "$KC" \
                    && k ls default --keychain "$KC" && k find token --keychain "$KC" && k status --keychain "$KC" && k start --keychain "$KC" \
                    && printf 'protocol=https\nhost=example.org\nusername=u\npassword=p\n\n' \
                        | k git-credential store --keychain "$KC" \
                    && k docker-credential list --keychain "$KC" && k rm default/token --keychain "$KC" \
                    && k lock --keychain "$KC" && k help get && k --version || exit 1
                "$K" stop --keychain "$KC"
                cat "$R"/trace.* | grep -c . && grep -h '\\.so' "$R"/trace.* | head -5
                """, arguments: [installed])
            #expect(traced.succeeded, "\(traced)")
            let lines = traced.stdout.split(separator: "\n")
            // The traces hold something (the keychain's socket directory, the
            // item's path), and no library among it.
            #expect((lines.first.flatMap { Int($0) } ?? 0) > 0, "\(traced)")
            #expect(lines.count == 1, "the fixed build opened libraries: \(lines.dropFirst())")
        }

        /// The release build looks for no library beside itself (no
        /// RUNPATH): a libm.so.6 or libc.so.6 dropped beside a copy, in the
        /// directory of either half, is not loaded, by a command or a device.
        @Test func aLibraryDroppedBesideTheBuildIsNotLoaded() throws {
            let (harness, installed) = try installedRelease()
            let marker = harness.root + "/loaded"
            let planted = harness.sh(
                """
                printf '%s\n' '#include <fcntl.h>' \
                    '__attribute__((constructor)) static void planted(void) { creat("\(marker)", 0600); }' > "$R/planted.c"
                for directory in "$1/bin" "$1/libexec/keychainfs"; do
                    for library in libm.so.6 libc.so.6; do
                        gcc -shared -fPIC -o "$directory/$library" "$R/planted.c" || exit 1
                    done
                done
                """, arguments: [installed])
            try #require(planted.succeeded, "\(planted)")
            let fixed = installed + "/bin/keychainfs"
            #expect(harness.sh("\"$1\" --version", arguments: [fixed]).succeeded)
            let initialised = harness.sh(
                "\"$1\" init --no-tpm --keychain \"$KC\" && \"$1\" start --keychain \"$KC\" && \"$1\" stop --keychain \"$KC\"",
                arguments: [fixed], stdin: "1234\n1234\n")
            #expect(initialised.succeeded, "\(initialised)")
            #expect(!FileManager.default.fileExists(atPath: marker), "a planted library ran")
        }
    }
}
