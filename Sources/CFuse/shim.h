#ifndef CFUSE_SHIM_H
#define CFUSE_SHIM_H
// 3.12: below it, fuse_session_loop_mt is the 3.2 entry point, which reads
// the config as the old two-field struct: our fuse_loop_cfg_create() object
// then means clone_fd on and max_idle_threads 0, i.e. a new worker thread
// for every request (thousands per `ls -l`).
#define FUSE_USE_VERSION 312
#include <fuse3/fuse_lowlevel.h>
#include <stddef.h>

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

// The scratch directory of `keychainfs edit`: as above, but plain READDIR
// (it has no READDIRPLUS: a directory of a few files).
static inline void CFuse_configure_scratch_connection(struct fuse_conn_info *conn) {
    CFuse_configure_connection(conn);
    conn->want &= ~(unsigned)FUSE_CAP_READDIRPLUS;
}
#endif
