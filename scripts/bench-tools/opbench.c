/* The client of scripts/bench: times single operations the way a program
 * uses a secret, in this process, pinned to one CPU.
 *   opbench read  DIR COUNT ITERATIONS  open+read+close of DIR/sNNN, NNN random < COUNT
 *   opbench write DIR COUNT ITERATIONS  open(O_TRUNC)+write 44 B+close (acknowledged)
 *   opbench create DIR COUNT 0          creates DIR/s000 .. DIR/s<COUNT-1>, 44 B each
 *   opbench interleaved-read|interleaved-write COUNT ITERATIONS DIR...
 *       each iteration picks one item at random and does the operation on it in
 *       every DIR, the DIRs in a new shuffled order each time: every subject
 *       runs as cold as a secret read between other work, and the machine's
 *       noise falls on all of them alike.
 *   opbench interleaved-exec ITERATIONS -- COMMAND ARGS... [-- COMMAND ARGS...]...
 *       the same for whole programs: each iteration runs every command once
 *       (output to /dev/null), in a new shuffled order, timed from fork to
 *       exit; a command that fails stops the run.
 * Prints: median_us p90_us p99_us mean_us (create: items_per_second); the
 * interleaved modes print that line once per DIR or COMMAND, in the order given. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const char value[] = "0123456789abcdef0123456789abcdef0123456789ab"; /* 44 bytes */

/* One timed operation on PATH; returns microseconds or exits on failure. */
static double operate(int writing, const char *path) {
    char buffer[256];
    double start = now_us();
    if (writing) {
        int fd = open(path, O_WRONLY | O_TRUNC | O_CREAT, 0600);
        if (fd < 0 || write(fd, value, 44) != 44 || close(fd) != 0) { perror(path); exit(1); }
    } else {
        int fd = open(path, O_RDONLY);
        if (fd < 0) { perror(path); exit(1); }
        ssize_t n = read(fd, buffer, sizeof buffer);
        if (n != 44) { fprintf(stderr, "%s: read %zd bytes\n", path, n); exit(1); }
        close(fd);
    }
    return now_us() - start;
}

static void report(double *samples, int iterations) {
    qsort(samples, iterations, sizeof(double), compare);
    double sum = 0;
    for (int i = 0; i < iterations; i++) sum += samples[i];
    printf("%.1f %.1f %.1f %.1f\n", samples[iterations / 2], samples[iterations * 9 / 10],
           samples[iterations * 99 / 100], sum / iterations);
}

/* Runs argv with output to /dev/null; returns microseconds or exits on failure. */
static double run_program(char **argv) {
    double start = now_us();
    pid_t child = fork();
    if (child == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        execvp(argv[0], argv);
        _exit(127);
    }
    int status;
    if (child < 0 || waitpid(child, &status, 0) != child) { perror("fork"); exit(1); }
    double elapsed = now_us() - start;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "%s failed (status %d)\n", argv[0], status);
        exit(1);
    }
    return elapsed;
}

/* Each subject: a directory (operate on item ITEM there) or a command. */
typedef struct { const char *dir; char **argv; } subject_t;

static int interleaved(int writing, int count, int iterations, int subjects, subject_t *subject) {
    double *samples = malloc(sizeof(double) * iterations * subjects);
    int order[subjects];
    char path[4096];
    for (int s = 0; s < subjects; s++) order[s] = s;
    srand(42);
    for (int i = -iterations / 10; i < iterations; i++) {   /* the first tenth warms up */
        int item = rand() % count;
        for (int s = subjects - 1; s > 0; s--) {            /* Fisher-Yates */
            int j = rand() % (s + 1), t = order[s];
            order[s] = order[j]; order[j] = t;
        }
        for (int k = 0; k < subjects; k++) {
            int s = order[k];
            double elapsed;
            if (subject[s].argv) {
                elapsed = run_program(subject[s].argv);
            } else {
                snprintf(path, sizeof path, "%s/s%03d", subject[s].dir, item);
                elapsed = operate(writing, path);
            }
            if (i >= 0) samples[s * iterations + i] = elapsed;
        }
    }
    for (int s = 0; s < subjects; s++) report(samples + s * iterations, iterations);
    return 0;
}

static int interleaved_dirs(int writing, int count, int iterations, int subjects, char **dirs) {
    subject_t *subject = calloc(subjects, sizeof(subject_t));
    for (int s = 0; s < subjects; s++) subject[s].dir = dirs[s];
    return interleaved(writing, count, iterations, subjects, subject);
}

/* argv: ITERATIONS -- CMD... -- CMD...; each "--" ends the command before it. */
static int interleaved_exec(int argc, char **argv) {
    int iterations = atoi(argv[0]);
    subject_t *subject = calloc(argc, sizeof(subject_t));
    int subjects = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            argv[i] = NULL;                       /* ends the previous command's argv */
            if (i + 1 < argc) subject[subjects++].argv = argv + i + 1;
        }
    }
    if (subjects == 0) { fprintf(stderr, "interleaved-exec: no command\n"); return 2; }
    return interleaved(0, 1, iterations, subjects, subject);
}

int main(int argc, char **argv) {
    if (argc >= 5 && strcmp(argv[1], "interleaved-exec") == 0)
        return interleaved_exec(argc - 2, argv + 2);
    if (argc >= 5 && strncmp(argv[1], "interleaved-", 12) == 0)
        return interleaved_dirs(strcmp(argv[1], "interleaved-write") == 0, atoi(argv[2]), atoi(argv[3]),
                                argc - 4, argv + 4);
    if (argc != 5) {
        fprintf(stderr, "usage: opbench read|write|create DIR COUNT ITERATIONS\n"
                        "       opbench interleaved-read|interleaved-write COUNT ITERATIONS DIR...\n"
                        "       opbench interleaved-exec ITERATIONS -- COMMAND ARGS... [-- COMMAND ARGS...]...\n");
        return 2;
    }
    int writing = strcmp(argv[1], "write") == 0;
    const char *dir = argv[2];
    int count = atoi(argv[3]), iterations = atoi(argv[4]);
    double *samples = malloc(sizeof(double) * iterations);
    char path[4096];
    if (strcmp(argv[1], "create") == 0) {
        double start = now_us();
        for (int i = 0; i < count; i++) {
            snprintf(path, sizeof path, "%s/s%03d", dir, i);
            int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
            if (fd < 0 || write(fd, value, 44) != 44 || close(fd) != 0) { perror(path); return 1; }
        }
        printf("%.0f\n", count / ((now_us() - start) / 1e6));
        return 0;
    }
    srand(42);
    for (int i = -iterations / 10; i < iterations; i++) {   /* the first tenth warms up */
        snprintf(path, sizeof path, "%s/s%03d", dir, rand() % count);
        double elapsed = operate(writing, path);
        if (i >= 0) samples[i] = elapsed;
    }
    report(samples, iterations);
    return 0;
}
