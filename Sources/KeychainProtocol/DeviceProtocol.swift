import KeychainCore
internal import CLinux
#if canImport(Glibc)
import Glibc
#endif

/// The device's request/reply protocol on its UNIX socket (docs/PROTOCOL.md):
/// one request and one reply per connection, each a frame
/// `length u32 LE | body`, the body `version u8 | kind u8 | code i32 LE |
/// fields`, each field `length u32 LE | bytes`. Requests carry the operation
/// in `kind` (code 0); replies carry the outcome (0 ok, 1 a core error whose
/// OSStatus is `code`, 2 a system error whose errno is `code`) and, for
/// errors, a sentence for the user as their first field.
///
/// Frames may carry passcodes: they are read into and built in secret memory
/// (``SecureBytes``, wiped on release), and a passcode field is copied
/// straight into its own ``SecureBytes``, never into a String.
public enum DeviceProtocol {
    /// The protocol version this build speaks.
    /// 2: `backup` names the policed groups it includes and carries the
    /// passcode; `restore` carries the passcode (docs/SECURITY.md, "Callers
    /// the device trusts").
    /// 3: service mode (`create`, `attach`, `auditLog`, `verifyLog`); the
    /// files of `backup` and `restore` are passed as descriptors.
    /// 4: `watch`, `autoLock`. 5: items' details (`set`'s field, `details`).
    /// 6: a claim in `details` records its script and JIT; `status` says
    /// who decides (docs/SECRET-SERVICE.md, "The device's judge"). 7:
    /// `status` names the mount it is asked through, and answers the whole
    /// report: the serving process's facts too (one status for every view:
    /// docs/FILESYSTEM.md, "`.control`"). 8: `status` says whether
    /// the keychain is bound to its passcode (docs/FORMAT.md, "The passcode
    /// binding"). 9: the TPM through the service (`tpm*` requests, kinds 35
    /// to 41, which only the service answers: docs/FORMAT.md, "The TPM
    /// through the service"). 10: sync with the person's other machines
    /// (`sync*` requests, kinds 42 to 54, a per-user device's: docs/SYNC.md).
    /// 11: `status` names the TCTI the device reaches its TPM at; purge,
    /// background, access mode and migrate (kinds 55 to 58), which only
    /// `.control` could do before. 12:
    /// `status` says whether the keychain is read-only (docs/FILESYSTEM.md,
    /// "A read-only keychain").
    public static let version: UInt8 = 12
    /// The largest frame body accepted: a whole value and its names.
    public static let maximumBody = ItemLimits.maximumValueSize + (64 << 10)
}

/// One field of a frame being built.
enum FrameField {
    case text(String)
    case optionalText(String?)
    case optionalSecret(SecureBytes?)

    /// `length | body` in secret memory.
    static func frame(kind: UInt8, code: Int32, _ fields: [FrameField]) throws(KeychainError) -> SecureBytes {
        // A frame holds a whole value and its names: its limit is the frame's, not a value's
        // (a value within 40 bytes of 1 MiB made a frame past 1 MiB, refused as "the device went away").
        let buffer = SecureBuffer(limit: DeviceProtocol.maximumBody)
        // Array.withUnsafeBytes only rethrows untyped errors: carry ours out.
        func append(_ bytes: [UInt8]) throws(KeychainError) {
            var failure: KeychainError?
            bytes.withUnsafeBytes { raw in
                do throws(KeychainError) { try buffer.append(raw) } catch { failure = error }
            }
            if let failure { throw failure }
        }
        func appendLength(_ count: Int) throws(KeychainError) {
            try append(withUnsafeBytes(of: UInt32(count).littleEndian, Array.init))
        }
        try append([DeviceProtocol.version, kind])
        try append(withUnsafeBytes(of: code.littleEndian, Array.init))
        for field in fields {
            switch field {
            case .text(let text):
                try appendLength(text.utf8.count)
                try append(Array(text.utf8))
            case .optionalText(let text):
                try append([text == nil ? 0 : 1])
                try appendLength(text?.utf8.count ?? 0)
                try append(Array((text ?? "").utf8))
            case .optionalSecret(let secret):
                try append([secret == nil ? 0 : 1])
                try appendLength(secret?.count ?? 0)
                if let secret { try secret.withUnsafeBytes { (raw) throws(KeychainError) in try buffer.append(raw) } }
            }
        }
        let body = buffer.count
        guard body <= DeviceProtocol.maximumBody else { throw .param }
        let frame = try SecureBytes(count: 4 + body)
        frame.mutableBytes.storeBytes(of: UInt32(body).littleEndian, toByteOffset: 0, as: UInt32.self)
        buffer.withBytes(from: 0, length: body) {
            UnsafeMutableRawBufferPointer(rebasing: frame.mutableBytes[4...]).copyMemory(from: $0)
        }
        buffer.wipe()
        return frame
    }
}

