// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "KeychainFS",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "KeychainCore", targets: ["KeychainCore"]),
    ],
    targets: [
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .target(name: "KeychainCore", dependencies: ["CSodium", "CSQLite"]),
        .testTarget(
            name: "KeychainCoreTests",
            dependencies: ["KeychainCore"],
            resources: [.copy("Fixtures")]
        ),
    ],
    swiftLanguageModes: [.v6]
)
