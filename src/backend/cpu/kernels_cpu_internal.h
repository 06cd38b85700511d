/* kernels_cpu_internal.h: helpers shared by the CPU backend's kernel files
 * (kernels_cpu*.c) and by tests/backend/test_kernels.c.  Not installed.
 *
 * It holds the kernels' cross-file declarations, the precondition check,
 * a vectorisable expf, explicit 4-lane vector types, and fixed-order sums
 * whose summation order is written out, so results do not depend on what
 * the vectoriser does.  It deliberately holds no state and no tuning knobs
 * that change results. */
#ifndef MT_KERNELS_CPU_INTERNAL_H
#define MT_KERNELS_CPU_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_require.h"
#include "mt_bf16.h"
#include "mt_backend.h"

/* Elementwise loops below this many elements run on one thread: forking
 * the team costs more than it saves.  The threshold never changes results,
 * only who computes them. */
#define MT_CPU_PAR_MIN ((int64_t)1 << 15)

/* A violated precondition stops the process (backend_require.h). */
#define MT_CPU_REQUIRE(cond, kernel, ...) MT_BACKEND_REQUIRE("cpu", cond, kernel, __VA_ARGS__)

/* c ? a : b through bit masks.  GCC (12, -O2) turns float ternaries into
 * branches it then cannot if-convert under -ftrapping-math, which stops a
 * loop calling mt_cpu_expf from vectorising; integer selects do not. */
static inline float mt_cpu_select(int c, float a, float b)
{
    uint32_t ab, bb, m = (uint32_t)0 - (uint32_t)(c != 0);
    memcpy(&ab, &a, sizeof ab);
    memcpy(&bb, &b, sizeof bb);
    ab = (ab & m) | (bb & ~m);
    float r;
    memcpy(&r, &ab, sizeof r);
    return r;
}

/* x, or with r the bf16 value nearest x (mt_f32_to_bf16's rounding, as
 * round_bf16 applies it): the store of a kernel on the rounding table
 * (mt_backend_t.rounds_bf16).  Integer selects, so loops calling it still
 * vectorise. */
static inline float mt_cpu_bf16_if(float x, int r)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t nan = (u >> 16 | 0x40u) << 16;
    const uint32_t near = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const uint32_t m = (uint32_t)0 - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
    const uint32_t k = (uint32_t)0 - (uint32_t)(r != 0);
    const uint32_t v = (((nan & m) | (near & ~m)) & k) | (u & ~k);
    float y;
    memcpy(&y, &v, sizeof y);
    return y;
}

/* matmul_add (mt_backend_t) through a table's matmul mm, whose elements
 * are esize bytes (4: float32, 2: bf16 storage): r into c, then beta 1 */
static inline void mt_cpu_matmul_add_by(void (*mm)(float *, const float *, const float *,
                                                   int64_t, int64_t, int64_t, bool, bool, float),
                                        size_t esize, float *c, const float *r, const float *a,
                                        const float *b, int64_t m, int64_t n, int64_t k, bool ta,
                                        bool tb)
{
    if (c != r && m > 0 && n > 0)
        memmove(c, r, esize * (size_t)(m * n));
    mm(c, a, b, m, n, k, ta, tb, 1.0f);
}

/* exp(x) in float, written so the compiler can vectorise loops that call
 * it (libm's expf is an opaque scalar call at -O2).  Cephes' expf: x =
 * n ln2 + r with |r| <= ln2/2, a degree-6 polynomial for e^r, 2^n from the
 * exponent bits.  Within 2 ulp of exp over [-87, 88] (test_kernels checks
 * it); exactly 0 below -87 (true value < 1.7e-38), +inf above 88, NaN for
 * NaN.  A pure function of x: bit-identical wherever it runs in one build. */
static inline float mt_cpu_expf(float x)
{
    const float shifter = 12582912.0f; /* 1.5 * 2^23: x + shifter rounds x to an integer */
    float xc = mt_cpu_select(x < -87.0f, -87.0f, x);
    xc = mt_cpu_select(xc > 88.0f, 88.0f, xc);
    float t = xc * 1.44269504088896341f + shifter;
    float n = t - shifter;
    float r = xc - n * 0.693359375f; /* ln2 split in two for an exact n ln2 */
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * (r * r) + r + 1.0f;
    uint32_t ti, si; /* unsigned: NaN inputs give garbage bits here, never UB */
    memcpy(&ti, &t, sizeof ti);
    si = (ti - 0x4B400000u + 127u) << 23; /* low mantissa bits of t hold n */
    float s;
    memcpy(&s, &si, sizeof s);
    y *= s;
    y = mt_cpu_select(x < -87.0f, 0.0f, y);
    return mt_cpu_select(x > 88.0f, (float)INFINITY, y);
}

