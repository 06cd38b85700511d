/* kernels_cpu_guard.c: mt_backend_cpu_guarded(), the CPU backend with a
 * guard for tests of device discipline (tests/model/test_device_discipline.c).
 *
 * Its device_alloc maps fresh pages (mmap) and records them.  Between
 * calls of the table's entries every recorded allocation is PROT_NONE;
 * each entry unprotects them all, runs the CPU kernel and protects them
 * again.  So host code that reads or writes backend memory other than
 * through the backend (a memcpy on an arena, a host loop over router
 * indices) faults here, where on a GPU it would read garbage or crash
 * later; the SIGSEGV handler names the address, the allocation and (with
 * glibc) the call stack.  In strict mode (mt_cpu_guard_strict) an entry
 * also refuses tensor arguments that are not its memory: a host array
 * handed to a kernel, which a GPU kernel could not read.
 *
 * It is deliberately simple and slow: a linear table of allocations, two
 * mprotect calls per allocation per kernel, one host thread (kernels may
 * use OpenMP inside a call).  Overruns within an allocation's last page
 * are not caught: it guards against host access, not bounds. */
#include "config.h"

#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <execinfo.h>
#endif

#include "mt_backend.h"

typedef struct {
    char *base;
    size_t bytes, mapped;
} guard_region_t;

static guard_region_t *regions;
static int nregions, capregions;
static int depth; /* > 0 inside a table entry: the regions are open */
static bool strict; /* tensor arguments must be backend memory */
static const mt_backend_t *cpu;

/* The allocation holding address a (its end counts: an empty tensor may
 * sit there), or -1. */
static int region_of(const void *a)
{
    const char *c = a;
    for (int i = 0; i < nregions; i++)
        if (c >= regions[i].base && c <= regions[i].base + regions[i].bytes)
            return i;
    return -1;
}

static void protect_all(int prot)
{
    for (int i = 0; i < nregions; i++)
        if (mprotect(regions[i].base, regions[i].mapped, prot) != 0) {
            perror("meshtrain guard: mprotect");
            abort();
        }
}

static void open_all(void)
{
    if (depth++ == 0)
        protect_all(PROT_READ | PROT_WRITE);
}

static void close_all(void)
{
    if (--depth == 0)
        protect_all(PROT_NONE);
}

/* ------------------------------------------------------------------ fault report */

static void say(const char *s)
{
    ssize_t r = write(STDERR_FILENO, s, strlen(s));
    (void)r;
}

static void backtrace_and_exit(void)
{
#ifdef __GLIBC__
    void *frames[32];
    int n = backtrace(frames, 32);
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
#endif
    _exit(MT_CPU_GUARD_EXIT);
}

static void on_segv(int sig, siginfo_t *info, void *uctx)
{
    (void)sig, (void)uctx;
    char msg[256];
    const char *a = (const char *)info->si_addr;
    int hit = -1;
    for (int i = 0; i < nregions; i++)
        if (a >= regions[i].base && a < regions[i].base + regions[i].mapped)
            hit = i;
    if (hit >= 0)
        snprintf(msg, sizeof msg,
                 "meshtrain guard: host access to backend memory at %p outside a backend call: "
                 "allocation %d of %d (%zu bytes at %p), byte %zu\n",
                 (const void *)a, hit, nregions, regions[hit].bytes, (void *)regions[hit].base,
                 (size_t)(a - regions[hit].base));
    else
        snprintf(msg, sizeof msg,
                 "meshtrain guard: segmentation fault at %p, not in backend memory (%d "
                 "allocations)\n", (const void *)a, nregions);
    say(msg);
    backtrace_and_exit();
}

/* Strict mode: a host array given to a kernel as a tensor (which a GPU
 * kernel could not read) stops the program like a host access. */
static void require_backend(const char *entry, const char *names, const void *const *t, int n)
{
    if (!strict)
        return;
    for (int i = 0; i < n; i++)
        if (t[i] && region_of(t[i]) < 0) {
            fprintf(stderr, "meshtrain guard: %s: tensor argument %d of (%s) at %p is not "
                            "backend memory\n", entry, i + 1, names, t[i]);
            backtrace_and_exit();
        }
}