/// The fields of a frame body: `length u32 LE | bytes` each.
extension ByteReader where Bytes == UnsafeRawBufferPointer {
    /// A reader of a frame body; ``KeychainError/param`` for anything malformed.
    init(frame body: UnsafeRawBufferPointer) { self.init(body, malformed: .param) }

    private mutating func field() throws(KeychainError) -> UnsafeRawBufferPointer {
        UnsafeRawBufferPointer(rebasing: try take(Int(try readUInt32())))
    }

    /// UTF-8 without NUL: texts are paths and names, and a C string ends at a NUL.
    mutating func text() throws(KeychainError) -> String {
        let bytes = try field()
        guard !bytes.contains(0), let text = String(validating: bytes, as: UTF8.self) else { throw malformed }
        return text
    }

    mutating func optionalText() throws(KeychainError) -> String? {
        let present = try readByte()
        let text = try text()
        guard present <= 1, present == 1 || text.isEmpty else { throw malformed }
        return present == 1 ? text : nil
    }

    mutating func optionalSecret() throws(KeychainError) -> SecureBytes? {
        let present = try readByte()
        let secret = try field()
        guard present <= 1, present == 1 || secret.isEmpty else { throw malformed }
        return present == 1 ? try SecureBytes(copying: secret) : nil
    }
}

extension DeviceProtocol {
    /// Reads one frame from `fd` and returns its body, in secret memory; nil
    /// when the peer sent no whole frame (it closed, its deadline passed) or
    /// announced a body over ``maximumBody``. With `sender`, every byte must
    /// have been sent by that process (the device's listener passes
    /// credentials): one that connected and let another process finish its
    /// request (a child after an `exec` of the parent) is refused.
    public static func receive(from fd: BorrowedDescriptor, sentBy sender: Int32? = nil) -> SecureBytes? {
        var passed: FileDescriptor?  // none is wanted: closed here if one came
        return receive(from: fd, sentBy: sender, descriptor: &passed)
    }

    /// ``receive(from:sentBy:)``, and in `descriptor` the one descriptor
    /// passed with the frame (SCM_RIGHTS), nil when none came. A frame that
    /// did not arrive whole leaves none open.
    public static func receive(from fd: BorrowedDescriptor, sentBy sender: Int32?, descriptor: inout FileDescriptor?)
        -> SecureBytes?
    {
        var refusedMemory = false
        return receive(from: fd, sentBy: sender, descriptor: &descriptor, refusedMemory: &refusedMemory)
    }

    /// Bodies longer than this take a slot of their own in secret memory
    /// (``SecretArena``'s large classes): the service holds each person to
    /// so many of them at once (``receive(from:sentBy:descriptor:refusedMemory:admittingLarge:)``).
    public static let largeBody = LockedMemoryShares.largeBody

    /// ``receive(from:sentBy:descriptor:)``, saying in `refusedMemory`
    /// when no frame came because its body could not be given secret
    /// memory (``SecretArena``): not the sender's fault, and said so. A
    /// body announced longer than ``largeBody`` is read only once
    /// `admittingLarge` (asked once, with the announced length, before any
    /// of it is held) lets it; refused, no frame comes and `refusedMemory`
    /// says so.
    public static func receive(
        from fd: BorrowedDescriptor, sentBy sender: Int32?, descriptor: inout FileDescriptor?,
        refusedMemory: inout Bool,
        admittingLarge: (Int) -> Bool = { _ in true }
    ) -> SecureBytes? {
        descriptor = nil
        refusedMemory = false
        var length = [UInt8](repeating: 0, count: 4)
        var body: SecureBytes?
        if length.withUnsafeMutableBytes({ readExactly(fd, into: $0, sentBy: sender, descriptor: &descriptor) }) {
            let count = length.withUnsafeBytes { Int(UInt32(littleEndian: $0.load(as: UInt32.self))) }
            if count > largeBody && count <= maximumBody && !admittingLarge(count) {
                refusedMemory = true
            } else if count <= maximumBody {
                body = receiveBody(count: count, refusedMemory: &refusedMemory) {
                    readExactly(fd, into: $0, sentBy: sender, descriptor: &descriptor)
                }
            }
        }
        if body == nil { descriptor = nil }
        return body
    }

