/* kernels_cpu_guard.c: mt_backend_cpu_guarded(), the CPU backend with a
 * guard for tests of device discipline (tests/test_device_discipline.c).
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

GUARD_VOID(matmul, (float *c, const float *a, const float *b, int64_t m, int64_t n, int64_t k,
                    bool ta, bool tb, float beta), (c, a, b, m, n, k, ta, tb, beta), c, a, b)
GUARD_VOID(embedding_forward, (float *out, const int32_t *tok, const float *table, int64_t n,
                               int64_t dim), (out, tok, table, n, dim), out, tok, table)
GUARD_VOID(embedding_backward, (float *dtable, const float *dout, const int32_t *tok, int64_t n,
                                int64_t dim), (dtable, dout, tok, n, dim), dtable, dout, tok)
GUARD_VOID(rmsnorm_forward, (float *out, float *rstd, const float *x, const float *w, int64_t n,
                             int64_t dim, float eps), (out, rstd, x, w, n, dim, eps), out, rstd, x, w)
GUARD_VOID(rmsnorm_backward, (float *dx, float *dw, const float *dout, const float *x,
                              const float *w, const float *rstd, int64_t n, int64_t dim),
           (dx, dw, dout, x, w, rstd, n, dim), dx, dw, dout, x, w, rstd)
GUARD_VOID(rope_forward, (float *x, const int32_t *pos, int64_t n, int64_t nh, int64_t hd,
                          double theta), (x, pos, n, nh, hd, theta), x, pos)
GUARD_VOID(rope_backward, (float *dx, const int32_t *pos, int64_t n, int64_t nh, int64_t hd,
                           double theta), (dx, pos, n, nh, hd, theta), dx, pos)
GUARD_VOID(attention_forward, (float *out, float *lse, const float *q, const float *k,
                               const float *v, const int32_t *ds, int64_t B, int64_t T,
                               int64_t nh, int64_t nkv, int64_t hd),
           (out, lse, q, k, v, ds, B, T, nh, nkv, hd), out, lse, q, k, v, ds)
GUARD_VOID(attention_backward, (float *dq, float *dk, float *dv, const float *dout,
                                const float *out, const float *lse, const float *q,
                                const float *k, const float *v, const int32_t *ds, int64_t B,
                                int64_t T, int64_t nh, int64_t nkv, int64_t hd),
           (dq, dk, dv, dout, out, lse, q, k, v, ds, B, T, nh, nkv, hd), dq, dk, dv, dout, out, lse, q, k, v, ds)
GUARD_VOID(swiglu_forward, (float *out, const float *g, const float *u, int64_t n),
           (out, g, u, n), out, g, u)
GUARD_VOID(swiglu_backward, (float *dg, float *du, const float *dout, const float *g,
                             const float *u, int64_t n), (dg, du, dout, g, u, n), dg, du, dout, g, u)
GUARD_DOUBLE(cross_entropy, (float *dl, const float *l, const int32_t *tgt, int64_t n, int64_t V,
                             int64_t vv, float scale, int64_t *count),
             (dl, l, tgt, n, V, vv, scale, count), dl, l, tgt)
GUARD_VOID(ce_shard_max, (float *mx, const float *l, int64_t n, int64_t V, int64_t vv),
           (mx, l, n, V, vv), mx, l)
GUARD_VOID(ce_shard_sum, (double *z, double *ly, const float *l, const int32_t *tgt,
                          const float *mx, int64_t n, int64_t V, int64_t v_lo, int64_t vv),
           (z, ly, l, tgt, mx, n, V, v_lo, vv), z, ly, l, tgt, mx)
GUARD_DOUBLE(ce_shard_finish, (float *dl, const float *l, const int32_t *tgt, const float *mx,
                               const double *z, const double *ly, int64_t n, int64_t V,
                               int64_t v_lo, int64_t vv, float scale, int64_t *count),
             (dl, l, tgt, mx, z, ly, n, V, v_lo, vv, scale, count), dl, l, tgt, mx, z, ly)
GUARD_VOID(add, (float *y, const float *x, int64_t n), (y, x, n), y, x)
GUARD_DOUBLE(sum_squares, (const float *x, int64_t n), (x, n), x)
GUARD_VOID(scale, (float *x, float s, int64_t n), (x, s, n), x)
GUARD_VOID(round_bf16, (float *x, int64_t n), (x, n), x)
GUARD_VOID(adamw, (float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                   float b2, float eps, float wd, int64_t t), (p, g, m, v, n, lr, b1, b2, eps, wd, t), p, g, m, v)
GUARD_VOID(attention_block_forward, (float *out, float *lse, int64_t ls, const float *q,
                                     const float *k, const float *v, const int32_t *ds,
                                     int64_t nq, int64_t nk, int64_t q0, int64_t k0, int64_t nh,
                                     int64_t nkv, int64_t hd),
           (out, lse, ls, q, k, v, ds, nq, nk, q0, k0, nh, nkv, hd), out, lse, q, k, v, ds)
GUARD_VOID(attention_block_backward, (float *dq, float *dk, float *dv, const float *dout,
                                      const float *out, const float *lse, int64_t ls,
                                      const float *q, const float *k, const float *v,
                                      const int32_t *ds, int64_t nq, int64_t nk, int64_t q0,
                                      int64_t k0, int64_t nh, int64_t nkv, int64_t hd),
           (dq, dk, dv, dout, out, lse, ls, q, k, v, ds, nq, nk, q0, k0, nh, nkv, hd), dq, dk, dv, dout, out, lse, q, k, v, ds)
GUARD_VOID(copy_to_device, (void *dst, const void *src, size_t bytes), (dst, src, bytes), dst)
GUARD_VOID(copy_to_host, (void *dst, const void *src, size_t bytes), (dst, src, bytes), src)
GUARD_VOID(copy, (void *dst, const void *src, size_t bytes), (dst, src, bytes), dst, src)
GUARD_VOID(zero, (void *dst, size_t bytes), (dst, bytes), dst)
GUARD_VOID(synchronize, (void), (), NULL)
GUARD_VOID(matmul_bf16, (uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                         int64_t k, bool ta, bool tb, float beta), (c, a, b, m, n, k, ta, tb, beta), c, a, b)
GUARD_VOID(moe_router_forward, (float *probs, int32_t *idx, float *w, const float *bias,
                                int64_t n, int64_t E, int64_t k, bool norm),
           (probs, idx, w, bias, n, E, k, norm), probs, idx, w, bias)
GUARD_VOID(moe_router_backward, (float *dl, const float *dw, const float *probs,
                                 const int32_t *idx, const float *w, const float *dp_all,
                                 int64_t n, int64_t E, int64_t k, bool norm),
           (dl, dw, probs, idx, w, dp_all, n, E, k, norm), dl, dw, probs, idx, w, dp_all)
GUARD_VOID(moe_gather_rows, (float *dst, const float *src, const int32_t *rows, int64_t n,
                             int64_t width), (dst, src, rows, n, width), dst, src, rows)
GUARD_VOID(moe_combine, (float *out, const float *res, const float *y, const int32_t *slot_row,
                         const float *w, int64_t n, int64_t k, int64_t width),
           (out, res, y, slot_row, w, n, k, width), out, res, y, slot_row, w)
GUARD_VOID(moe_combine_backward, (float *dw, float *dy, const float *dout, const float *y,
                                  const int32_t *slot_row, const float *w, int64_t n, int64_t k,
                                  int64_t width), (dw, dy, dout, y, slot_row, w, n, k, width), dw, dy, dout, y, slot_row, w)

/* A new table entry must be wrapped here too: a NULL entry would crash
 * the guarded test instead of telling it what went wrong. */
