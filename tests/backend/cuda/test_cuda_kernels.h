/* test_cuda_kernels.h: helpers of the CUDA kernel tests (test_cuda_kernels.c,
 * test_cuda_attention.c): random inputs, device buffers from a test arena,
 * and the normwise comparison.  Errors are max |gpu - cpu| / max |cpu|
 * over a tensor (elementwise relative error is meaningless where entries
 * cancel to ~0). */
#ifndef MT_TEST_CUDA_KERNELS_H
#define MT_TEST_CUDA_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt_bf16.h"
#include "mt_cuda.h"
#include "mt_test.h"

/* the device arena the tests allocate from (reset between tests) */
extern mt_cuda_arena_t tc_arena;
extern const mt_backend_t *tc_cpu, *tc_gpu;
extern int tc_verbose;

/* main()'s start in every CUDA kernel test: exit 77 without a device,
 * else the backend (64 MiB scratch) and the test arena set up, with gpu as
 * tc_gpu and the CPU backend as tc_cpu; exits 99 when that fails. */
static mt_cuda_arena_t tc_backend_arena; /* the backend's workspace and scratch */

static inline void tc_setup(const char *name, const mt_backend_t *(*gpu)(void))
{
    if (mt_cuda_device_count() == 0) {
        printf("%s: no CUDA device visible: skipping (exit 77)\n", name);
        exit(77);
    }
    tc_verbose = getenv("MT_TEST_VERBOSE") != NULL;
    if (mt_cuda_arena_init(&tc_backend_arena, "backend", (size_t)160 << 20) != MT_OK ||
        mt_cuda_backend_init(&tc_backend_arena, (size_t)64 << 20) != MT_OK ||
        mt_cuda_arena_init(&tc_arena, "test", (size_t)256 << 20) != MT_OK) {
        fprintf(stderr, "%s: %s (%s)\nhint: %s\n", name, mt_error_message(), mt_error_where(),
                mt_error_hint_text());
        exit(99);
    }
    tc_cpu = mt_backend_cpu();
    tc_gpu = gpu();
}

/* main()'s end: everything tc_setup made, freed */
static inline void tc_teardown(void)
{
    tc_gpu->synchronize();
    mt_cuda_arena_free(&tc_arena);
    mt_cuda_backend_free();
    mt_cuda_arena_free(&tc_backend_arena);
}

static inline uint64_t tc_rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* doc_start of B rows of T tokens: random documents of 1..T/3+1 tokens */
static inline int32_t *tc_make_docs(uint64_t *s, int64_t B, int64_t T)
{
    int32_t *doc = (int32_t *)malloc((size_t)(B * T) * sizeof(int32_t));
    for (int64_t b = 0; b < B; b++) {
        int64_t start = 0, left = 0;
        for (int64_t t = 0; t < T; t++) {
            if (left == 0) {
                start = t;
                left = 1 + (int64_t)(tc_rng_next(s) % (uint64_t)(T / 3 + 1));
            }
            doc[b * T + t] = (int32_t)start;
            left--;
        }
    }
    return doc;
}

/* A sliding window of W over the rows (doc/sliding-window.md), as the
 * model hands it to the kernels: each query's first visible key
 * lo_t = max(doc[t] (0 when doc is NULL), t - W + 1), in place of doc. */
static inline int32_t *tc_window(int32_t *doc, int64_t B, int64_t T, int64_t W)
{
    int32_t *lo = doc ? doc : (int32_t *)malloc((size_t)(B * T) * sizeof(int32_t));
    for (int64_t i = 0; i < B * T; i++) {
        const int64_t t = i % T, d = doc ? doc[i] : 0;
        lo[i] = (int32_t)(t - W + 1 > d ? t - W + 1 : d);
    }
    return lo;
}

