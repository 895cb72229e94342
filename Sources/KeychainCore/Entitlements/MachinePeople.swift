#if canImport(Glibc)
import Glibc
#endif

/// Who a uid is, as the machine's shares are counted: the person a passwd
/// account is. `useradd` gives each account 65,536 subordinate uids
/// (`/etc/subuid`) that `newuidmap` lets it run processes as, each a
/// different SO_PEERCRED uid: counted per uid, a user's shares and quotas
/// were multiplied by them (120 filled the TPM's NV). So a subordinate uid
/// counts as its owner, and a uid that is neither an account nor anyone's
/// subordinate is nobody's (refused).
public enum MachinePeople {
    /// The uid of the person `uid` is: itself for a passwd account, the
    /// owner of the range it lies in for a subordinate uid; nil otherwise.
    public static func person(of uid: UInt32, subordinateIDs: String = "/etc/subuid") -> UInt32? {
        if account(uid: uid) != nil { return uid }
        guard let fd = FileDescriptor(open(subordinateIDs, O_RDONLY | O_CLOEXEC)),
            let bytes = try? fd.borrowed.readAll(limit: 1 << 20)
        else { return nil }
        return owner(of: uid, in: String(decoding: bytes, as: UTF8.self))
    }

    /// The owner of the range holding `uid` in `/etc/subuid`'s text
    /// (subuid(5): `NAME-OR-UID:START:COUNT` per line), as a uid; nil when
    /// no range holds it or its owner is no account.
    static func owner(of uid: UInt32, in text: String) -> UInt32? {
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: ":", omittingEmptySubsequences: false)
            guard fields.count == 3, let start = UInt64(fields[1]), let count = UInt64(fields[2]),
                (start..<(start + count)).contains(UInt64(uid))
            else { continue }
            let name = String(fields[0])
            if let owner = UInt32(name) { return account(uid: owner) }
            return account(named: name)
        }
        return nil
    }

    /// `uid` when a passwd account has it (getpwuid_r: the service answers on many threads).
    private static func account(uid: UInt32) -> UInt32? {
        lookUp { entry, buffer, result in getpwuid_r(uid, &entry, buffer.baseAddress!, buffer.count, &result) }
    }

    /// The uid of the passwd account `name`.
    private static func account(named name: String) -> UInt32? {
        lookUp { entry, buffer, result in getpwnam_r(name, &entry, buffer.baseAddress!, buffer.count, &result) }
    }

    private static func lookUp(
        _ call: (inout passwd, UnsafeMutableBufferPointer<CChar>, inout UnsafeMutablePointer<passwd>?) -> Int32
    ) -> UInt32? {
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 16384)
        let status = buffer.withUnsafeMutableBufferPointer { call(&entry, $0, &result) }
        return status == 0 && result != nil ? entry.pw_uid : nil
    }
}
