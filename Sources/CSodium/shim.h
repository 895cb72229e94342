#ifndef CSODIUM_SHIM_H
#define CSODIUM_SHIM_H
#include <sodium.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/prctl.h>

// prctl is variadic; Swift cannot call it directly.
static inline int CSodium_disableCoreDumps(void) {
    struct rlimit none = {0, 0};
    if (setrlimit(RLIMIT_CORE, &none) != 0) return -1;
    return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}
#endif
