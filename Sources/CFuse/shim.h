#ifndef CFUSE_SHIM_H
#define CFUSE_SHIM_H
// 3.12: below it, fuse_session_loop_mt is the 3.2 entry point, which reads
// the config as the old two-field struct: our fuse_loop_cfg_create() object
// then means clone_fd on and max_idle_threads 0, i.e. a new worker thread
// for every request (thousands per `ls -l`).
#define FUSE_USE_VERSION 312
#include <fuse3/fuse_lowlevel.h>
#include <sys/mount.h>
#include <sys/signalfd.h>
#include <sys/eventfd.h>
#include <spawn.h>
#include <malloc.h>
#include <sys/syscall.h>
#include <unistd.h>

// Whether the process a pidfd refers to still runs (pidfd_send_signal with
// signal 0; glibc 2.36 has no wrapper declared without _GNU_SOURCE, and
// syscall() is variadic).
static inline int CFuse_pidfd_alive(int pidfd) {
    return syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0;
}

// glibc's malloc tuning (malloc.h is not part of Swift's Glibc module).
static inline void CFuse_limit_malloc_arenas(int arenas) { mallopt(M_ARENA_MAX, arenas); }
static inline void CFuse_fix_mmap_threshold(int bytes) { mallopt(M_MMAP_THRESHOLD, bytes); }
static inline void CFuse_release_free_memory(void) { malloc_trim(0); }

// glibc >= 2.34 exports this GNU extension, but declares it only with
// _GNU_SOURCE, which the Glibc module was built without. A child must not
// inherit our descriptors: an inherited FUSE descriptor would flush (commit)
// the file when the child exits.
extern int posix_spawn_file_actions_addclosefrom_np(posix_spawn_file_actions_t *actions, int from);
static inline int CFuse_spawn_close_from(posix_spawn_file_actions_t *actions, int from) {
    return posix_spawn_file_actions_addclosefrom_np(actions, from);
}

// fuse_session_loop_mt takes a config object that only has constructor
// functions: wrap the calls in one. The defaults are kept on purpose: up to
// 10 workers, idle ones never destroyed (a limit on idle threads makes
// libfuse create and destroy threads under ordinary load).
static inline int CFuse_session_loop_mt(struct fuse_session *se) {
    struct fuse_loop_config *config = fuse_loop_cfg_create();
    if (config == NULL) return -1;
    int result = fuse_session_loop_mt(se, config);
    fuse_loop_cfg_destroy(config);
    return result;
}

// The capability flags are macros Swift imports, but as Int32; keep the
// wanted set in C where the types match conn->want.
static inline void CFuse_configure_connection(struct fuse_conn_info *conn) {
    // open(O_TRUNC) arrives as one open, not open + truncate.
    if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC) conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
    // Never let plaintext sit in the page cache through write-back.
    conn->want &= ~(unsigned)FUSE_CAP_WRITEBACK_CACHE;
    // Listings carry the attributes (one request per chunk of names instead
    // of a LOOKUP per name), always: the kernel's "auto" heuristic would
    // fall back to plain READDIR and a LOOKUP per name for `ls -l`.
    if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
    conn->want &= ~(unsigned)FUSE_CAP_READDIRPLUS_AUTO;
    // Values are whole secrets, never spliced through pipes.
    conn->want &= ~(unsigned)(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
}
#endif