_Static_assert(sizeof(mt_backend_t) == 36 * sizeof(void *),
               "mt_backend_t changed: wrap the new entry in kernels_cpu_guard.c and count it");

static const mt_backend_t guarded = {
    .name = "cpu-guarded",
    .matmul = g_matmul,
    .embedding_forward = g_embedding_forward,
    .embedding_backward = g_embedding_backward,
    .rmsnorm_forward = g_rmsnorm_forward,
    .rmsnorm_backward = g_rmsnorm_backward,
    .rope_forward = g_rope_forward,
    .rope_backward = g_rope_backward,
    .attention_forward = g_attention_forward,
    .attention_backward = g_attention_backward,
    .swiglu_forward = g_swiglu_forward,
    .swiglu_backward = g_swiglu_backward,
    .cross_entropy = g_cross_entropy,
    .ce_shard_max = g_ce_shard_max,
    .ce_shard_sum = g_ce_shard_sum,
    .ce_shard_finish = g_ce_shard_finish,
    .add = g_add,
    .sum_squares = g_sum_squares,
    .scale = g_scale,
    .round_bf16 = g_round_bf16,
    .adamw = g_adamw,
    .attention_block_forward = g_attention_block_forward,
    .attention_block_backward = g_attention_block_backward,
    .copy_to_device = g_copy_to_device,
    .copy_to_host = g_copy_to_host,
    .copy = g_copy,
    .zero = g_zero,
    .synchronize = g_synchronize,
    .matmul_bf16 = g_matmul_bf16,
    .moe_router_forward = g_moe_router_forward,
    .moe_router_backward = g_moe_router_backward,
    .moe_gather_rows = g_moe_gather_rows,
    .moe_combine = g_moe_combine,
    .moe_combine_backward = g_moe_combine_backward,
    .device_alloc = g_device_alloc,
    .device_free = g_device_free,
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
        /* for the trainer's tests (tests/device_guard.sh), which cannot call
         * mt_cpu_guard_strict: strict from the start */
        const char *e = getenv("MESHTRAIN_GUARD_STRICT");
        if (e && *e && strcmp(e, "0") != 0)
            strict = true;
    }
    return &guarded;
}
