#if canImport(Glibc)
import Glibc
#endif

/// The labels people give their collections over the Secret Service
/// (`Properties.Set(Collection, "Label")`, as seahorse and libsecret set
/// them), kept beside the groups they name, in the keychain's
/// `collection-labels` file (docs/FORMAT.md): `count u16 | (group | label)*`,
/// each a u16-prefixed UTF-8 string. A label is what a collection is called
/// on screen, no secret, like a group's name; the file is the keychain's
/// own (0600), and one that is unreadable or damaged gives every collection
/// its group's name again rather than an error.
extension KeychainDirectory {
    public static let collectionLabelsFileName = "collection-labels"
    /// The most labels kept, and the longest: a collection's label is a line on screen.
    public static let maximumCollectionLabels = 1024
    public static let maximumCollectionLabelBytes = 4096

    private var collectionLabelsPath: String { path + "/" + Self.collectionLabelsFileName }

    /// Each labelled group's label.
    public func collectionLabels() -> [String: String] {
        guard let fd = FileDescriptor(open(collectionLabelsPath, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)),
            let bytes = try? fd.borrowed.readAll(limit: 8 << 20)
        else { return [:] }
        var reader = ByteReader(bytes)
        var labels: [String: String] = [:]
        do throws(KeychainError) {
            let count = try reader.readUInt16()
            for _ in 0..<count {
                let group = try reader.readPrefixed()
                labels[group] = try reader.readPrefixed()
            }
            guard reader.isAtEnd else { return [:] }
        } catch {
            Diagnostics.log("the collections' labels (\(collectionLabelsPath)) are damaged: each is its group's name")
            return [:]
        }
        return labels
    }

    /// Gives `group`'s collection `label` (nil: its group's name again), written whole and durably.
    /// ``KeychainError/param`` for a label over ``maximumCollectionLabelBytes`` or one label too
    /// many; then nothing changes.
    public func setCollectionLabel(_ label: String?, of group: String) throws(KeychainError) {
        var labels = collectionLabels()
        labels[group] = label
        guard (label?.utf8.count ?? 0) <= Self.maximumCollectionLabelBytes,
            labels.count <= Self.maximumCollectionLabels
        else { throw .param }
        var writer = ByteWriter()
        writer.append(UInt16(labels.count))
        for (group, label) in labels.sorted(by: { $0.key < $1.key }) {
            writer.appendPrefixed(group)
            writer.appendPrefixed(label)
        }
        try Self.writePrivateFile(try SecureBytes(writer.bytes), at: collectionLabelsPath)
    }
}
