#if canImport(Glibc)
import Glibc
#endif

#if !DEBUG
/// The harness reaches internals through @testable, which release builds do not allow.
@main
struct ReleaseStub {
    static func main() {
        let message = Array("keychainfs-fuzz: build it in debug (scripts/fuzz does)\n".utf8)
        _ = message.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
        exit(64)
    }
}
#elseif FUZZING
/// Built by scripts/fuzz with -sanitize=fuzzer -DFUZZING: libFuzzer's own
/// `main` drives this entry; the target comes from KEYCHAINFS_FUZZ_TARGET.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    fuzzTarget.run(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}

private let fuzzTarget: FuzzTarget = {
    let name = getenv("KEYCHAINFS_FUZZ_TARGET").map { String(cString: $0) } ?? ""
    guard let target = FuzzTarget(rawValue: name) else {
        fatalError("set KEYCHAINFS_FUZZ_TARGET to one of \(FuzzTarget.allCases.map(\.rawValue))")
    }
    return target
}()

/// libFuzzer's driver, for programs with a main of their own.
@_silgen_name("LLVMFuzzerRunDriver")
private func runFuzzerDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt

/// SwiftPM gives every executable an entry of its own, which the linker
/// takes over libFuzzer's `main` (still linked, hence the exported entry
/// above): it hands the arguments to libFuzzer's driver.
@main
struct Fuzz {
    static func main() {
        var argc = CommandLine.argc
        var argv = CommandLine.unsafeArgv
        exit(runFuzzerDriver(&argc, &argv) { data, size in fuzzOneInput(data, size) })
    }
}
#else
/// Without libFuzzer: `keychainfs-fuzz TARGET FILE...` runs each input once
/// (the committed corpus and every crash found, as regression tests).
@main
struct Replay {
    static func main() {
        let arguments = CommandLine.arguments
        // The targets, one a line: what the scripts replay and fuzz.
        if arguments.count == 2 && arguments[1] == "--list" {
            for target in FuzzTarget.allCases { print(target.rawValue) }
            return
        }
        guard arguments.count >= 2, let target = FuzzTarget(rawValue: arguments[1]) else {
            complain("usage: keychainfs-fuzz TARGET FILE...; targets: \(FuzzTarget.allCases.map(\.rawValue))")
            exit(64)
        }
        for path in arguments.dropFirst(2) {
            guard let file = fopen(path, "rb") else {
                complain("keychainfs-fuzz: cannot read \(path)")
                exit(1)
            }
            var bytes: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 65536)
            while true {
                let count = fread(&chunk, 1, chunk.count, file)
                if count <= 0 { break }
                bytes += chunk[0..<count]
            }
            fclose(file)
            bytes.withUnsafeBytes { target.run($0) }
        }
        print("keychainfs-fuzz: \(target.rawValue): \(arguments.count - 2) inputs passed")
    }

    /// stderr without the C global, which Swift 6 rejects as shared mutable state.
    private static func complain(_ message: String) {
        let line = Array((message + "\n").utf8)
        _ = line.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    }
}
#endif
