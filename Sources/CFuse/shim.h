#ifndef CFUSE_SHIM_H
#define CFUSE_SHIM_H
// 3.12, the API of the installed libfuse (3.14). The multi-threaded loop is
// our own (FuseSessionLoop.swift), over fuse_session_receive_buf and
// fuse_session_process_buf, so that each request is checked before libfuse
// parses it.
#define FUSE_USE_VERSION 312
#include <fuse3/fuse_lowlevel.h>
#include <stddef.h>

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
