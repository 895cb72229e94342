/*
 * pam_keychainfs: the login password unlocks the user's keychain, and a
 * password change through PAM changes its passcode (docs/DESKTOP.md,
 * "Unlocked at login"), as gnome-keyring's PAM module does for its login
 * keyring.
 *
 * C, not Swift, and built with the C compiler, not SwiftPM (which links
 * the Swift runtime into every dynamic library): this file is loaded into
 * login, gdm, sshd and screen lockers, which must not get a runtime of
 * ours. It does no keychain work itself. It runs `keychainfs pam-hook
 * MODE` as the user (never as root), the password on its standard input
 * (one end of a socket pair), never in
 * argv or the environment (docs/DESKTOP.md, "Unlocked at login"):
 *
 *   auth          The password PAM has just checked. With the user's
 *                 session up (/run/user/UID, a screen locker, su), the
 *                 keychain is unlocked at once; at a login, whose session
 *                 does not exist yet, it is kept in PAM's data for...
 *   session       ...open_session, after pam_systemd made the runtime
 *                 directory, and wiped there (or at pam_end).
 *   password      PAM_OLDAUTHTOK and PAM_AUTHTOK once the primary module
 *                 changed the password (PAM_UPDATE_AUTHTOK): the passcode
 *                 follows. Without the old password (root's `passwd USER`)
 *                 the passcode cannot change; the hook says so.
 *
 * Whatever happens, the module returns PAM_IGNORE: it never decides who
 * logs in, and a keychain it cannot unlock leaves the login as it was.
 * Only the configuration (written by root) chooses the helper, with
 * `keychainfs=PATH`: nothing of the caller's environment is used, since a
 * user who runs `su OTHER` would otherwise pick the program that gets
 * OTHER's password.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <poll.h>
#include <stdint.h>
#include <time.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <syslog.h>
#include <unistd.h>

/* The device's own Linux calls (sock_diag), shared with the Swift targets:
 * static inline C, no Swift runtime comes with it. */
#include "../CLinux/shim.h"

#include <security/pam_ext.h>
#include <security/pam_modules.h>
#include <security/pam_modutil.h>

/* Built with -fvisibility=hidden: PAM looks up only these. */
#define EXPORTED __attribute__((visibility("default")))

#define STASH_NAME "keychainfs-login-password"
#define DEFAULT_HELPER "/usr/bin/keychainfs"
/* The longest passcode keychainfs reads (Passcode.maximumLength). */
#define MAXIMUM_PASSWORD 1024

/* Milliseconds on the monotonic clock. */
static long long monotonic_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

/* Whether `deadline` (monotonic ms) has passed: every scan of the machine's
 * processes stops there. A program of the user holding 20,000 descriptors
 * in each of 400 processes made the scans alone take 78 s, past the hook's
 * timeout; a process not looked at is no device, and a socket not found
 * alone is not. */
static int past(long long deadline) { return monotonic_ms() > deadline; }

/* The password between authenticate and open_session, locked in memory
 * (never swapped) and wiped when PAM drops it. */
struct stash {
    size_t length;
    char password[MAXIMUM_PASSWORD + 1];
};

static void drop_stash(pam_handle_t *pamh, void *data, int status) {
    (void)pamh;
    (void)status;
    struct stash *stash = data;
    explicit_bzero(stash, sizeof *stash);
    munlock(stash, sizeof *stash);
    free(stash);
}

/* The module's arguments, as root wrote them in the PAM configuration:
 * `keychainfs=PATH`, the helper, and `timeout=SECONDS` (1 to 300, 30 when
 * not given), the longest the hook may take before it is ended and the
 * login goes on without it. */
struct options {
    const char *helper;
    int timeout;
};

static struct options module_options(int argc, const char **argv) {
    struct options options = {DEFAULT_HELPER, 30};
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "keychainfs=", 11) == 0 && argv[i][11] == '/') options.helper = argv[i] + 11;
        if (strncmp(argv[i], "timeout=", 8) == 0) {
            char *end = NULL;
            long seconds = strtol(argv[i] + 8, &end, 10);
            if (end != NULL && *end == '\0' && seconds >= 1 && seconds <= 300) options.timeout = (int)seconds;
        }
    }
    return options;
}


/* The user's runtime directory when their session made it (pam_systemd,
 * logind): a directory of theirs, mode 0700. Written into `path`. */
static int session_runtime_directory(const struct passwd *user, char *path, size_t size) {
    struct stat info;
    snprintf(path, size, "/run/user/%u", (unsigned)user->pw_uid);
    return lstat(path, &info) == 0 && S_ISDIR(info.st_mode) && info.st_uid == user->pw_uid &&
           (info.st_mode & 077) == 0;
}