/* uniform in [-1, 1) */
static inline float tc_uniform(uint64_t *s)
{
    return (float)((double)(tc_rng_next(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static inline float *tc_rand(uint64_t *s, int64_t n, float scale)
{
    float *x = (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = tc_uniform(s) * scale;
    return x;
}

/* device memory from the test arena, uninitialised */
static inline void *tc_dev_raw(size_t bytes)
{
    void *p = NULL;
    if (mt_cuda_arena_alloc(&tc_arena, bytes ? bytes : 1, &p) != MT_OK) {
        fprintf(stderr, "test arena: %s\n", mt_error_message());
        exit(99);
    }
    return p;
}

/* a device copy of host memory */
static inline void *tc_up(const void *host, size_t bytes)
{
    void *d = tc_dev_raw(bytes);
    tc_gpu->copy_to_device(d, host, bytes);
    return d;
}

/* device memory for a kernel's output, filled with 0xff bytes (NaN as
 * float): an element the kernel should write and does not shows up, on a
 * GPU and under the emulation alike, whatever the arena held before */
static inline void *tc_dev(size_t bytes)
{
    unsigned char *h = (unsigned char *)malloc(bytes ? bytes : 1);
    memset(h, 0xff, bytes);
    void *d = tc_up(h, bytes);
    free(h);
    return d;
}

/* a new host copy of device memory */
static inline void *tc_down(const void *dev, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 1);
    tc_gpu->copy_to_host(h, dev, bytes);
    return h;
}

/* max |got - ref| / max(max |ref|, floor); floor 0: plain normwise */
static inline double tc_normwise_floor(const float *got, const float *ref, int64_t n,
                                       double floor)
{
    double md = 0.0, mr = floor;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - (double)ref[i]);
        md = d > md || d != d ? d : md; /* NaN propagates */
        mr = fabs((double)ref[i]) > mr ? fabs((double)ref[i]) : mr;
    }
    return mr > 0 ? md / mr : md;
}

/* Gradients whose exact value is 0 (attention over one visible key:
 * dS = P (dP - D) cancels) come out of both sides as rounding noise of
 * O(1) terms, and noise over noise is not an error.  The inputs of the
 * kernel tests are O(1), so a reference whose largest element is below
 * `floor` is compared absolutely, against tol x floor. */
#define CHECK_CLOSE_FLOOR(what, got, ref, n, tol, floor)                                \
    do {                                                                                \
        const double tc_e_ = tc_normwise_floor((got), (ref), (n), (floor));              \
        if (tc_verbose)                                                                 \
            printf("  %-36s normwise error %.3g (bound %.1g)\n", (what), tc_e_, (tol));  \
        CHECK(tc_e_ <= (tol), "%s: normwise error %.3g > %.1g", (what), tc_e_, (tol));  \
    } while (0)

#define CHECK_CLOSE(what, got, ref, n, tol) CHECK_CLOSE_FLOOR(what, got, ref, n, tol, 0.0)

#define CHECK_SAME_BYTES(what, a, b, bytes)                                             \
    CHECK(memcmp((a), (b), (bytes)) == 0, "%s: the bytes differ", (what))

/* mt_test.h's counters are static, one pair per file: a test file other
 * than test_cuda_kernels.c returns its own, and main adds them to its
 * pair, so the exit code counts every file's failures. */
typedef struct {
    int checks, failures;
} tc_counts_t;

static inline tc_counts_t tc_counts(void)
{
    tc_counts_t c = {mt_test_checks, mt_test_failures};
    return c;
}

static inline void tc_add_counts(tc_counts_t c)
{
    mt_test_checks += c.checks;
    mt_test_failures += c.failures;
}

/* test_cuda_bf16 and test_cuda_storage: float counts as bytes, host bf16
 * values, device bytes compared */
#define F(n) ((size_t)(n) * sizeof(float))

/* a host copy of x's n bf16 values */
static inline float *bf16_copy(const float *x, int64_t n)
{
    float *y = malloc(F(n));
    for (int64_t i = 0; i < n; i++)
        y[i] = mt_bf16_to_f32(mt_f32_to_bf16(x[i]));
    return y;
}

/* uniform [-scale, scale) rounded to bf16 values */
static inline float *rand_bf16(uint64_t *s, int64_t n, float scale)
{
    float *x = tc_rand(s, n, scale), *y = bf16_copy(x, n);
    free(x);
    return y;
}

/* the device floats at d_a and d_b, byte for byte */
static inline void check_same(const char *what, const float *d_a, const float *d_b, int64_t n)
{
    float *a = tc_down(d_a, F(n)), *b = tc_down(d_b, F(n));
    CHECK_SAME_BYTES(what, a, b, F(n));
    free(a), free(b);
}

/* test_cuda_attention.c */
tc_counts_t tc_test_attention(uint64_t *seed);
/* test_cuda_storage.c (in test_cuda_bf16) */
tc_counts_t tc_test_storage(uint64_t *seed);
/* test_cuda_kernels_moe.c */
tc_counts_t tc_test_moe(uint64_t *seed);

#endif