    /// The secret memory a body gets before any of it arrived.
    static let firstBodySlot = 4096

    /// A body of `count` bytes, read by `read` (which fills the buffer it
    /// is lent, or fails) into secret memory that grows as the bytes arrive:
    /// ``firstBodySlot`` first, then four times what arrived. A peer that
    /// announces a large body and sends none of it holds 4 KiB, not the
    /// 2 MiB slot its header asked for (32 such connections once took the
    /// service's whole locked-memory limit before a byte of a body came).
    static func receiveBody(count: Int, read: (UnsafeMutableRawBufferPointer) -> Bool) -> SecureBytes? {
        var refusedMemory = false
        return receiveBody(count: count, refusedMemory: &refusedMemory, read: read)
    }

    static func receiveBody(
        count: Int, refusedMemory: inout Bool, read: (UnsafeMutableRawBufferPointer) -> Bool
    ) -> SecureBytes? {
        guard var held = try? SecureBytes(count: min(count, firstBodySlot)) else {
            refusedMemory = true
            return nil
        }
        var received = 0
        while true {
            guard read(UnsafeMutableRawBufferPointer(rebasing: held.mutableBytes[received...])) else { return nil }
            received = held.count
            if received == count { return held }
            guard let grown = try? SecureBytes(count: min(count, received * 4)) else {
                refusedMemory = true
                return nil
            }
            UnsafeMutableRawBufferPointer(rebasing: grown.mutableBytes[..<received]).copyMemory(
                from: UnsafeRawBufferPointer(held.mutableBytes))
            held = grown  // the smaller slot is wiped as it goes back
        }
    }

    private static func readExactly(
        _ fd: BorrowedDescriptor, into buffer: UnsafeMutableRawBufferPointer, sentBy sender: Int32?,
        descriptor: inout FileDescriptor?
    ) -> Bool {
        var offset = 0
        while offset < buffer.count {
            var from: Int32 = 0, passed: Int32 = -1
            let rest = UnsafeMutableRawBufferPointer(rebasing: buffer[offset...])
            let count = try? valueOrErrno(retryOnInterrupt: true) {
                CLinux_receive_with_sender(fd.raw, rest.baseAddress, rest.count, &from, &passed)
            }
            if let received = FileDescriptor(passed), descriptor.raw == nil {
                descriptor = .some(consume received)
            }  // else: one descriptor per frame, a second one is not ours to keep (closed)
            guard let count, count > 0 else { return false }
            if let sender, from != sender { return false }
            offset += count
        }
        return true
    }

    /// Writes a whole frame; false on an error. With `descriptor`, passes
    /// it (SCM_RIGHTS) with the frame's first bytes.
    public static func send(
        _ frame: SecureBytes, to fd: BorrowedDescriptor, passing descriptor: BorrowedDescriptor? = nil
    )
        -> Bool
    {
        frame.withUnsafeBytes { bytes in
            var rest = bytes
            if let descriptor {
                guard
                    let sent = try? valueOrErrno(
                        retryOnInterrupt: true,
                        {
                            CLinux_send_with_descriptor(fd.raw, bytes.baseAddress, bytes.count, descriptor.raw)
                        })
                else { return false }
                rest = UnsafeRawBufferPointer(rebasing: bytes[sent...])
            }
            // send(2) with MSG_NOSIGNAL, not write(2): a peer that closed (a device that refused a
            // body it had no memory for) is an error to report, not SIGPIPE killing the command.
            var offset = 0
            while offset < rest.count {
                guard
                    let sent = try? valueOrErrno(
                        retryOnInterrupt: true,
                        { Glibc.send(fd.raw, rest.baseAddress! + offset, rest.count - offset, Int32(MSG_NOSIGNAL)) }),
                    sent > 0
                else { return false }
                offset += sent
            }
            return true
        }
    }
}