/* Whether root alone can change `path`: root's, a regular file, written by
 * nobody else, in directories that are root's and written by nobody else
 * (what RootControlledFile checks in Swift). */
static int root_controlled(const char *path) {
    struct stat info;
    if (path[0] != '/' || stat(path, &info) != 0 || !S_ISREG(info.st_mode) || info.st_uid != 0 ||
        (info.st_mode & 022) != 0)
        return 0;
    char directory[4096];
    if (strlen(path) >= sizeof directory) return 0;
    strcpy(directory, path);
    for (char *slash = strrchr(directory, '/'); slash != NULL; slash = strrchr(directory, '/')) {
        if (slash == directory) slash[1] = '\0'; else *slash = '\0';
        if (stat(directory, &info) != 0 || info.st_uid != 0 || (info.st_mode & 022) != 0) return 0;
        if (slash == directory) break;
    }
    return 1;
}

/* The whole of a small /proc file, NUL-terminated; its length, or -1. */
static ssize_t read_proc(const char *pid, const char *name, char *buffer, size_t size) {
    char path[300];
    snprintf(path, sizeof path, "/proc/%s/%s", pid, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t total = 0;
    ssize_t count;
    while (total + 1 < size && ((count = read(fd, buffer + total, size - 1 - total)) > 0 || (count < 0 && errno == EINTR)))
        if (count > 0) total += (size_t)count;
    close(fd);
    buffer[total] = '\0';
    return (ssize_t)total;
}

/* Whether every executable mapping of process `pid` is a file root
 * controls, as mapped: its environment says nothing (a preloaded library's
 * constructor rewrote `LD_PRELOAD=` in it, and the device then logged the
 * password it was given), its mappings do. No anonymous executable memory
 * (code copied out of a library that was then unmapped), no executable
 * page of a file written since it was mapped (a private copy of root's
 * file filled with other code: smaps's `Anonymous` is not 0), no file
 * deleted or root's no more. [vdso] and [vsyscall] are the kernel's. */
static int executable_code_clean(const char *pid) {
    char path[300];
    snprintf(path, sizeof path, "/proc/%s/smaps", pid);
    FILE *smaps = fopen(path, "re");
    if (smaps == NULL) return 0;
    char line[4096 + 256];
    int clean = 1, executable = 0;
    while (clean && fgets(line, sizeof line, smaps) != NULL) {
        unsigned long start, end, offset, inode;
        char permissions[8];
        int name = 0;
        if (sscanf(line, "%lx-%lx %7s %lx %*x:%*x %lu %n", &start, &end, permissions, &offset, &inode, &name) == 5) {
            executable = permissions[2] == 'x';
            if (!executable) continue;
            char *file = line + name;
            file[strcspn(file, "\n")] = '\0';
            if (file[0] == '[') clean = strcmp(file, "[vdso]") == 0 || strcmp(file, "[vsyscall]") == 0;
            else clean = file[0] == '/' && strstr(file, " (deleted)") == NULL && root_controlled(file);
        } else if (executable && strncmp(line, "Anonymous:", 10) == 0) {
            unsigned long kilobytes = 1;
            clean = sscanf(line + 10, "%lu", &kilobytes) == 1 && kilobytes == 0;
        }
    }
    fclose(smaps);
    return clean;
}

/* Whether process `pid` is in this process's user namespace (the links of
 * /proc/PID/ns/user name a namespace by its inode). */
static int same_user_namespace(const char *pid) {
    char path[300], theirs[64], ours[64];
    snprintf(path, sizeof path, "/proc/%s/ns/user", pid);
    ssize_t length = readlink(path, theirs, sizeof theirs - 1);
    ssize_t own = readlink("/proc/self/ns/user", ours, sizeof ours - 1);
    if (length <= 0 || own <= 0 || length != own) return 0;
    return memcmp(theirs, ours, (size_t)length) == 0;
}

/* The inodes of the listening UNIX sockets of this network namespace, up to
 * `capacity` (/proc/net/unix: Flags with __SO_ACCEPTCON, 0x10000); how many. */
static size_t listening_sockets(unsigned long *inodes, size_t capacity) {
    FILE *table = fopen("/proc/net/unix", "re");
    if (table == NULL) return 0;
    char line[512];
    size_t count = 0;
    /* The header, then one line a socket (a line cut by a long path fails to parse, and is skipped). */
    if (fgets(line, sizeof line, table) != NULL) {
        while (count < capacity && fgets(line, sizeof line, table) != NULL) {
            unsigned long flags = 0, inode = 0;
            if (sscanf(line, "%*s %*x %*x %lx %*x %*x %lu", &flags, &inode) == 2 && (flags & 0x10000) != 0)
                inodes[count++] = inode;
        }
    }
    fclose(table);
    return count;
}

/* The socket inode that /proc/PID/fd/N (`path`) names, or 0. */
static unsigned long socket_inode(const char *path) {
    char target[64];
    ssize_t length = readlink(path, target, sizeof target - 1);
    if (length <= 0) return 0;
    target[length] = '\0';
    unsigned long inode = 0;
    return sscanf(target, "socket:[%lu]", &inode) == 1 ? inode : 0;
}

/* Whether a process other than `pid` holds socket `inode` (root reads every
 * process's descriptors; a process gone meanwhile holds nothing). */
static int held_by_another(const char *pid, unsigned long inode, long long deadline) {
    DIR *proc = opendir("/proc");
    if (proc == NULL) return 1;
    int held = 0;
    for (struct dirent *entry = readdir(proc); entry != NULL && !held; entry = readdir(proc)) {
        if (past(deadline)) held = 1;
        if (entry->d_name[0] < '1' || entry->d_name[0] > '9' || strcmp(entry->d_name, pid) == 0) continue;
        char directory[300];
        snprintf(directory, sizeof directory, "/proc/%s/fd", entry->d_name);
        DIR *descriptors = opendir(directory);
        if (descriptors == NULL) continue;
        for (struct dirent *fd = readdir(descriptors); fd != NULL && !held; fd = readdir(descriptors)) {
            if (fd->d_name[0] < '0' || fd->d_name[0] > '9') continue;
            char path[600];
            snprintf(path, sizeof path, "%s/%s", directory, fd->d_name);
            held = socket_inode(path) == inode || past(deadline);
        }
        closedir(descriptors);
    }
    closedir(proc);
    return held;
}

/* The inode of the socket that `inode`'s socket is connected to (sock_diag,
 * UNIX_DIAG_PEER), or 0: the device's own query (CLinux's shim, plain C). */
static unsigned long peer_inode(unsigned long inode) {
    int netlink = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (netlink < 0) return 0;
    uint32_t peer = 0;
    char name[108];
    size_t length = 0;
    if (CLinux_unix_socket_peer(netlink, (uint32_t)inode, &peer, name, sizeof name, &length) != 0) peer = 0;
    close(netlink);
    return peer;
}

/* The one process that holds socket `inode` in its descriptors, as "PID"
 * in `holder` (empty: none yet); -1 when two or more do. */
static int sole_holder(unsigned long inode, char *holder, size_t size, long long deadline) {
    holder[0] = '\0';
    DIR *proc = opendir("/proc");
    if (proc == NULL) return -1;
    int holders = 0;
    for (struct dirent *entry = readdir(proc); entry != NULL && holders < 2; entry = readdir(proc)) {
        if (past(deadline)) holders = 2;
        if (entry->d_name[0] < '1' || entry->d_name[0] > '9') continue;
        char directory[300];
        snprintf(directory, sizeof directory, "/proc/%s/fd", entry->d_name);
        DIR *descriptors = opendir(directory);
        if (descriptors == NULL) continue;
        int holds = 0;
        for (struct dirent *fd = readdir(descriptors); fd != NULL && !holds; fd = readdir(descriptors)) {
            if (fd->d_name[0] < '0' || fd->d_name[0] > '9') continue;
            if (past(deadline)) {
                holders = 2;
                break;
            }
            char path[600];
            snprintf(path, sizeof path, "%s/%s", directory, fd->d_name);
            holds = socket_inode(path) == inode;
        }
        closedir(descriptors);
        if (holds) {
            holders++;
            if (strlen(entry->d_name) < size) strcpy(holder, entry->d_name);
        }
    }
    closedir(proc);
    return holders > 1 ? -1 : 0;
}

/* Whether the connection `connection` (the hook's, passed here) was
 * accepted by one of the checked devices in `devices` ("PID:START:INODE,...")
 * and is held by it alone: the end that reads what the hook sends is in that
 * process's descriptors and nobody else's. SO_PEERCRED and the listening
 * socket say who listened; a listening descriptor passed around in flight
 * (SCM_RIGHTS, in no process's table) let another process accept. Waits up
 * to half a second for the device to accept. */
static int accepted_by_device(int connection, const char *devices, long long deadline) {
    struct stat info;
    if (fstat(connection, &info) != 0 || !S_ISSOCK(info.st_mode)) return 0;
    unsigned long peer = peer_inode((unsigned long)info.st_ino);
    if (peer == 0) return 0;
    for (int attempt = 0; attempt < 100 && !past(deadline); attempt++) {
        char holder[32];
        if (sole_holder(peer, holder, sizeof holder, deadline) != 0) return 0;
        if (holder[0] != '\0') {
            /* The holder must be a listed device: "PID:" at the start of an entry. */
            size_t length = strlen(holder);
            for (const char *entry = devices; entry != NULL && *entry != '\0';) {
                if (strncmp(entry, holder, length) == 0 && entry[length] == ':') return 1;
                entry = strchr(entry, ',');
                if (entry != NULL) entry++;
            }
            return 0;
        }
        struct timespec pause = {0, 5 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    return 0;
}

/* The user's devices that may be given the password (docs/SECURITY.md,
 * "The login password and the session", its row "the login password goes
 * only to the device"), as "PID:START:INODE,..." in `list` (START: the 22nd
 * field of /proc/PID/stat, which with the pid names one process for good;
 * INODE: a listening socket the process holds and no other process does, so
 * that only it accepts what reaches that socket: SO_PEERCRED names the
 * process that called listen, which may have forked a child to accept and
 * then exec'd the installed program). A device is a process of the user
 * running the device build (`../libexec/keychainfs/device/keychainfs` beside
 * the helper), as root installed it, setgid to a group that is not the
 * user's, and started so: its saved group is that group, which only a setgid
 * exec with no tracer and no new privileges gives, and which makes it
 * undumpable from its first instruction (docs/SECURITY.md, "A device
 * undumpable from its first instruction": a descriptor of /proc/PID/mem
 * opened before a device made itself undumpable read the password); not
 * traced, with none of the loader's variables that would run another
 * program's code in it. Only root can read that of a device, which makes
 * itself undumpable: the hook, as the user, checks its socket's peer against
 * this list, so that a program of the user listening on the device's socket
 * first is given nothing. */
static void verified_devices(const struct passwd *user, const char *helper, char *list, size_t size,
                             long long deadline) {
    list[0] = '\0';
    if (geteuid() != 0 || !root_controlled(helper)) return;
    char device[4096];
    const char *slash = strrchr(helper, '/');
    size_t directory = slash != NULL ? (size_t)(slash - helper) : 0;
    const char *parent_end = directory > 0 ? memrchr(helper, '/', directory) : NULL;
    size_t parent = parent_end != NULL ? (size_t)(parent_end - helper) : 0;
    snprintf(device, sizeof device, "%.*s/libexec/keychainfs/device/keychainfs", (int)parent, helper);
    struct stat build;
    if (!root_controlled(device) || stat(device, &build) != 0 || (build.st_mode & S_ISGID) == 0 || build.st_gid == 0 ||
        build.st_gid == user->pw_gid)
        return;
    /* One buffer for each process's status, environment and stat in turn. */
    const size_t text_size = 1 << 16;
    char *text = malloc(text_size);
    if (text == NULL) return;
    DIR *proc = opendir("/proc");
    if (proc == NULL) {
        free(text);
        return;
    }
    unsigned long listening[1024];
    size_t listening_count = listening_sockets(listening, sizeof listening / sizeof listening[0]);
    size_t used = 0;
    for (struct dirent *entry = readdir(proc); entry != NULL && used + 48 < size && !past(deadline);
         entry = readdir(proc)) {
        if (entry->d_name[0] < '1' || entry->d_name[0] > '9') continue;
        char path[300], executable[4096];
        snprintf(path, sizeof path, "/proc/%s/exe", entry->d_name);
        ssize_t length = readlink(path, executable, sizeof executable - 1);
        if (length <= 0) continue;
        executable[length] = '\0';
        if (strcmp(executable, device) != 0) continue;
        /* Its real, effective and saved uids, its groups (the user's real
         * and effective, the device build's saved: CLinux_settle_groups),
         * and no tracer. */
        if (read_proc(entry->d_name, "status", text, text_size) <= 0) continue;
        char uid_line[96], gid_line[96];
        snprintf(uid_line, sizeof uid_line, "\nUid:\t%u\t%u\t%u\t", (unsigned)user->pw_uid, (unsigned)user->pw_uid,
                 (unsigned)user->pw_uid);
        snprintf(gid_line, sizeof gid_line, "\nGid:\t%u\t%u\t%u\t", (unsigned)user->pw_gid, (unsigned)user->pw_gid,
                 (unsigned)build.st_gid);
        if (strstr(text, uid_line) == NULL || strstr(text, gid_line) == NULL ||
            strstr(text, "\nTracerPid:\t0\n") == NULL)
            continue;
        /* No seccomp filter, and undumpable as the device makes itself:
         * a filter the user installed before exec made its
         * prctl(PR_SET_DUMPABLE, 0) a no-op, and the user read the password
         * out of its memory (/proc/PID/mem, Yama absent). The kernel gives
         * an undumpable process's /proc entries to root. */
        if (strstr(text, "\nSeccomp:\t0\n") == NULL || strstr(text, "\nNoNewPrivs:\t0\n") == NULL) continue;
        struct stat entries;
        snprintf(path, sizeof path, "/proc/%s/mem", entry->d_name);
        if (stat(path, &entries) != 0 || entries.st_uid != 0) continue;
        /* In this process's user namespace: a device in one the user made
         * (unshare(CLONE_NEWUSER), no privilege needed) is under the user's
         * capabilities there, CAP_SYS_PTRACE included, whatever its
         * dumpability: a program of the user took the accepted connection
         * out of it with pidfd_getfd and read the password. */
        if (!same_user_namespace(entry->d_name)) continue;
        if (!executable_code_clean(entry->d_name)) continue;
        /* None of the loader's variables (ld.so(8)), and its system bus the
         * machine's: a device told another (DBUS_SYSTEM_BUS_ADDRESS, a bus of
         * the user's, or none) follows no logind and never locks with the
         * session (docs/SECURITY.md, "The login password and the session").
         * Its mappings are read below: a library can rewrite this text. */
        ssize_t environment = read_proc(entry->d_name, "environ", text, text_size);
        if (environment < 0) continue;
        int loader = 0;
        for (ssize_t at = 0; at < environment; at += (ssize_t)strlen(text + at) + 1) {
            if (strncmp(text + at, "LD_PRELOAD=", 11) == 0 || strncmp(text + at, "LD_LIBRARY_PATH=", 16) == 0 ||
                strncmp(text + at, "LD_AUDIT=", 9) == 0 || strncmp(text + at, "DBUS_SYSTEM_BUS_ADDRESS=", 24) == 0)
                loader = 1;
            /* A TPM other than the machine's: a TCTI the user named (a
             * module of theirs, which ran in the device and read the
             * password; or swtpm at a port of theirs, whose own memory gave
             * the session key that checks the passcode's HMAC, and the login
             * password was guessed offline), or a broker at a socket of
             * theirs, which would be given the passcode's auth. The device
             * reaches /dev/tpmrm0 or the service's broker when told of
             * neither (docs/SECURITY.md, "The TPM is the machine's, or none"). */
            if (strncmp(text + at, "TPM2TOOLS_TCTI=", 15) == 0 && text[at + 15] != '\0' &&
                strcmp(text + at + 15, "device:/dev/tpmrm0") != 0)
                loader = 1;
            if (strncmp(text + at, "KEYCHAINFS_SERVICE=", 19) == 0 && text[at + 19] != '\0') loader = 1;
        }
        if (loader || environment >= (ssize_t)text_size - 1) continue;
        /* Its start time: after the last ')' (the command name may hold any byte), the 20th field. */
        if (read_proc(entry->d_name, "stat", text, text_size) <= 0) continue;
        char *field = strrchr(text, ')');
        unsigned long long start = 0;
        for (int number = 0; field != NULL && number < 20; number++) field = strchr(field + 1, ' ');
        if (field == NULL || sscanf(field + 1, "%llu", &start) != 1) continue;
        /* Each listening socket it holds alone. */
        char directory[300];
        snprintf(directory, sizeof directory, "/proc/%s/fd", entry->d_name);
        DIR *descriptors = opendir(directory);
        if (descriptors == NULL) continue;
        for (struct dirent *fd = readdir(descriptors); fd != NULL && used + 48 < size; fd = readdir(descriptors)) {
            if (fd->d_name[0] < '0' || fd->d_name[0] > '9') continue;
            char descriptor[600];
            snprintf(descriptor, sizeof descriptor, "%s/%s", directory, fd->d_name);
            unsigned long inode = socket_inode(descriptor);
            int listens = 0;
            for (size_t index = 0; inode != 0 && index < listening_count && !listens; index++)
                listens = listening[index] == inode;
            if (!listens || held_by_another(entry->d_name, inode, deadline)) continue;
            int written = snprintf(list + used, size - used, "%s%s:%llu:%lu", used > 0 ? "," : "", entry->d_name,
                                   start, inode);
            if (written < 0 || (size_t)written >= size - used) break;
            used += (size_t)written;
        }
        closedir(descriptors);
    }
    closedir(proc);
    /* An environment may hold a user's secrets: wiped before it is freed. */
    explicit_bzero(text, text_size);
    free(text);
}

/* Reaps `child` once it has ended, waiting until `deadline` at most: its
 * pid, 0 when it still runs then, -1 on an error. */
static pid_t reap_by(pid_t child, int *raw, long long deadline) {
    pid_t reaped;
    while ((reaped = waitpid(child, raw, WNOHANG)) == 0 && monotonic_ms() < deadline) {
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    return reaped;
}

/* verified_devices in a child process of its own, given until `deadline`.
 * A read of a process's /proc/PID/smaps or environ waits for that
 * process's memory-map lock, which a program of the user can hold for as
 * long as it likes (an outsider's device, started with a library of
 * theirs, read through /proc/self/mem a page of a FUSE file that never
 * answers, and queued a write of clear_refs behind it): a deadline
 * checked between reads cannot cut one read, and the login waited for
 * good. That wait ends for a fatal signal, so the child is ended with
 * SIGKILL at the deadline, and nothing it found counts (no device is
 * checked: the hook gives the password to none it did not start). */
static void verified_devices_within(pam_handle_t *pamh, const struct passwd *user, const char *helper, char *list,
                                    size_t size, long long deadline) {
    list[0] = '\0';
    int ends[2];
    if (pipe2(ends, O_CLOEXEC) != 0) return;
    pid_t child = fork();
    if (child == 0) {
        close(ends[0]);
        verified_devices(user, helper, list, size, deadline);
        size_t length = strlen(list), written = 0;
        while (written < length) {
            ssize_t count = write(ends[1], list + written, length - written);
            if (count < 0 && errno == EINTR) continue;
            if (count <= 0) break;
            written += (size_t)count;
        }
        _exit(0);
    }
    close(ends[1]);
    size_t used = 0;
    int whole = 0;
    while (child > 0 && !whole && used + 1 < size) {
        long long left = deadline - monotonic_ms();
        if (left <= 0) break;
        struct pollfd waiting = {.fd = ends[0], .events = POLLIN};
        int ready = poll(&waiting, 1, left > 60000 ? 60000 : (int)left);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) continue;
        ssize_t count = read(ends[0], list + used, size - 1 - used);
        if (count < 0 && errno == EINTR) continue;
        if (count < 0) break;
        if (count == 0) whole = 1;
        used += (size_t)(count > 0 ? count : 0);
    }
    close(ends[0]);
    list[whole ? used : 0] = '\0';
    if (child > 0) {
        if (!whole) {
            kill(child, SIGKILL);
            pam_syslog(pamh, LOG_NOTICE,
                       "keychainfs: the check of %s's running devices did not end within the timeout; "
                       "none is given the password",
                       user->pw_name);
        }
        /* Reaped once it has ended, which a SIGKILL makes quick; never waited for past a second. */
        int raw;
        reap_by(child, &raw, monotonic_ms() + 1000);
    }
}

/* run_hook's work, with SIGCHLD at its default. */
static int run_hook_children(pam_handle_t *pamh, const struct passwd *user, struct options options, const char *mode,
                             const char *input, size_t length) {
    const char *helper = options.helper;
    /* Past this, the hook is ended: a program of the user that stops it
     * (SIGSTOP, which its uid may send) held every login and screen unlock
     * for good (docs/SECURITY.md, "The login password and the session"). */
    long long deadline = monotonic_ms() + (long long)options.timeout * 1000;
    if (geteuid() != 0 && (getuid() != user->pw_uid || geteuid() != user->pw_uid)) return -1;
    /* The hook's real group: one that is not the user's and grants nothing
     * (see the child below). An account whose own group is nogroup cannot
     * be told apart from it: its hook is not run. */
    const struct group *nobody = pam_modutil_getgrnam(pamh, "nogroup");
    gid_t outsider = nobody != NULL ? nobody->gr_gid : 65534;
    if (geteuid() == 0 && user->pw_gid == outsider) {
        pam_syslog(pamh, LOG_NOTICE, "keychainfs pam-hook for %s: not run, the account's group is nogroup",
                   user->pw_name);
        return -1;
    }
    char runtime[64];
    int has_runtime = session_runtime_directory(user, runtime, sizeof runtime);
    char home[4096 + 8], name[256 + 8], logname[256 + 8], runtime_variable[64 + 16];
    snprintf(home, sizeof home, "HOME=%s", user->pw_dir);
    snprintf(name, sizeof name, "USER=%s", user->pw_name);
    snprintf(logname, sizeof logname, "LOGNAME=%s", user->pw_name);
    snprintf(runtime_variable, sizeof runtime_variable, "XDG_RUNTIME_DIR=%s", runtime);
    /* The devices the hook may give the password to, checked here, as root (none: it starts one itself). */
    char devices[64 + 8 * 48];
    strcpy(devices, "KEYCHAINFS_PAM_DEVICES=");
    verified_devices_within(pamh, user, helper, devices + strlen(devices), sizeof devices - strlen(devices), deadline);
    /* Descriptor 3 of the hook: it passes here each connection to a checked
     * device before it sends the password on it, and reads back whether the
     * device accepted it and holds it alone (accepted_by_device). */
    char *environment[] = {home, name, logname, "PATH=/usr/bin:/bin", devices, "KEYCHAINFS_PAM_VERIFY=3",
                           has_runtime ? runtime_variable : NULL, NULL};
    char *arguments[] = {"keychainfs", "pam-hook", (char *)mode, NULL};

    /* A socket pair, not a pipe: written with MSG_NOSIGNAL, a hook that
     * exits before it reads (a helper that cannot be run) gets the caller
     * no SIGPIPE, which would end login or gdm itself. */
    int channel[2], verify[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, channel) != 0) return -1;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, verify) != 0) {
        close(channel[0]);
        close(channel[1]);
        return -1;
    }
    pid_t child = fork();
    if (child == 0) {
        int null = open("/dev/null", O_RDWR);
        if (dup2(channel[0], 0) < 0 || null < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0 || dup2(verify[0], 3) < 0)
            _exit(127);
        /* Drop everything of the caller's before running anything of the
         * user's: groups, then the group, then the user (all three ids).
         * The real group is nogroup, the effective and saved the user's
         * (docs/SECURITY.md, "The login password and the session":
         * nobody takes the password from the hook):
         * exec then leaves the hook undumpable (the kernel does so when the
         * effective group is not the real one, as for a setgid program),
         * and no process of the user has its credentials, so none can copy
         * its standard input (pidfd_getfd), attach (ptrace) or read its
         * memory, from its first instruction on. A device it starts
         * inherits the same, and takes the user's group as its real one
         * once undumpable. nogroup grants nothing: files are made with the
         * effective group, and the user's group stays among the groups. */
        if (geteuid() == 0 && (initgroups(user->pw_name, user->pw_gid) != 0 ||
                               setresgid(outsider, user->pw_gid, user->pw_gid) != 0 ||
                               setresuid(user->pw_uid, user->pw_uid, user->pw_uid) != 0))
            _exit(127);
        if (getuid() != user->pw_uid || geteuid() != user->pw_uid || chdir("/") != 0) _exit(127);
        setsid();
        execve(helper, arguments, environment);
        _exit(127);
    }
    close(channel[0]);
    close(verify[0]);
    int status = -1;
    if (child > 0) {
        size_t written = 0;
        while (written < length) {
            ssize_t count = send(channel[1], input + written, length - written, MSG_NOSIGNAL);
            if (count < 0 && errno == EINTR) continue;
            if (count <= 0) break;
            written += (size_t)count;
        }
        close(channel[1]);
        /* Each connection the hook asks about, until it closes its end (it
         * exits), within 30 s in all. */
        for (int asked = 0; asked < 16; asked++) {
            struct pollfd waiting = {.fd = verify[1], .events = POLLIN};
            long long left = deadline - monotonic_ms();
            if (left <= 0 || poll(&waiting, 1, (int)left) <= 0) break;
            char byte = 0;
            union {
                struct cmsghdr header;
                char space[CMSG_SPACE(sizeof(int))];
            } control;
            struct iovec part = {.iov_base = &byte, .iov_len = 1};
            struct msghdr message = {.msg_iov = &part, .msg_iovlen = 1, .msg_control = control.space,
                                     .msg_controllen = sizeof control.space};
            ssize_t count = recvmsg(verify[1], &message, MSG_CMSG_CLOEXEC);
            if (count <= 0) break;
            int connection = -1;
            struct cmsghdr *item = CMSG_FIRSTHDR(&message);
            if (item != NULL && item->cmsg_level == SOL_SOCKET && item->cmsg_type == SCM_RIGHTS)
                memcpy(&connection, CMSG_DATA(item), sizeof connection);
            char verdict = connection >= 0 && accepted_by_device(connection, devices + strlen("KEYCHAINFS_PAM_DEVICES="), deadline) ? 1 : 0;
            if (connection >= 0) close(connection);
            if (send(verify[1], &verdict, 1, MSG_NOSIGNAL) != 1) break;
        }
        close(verify[1]);
        int raw;
        /* Waited for until the deadline, then ended (SIGKILL ends a stopped process too). */
        pid_t reaped = reap_by(child, &raw, deadline);
        if (reaped == 0) {
            kill(child, SIGKILL);
            pam_syslog(pamh, LOG_NOTICE, "keychainfs pam-hook %s for %s: ended after %d s", mode, user->pw_name,
                       options.timeout);
            while ((reaped = waitpid(child, &raw, 0)) < 0 && errno == EINTR) {}
            reaped = -1;
        }
        if (reaped == child && WIFEXITED(raw)) status = WEXITSTATUS(raw);
    } else {
        close(channel[1]);
        close(verify[1]);
    }
    if (status != 0)
        pam_syslog(pamh, LOG_NOTICE, "keychainfs pam-hook %s for %s: %s %d", mode, user->pw_name,
                   status < 0 ? "not run" : "exit status", status);
    return status;
}

