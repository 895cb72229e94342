#ifndef CLINUX_SHIM_H
#define CLINUX_SHIM_H
// Linux and glibc calls that Swift cannot make directly (variadic functions,
// declarations hidden behind _GNU_SOURCE, headers outside the Glibc module).
// Nothing of FUSE, libsodium or SQLite: each of those has its own shim.
#include <malloc.h>
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

// prctl is variadic. RLIMIT_CORE 0 and PR_SET_DUMPABLE 0: no core dump, and
// no ptrace attach by other processes of the same user.
static inline int CLinux_disable_core_dumps(void) {
    struct rlimit none = {0, 0};
    if (setrlimit(RLIMIT_CORE, &none) != 0) return -1;
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
#endif
