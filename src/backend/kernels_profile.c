/* kernels_profile.c: mt_backend_profiled(), a backend table that times
 * every entry of another one (mt_backend.h; MESHTRAIN_PROFILE=1 in the
 * trainer, doc/performance.md "Kernel profile").
 *
 * Each entry synchronizes the inner backend, runs the inner entry,
 * synchronizes again and adds the wall time to the entry's total: on a
 * GPU that is the kernel's device time plus its launch (a few
 * microseconds), with nothing overlapping it, which is what a profile of
 * where a step's time goes needs; on the CPU it is the kernel's time.
 * The run is slower than an unprofiled one by those waits, and its
 * numbers are the same: the inner entries do the work.  matmul is
 * counted per shape as well (its largest shapes are where a GEMM-bound
 * step goes).  One inner backend per process. */
#include "config.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt_backend.h"
#include "mt_clock.h"

static const mt_backend_t *inner;

/* the entries, in the list's order */
enum {
#define MT_BACKEND_VOID(name, ...) E_##name,
#define MT_BACKEND_DOUBLE(name, ...) E_##name,
#include "backend_entries.def"
#undef MT_BACKEND_VOID
#undef MT_BACKEND_DOUBLE
    E_COUNT
};

static const char *const entry_name[E_COUNT] = {
#define MT_BACKEND_VOID(name, ...) #name,
#define MT_BACKEND_DOUBLE(name, ...) #name,
#include "backend_entries.def"
#undef MT_BACKEND_VOID
#undef MT_BACKEND_DOUBLE
};

static double total_s[E_COUNT];
static int64_t calls[E_COUNT];

#define NSHAPES 64 /* matmul shapes kept; more are counted as "other" */
typedef struct {
    int64_t m, n, k, calls;
    double s;
} shape_t;
static shape_t shape[NSHAPES + 1];
static int nshape;

/* the inner entries never call the table's: one level */
static double begin(void)
{
    inner->synchronize();
    return mt_now_s();
}

static void end(int e, double t0)
{
    inner->synchronize();
    total_s[e] += mt_now_s() - t0;
    calls[e]++;
}

static void count_shape(int64_t m, int64_t n, int64_t k, double s)
{
    int i = 0;
    while (i < nshape && !(shape[i].m == m && shape[i].n == n && shape[i].k == k))
        i++;
    if (i == nshape) {
        if (nshape == NSHAPES)
            i = NSHAPES; /* the "other" row */
        else
            shape[nshape++] = (shape_t){m, n, k, 0, 0.0};
    }
    shape[i].calls++, shape[i].s += s;
}