/* Runs `HELPER pam-hook MODE` as `user` with `length` bytes of `input` on
 * its standard input; its exit status, or -1 when it could not be run. A
 * caller that is not root acts only for itself (a screen locker). */
static int run_hook(pam_handle_t *pamh, const struct passwd *user, struct options options, const char *mode,
                    const char *input, size_t length) {
    /* An application's SIGCHLD handler must not reap our children first,
     * the devices' check or the hook (pam_exec does the same). */
    struct sigaction default_action = {.sa_handler = SIG_DFL}, saved;
    sigemptyset(&default_action.sa_mask);
    sigaction(SIGCHLD, &default_action, &saved);
    int status = run_hook_children(pamh, user, options, mode, input, length);
    sigaction(SIGCHLD, &saved, NULL);
    return status;
}

static const struct passwd *target_user(pam_handle_t *pamh) {
    const char *name = NULL;
    if (pam_get_user(pamh, &name, NULL) != PAM_SUCCESS || name == NULL) return NULL;
    return pam_modutil_getpwnam(pamh, name);
}

/* A token the hook can take: present, not empty, not longer than a
 * passcode, and one line (the hook reads passcodes as lines). */
static int usable(const char *token) {
    if (token == NULL || token[0] == '\0') return 0;
    size_t length = strnlen(token, MAXIMUM_PASSWORD + 1);
    return length <= MAXIMUM_PASSWORD && memchr(token, '\n', length) == NULL;
}