/* Explicit 4-lane vectors (a GCC/Clang extension).  GCC 12 at -O2 keeps
 * an `omp simd` accumulator array in memory across the outer loop, which
 * made the register-tiled loops 3x slower; named vector variables stay in
 * registers, under -O2 (SSE) and -march=native (where it also fuses FMAs)
 * alike.  Each lane does exactly the scalar arithmetic, in the same order. */
typedef float mt_v4f __attribute__((vector_size(16)));
typedef float mt_v2f __attribute__((vector_size(8)));
typedef double mt_v2d __attribute__((vector_size(16)));
typedef int32_t mt_v4i __attribute__((vector_size(16)));

static inline mt_v4f mt_v4f_load(const float *p)
{
    mt_v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void mt_v4f_store(float *p, mt_v4f v) { memcpy(p, &v, sizeof v); }

/* two floats widened to doubles */
static inline mt_v2d mt_v2d_load_f(const float *p)
{
    mt_v2f v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, mt_v2d);
}

/* Sum of x[0..n) in float: 8 interleaved partial sums (lanes i % 8)
 * combined in a fixed tree, so the order is the same everywhere. */
static inline float mt_cpu_sum8(const float *x, int64_t n)
{
    mt_v4f a0 = {0, 0, 0, 0}, a1 = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 += mt_v4f_load(x + i);
        a1 += mt_v4f_load(x + i + 4);
    }
    float tail = 0.0f;
    for (; i < n; i++)
        tail += x[i];
    return (((a0[0] + a1[0]) + (a0[1] + a1[1])) + ((a0[2] + a1[2]) + (a0[3] + a1[3]))) + tail;
}

/* Dot product in float, same fixed 8-lane order as mt_cpu_sum8. */
static inline float mt_cpu_dot8(const float *a, const float *b, int64_t n)
{
    mt_v4f a0 = {0, 0, 0, 0}, a1 = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 += mt_v4f_load(a + i) * mt_v4f_load(b + i);
        a1 += mt_v4f_load(a + i + 4) * mt_v4f_load(b + i + 4);
    }
    float tail = 0.0f;
    for (; i < n; i++)
        tail += a[i] * b[i];
    return (((a0[0] + a1[0]) + (a0[1] + a1[1])) + ((a0[2] + a1[2]) + (a0[3] + a1[3]))) + tail;
}

/* sum_i a_i b_i in double (float products are exact in double): 4
 * interleaved partial sums (lanes i % 4) combined in a fixed order.
 * b == NULL gives sum_i a_i^2. */
static inline double mt_cpu_dot_f64(const float *a, const float *b, int64_t n)
{
    mt_v2d a0 = {0, 0}, a1 = {0, 0};
    if (!b)
        b = a;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a0 += mt_v2d_load_f(a + i) * mt_v2d_load_f(b + i);
        a1 += mt_v2d_load_f(a + i + 2) * mt_v2d_load_f(b + i + 2);
    }
    double tail = 0.0;
    for (; i < n; i++)
        tail += (double)a[i] * (double)b[i];
    return ((a0[0] + a1[0]) + (a0[1] + a1[1])) + tail;
}

/* Sum of x[0..n) in double, lanes i % 4, the order of mt_cpu_dot_f64. */
static inline double mt_cpu_sum_f64(const float *x, int64_t n)
{
    mt_v2d a0 = {0, 0}, a1 = {0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a0 += mt_v2d_load_f(x + i);
        a1 += mt_v2d_load_f(x + i + 2);
    }
    double tail = 0.0;
    for (; i < n; i++)
        tail += (double)x[i];
    return ((a0[0] + a1[0]) + (a0[1] + a1[1])) + tail;
}

/* The kernels, one family per file; kernels_cpu.c puts them in the table.
 * A trailing `round` rounds the activations the kernel writes to bf16
 * (mt_cpu_bf16_if): true in the rounding table, mt_backend_cpu_bf16. */
#define MT_CPU_HIDDEN __attribute__((visibility("hidden")))

MT_CPU_HIDDEN void mt_cpu_embedding_forward(float *out, const int32_t *tokens, const float *table,
                                            int64_t n_tokens, int64_t dim);
MT_CPU_HIDDEN void mt_cpu_embedding_backward(float *dtable, const float *dout,
                                             const int32_t *tokens, int64_t n_tokens,
                                             int64_t dim);
MT_CPU_HIDDEN void mt_cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w,
                                          int64_t n, int64_t dim, float eps, bool round);
MT_CPU_HIDDEN void mt_cpu_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                                           const float *w, const float *rstd, int64_t n,
                                           int64_t dim, bool accumulate, bool round);
MT_CPU_HIDDEN void mt_cpu_rmsnorm_rowsums(double *sums, const float *a, const float *b,
                                          const float *w, int64_t n, int64_t dim);
