/* The client of scripts/bench: times single operations the way a program
 * uses a secret, in this process, pinned to one CPU.
 *   opbench read  DIR COUNT ITERATIONS  open+read+close of DIR/sNNN, NNN random < COUNT
 *   opbench write DIR COUNT ITERATIONS  open(O_TRUNC)+write 44 B+close (acknowledged)
 *   opbench create DIR COUNT 0          creates DIR/s000 .. DIR/s<COUNT-1>, 44 B each
 * Prints: median_us p90_us p99_us mean_us (create: items_per_second) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: opbench read|write DIR COUNT ITERATIONS\n"); return 2; }
    int writing = strcmp(argv[1], "write") == 0;
    const char *dir = argv[2];
    int count = atoi(argv[3]), iterations = atoi(argv[4]);
    double *samples = malloc(sizeof(double) * iterations);
    char path[4096], buffer[256];
    const char value[] = "0123456789abcdef0123456789abcdef0123456789ab"; /* 44 bytes */
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
        double start = now_us();
        if (writing) {
            int fd = open(path, O_WRONLY | O_TRUNC | O_CREAT, 0600);
            if (fd < 0 || write(fd, value, 44) != 44 || close(fd) != 0) { perror(path); return 1; }
        } else {
            int fd = open(path, O_RDONLY);
            if (fd < 0) { perror(path); return 1; }
            ssize_t n = read(fd, buffer, sizeof buffer);
            if (n != 44) { fprintf(stderr, "%s: read %zd bytes\n", path, n); return 1; }
            close(fd);
        }
        if (i >= 0) samples[i] = now_us() - start;
    }
    qsort(samples, iterations, sizeof(double), compare);
    double sum = 0;
    for (int i = 0; i < iterations; i++) sum += samples[i];
    printf("%.1f %.1f %.1f %.1f\n", samples[iterations / 2], samples[iterations * 9 / 10],
           samples[iterations * 99 / 100], sum / iterations);
    return 0;
}