EXPORTED int pam_sm_authenticate(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    const struct passwd *user = target_user(pamh);
    const void *item = NULL;
    if (user == NULL || pam_get_item(pamh, PAM_AUTHTOK, &item) != PAM_SUCCESS || !usable(item)) return PAM_IGNORE;
    const char *password = item;
    char runtime[64];
    if (session_runtime_directory(user, runtime, sizeof runtime)) {
        run_hook(pamh, user, module_options(argc, argv), "unlock", password, strlen(password));
        return PAM_IGNORE;
    }
    struct stash *stash = calloc(1, sizeof *stash);
    if (stash == NULL) return PAM_IGNORE;
    mlock(stash, sizeof *stash);
    stash->length = strlen(password);
    memcpy(stash->password, password, stash->length);
    if (pam_set_data(pamh, STASH_NAME, stash, drop_stash) != PAM_SUCCESS) drop_stash(pamh, stash, 0);
    return PAM_IGNORE;
}

EXPORTED int pam_sm_setcred(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh, (void)flags, (void)argc, (void)argv;
    return PAM_IGNORE;
}

EXPORTED int pam_sm_open_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    const void *data = NULL;
    const struct passwd *user = target_user(pamh);
    if (user == NULL || pam_get_data(pamh, STASH_NAME, &data) != PAM_SUCCESS || data == NULL) return PAM_IGNORE;
    const struct stash *stash = data;
    char runtime[64];
    if (session_runtime_directory(user, runtime, sizeof runtime))
        run_hook(pamh, user, module_options(argc, argv), "unlock", stash->password, stash->length);
    /* Replacing the data calls drop_stash on the password: it is wiped now. */
    pam_set_data(pamh, STASH_NAME, NULL, NULL);
    return PAM_IGNORE;
}

