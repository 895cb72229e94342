import KeychainCore
/// The device's mounts.
public enum MountRequest: Equatable, Sendable {
    /// Mount the keychain, or one group of it, at a mount point (absolute).
    case mount(group: String?, mountpoint: String)
    /// Serve the FUSE connection passed with the request (a `/dev/fuse`
    /// descriptor the caller mounted with fusermount3) at `mountpoint`.
    case attach(group: String?, mountpoint: String)
    /// Unmount one of the device's mounts.
    case unmount(mountpoint: String)
}

extension MountRequest {
    /// The `kind` byte of each request of this group: unique among all
    /// groups (``DeviceRequest/kindsOfEachGroup``, checked by the protocol's tests),
    /// and never reused, since a byte means one request to every version.
    enum Kind: UInt8, CaseIterable {
        case mount = 2, unmount = 3, attach = 24
    }

    /// The request's kind and fields.
    var frameParts: (Kind, [FrameField]) {
        switch self {
        case .mount(let group, let mountpoint): return (.mount, [.optionalText(group), .text(mountpoint)])
        case .attach(let group, let mountpoint): return (.attach, [.optionalText(group), .text(mountpoint)])
        case .unmount(let mountpoint): return (.unmount, [.text(mountpoint)])
        }
    }

    /// The request of `kind`, read from its fields.
    static func parsing(_ kind: Kind, _ reader: inout ByteReader<UnsafeRawBufferPointer>)
        throws(KeychainError) -> Self
    {
        switch kind {
        case .mount: return .mount(group: try reader.optionalText(), mountpoint: try reader.text())
        case .attach: return .attach(group: try reader.optionalText(), mountpoint: try reader.text())
        case .unmount: return .unmount(mountpoint: try reader.text())
        }
    }
}
