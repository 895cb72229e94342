#ifndef CLINUX_SHIM_H
#define CLINUX_SHIM_H
// Linux and glibc calls that Swift cannot make directly (variadic functions,
// declarations hidden behind _GNU_SOURCE, headers outside the Glibc module).
// Nothing of FUSE, libsodium or SQLite: each of those has its own shim.
#include <malloc.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <unistd.h>

// Whether the process a pidfd refers to still runs (pidfd_send_signal with
// signal 0; glibc 2.36 has no wrapper declared without _GNU_SOURCE, and
// syscall() is variadic).
static inline int CLinux_pidfd_alive(int pidfd) {
    return syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0;
}

// RLIMIT_CORE 0: no core file (setrlimit's resource is an enum Swift
// imports awkwardly).
static inline int CLinux_disable_core_files(void) {
    struct rlimit none = {0, 0};
    return setrlimit(RLIMIT_CORE, &none);
}

// prctl is variadic. No core file, and PR_SET_DUMPABLE 0: no ptrace attach
// and no reading of /proc/PID/mem, maps or exe by other processes of the
// same user (only by holders of CAP_SYS_PTRACE).
static inline int CLinux_disable_core_dumps(void) {
    if (CLinux_disable_core_files() != 0) return -1;
    return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

// glibc's malloc tuning (malloc.h is not part of Swift's Glibc module).
static inline void CLinux_limit_malloc_arenas(int arenas) { mallopt(M_ARENA_MAX, arenas); }
static inline void CLinux_fix_mmap_threshold(int bytes) { mallopt(M_MMAP_THRESHOLD, bytes); }
static inline void CLinux_release_free_memory(void) { malloc_trim(0); }

// glibc >= 2.34 exports this GNU extension, but declares it only with
// _GNU_SOURCE, which the Glibc module was built without. A child must not
// inherit our descriptors: an inherited FUSE descriptor would flush (commit)
// the file when the child exits.
extern int posix_spawn_file_actions_addclosefrom_np(posix_spawn_file_actions_t *actions, int from);
static inline int CLinux_spawn_close_from(posix_spawn_file_actions_t *actions, int from) {
    return posix_spawn_file_actions_addclosefrom_np(actions, from);
}

// One recvmsg on a UNIX stream socket whose listener had SO_PASSCRED set:
// the bytes read, and in *sender the process (thread group) that sent them.
// The kernel attaches the sender's credentials to every message, and a
// stream read never joins messages of two senders (af_unix.c
// maybe_add_creds, unix_stream_read_generic); 0 when none came with them.
// SCM_CREDENTIALS and struct ucred are _GNU_SOURCE-only: spelled out here.
static inline ssize_t CLinux_receive_with_sender(int fd, void *buffer, size_t length, int *sender) {
    union { struct cmsghdr header; char space[CMSG_SPACE(3 * sizeof(int))]; } control;
    struct iovec vector = { buffer, length };
    struct msghdr message;
    memset(&message, 0, sizeof message);
    message.msg_iov = &vector;
    message.msg_iovlen = 1;
    message.msg_control = control.space;
    message.msg_controllen = sizeof control.space;
    *sender = 0;
    ssize_t count = recvmsg(fd, &message, MSG_CMSG_CLOEXEC);
    if (count <= 0) return count;
    for (struct cmsghdr *item = CMSG_FIRSTHDR(&message); item != NULL; item = CMSG_NXTHDR(&message, item)) {
        if (item->cmsg_level == SOL_SOCKET && item->cmsg_type == 2 /* SCM_CREDENTIALS */) {
            memcpy(sender, CMSG_DATA(item), sizeof(int));  // ucred.pid comes first
        }
    }
    return count;
}
#endif