EXPORTED int pam_sm_close_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh, (void)flags, (void)argc, (void)argv;
    return PAM_IGNORE;
}

EXPORTED int pam_sm_chauthtok(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    if (flags & PAM_PRELIM_CHECK) return PAM_IGNORE;
    const struct passwd *user = target_user(pamh);
    const void *old = NULL, *new = NULL;
    if (user == NULL || pam_get_item(pamh, PAM_AUTHTOK, &new) != PAM_SUCCESS || !usable(new)) return PAM_IGNORE;
    pam_get_item(pamh, PAM_OLDAUTHTOK, &old);
    struct options options = module_options(argc, argv);
    if (!usable(old)) {
        run_hook(pamh, user, options, "password-set", "", 0);
        return PAM_IGNORE;
    }
    /* "old NUL new": neither can hold a NUL (PAM's tokens are C strings). */
    static const size_t size = 2 * MAXIMUM_PASSWORD + 1;
    char *both = calloc(1, size);
    if (both == NULL) return PAM_IGNORE;
    mlock(both, size);
    size_t old_length = strlen(old), new_length = strlen(new);
    memcpy(both, old, old_length);
    memcpy(both + old_length + 1, new, new_length);
    run_hook(pamh, user, options, "password", both, old_length + 1 + new_length);
    explicit_bzero(both, size);
    munlock(both, size);
    free(both);
    return PAM_IGNORE;
}
