#ifndef CLINUX_SHIM_H
#define CLINUX_SHIM_H
// Linux and glibc calls that Swift cannot make directly (variadic functions,
// declarations hidden behind _GNU_SOURCE, headers outside the Glibc module).
// Nothing of FUSE, libsodium or SQLite: each of those has its own shim.
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <malloc.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <linux/fuse.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/sysmacros.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <sys/prctl.h>
#include <sys/auxv.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

// poll(2)'s POLLRDHUP (the peer closed its end) is declared only under
// _GNU_SOURCE.
static const short CLinux_POLLRDHUP = 0x2000;

// renameat2(2) with RENAME_EXCHANGE (declared only under _GNU_SOURCE):
// the two paths swap places atomically; both must exist.
static inline int CLinux_rename_exchange(const char *first, const char *second) {
    return (int)syscall(SYS_renameat2, AT_FDCWD, first, AT_FDCWD, second, 1 << 1);
}

// RLIMIT_CORE 0: no core file (setrlimit's resource is an enum Swift
// imports awkwardly).
static inline int CLinux_disable_core_files(void) {
    struct rlimit none = {0, 0};
    return setrlimit(RLIMIT_CORE, &none);
}

// The calling thread at background priority: the SCHED_IDLE policy, nice
// 19 and the idle I/O class (sched_setscheduler(2), setpriority(2) and
// ioprio_set(2) take a thread id; anyone may lower their own). SCHED_IDLE,
// not nice alone: the kernel's EEVDF scheduler lets a running nice-19
// thread finish its slice before a woken ordinary one runs, so on two busy
// cores every wakeup of a `get` (its process, the device's thread, the
// reply) waited up to a slice, 2.9 times an idle `get` in all; a woken
// ordinary thread preempts a SCHED_IDLE one at once (docs/BENCHMARKS.md).
// 0, or -1 with errno.
static inline int CLinux_background_this_thread(void) {
    pid_t thread = (pid_t)syscall(SYS_gettid);
    // SCHED_IDLE is 5 (sched(7)); its priority must be 0.
    struct { int priority; } idle = {0};
    if (syscall(SYS_sched_setscheduler, thread, 5, &idle) != 0) return -1;
    if (setpriority(PRIO_PROCESS, (id_t)thread, 19) != 0) return -1;
    // IOPRIO_WHO_PROCESS (1), IOPRIO_CLASS_IDLE (3) << IOPRIO_CLASS_SHIFT (13).
    return (int)syscall(SYS_ioprio_set, 1, thread, 3 << 13);
}

// This process's RLIMIT_MEMLOCK (the soft limit, what mlock allows), UINT64_MAX for none.
static inline uint64_t CLinux_locked_memory_limit(void) {
    struct rlimit limit;
    if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return 0;
    return limit.rlim_cur == RLIM_INFINITY ? UINT64_MAX : limit.rlim_cur;
}

// RLIMIT_MEMLOCK raised to `bytes` where it is lower (the hard limit too,
// with CAP_SYS_RESOURCE; else the soft one as far as the hard allows).
// The soft limit it leaves.
static inline uint64_t CLinux_raise_locked_memory(uint64_t bytes) {
    struct rlimit limit;
    if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return 0;
    if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < bytes) {
        struct rlimit raised = {bytes, limit.rlim_max == RLIM_INFINITY || limit.rlim_max > bytes ? limit.rlim_max : bytes};
        if (setrlimit(RLIMIT_MEMLOCK, &raised) != 0) {
            raised.rlim_cur = raised.rlim_max = limit.rlim_max;
            if (setrlimit(RLIMIT_MEMLOCK, &raised) != 0) return limit.rlim_cur;
        }
    }
    return CLinux_locked_memory_limit();
}

