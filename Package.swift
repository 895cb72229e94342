// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "KeychainFS",
    platforms: [.macOS(.v15)],
    products: [
        // The library: the core, the device's wire protocol (a client of a
        // running device) and the TPM adapter (a device booted here); its
        // users import KeychainTPM for PasswordManager.open (README.md, "The Swift library").
        .library(name: "KeychainCore", targets: ["KeychainCore", "KeychainProtocol", "KeychainTPM"]),
        .executable(name: "keychainfs", targets: ["keychainfs"])
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2")
    ],
    targets: [
        .systemLibrary(name: "CSodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CSQLite", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CFuse", providers: [.apt(["libfuse3-dev"])]),
        // OpenSSL's libcrypto: HMAC-SHA-1 for one-time codes, which libsodium
        // lacks. Loaded on first use, not linked (see its shim.h).
        .systemLibrary(name: "COpenSSL", providers: [.apt(["libssl-dev"])]),
        // Linux and glibc calls Swift cannot make directly (variadic, _GNU_SOURCE-only).
        .systemLibrary(name: "CLinux"),
        // sd-bus, for the Secret Service: loaded on first use, not linked (see its shim.h).
        .systemLibrary(name: "CSystemd", providers: [.apt(["libsystemd-dev"])]),
        // tpm2-tss, for the device secret sealed by a TPM: loaded on first use, not linked (see its shim.h).
        .systemLibrary(name: "CTSS", providers: [.apt(["libtss2-dev"])]),
        // The keychain: its model, store, crypto, device and consent. It knows
        // no wire and no TPM: what it needs of them it names as protocols
        // (KeyProtector, RemoteKeychain) that KeychainTPM and KeychainProtocol implement.
        .target(name: "KeychainCore", dependencies: ["CLinux", "COpenSSL", "CSodium", "CSQLite"]),
        // The device's wire protocol (docs/PROTOCOL.md): requests, replies, the
        // socket and DeviceConnection (the core's RemoteKeychain). Uses the core.
        .target(
            name: "KeychainProtocol", dependencies: ["KeychainCore", "CLinux"],
            // A reply's reader is a generic of the core's: its metadata is
            // reached through its accessor, not found by its name, which
            // searched every type of the static build on each command's first
            // reply (docs/BENCHMARKS.md, "the wire protocol's own target").
            swiftSettings: [
                .unsafeFlags(
                    ["-Xfrontend", "-disable-concrete-type-metadata-mangled-name-accessors"],
                    .when(configuration: .release))
            ]),
        // The TPM adapter (tpm2-tss), the core's KeyProtector, and the service's
        // broker: uses the core, and the protocol to reach and answer the
        // service's TPM; the public calls that boot a device with it live here.
        .target(
            name: "KeychainTPM", dependencies: ["KeychainCore", "KeychainProtocol", "CTSS", "CSodium", "COpenSSL"]),
        .target(
            name: "SecretService", dependencies: ["KeychainCore", "KeychainProtocol", "CSystemd", "COpenSSL", "CLinux"]),
        .target(name: "KeychainFS", dependencies: ["KeychainCore", "KeychainProtocol", "CFuse", "CLinux"]),
        // Sync of migratable items with the person's other devices through
        // a git remote (docs/SYNC.md). It uses the core; the core does not know it.
        .target(name: "KeychainSync", dependencies: ["KeychainCore", "CSodium", "CLinux"]),
        // The device process: the per-user device and the service, serving
        // mounts (KeychainFS) and the bus (SecretService).
        .target(
            name: "KeychainDevice",
            dependencies: [
                "KeychainCore", "KeychainProtocol", "KeychainTPM", "KeychainFS", "KeychainSync", "SecretService",
                "CFuse", "CLinux"
            ]),
        .executableTarget(
            name: "keychainfs",
            dependencies: [
                "KeychainCore", "KeychainProtocol", "KeychainTPM", "KeychainFS", "KeychainDevice", "SecretService",
                .product(name: "ArgumentParser", package: "swift-argument-parser")
            ]
        ),
        // Fuzz targets for the parsers of untrusted bytes: a libFuzzer
        // harness when built by scripts/fuzz, a replayer of inputs otherwise.
        // Debug builds only (it reaches internals through @testable).
        .executableTarget(
            name: "keychainfs-fuzz",
            dependencies: ["KeychainCore", "KeychainProtocol", "KeychainTPM", "KeychainFS", "SecretService", "CFuse"]),
        // What the test targets share: the mount harness (a keychain, its
        // device and mounts, torn down whatever happens), fixtures, memory scans.
        .target(name: "TestSupport", dependencies: ["KeychainCore"], path: "Tests/Support"),
        // Unit tests of the core: no kernel, no process of ours.
        .testTarget(
            name: "KeychainCoreTests",
            dependencies: ["KeychainCore", "KeychainProtocol", "KeychainTPM", "TestSupport"],
            resources: [.copy("Fixtures")]
        ),
        // Unit tests of the FUSE driver's own structures: no kernel.
        .testTarget(
            name: "KeychainFSTests", dependencies: ["KeychainCore", "KeychainTPM", "KeychainFS", "TestSupport"]),
        // Sync: the merge rule alone, and devices in this process syncing
        // through bare git repositories (and the attacks a remote can try).
        .testTarget(
            name: "KeychainSyncTests", dependencies: ["KeychainCore", "KeychainTPM", "KeychainSync", "TestSupport"]),
        // Unit tests of the Secret Service provider: its readers, paths and sessions with no
        // bus; its handlers over a fake store, called in-process over a socketpair with no bus
        // daemon (InProcessProviderTests), and by secret-tool on a private dbus-daemon
        // (FakeStoreProviderTests).
        .testTarget(
            name: "SecretServiceUnitTests",
            dependencies: ["KeychainCore", "KeychainProtocol", "SecretService", "TestSupport"]),
        // A real device: mounts, the device process, the library as its client.
        .testTarget(
            name: "MountTests",
            dependencies: [
                "KeychainCore", "KeychainProtocol", "KeychainTPM", "KeychainFS", "KeychainDevice", "TestSupport"
            ],
            // Attack programs the service tests run as ordinary users; the
            // golden keychain of format 5 with the software TPM state it was sealed by.
            resources: [.copy("Attacks"), .copy("Fixtures")]
        ),
        // The keychainfs command as a user runs it: output, exit statuses, helpers.
        .testTarget(
            name: "CommandLineTests",
            dependencies: ["KeychainCore", "KeychainProtocol", "KeychainTPM", "KeychainFS", "TestSupport"])
    ],
    swiftLanguageModes: [.v6]
)