#define MT_BACKEND_VOID(name, params, args, ...)                              \
    static void p_##name params                                               \
    {                                                                         \
        double t0_ = begin();                                                 \
        inner->name args;                                                     \
        end(E_##name, t0_);                                                   \
    }
#define MT_BACKEND_DOUBLE(name, params, args, ...)                            \
    static double p_##name params                                             \
    {                                                                         \
        double t0_ = begin();                                                 \
        double r_ = inner->name args;                                         \
        end(E_##name, t0_);                                                   \
        return r_;                                                            \
    }
#include "backend_entries.def"
#undef MT_BACKEND_VOID
#undef MT_BACKEND_DOUBLE

/* the GEMMs count their shapes too (the table's entries, set in
 * mt_backend_profiled): matmul's, matmul_f32out's and matmul_add's in one
 * shape table */
static void p_matmul_shaped(float *c, const float *a, const float *b, int64_t m, int64_t n,
                            int64_t k, bool ta, bool tb, float beta)
{
    double before = total_s[E_matmul];
    p_matmul(c, a, b, m, n, k, ta, tb, beta);
    count_shape(m, n, k, total_s[E_matmul] - before);
}

static void p_matmul_f32out_shaped(float *c, const float *a, const float *b, int64_t m,
                                   int64_t n, int64_t k, bool ta, bool tb, float beta)
{
    double before = total_s[E_matmul_f32out];
    p_matmul_f32out(c, a, b, m, n, k, ta, tb, beta);
    count_shape(m, n, k, total_s[E_matmul_f32out] - before);
}

static void p_matmul_add_shaped(float *c, const float *r, const float *a, const float *b,
                                int64_t m, int64_t n, int64_t k, bool ta, bool tb)
{
    double before = total_s[E_matmul_add];
    p_matmul_add(c, r, a, b, m, n, k, ta, tb);
    count_shape(m, n, k, total_s[E_matmul_add] - before);
}

static void *p_device_alloc(size_t bytes) { return inner->device_alloc(bytes); }
static void p_device_free(void *p) { inner->device_free(p); }

_Static_assert(offsetof(mt_backend_t, rounds_bf16) == 46 * sizeof(void *) &&
                   sizeof(mt_backend_t) == 47 * sizeof(void *),
               "mt_backend_t changed: list the new entry in backend_entries.def and count it");

static mt_backend_t profiled = {
#define MT_BACKEND_VOID(name, ...) .name = p_##name,
#define MT_BACKEND_DOUBLE(name, ...) .name = p_##name,
#include "backend_entries.def"
#undef MT_BACKEND_VOID
#undef MT_BACKEND_DOUBLE
    .device_alloc = p_device_alloc,
    .device_free = p_device_free,
};

const mt_backend_t *mt_backend_profiled(const mt_backend_t *be)
{
    if (inner && inner != be)
        return NULL;
    if (!inner) {
        static char name[64];
        snprintf(name, sizeof name, "%s+profile", be->name);
        inner = be;
        profiled.name = name;
        profiled.matmul = p_matmul_shaped;
        profiled.matmul_f32out = p_matmul_f32out_shaped;
        profiled.matmul_add = p_matmul_add_shaped;
        profiled.rounds_bf16 = be->rounds_bf16; /* the inner entries round */
        profiled.reads_bf16 = be->reads_bf16;
        profiled.stores_bf16 = be->stores_bf16;
    }
    return &profiled;
}

void mt_backend_profile_reset(void)
{
    memset(total_s, 0, sizeof total_s);
    memset(calls, 0, sizeof calls);
    memset(shape, 0, sizeof shape);
    nshape = 0;
}

static int by_time(const void *a, const void *b)
{
    double x = total_s[*(const int *)a], y = total_s[*(const int *)b];
    return x < y ? 1 : x > y ? -1 : 0;
}

static int shape_by_time(const void *a, const void *b)
{
    double x = ((const shape_t *)a)->s, y = ((const shape_t *)b)->s;
    return x < y ? 1 : x > y ? -1 : 0;
}

double mt_backend_profile_report(FILE *out, double wall_s, int top_shapes)
{
    int order[E_COUNT];
    double sum = 0;
    for (int e = 0; e < E_COUNT; e++)
        order[e] = e, sum += total_s[e];
    qsort(order, E_COUNT, sizeof order[0], by_time);
    fprintf(out, "kernel profile (%s; each entry timed alone, synchronized): %.3f s in the "
                 "backend of %.3f s\n", inner ? inner->name : "?", sum, wall_s);
    fprintf(out, "  %-26s %9s %11s %7s %10s\n", "entry", "calls", "seconds", "share", "ms/call");
    for (int i = 0; i < E_COUNT; i++) {
        int e = order[i];
        if (calls[e] == 0)
            continue;
        fprintf(out, "  %-26s %9lld %11.4f %6.1f%% %10.4f\n", entry_name[e], (long long)calls[e],
                total_s[e], sum > 0 ? 100.0 * total_s[e] / sum : 0.0,
                1e3 * total_s[e] / (double)calls[e]);
    }
    shape_t top[NSHAPES + 1]; /* the costliest matmul shapes; "other" has m = 0 */
    int nt = 0;
    for (int i = 0; i <= NSHAPES; i++)
        if (shape[i].calls > 0)
            top[nt++] = shape[i];
    qsort(top, (size_t)nt, sizeof top[0], shape_by_time);
    for (int t = 0; t < top_shapes && t < nt; t++) {
        const shape_t *h = &top[t];
        double flop = 2.0 * (double)h->m * (double)h->n * (double)h->k * (double)h->calls;
        if (h->m == 0)
            fprintf(out, "  matmul other shapes       %9lld %11.4f\n", (long long)h->calls, h->s);
        else
            fprintf(out, "  matmul %6lld x %6lld x %6lld %6lld %11.4f %7.1f TFLOP/s\n",
                    (long long)h->m, (long long)h->n, (long long)h->k, (long long)h->calls, h->s,
                    h->s > 0 ? flop / h->s / 1e12 : 0.0);
    }
    return sum;
}