// prctl is variadic. No core file, and PR_SET_DUMPABLE 0: no ptrace attach
// and no reading of /proc/PID/mem, maps or exe by other processes of the
// same user (only by holders of CAP_SYS_PTRACE).
static inline int CLinux_disable_core_dumps(void) {
    if (CLinux_disable_core_files() != 0) return -1;
    return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

// setresgid(2), declared only under _GNU_SOURCE; glibc's, which changes
// every thread's credentials (the raw system call changes the caller's).
extern int setresgid(gid_t real, gid_t effective, gid_t saved);
extern int getresgid(gid_t *real, gid_t *effective, gid_t *saved);

// Settles the groups a keychainfs process starts with (docs/SECURITY.md,
// "A device undumpable from its first instruction"). 0, or -1 with errno.
//
// - Started setgid (the installed device build, setgid to a group that owns
//   nothing: real the user's, effective and saved that group): the
//   effective group becomes the user's again, so that files are made with
//   it, and the saved group stays the device's. That saved group is what
//   tells pam_keychainfs, as root, that the kernel started the process
//   undumpable from its first instruction: a setgid exec makes a process
//   undumpable before any of its code runs, under a tracer or with no new
//   privileges the bit is ignored, and no process of the user has its
//   credentials (ptrace_may_access compares the saved group too). The
//   kernel resets dumpability on a change of the effective ids to
//   suid_dumpable (commit_creds), so the change below keeps it undumpable.
// - Started by pam_keychainfs's hook (real nogroup, effective and saved the
//   user's: docs/SECURITY.md, the row "nobody takes the password from the
//   hook"): the effective group becomes the real one too. Only the real
//   group changes, which leaves dumpability as it was.
static inline int CLinux_settle_groups(void) {
    gid_t real, effective, saved;
    if (getresgid(&real, &effective, &saved) != 0) return -1;
    if (real == effective) return 0;
    struct stat image;
    if (effective == saved && stat("/proc/self/exe", &image) == 0 && (image.st_mode & S_ISGID) != 0 &&
        image.st_gid == effective)
        return setresgid((gid_t)-1, real, (gid_t)-1);
    return setresgid(effective, effective, effective);
}

// Makes the effective group the real one too, keeping the effective and
// saved ones (pam_keychainfs's hook, before it starts the setgid device
// build: see CLinux_settle_groups). 0, or -1 with errno.
static inline int CLinux_take_effective_group(void) {
    gid_t effective = getegid();
    if (getgid() == effective) return 0;
    return setresgid(effective, (gid_t)-1, (gid_t)-1);
}

// prctl is variadic. Names the calling thread (16 bytes at most, with the
// NUL), as /proc/PID/task/TID/comm and top show it.
static inline int CLinux_name_thread(const char *name) { return prctl(PR_SET_NAME, name, 0, 0, 0); }

// glibc's malloc tuning (malloc.h is not part of Swift's Glibc module).
// pidfd_open(2), which glibc 2.36 declares only with _GNU_SOURCE via sys/pidfd.h.
// memfd_create(2) (declared only under _GNU_SOURCE), close-on-exec: a
// file in memory alone, for what a child process reads or writes.
static inline int CLinux_memfd(const char *name) { return (int)syscall(SYS_memfd_create, name, 1u /* MFD_CLOEXEC */); }
static inline int CLinux_pidfd_open(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

static inline void CLinux_limit_malloc_arenas(int arenas) { mallopt(M_ARENA_MAX, arenas); }
static inline void CLinux_fix_mmap_threshold(int bytes) { mallopt(M_MMAP_THRESHOLD, bytes); }
static inline void CLinux_release_free_memory(void) { malloc_trim(0); }

// accept4(2) is declared only with _GNU_SOURCE. The new descriptor is
// close-on-exec from the start: no child spawned meanwhile inherits it.
extern int accept4(int fd, struct sockaddr *address, socklen_t *length, int flags);
static inline int CLinux_accept_cloexec(int listener) { return accept4(listener, NULL, NULL, SOCK_CLOEXEC); }

// glibc >= 2.34 exports this GNU extension, but declares it only with
// _GNU_SOURCE, which the Glibc module was built without. A child must not
// inherit our descriptors: an inherited FUSE descriptor would flush (commit)
// the file when the child exits.
extern int posix_spawn_file_actions_addclosefrom_np(posix_spawn_file_actions_t *actions, int from);
static inline int CLinux_spawn_close_from(posix_spawn_file_actions_t *actions, int from) {
    return posix_spawn_file_actions_addclosefrom_np(actions, from);
}

// One recvmsg on a UNIX stream socket whose listener had SO_PASSCRED set:
// the bytes read, in *sender the process (thread group) that sent them, and
// in *descriptor a descriptor passed with them (SCM_RIGHTS), else -1.
// The kernel attaches the sender's credentials to every message, and a
// stream read never joins messages of two senders (af_unix.c
// maybe_add_creds, unix_stream_read_generic); 0 when none came with them.
// Room for one descriptor only: the kernel closes any further ones
// (scm_detach_fds), and a second one arriving later replaces nothing: the
// caller closes what it does not want. SCM_CREDENTIALS and struct ucred
// are _GNU_SOURCE-only: spelled out here.
static inline ssize_t CLinux_receive_with_sender(int fd, void *buffer, size_t length, int *sender, int *descriptor) {
    union { struct cmsghdr header; char space[CMSG_SPACE(3 * sizeof(int)) + CMSG_SPACE(sizeof(int))]; } control;
    struct iovec vector = { buffer, length };
    struct msghdr message;
    memset(&message, 0, sizeof message);
    message.msg_iov = &vector;
    message.msg_iovlen = 1;
    message.msg_control = control.space;
    message.msg_controllen = sizeof control.space;
    *sender = 0;
    *descriptor = -1;
    ssize_t count = recvmsg(fd, &message, MSG_CMSG_CLOEXEC);
    if (count <= 0) return count;
    for (struct cmsghdr *item = CMSG_FIRSTHDR(&message); item != NULL; item = CMSG_NXTHDR(&message, item)) {
        if (item->cmsg_level == SOL_SOCKET && item->cmsg_type == 2 /* SCM_CREDENTIALS */) {
            memcpy(sender, CMSG_DATA(item), sizeof(int));  // ucred.pid comes first
        } else if (item->cmsg_level == SOL_SOCKET && item->cmsg_type == SCM_RIGHTS
                   && item->cmsg_len >= CMSG_LEN(sizeof(int))) {
            memcpy(descriptor, CMSG_DATA(item), sizeof(int));
        }
    }
    return count;
}

// One sendmsg of `length` bytes that passes `descriptor` with them
// (SCM_RIGHTS): the kernel gives the receiver its own descriptor of the
// same open file (the /dev/fuse connection fusermount3 opened, a backup
// file the user opened).
static inline ssize_t CLinux_send_with_descriptor(int fd, const void *buffer, size_t length, int descriptor) {
    union { struct cmsghdr header; char space[CMSG_SPACE(sizeof(int))]; } control;
    struct iovec vector = { (void *)buffer, length };
    struct msghdr message;
    memset(&message, 0, sizeof message);
    memset(&control, 0, sizeof control);
    message.msg_iov = &vector;
    message.msg_iovlen = 1;
    message.msg_control = control.space;
    message.msg_controllen = sizeof control.space;
    struct cmsghdr *item = CMSG_FIRSTHDR(&message);
    item->cmsg_level = SOL_SOCKET;
    item->cmsg_type = SCM_RIGHTS;
    item->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(item), &descriptor, sizeof(int));
    return sendmsg(fd, &message, MSG_NOSIGNAL);
}

// prctl(2) with one argument: it is variadic.
static inline int CLinux_prctl(int option, unsigned long argument) { return prctl(option, argument, 0, 0, 0); }

// capget(2) and capset(2) have no glibc wrapper: the raw calls, with
// _LINUX_CAPABILITY_VERSION_3's header and its two data words (bits 0-31
// and 32-63 of each set).
struct CLinux_capability_header { unsigned int version; int pid; };
struct CLinux_capability_data { unsigned int effective, permitted, inheritable; };
static inline int CLinux_capget(struct CLinux_capability_header *header, struct CLinux_capability_data *data) {
    return (int)syscall(SYS_capget, header, data);
}
static inline int CLinux_capset(struct CLinux_capability_header *header, struct CLinux_capability_data *data) {
    return (int)syscall(SYS_capset, header, data);
}
// glibc's wrappers (declared only with _GNU_SOURCE) change every thread's
// credentials, where the raw system calls would change one thread's.
extern int setresuid(uid_t ruid, uid_t euid, uid_t suid);
extern int setresgid(gid_t rgid, gid_t egid, gid_t sgid);

// ioctl is variadic. FUSE_DEV_IOC_CLONE binds `clone`, a fresh /dev/fuse
// descriptor, to the connection of `connection`. The kernel allows it only
// when `connection` is a /dev/fuse file opened in the caller's user
// namespace and already bound to a mounted connection (fs/fuse/dev.c,
// fuse_dev_ioctl_clone): how the device tells a mount's descriptor from
// anything else passed to it. 0, or -1 with errno.
static inline int CLinux_fuse_clone(int clone, int connection) {
    uint32_t old = (uint32_t)connection;
    return ioctl(clone, FUSE_DEV_IOC_CLONE, &old);
}

// sock_diag(7) for one UNIX socket, by inode: the inode of the socket it is
// connected to (*peer, 0: none) and the address it is bound to (*length
// bytes in `name`; an accepted socket shows its listener's path). `netlink`
// is a NETLINK_SOCK_DIAG socket. The request and the attributes are C
// structs and macros (NLMSG_*, RTA_*). 0, or -1 with errno.
static inline int CLinux_unix_socket_peer(int netlink, uint32_t inode, uint32_t *peer,
                                          char *name, size_t capacity, size_t *length) {
    struct { struct nlmsghdr header; struct unix_diag_req request; } message;
    memset(&message, 0, sizeof message);
    message.header.nlmsg_len = sizeof message;
    message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    message.header.nlmsg_flags = NLM_F_REQUEST;
    message.request.sdiag_family = AF_UNIX;
    message.request.udiag_states = (uint32_t)-1;
    message.request.udiag_ino = inode;
    message.request.udiag_show = UDIAG_SHOW_PEER | UDIAG_SHOW_NAME;
    // INET_DIAG_NOCOOKIE: any socket with that inode.
    message.request.udiag_cookie[0] = message.request.udiag_cookie[1] = ~0U;
    if (send(netlink, &message, sizeof message, 0) != (ssize_t)sizeof message) return -1;
    union { struct nlmsghdr header; char bytes[8192]; } answer;
    ssize_t count = recv(netlink, &answer, sizeof answer, 0);
    if (count < 0) return -1;
    struct nlmsghdr *header = &answer.header;
    if (!NLMSG_OK(header, (size_t)count)) { errno = EIO; return -1; }
    if (header->nlmsg_type == NLMSG_ERROR) {
        errno = -((struct nlmsgerr *)NLMSG_DATA(header))->error;
        return -1;
    }
    if (header->nlmsg_type != SOCK_DIAG_BY_FAMILY) { errno = EIO; return -1; }
    struct unix_diag_msg *found = NLMSG_DATA(header);
    *peer = 0;
    *length = 0;
    int rest = (int)(header->nlmsg_len - NLMSG_LENGTH(sizeof *found));
    for (struct rtattr *attribute = (struct rtattr *)(found + 1); RTA_OK(attribute, rest); attribute = RTA_NEXT(attribute, rest)) {
        if (attribute->rta_type == UNIX_DIAG_PEER && RTA_PAYLOAD(attribute) >= sizeof(uint32_t)) {
            memcpy(peer, RTA_DATA(attribute), sizeof(uint32_t));
        } else if (attribute->rta_type == UNIX_DIAG_NAME) {
            size_t size = RTA_PAYLOAD(attribute) < capacity ? RTA_PAYLOAD(attribute) : capacity;
            memcpy(name, RTA_DATA(attribute), size);
            *length = size;
        }
    }
    return 0;
}
// sock_diag(7): the inode of the listening UNIX socket bound to the file
// whose device and inode are `device`, `inode` (as stat(2) gives them),
// in *found (0: none). The
// file's inode tells one socket: two sockets that were bound to one path
// in turn both show that path, but only the last is its file's.
// `netlink` is a NETLINK_SOCK_DIAG socket. 0, or -1 with errno.
static inline int CLinux_unix_listener_of_file(int netlink, uint64_t device, uint64_t inode, uint32_t *found) {
    // The kernel keeps a superblock's dev_t as MKDEV(major, minor), not as stat encodes it.
    uint32_t kernel_device = ((uint32_t)major(device) << 20) | (uint32_t)minor(device);
    struct { struct nlmsghdr header; struct unix_diag_req request; } message;
    memset(&message, 0, sizeof message);
    message.header.nlmsg_len = sizeof message;
    message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    message.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    message.request.sdiag_family = AF_UNIX;
    message.request.udiag_states = 1U << 10; // TCP_LISTEN
    message.request.udiag_show = UDIAG_SHOW_VFS;
    if (send(netlink, &message, sizeof message, 0) != (ssize_t)sizeof message) return -1;
    *found = 0;
    union { struct nlmsghdr header; char bytes[32768]; } answer;
    for (;;) {
        ssize_t count = recv(netlink, &answer, sizeof answer, 0);
        if (count < 0) return -1;
        for (struct nlmsghdr *header = &answer.header; NLMSG_OK(header, (size_t)count);
             header = NLMSG_NEXT(header, count)) {
            if (header->nlmsg_type == NLMSG_DONE) return 0;
            if (header->nlmsg_type == NLMSG_ERROR) {
                errno = -((struct nlmsgerr *)NLMSG_DATA(header))->error;
                return -1;
            }
            if (header->nlmsg_type != SOCK_DIAG_BY_FAMILY) continue;
            struct unix_diag_msg *socket_found = NLMSG_DATA(header);
            int rest = (int)(header->nlmsg_len - NLMSG_LENGTH(sizeof *socket_found));
            for (struct rtattr *attribute = (struct rtattr *)(socket_found + 1); RTA_OK(attribute, rest);
                 attribute = RTA_NEXT(attribute, rest)) {
                if (attribute->rta_type != UNIX_DIAG_VFS || RTA_PAYLOAD(attribute) < sizeof(struct unix_diag_vfs))
                    continue;
                struct unix_diag_vfs vfs;
                memcpy(&vfs, RTA_DATA(attribute), sizeof vfs);
                if (vfs.udiag_vfs_dev == kernel_device && vfs.udiag_vfs_ino == inode) *found = socket_found->udiag_ino;
            }
        }
    }
}
#endif
