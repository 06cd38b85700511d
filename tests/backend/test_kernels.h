/* test_kernels.h: what the CPU kernel tests (test_kernels.c,
 * test_kernels_softmax.c, test_kernels_layers.c) share: the backend under
 * test, a seeded generator, buffers, the normwise comparisons against a
 * double reference (tolerances: test_kernels.c), central finite
 * differences and the determinism check across thread counts.  Each program has its own copy
 * of the state below. */
#ifndef MT_TEST_KERNELS_H
#define MT_TEST_KERNELS_H

#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels_cpu_internal.h"
#include "mt_backend.h"
#include "mt_test.h"

static const mt_backend_t *be;
static int verbose;

/* main's start in each program: MT_TEST_VERBOSE, one OpenMP thread (the
 * determinism checks set their own), the CPU backend */
static inline void kernels_test_begin(void)
{
    const char *ve = getenv("MT_TEST_VERBOSE");
    verbose = ve && *ve && strcmp(ve, "0") != 0;
    omp_set_num_threads(1);
    be = mt_backend_cpu();
}

/* ------------------------------------------------------------------ helpers */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static inline double urand(void) /* [0, 1) */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static inline int64_t irand(int64_t n) { return (int64_t)(urand() * (double)n); }

static inline float *fnew(int64_t n)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p)
        abort();
    return p;
}

static inline double *dnew(int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!p)
        abort();
    return p;
}

static inline float *frand(int64_t n, double scale)
{
    float *p = fnew(n);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)((2.0 * urand() - 1.0) * scale);
    return p;
}

static inline float *fcopy(const float *x, int64_t n)
{
    float *p = fnew(n);
    memcpy(p, x, (size_t)n * sizeof(float));
    return p;
}

static inline void ffill(float *x, int64_t n, float v)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = v;
}

/* Normwise error of got against ref (see the top comment); NaN fails. */
static inline double norm_err(const float *got, const double *ref, int64_t n, int64_t *worst)
{
    double emax = 0.0, rmax = 0.0;
    *worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]);
        if (!(e <= emax)) { /* also catches NaN */
            emax = isnan(e) ? INFINITY : e;
            *worst = i;
        }
        if (fabs(ref[i]) > rmax)
            rmax = fabs(ref[i]);
    }
    return emax / (rmax > 0.0 ? rmax : 1.0);
}

/* floor: a magnitude below which max|ref| is not trusted as the scale,
 * for outputs that are differences of much larger terms (0 if none). */
static inline void check_close_floor(const char *what, const float *got, const double *ref,
                                     int64_t n, double tol, double floor)
{
    int64_t w;
    double rmax = 0.0;
    for (int64_t i = 0; i < n; i++)
        rmax = fabs(ref[i]) > rmax ? fabs(ref[i]) : rmax;
    double e = norm_err(got, ref, n, &w);
    if (floor > rmax && rmax > 0.0)
        e *= rmax / floor;
    else if (floor > rmax)
        e /= floor;
    if (verbose)
        printf("  %-44s err %.2e (tol %.0e)\n", what, e, tol);
    CHECK(e <= tol, "%s: normwise error %.3g > %.3g (worst [%lld]: got %.9g, ref %.9g)", what, e,
          tol, (long long)w, n ? got[w] : 0.0f, n ? ref[w] : 0.0);
}

static inline void check_close(const char *what, const float *got, const double *ref,
                               int64_t n, double tol)
{
    check_close_floor(what, got, ref, n, tol, 0.0);
}

/* Finite differences of L(x) = loss() with respect to x[idx] for nsamp
 * random idx, against the analytic gradient grad[idx], normwise over the
 * samples: max |fd - g| / max(max |g|, floor) <= 2e-3.  floor is 0 except
 * where the exact gradient is ~0 and rounding noise dominates (attention
 * with one key, RMSNorm with dim = 1); there the caller passes the scale
 * of the gradient's terms. */
typedef double (*loss_fn)(void *ctx);

static inline void check_fd(const char *what, float *x, int64_t n, const float *grad,
                            loss_fn loss, void *ctx, int nsamp, double h, double floor)
{
    double gmax = floor, emax = 0.0;
    for (int64_t i = 0; i < n; i++)
        gmax = fabs(grad[i]) > gmax ? fabs(grad[i]) : gmax;
    int64_t wi = 0;
    double wfd = 0.0;
    const double tol = 2e-3;
    for (int s = 0; s < nsamp && n > 0; s++) {
        const int64_t i = s < n && nsamp >= n ? s : irand(n);
        const float x0 = x[i];
        x[i] = (float)(x0 + h);
        const double hp = (double)x[i] - x0; /* the step actually taken */
        const double lp = loss(ctx);
        x[i] = (float)(x0 - h);
        const double hm = x0 - (double)x[i];
        const double lm = loss(ctx);
        x[i] = x0;
        const double fd = (lp - lm) / (hp + hm);
        const double e = fabs(fd - grad[i]);
        if (!(e <= emax)) {
            emax = isnan(e) ? INFINITY : e;
            wi = i;
            wfd = fd;
        }
    }
    const double rel = emax / (gmax > 0.0 ? gmax : 1.0);
    if (verbose)
        printf("  %-44s fd  %.2e (tol %.0e)\n", what, rel, tol);
    CHECK(rel <= tol,
          "%s: finite differences differ by %.3g normwise (> %.3g) at [%lld]: fd %.9g, "
          "analytic %.9g",
          what, rel, tol, (long long)wi, wfd, grad[wi]);
}

/* Determinism: run() fills the output buffers (and resets any in-place
 * input itself).  Same bytes twice at 2 threads; with all_counts, also the
 * same bytes at 1 and 3 threads. */
#define DET_MAX 4
typedef struct {
    void *buf[DET_MAX];
    size_t bytes[DET_MAX];
    int n;
} det_outs_t;

static inline void check_deterministic(const char *what, void (*run)(void *), void *ctx,
                                       const det_outs_t *o, int all_counts)
{
    void *ref[DET_MAX];
    omp_set_num_threads(2);
    run(ctx);
    for (int b = 0; b < o->n; b++) {
        ref[b] = malloc(o->bytes[b] ? o->bytes[b] : 1);
        memcpy(ref[b], o->buf[b], o->bytes[b]);
    }
    const int counts[] = {2, 1, 3};
    for (int c = 0; c < (all_counts ? 3 : 1); c++) {
        omp_set_num_threads(counts[c]);
        for (int b = 0; b < o->n; b++)
            memset(o->buf[b], 0xA5, o->bytes[b]);
        run(ctx);
        for (int b = 0; b < o->n; b++)
            CHECK(memcmp(ref[b], o->buf[b], o->bytes[b]) == 0,
                  "%s: output %d differs between runs at 2 and %d threads", what, b, counts[c]);
    }
    for (int b = 0; b < o->n; b++)
        free(ref[b]);
    omp_set_num_threads(1);
}

#endif
