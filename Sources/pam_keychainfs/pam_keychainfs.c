/*
 * pam_keychainfs: the login password unlocks the user's keychain, and a
 * password change through PAM changes its passcode (issue 39), as
 * gnome-keyring's PAM module does for its login keyring.
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
#include <syslog.h>
#include <unistd.h>

#include <security/pam_ext.h>
#include <security/pam_modules.h>
#include <security/pam_modutil.h>

/* Built with -fvisibility=hidden: PAM looks up only these. */
#define EXPORTED __attribute__((visibility("default")))

#define STASH_NAME "keychainfs-login-password"
#define DEFAULT_HELPER "/usr/bin/keychainfs"
/* The longest passcode keychainfs reads (Passcode.maximumLength). */
#define MAXIMUM_PASSWORD 1024

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

static const char *helper_path(int argc, const char **argv) {
    const char *helper = DEFAULT_HELPER;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "keychainfs=", 11) == 0 && argv[i][11] == '/') helper = argv[i] + 11;
    }
    return helper;
}

/* The user's runtime directory when their session made it (pam_systemd,
 * logind): a directory of theirs, mode 0700. Written into `path`. */
static int session_runtime_directory(const struct passwd *user, char *path, size_t size) {
    struct stat info;
    snprintf(path, size, "/run/user/%u", (unsigned)user->pw_uid);
    return lstat(path, &info) == 0 && S_ISDIR(info.st_mode) && info.st_uid == user->pw_uid &&
           (info.st_mode & 077) == 0;
}

/* Runs `HELPER pam-hook MODE` as `user` with `length` bytes of `input` on
 * its standard input; its exit status, or -1 when it could not be run. A
 * caller that is not root acts only for itself (a screen locker). */
static int run_hook(pam_handle_t *pamh, const struct passwd *user, const char *helper, const char *mode,
                    const char *input, size_t length) {
    if (geteuid() != 0 && (getuid() != user->pw_uid || geteuid() != user->pw_uid)) return -1;
    char runtime[64];
    int has_runtime = session_runtime_directory(user, runtime, sizeof runtime);
    char home[4096 + 8], name[256 + 8], logname[256 + 8], runtime_variable[64 + 16];
    snprintf(home, sizeof home, "HOME=%s", user->pw_dir);
    snprintf(name, sizeof name, "USER=%s", user->pw_name);
    snprintf(logname, sizeof logname, "LOGNAME=%s", user->pw_name);
    snprintf(runtime_variable, sizeof runtime_variable, "XDG_RUNTIME_DIR=%s", runtime);
    char *environment[] = {home, name, logname, "PATH=/usr/bin:/bin", has_runtime ? runtime_variable : NULL, NULL};
    char *arguments[] = {"keychainfs", "pam-hook", (char *)mode, NULL};

    /* A socket pair, not a pipe: written with MSG_NOSIGNAL, a hook that
     * exits before it reads (a helper that cannot be run) gets the caller
     * no SIGPIPE, which would end login or gdm itself. */
    int channel[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, channel) != 0) return -1;
    /* An application's SIGCHLD handler must not reap our child first
     * (pam_exec does the same). */
    struct sigaction default_action = {.sa_handler = SIG_DFL}, saved;
    sigemptyset(&default_action.sa_mask);
    sigaction(SIGCHLD, &default_action, &saved);
    pid_t child = fork();
    if (child == 0) {
        int null = open("/dev/null", O_RDWR);
        if (dup2(channel[0], 0) < 0 || null < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0) _exit(127);
        /* Drop everything of the caller's before running anything of the
         * user's: groups, then the group, then the user (all three ids). */
        if (geteuid() == 0 && (initgroups(user->pw_name, user->pw_gid) != 0 || setresgid(user->pw_gid, user->pw_gid, user->pw_gid) != 0 ||
                               setresuid(user->pw_uid, user->pw_uid, user->pw_uid) != 0))
            _exit(127);
        if (getuid() != user->pw_uid || geteuid() != user->pw_uid || chdir("/") != 0) _exit(127);
        setsid();
        execve(helper, arguments, environment);
        _exit(127);
    }
    close(channel[0]);
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
        int raw;
        pid_t reaped;
        while ((reaped = waitpid(child, &raw, 0)) < 0 && errno == EINTR) {}
        if (reaped == child && WIFEXITED(raw)) status = WEXITSTATUS(raw);
    } else {
        close(channel[1]);
    }
    sigaction(SIGCHLD, &saved, NULL);
    if (status != 0)
        pam_syslog(pamh, LOG_NOTICE, "keychainfs pam-hook %s for %s: %s %d", mode, user->pw_name,
                   status < 0 ? "not run" : "exit status", status);
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
        run_hook(pamh, user, helper_path(argc, argv), "unlock", password, strlen(password));
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
        run_hook(pamh, user, helper_path(argc, argv), "unlock", stash->password, stash->length);
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
    const char *helper = helper_path(argc, argv);
    if (!usable(old)) {
        run_hook(pamh, user, helper, "password-set", "", 0);
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
    run_hook(pamh, user, helper, "password", both, old_length + 1 + new_length);
    explicit_bzero(both, size);
    munlock(both, size);
    free(both);
    return PAM_IGNORE;
}
