/* The baseline for scripts/bench: a minimal in-memory FUSE filesystem
 * (low-level API, like keychainfs), 1000 files s000..s999 of 44 bytes at its
 * root, direct_io, no kernel caching of content; names and attributes are
 * cached for TIMEOUT seconds (default 0: no kernel caches at all). */
#define FUSE_USE_VERSION 312  /* see Sources/CFuse/shim.h: below 3.12 the loop config is misread */
#include <fuse3/fuse_lowlevel.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FILES 1000
#define SIZE 44
static char contents[FILES][SIZE];
static double timeout;

static int index_of(const char *name) {
    if (name[0] != 's' || strlen(name) != 4) return -1;
    int n = atoi(name + 1);
    return (n >= 0 && n < FILES) ? n : -1;
}

static void fill_stat(fuse_ino_t ino, struct stat *st) {
    memset(st, 0, sizeof *st);
    st->st_ino = ino;
    if (ino == 1) { st->st_mode = S_IFDIR | 0700; st->st_nlink = 2; }
    else { st->st_mode = S_IFREG | 0600; st->st_nlink = 1; st->st_size = SIZE; }
}

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    int n = index_of(name);
    if (parent != 1 || n < 0) { fuse_reply_err(req, ENOENT); return; }
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.ino = (fuse_ino_t)n + 2;
    e.entry_timeout = timeout;
    e.attr_timeout = timeout;
    fill_stat(e.ino, &e.attr);
    fuse_reply_entry(req, &e);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    struct stat st;
    fill_stat(ino, &st);
    fuse_reply_attr(req, &st, timeout);
}

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    fi->direct_io = 1;
    fi->noflush = 1;
    fuse_reply_open(req, fi);
}

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)fi;
    if (off >= SIZE) { fuse_reply_buf(req, NULL, 0); return; }
    size_t n = SIZE - off < size ? SIZE - off : size;
    fuse_reply_buf(req, contents[ino - 2] + off, n);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) { fprintf(stderr, "usage: memfs MOUNTPOINT [TIMEOUT]\n"); return 2; }
    timeout = argc == 3 ? atof(argv[2]) : 0;
    for (int i = 0; i < FILES; i++) memset(contents[i], 'a' + i % 26, SIZE);
    struct fuse_lowlevel_ops ops = {0};
    ops.lookup = ll_lookup;
    ops.getattr = ll_getattr;
    ops.open = ll_open;
    ops.read = ll_read;
    char *args_v[] = {argv[0], "-o", "fsname=memfs", NULL};
    struct fuse_args args = FUSE_ARGS_INIT(3, args_v);
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se || fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, argv[1]) != 0) return 1;
    struct fuse_loop_config *config = fuse_loop_cfg_create();  /* libfuse's defaults, as keychainfs */
    int rc = fuse_session_loop_mt(se, config);
    fuse_loop_cfg_destroy(config);
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return rc ? 1 : 0;
}