MT_CPU_HIDDEN void mt_cpu_rmsnorm_forward_sums(float *out, float *rstd, const float *x,
                                               const float *w, const double *sums, int64_t n,
                                               int64_t dim, int64_t full_dim, float eps,
                                               bool round);
MT_CPU_HIDDEN void mt_cpu_rmsnorm_backward_sums(float *dx, float *dw, const float *dout,
                                                const float *x, const float *w,
                                                const float *rstd, const double *sums,
                                                int64_t n, int64_t dim, int64_t full_dim,
                                                bool accumulate, bool round);
MT_CPU_HIDDEN void mt_cpu_rope_forward(float *x, const int32_t *pos, int64_t n_tokens,
                                       int64_t n_heads, int64_t head_dim,
                                       const double *inv_freq, double scale, bool round);
MT_CPU_HIDDEN void mt_cpu_rope_backward(float *dx, const int32_t *pos, int64_t n_tokens,
                                        int64_t n_heads, int64_t head_dim,
                                        const double *inv_freq, double scale, bool round);
MT_CPU_HIDDEN void mt_cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                                            const float *v, const int32_t *doc_start, int64_t B,
                                            int64_t T, int64_t nh, int64_t nkv, int64_t hd);
MT_CPU_HIDDEN void mt_cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                             const float *out, const float *lse, const float *q,
                                             const float *k, const float *v,
                                             const int32_t *doc_start, int64_t B, int64_t T,
                                             int64_t nh, int64_t nkv, int64_t hd);
MT_CPU_HIDDEN void mt_cpu_swiglu_forward(float *out, const float *gate, const float *up, int64_t n);
MT_CPU_HIDDEN void mt_cpu_swiglu_backward(float *dgate, float *dup, const float *dout,
                                          const float *gate, const float *up, int64_t n);
MT_CPU_HIDDEN double mt_cpu_cross_entropy(float *dlogits, const float *logits,
                                          const int32_t *targets, int64_t n, int64_t V,
                                          int64_t v_valid, float grad_scale, int64_t *count);
MT_CPU_HIDDEN void mt_cpu_ce_shard_max(float *mx, const float *logits, int64_t n, int64_t V,
                                       int64_t v_valid);
MT_CPU_HIDDEN void mt_cpu_ce_shard_sum(double *z, double *ly, const float *logits,
                                       const int32_t *targets, const float *mx, int64_t n,
                                       int64_t V, int64_t v_lo, int64_t v_valid);
MT_CPU_HIDDEN double mt_cpu_ce_shard_finish(float *dlogits, const float *logits,
                                            const int32_t *targets, const float *mx,
                                            const double *z, const double *ly, int64_t n,
                                            int64_t V, int64_t v_lo, int64_t v_valid,
                                            float grad_scale, int64_t *count);

/* context parallelism: kernels_cpu_attention_block.c */
MT_CPU_HIDDEN void mt_cpu_attention_block_forward(float *out, float *lse, int64_t lse_stride,
                                                  const float *q, const float *k, const float *v,
                                                  const int32_t *doc_start, int64_t nq,
                                                  int64_t nk, int64_t q0, int64_t k0, int64_t nh,
                                                  int64_t nkv, int64_t hd);
MT_CPU_HIDDEN void mt_cpu_attention_block_backward(float *dq, float *dk, float *dv,
                                                   const float *dout, const float *out,
                                                   const float *lse, int64_t lse_stride,
                                                   const float *q, const float *k, const float *v,
                                                   const int32_t *doc_start, int64_t nq,
                                                   int64_t nk, int64_t q0, int64_t k0,
                                                   int64_t nh, int64_t nkv, int64_t hd);

MT_CPU_HIDDEN void mt_cpu_moe_router_forward(float *probs, int32_t *idx, float *w,
                                             const float *bias, int64_t n, int64_t E, int64_t k,
                                             bool norm_topk);
MT_CPU_HIDDEN void mt_cpu_moe_prob_sums(double *sums, const float *probs, int64_t n, int64_t E);
MT_CPU_HIDDEN void mt_cpu_moe_router_backward(float *dlogits, const float *dw, const float *probs,
                                              const int32_t *idx, const float *w,
                                              const float *dp_all, int64_t n, int64_t E,
                                              int64_t k, bool norm_topk);
MT_CPU_HIDDEN void mt_cpu_moe_gather_rows(float *dst, const float *src, const int32_t *rows,
                                          int64_t n, int64_t width);
MT_CPU_HIDDEN void mt_cpu_moe_combine(float *out, const float *res, const float *y,
                                      const int32_t *slot_row, const float *w, int64_t n,
                                      int64_t k, int64_t width);
MT_CPU_HIDDEN void mt_cpu_moe_combine_backward(float *dw, float *dy, const float *dout,
                                               const float *y, const int32_t *slot_row,
                                               const float *w, int64_t n, int64_t k,
                                               int64_t width);

#endif
