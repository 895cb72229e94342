internal import CFuse
internal import CLinux
import KeychainCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// libfuse's multi-threaded session loop, with each request checked before
/// libfuse parses it (``FuseRequestCheck``) and wiped once it is answered.
/// As libfuse's own loop (fuse_loop_mt.c, 3.14): workers read a request
/// each from the connection (fuse_session_receive_buf) and answer it
/// (fuse_session_process_buf); a worker that takes a request when no other
/// is idle starts another, up to ``maximumWorkers``; FORGETs count for
/// none (a burst of them must not start threads); and the workers end when
/// the connection does (unmounted: every read returns ENODEV).
final class FuseSessionLoop: Sendable {
    /// libfuse's default (`max_threads`).
    static let maximumWorkers = 10

    private struct Workers {
        var started = 0
        var idle = 0
        var threads: [pthread_t] = []
    }

    // The session pointer is used by the workers only, as libfuse's loop uses it.
    private nonisolated(unsafe) let session: OpaquePointer
    private let workers = Mutex(Workers())

    init(session: OpaquePointer) { self.session = session }

    /// Serves until the session ends; returns once every worker has.
    func run() {
        startWorker()
        // A worker starts others only while it runs, so a thread it started
        // is in the list before the join of its starter returns.
        while let thread = workers.withLock({ $0.threads.popLast() }) { pthread_join(thread, nil) }
    }

    private func startWorker() {
        workers.withLock { workers in
            guard workers.started < Self.maximumWorkers,
                let thread = Threads.start(
                    blockingSignals: true,
                    { [self] in
                        _ = CLinux_name_thread("kcfs-fuse")
                        work()
                    })
            else { return }
            workers.started += 1
            workers.idle += 1
            workers.threads.append(thread)
        }
    }

    private func work() {
        var buffer = fuse_buf()
        defer {
            if let memory = buffer.mem {
                // The whole allocation: it held names, `.control` lines, values.
                explicit_bzero(memory, malloc_usable_size(memory))
                free(memory)
            }
        }
        while fuse_session_exited(session) == 0 {
            let received = Int(fuse_session_receive_buf(session, &buffer))
            if received == -Int(EINTR) { continue }  // an interrupted request (ENOENT), as libfuse retries
            guard received > 0, let memory = buffer.mem, buffer.flags.rawValue & FUSE_BUF_IS_FD.rawValue == 0 else {
                if received < 0 { fuse_session_exit(session) }
                break
            }
            let request = UnsafeRawBufferPointer(start: memory, count: received)
            let opcode = received >= 8 ? request.loadUnaligned(fromByteOffset: 4, as: UInt32.self) : 0
            let forget = opcode == 2 || opcode == 42
            let noneIdle = workers.withLock { workers -> Bool in
                if !forget { workers.idle -= 1 }
                return workers.idle == 0
            }
            if noneIdle { startWorker() }
            if let problem = FuseRequestCheck.problem(in: request) {
                refuse(request, problem, answering: !forget)
            } else {
                fuse_session_process_buf(session, &buffer)
            }
            explicit_bzero(memory, received)
            if !forget { workers.withLock { $0.idle += 1 } }
        }
        workers.withLock { $0.idle -= 1 }
    }

    /// Answers a malformed request EIO, unread (a FORGET gets no answer),
    /// and says so: only a connection the kernel does not write could carry one.
    private func refuse(_ request: UnsafeRawBufferPointer, _ problem: String, answering: Bool) {
        Diagnostics.log("a malformed FUSE request was refused: \(problem)")
        guard answering, request.count >= 16 else { return }
        // struct fuse_out_header: len u32, error i32, unique u64.
        var reply = [UInt8](repeating: 0, count: 16)
        reply.withUnsafeMutableBytes { out in
            out.storeBytes(of: UInt32(16).littleEndian, toByteOffset: 0, as: UInt32.self)
            out.storeBytes(of: Int32(-EIO).littleEndian, toByteOffset: 4, as: Int32.self)
            out.storeBytes(
                of: request.loadUnaligned(fromByteOffset: 8, as: UInt64.self), toByteOffset: 8, as: UInt64.self)
        }
        _ = reply.withUnsafeBytes { write(fuse_session_fd(session), $0.baseAddress, 16) }
    }
}