void mt_cpu_guard_strict(bool on)
{
    strict = on;
}

/* ------------------------------------------------------------------ memory */

static void *g_device_alloc(size_t bytes)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t mapped = ((bytes ? bytes : 1) + (size_t)page - 1) / (size_t)page * (size_t)page;
    if (nregions == capregions) {
        int cap = capregions ? 2 * capregions : 64;
        guard_region_t *r = realloc(regions, sizeof *r * (size_t)cap);
        if (!r)
            return NULL;
        regions = r, capregions = cap;
    }
    /* anonymous pages start zeroed, as device_alloc promises */
    void *p = mmap(NULL, mapped, depth > 0 ? PROT_READ | PROT_WRITE : PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    regions[nregions++] = (guard_region_t){p, bytes, mapped};
    return p;
}

static void g_device_free(void *p)
{
    if (!p)
        return;
    for (int i = 0; i < nregions; i++)
        if (regions[i].base == p) {
            munmap(regions[i].base, regions[i].mapped);
            regions[i] = regions[--nregions];
            return;
        }
    fprintf(stderr, "meshtrain guard: device_free(%p): not an allocation of this backend\n", p);
    abort();
}

/* ------------------------------------------------------------------ the table's entries */

/* Each entry: (strict) check that the tensor arguments, the ones named
 * after args, are backend memory; open the regions, run the CPU backend's
 * entry, close them. */
#define GUARD_VOID(name, params, args, ...)                                   \
    static void g_##name params                                               \
    {                                                                         \
        const void *t_[] = {__VA_ARGS__};                                     \
        require_backend(#name, #__VA_ARGS__, t_, (int)(sizeof t_ / sizeof t_[0])); \
        open_all();                                                           \
        cpu->name args;                                                       \
        close_all();                                                          \
    }
#define GUARD_DOUBLE(name, params, args, ...)                                 \
    static double g_##name params                                             \
    {                                                                         \
        const void *t_[] = {__VA_ARGS__};                                     \
        require_backend(#name, #__VA_ARGS__, t_, (int)(sizeof t_ / sizeof t_[0])); \
        open_all();                                                           \
        double r_ = cpu->name args;                                           \
        close_all();                                                          \
        return r_;                                                            \
    }

#define MT_BACKEND_VOID GUARD_VOID
#define MT_BACKEND_DOUBLE GUARD_DOUBLE
#include "backend_entries.def"
#undef MT_BACKEND_VOID
#undef MT_BACKEND_DOUBLE

/* A new table entry must be listed in backend_entries.def: a NULL entry
 * would crash the guarded test instead of telling it what went wrong. */
_Static_assert(offsetof(mt_backend_t, rounds_bf16) == 46 * sizeof(void *) &&
                   sizeof(mt_backend_t) == 47 * sizeof(void *),
               "mt_backend_t changed: list the new entry in backend_entries.def and count it");

static const mt_backend_t guarded = {
    .name = "cpu-guarded",
#define MT_BACKEND_VOID(name, ...) .name = g_##name,
#define MT_BACKEND_DOUBLE(name, ...) .name = g_##name,
#include "backend_entries.def"
#undef MT_BACKEND_VOID
#undef MT_BACKEND_DOUBLE
    .device_alloc = g_device_alloc,
    .device_free = g_device_free,
    .rounds_bf16 = false, /* it wraps the plain table: a bf16 model rounds in passes, which
                           * gives the rounding table's bits (tests/train/device_guard.sh) */
    .reads_bf16 = false,
};

const mt_backend_t *mt_backend_cpu_guarded(void)
{
    if (!cpu) {
        cpu = mt_backend_cpu();
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, NULL);
        /* for the trainer's tests (tests/train/device_guard.sh), which cannot call
         * mt_cpu_guard_strict: strict from the start */
        const char *e = getenv("MESHTRAIN_GUARD_STRICT");
        if (e && *e && strcmp(e, "0") != 0)
            strict = true;
    }
    return &guarded;
}
