/* kernels_cpu.c: the CPU reference backend's table (mt_backend_cpu) and its
 * dense linear-algebra and optimizer kernels: matmul through CBLAS, add,
 * scale, sum_squares and AdamW.
 *
 * The other op families live beside it (kernels_cpu_norm.c, _rope.c,
 * _attention.c, _mlp.c, _loss.c).  This file does not choose BLAS threads:
 * OpenBLAS decides those itself (OPENBLAS_NUM_THREADS), and sgemm gives the
 * same bits for the same inputs and thread count.  Every other kernel here
 * gives the same bits at ANY OpenMP thread count. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "kernels_cpu_internal.h"

/* ------------------------------------------------------------------ matmul */

static void mt_cpu_matmul(float *c, const float *a, const float *b, int64_t m, int64_t n,
                          int64_t k, bool trans_a, bool trans_b, float beta)
{
    MT_CPU_REQUIRE(m >= 0 && n >= 0 && k >= 0, "matmul", "m=%lld n=%lld k=%lld", (long long)m,
                   (long long)n, (long long)k);
    MT_CPU_REQUIRE(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, "matmul",
                   "CBLAS takes int dims: m=%lld n=%lld k=%lld", (long long)m, (long long)n,
                   (long long)k);
    if (m == 0 || n == 0)
        return;
    if (k == 0) { /* op(A) @ op(B) is zero; CBLAS rejects lda = 0 here */
        for (int64_t i = 0; i < m * n; i++)
            c[i] = beta == 0.0f ? 0.0f : beta * c[i];
        return;
    }
    const int lda = (int)(trans_a ? m : k);
    const int ldb = (int)(trans_b ? k : n);
    /* Reference BLAS semantics: beta == 0 writes C without reading it, so
     * an uninitialised (even NaN) C is overwritten; test_kernels checks it. */
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a, lda, b, ldb,
                beta, c, (int)n);
}

/* c = r + op(a) op(b) (mt_backend_t.matmul_add): r into c, then beta 1 */
static void mt_cpu_matmul_add(float *c, const float *r, const float *a, const float *b,
                              int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b)
{
    mt_cpu_matmul_add_by(mt_cpu_matmul, sizeof(float), c, r, a, b, m, n, k, trans_a, trans_b);
}

/* ------------------------------------------------------------------ elementwise */

static void mt_cpu_add(float *restrict y, const float *restrict x, int64_t n)
{
#pragma omp parallel for simd schedule(static) if (n > MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        y[i] += x[i];
}

static void mt_cpu_scale(float *restrict x, float s, int64_t n)
{
#pragma omp parallel for simd schedule(static) if (n > MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        x[i] *= s;
}

/* The number of chunks depends on n only, never on the thread count, and
 * the chunk sums are added in chunk order: the result is the same at any
 * thread count. */
#define SUMSQ_CHUNK_MIN ((int64_t)1 << 14)
#define SUMSQ_MAX_CHUNKS 256

static double mt_cpu_sum_squares(const float *restrict x, int64_t n)
{
    MT_CPU_REQUIRE(n >= 0, "sum_squares", "n=%lld", (long long)n);
    int64_t nchunks = (n + SUMSQ_CHUNK_MIN - 1) / SUMSQ_CHUNK_MIN;
    if (nchunks > SUMSQ_MAX_CHUNKS)
        nchunks = SUMSQ_MAX_CHUNKS;
    if (nchunks < 1)
        nchunks = 1;
    double partial[SUMSQ_MAX_CHUNKS];

#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (int64_t ch = 0; ch < nchunks; ch++) {
        const int64_t lo = n / nchunks * ch + (ch < n % nchunks ? ch : n % nchunks);
        const int64_t hi = lo + n / nchunks + (ch < n % nchunks ? 1 : 0);
        partial[ch] = mt_cpu_dot_f64(x + lo, NULL, hi - lo);
    }
    double total = 0.0;
    for (int64_t ch = 0; ch < nchunks; ch++)
        total += partial[ch];
    return total;
}

/* ------------------------------------------------------------------ AdamW */

/* The update loop; STORE_WORK runs after p[i] = pn (twice below: with
 * the compute copy's store and without, so plain AdamW carries none of
 * its work). */
#define ADAMW_LOOP(STORE_WORK)                                                         \
    _Pragma("omp parallel for simd schedule(static) if (n > MT_CPU_PAR_MIN)")         \
    for (int64_t i = 0; i < n; i++) {                                                 \
        const float gi = g[i] * gscale;                                               \
        const float mi = b1 * m[i] + one_b1 * gi;                                     \
        const float vi = b2 * v[i] + one_b2 * (gi * gi);                              \
        m[i] = mi;                                                                    \
        v[i] = vi;                                                                    \
        const float denom = sqrtf(vi) * inv_sqrt_bc2 + eps;                           \
        const float pi = p[i];                                                        \
        const float pn = pi - decay * pi - step * (mi / denom);                       \
        p[i] = pn;                                                                    \
        STORE_WORK;                                                                   \
    }

/* work NULL: plain AdamW; else also work[i] = bf16 value of the new p[i] */
static void cpu_adamw(float *restrict p, float *restrict work, const float *restrict g,
                      float gscale, float *restrict m, float *restrict v, int64_t n, float lr,
                      float b1, float b2, float eps, float wd, int64_t t)
{
    MT_CPU_REQUIRE(t >= 1, "adamw", "step t=%lld (steps count from 1)", (long long)t);
    /* Bias corrections in double: b2^t for b2 = 0.999 loses digits in
     * float after a few thousand steps. */
    const double bc1 = 1.0 - pow((double)b1, (double)t);
    const double bc2 = 1.0 - pow((double)b2, (double)t);
    const float step = (float)((double)lr / bc1);
    const float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    const float decay = lr * wd;
    const float one_b1 = 1.0f - b1, one_b2 = 1.0f - b2;
    if (work) {
        ADAMW_LOOP(work[i] = mt_cpu_bf16_if(pn, 1))
    } else {
        ADAMW_LOOP((void)0)
    }
}

static void mt_cpu_adamw(float *p, const float *g, float gscale, float *m, float *v, int64_t n,
                         float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    cpu_adamw(p, NULL, g, gscale, m, v, n, lr, b1, b2, eps, wd, t);
}

static void mt_cpu_adamw_bf16_copy(float *p, float *work, const float *g, float gscale, float *m,
                                   float *v, int64_t n, float lr, float b1, float b2, float eps,
                                   float wd, int64_t t)
{
    cpu_adamw(p, work, g, gscale, m, v, n, lr, b1, b2, eps, wd, t);
}

/* ------------------------------------------------------------------ memory, bf16 */

/* The CPU backend's memory is host memory: the moves are memcpy/memset. */
static void mt_cpu_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(dst, src, bytes);
}

static void mt_cpu_zero(void *dst, size_t bytes)
{
    if (bytes)
        memset(dst, 0, bytes);
}

static void mt_cpu_synchronize(void) {}

static void *mt_cpu_device_alloc(size_t bytes)
{
    return calloc(bytes ? bytes : 1, 1);
}

static void mt_cpu_device_free(void *p)
{
    free(p);
}

static void mt_cpu_round_bf16(float *x, int64_t n)
{
    MT_CPU_REQUIRE(n >= 0, "round_bf16", "n=%lld", (long long)n);
#pragma omp parallel for simd schedule(static) if (n > MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        x[i] = mt_cpu_bf16_if(x[i], 1);
}

static void mt_cpu_to_bf16(uint16_t *dst, const float *src, int64_t n)
{
    MT_CPU_REQUIRE(n >= 0, "to_bf16", "n=%lld", (long long)n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        dst[i] = mt_f32_to_bf16(src[i]);
}

static void mt_cpu_from_bf16(float *dst, const uint16_t *src, int64_t n)
{
    MT_CPU_REQUIRE(n >= 0, "from_bf16", "n=%lld", (long long)n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        dst[i] = mt_bf16_to_f32(src[i]);
}

/* Reference bf16 GEMM: fp32 products and sums in k order, one rounding
 * to bf16 at the end.  For tests and small shapes, not for speed. */
static void mt_cpu_matmul_bf16(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m,
                               int64_t n, int64_t k, bool trans_a, bool trans_b, float beta)
{
    MT_CPU_REQUIRE(m >= 0 && n >= 0 && k >= 0, "matmul_bf16", "m=%lld n=%lld k=%lld",
                   (long long)m, (long long)n, (long long)k);
#pragma omp parallel for schedule(static) if (m * n * k > MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int64_t p = 0; p < k; p++) {
                const float av = mt_bf16_to_f32(trans_a ? a[p * m + i] : a[i * k + p]);
                const float bv = mt_bf16_to_f32(trans_b ? b[j * k + p] : b[p * n + j]);
                acc += av * bv;
            }
            if (beta != 0.0f)
                acc += beta * mt_bf16_to_f32(c[i * n + j]);
            c[i * n + j] = mt_f32_to_bf16(acc);
        }
}

/* ------------------------------------------------------------------ tables */

/* The kernels that round in their stores on the rounding table, twice:
 * the plain table's entry (round false) and the rounding table's (true). */
#define MT_ARGS(...) __VA_ARGS__
#define ROUNDING_ENTRY(name, params, args)                                                   \
    static void cpu_##name params { mt_cpu_##name(MT_ARGS args, false); }                    \
    static void cpu_##name##_bf16 params { mt_cpu_##name(MT_ARGS args, true); }

ROUNDING_ENTRY(rmsnorm_forward, (float *out, float *rstd, const float *x, const float *w,
                                 int64_t n, int64_t dim, float eps),
               (out, rstd, x, w, n, dim, eps))
ROUNDING_ENTRY(rmsnorm_backward, (float *dx, float *dw, const float *dout, const float *x,
                                  const float *w, const float *rstd, int64_t n, int64_t dim,
                                  bool acc), (dx, dw, dout, x, w, rstd, n, dim, acc))
ROUNDING_ENTRY(rmsnorm_forward_sums, (float *out, float *rstd, const float *x, const float *w,
                                      const double *sums, int64_t n, int64_t dim,
                                      int64_t full_dim, float eps),
               (out, rstd, x, w, sums, n, dim, full_dim, eps))
ROUNDING_ENTRY(rmsnorm_backward_sums, (float *dx, float *dw, const float *dout, const float *x,
                                       const float *w, const float *rstd, const double *sums,
                                       int64_t n, int64_t dim, int64_t full_dim, bool acc),
               (dx, dw, dout, x, w, rstd, sums, n, dim, full_dim, acc))
ROUNDING_ENTRY(rope_forward, (float *x, const int32_t *pos, int64_t n, int64_t nh, int64_t hd,
                              const double *inv_freq, double scale),
               (x, pos, n, nh, hd, inv_freq, scale))
ROUNDING_ENTRY(rope_backward, (float *dx, const int32_t *pos, int64_t n, int64_t nh, int64_t hd,
                               const double *inv_freq, double scale),
               (dx, pos, n, nh, hd, inv_freq, scale))
/* SwiGLU (its expf) and attention (T^2 per row) are compute-bound on the
 * CPU: the rounding's integer work inside their loops costs more than a
 * vectorised pass over the outputs after them (swiglu_forward 1.06 ->
 * 1.65 ms in the store against 0.17 ms for the pass, 1.4M elements, 2
 * threads, SSE2), so these entries round in a pass of their own. */
static void cpu_swiglu_forward_bf16(float *out, const float *gate, const float *up, int64_t n)
{
    mt_cpu_swiglu_forward(out, gate, up, n);
    mt_cpu_round_bf16(out, n);
}

static void cpu_swiglu_backward_bf16(float *dgate, float *dup, const float *dout,
                                     const float *gate, const float *up, int64_t n)
{
    mt_cpu_swiglu_backward(dgate, dup, dout, gate, up, n);
    mt_cpu_round_bf16(dgate, n);
    mt_cpu_round_bf16(dup, n);
}

static void cpu_attention_forward_bf16(float *out, float *lse, const float *q, const float *k,
                                       const float *v, const int32_t *doc_start, int64_t B,
                                       int64_t T, int64_t nh, int64_t nkv, int64_t hd)
{
    mt_cpu_attention_forward(out, lse, q, k, v, doc_start, B, T, nh, nkv, hd);
    mt_cpu_round_bf16(out, B * T * nh * hd);
}

static void cpu_attention_backward_bf16(float *dq, float *dk, float *dv, const float *dout,
                                        const float *out, const float *lse, const float *q,
                                        const float *k, const float *v, const int32_t *doc_start,
                                        int64_t B, int64_t T, int64_t nh, int64_t nkv,
                                        int64_t hd)
{
    mt_cpu_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, doc_start, B, T, nh, nkv, hd);
    mt_cpu_round_bf16(dq, B * T * nh * hd);
    mt_cpu_round_bf16(dk, B * T * nkv * hd);
    mt_cpu_round_bf16(dv, B * T * nkv * hd);
}

/* Cross-entropy reads its logits as bf16 values and writes bf16-valued
 * gradients on the rounding table.  On the CPU the loss is compute-bound
 * (one exp per logit) like SwiGLU, so these round in passes: the logits
 * in place first (the caller's buffer is left holding the bf16 values,
 * which the contract allows), dlogits after. */
static float *round_logits(const float *logits, int64_t n)
{
    float *l = (float *)(uintptr_t)logits;
    mt_cpu_round_bf16(l, n);
    return l;
}

static double cpu_cross_entropy_bf16(float *dlogits, const float *logits, const int32_t *targets,
                                     int64_t n, int64_t V, int64_t v_valid, float grad_scale,
                                     int64_t *count)
{
    const double loss = mt_cpu_cross_entropy(dlogits, round_logits(logits, n * V), targets, n, V,
                                              v_valid, grad_scale, count);
    if (dlogits)
        mt_cpu_round_bf16(dlogits, n * V);
    return loss;
}

static void cpu_ce_shard_max_bf16(float *mx, const float *logits, int64_t n, int64_t V,
                                  int64_t v_valid)
{
    mt_cpu_ce_shard_max(mx, round_logits(logits, n * V), n, V, v_valid);
}

static void cpu_ce_shard_sum_bf16(double *z, double *ly, const float *logits,
                                  const int32_t *targets, const float *mx, int64_t n, int64_t V,
                                  int64_t v_lo, int64_t v_valid)
{
    mt_cpu_ce_shard_sum(z, ly, round_logits(logits, n * V), targets, mx, n, V, v_lo, v_valid);
}

static double cpu_ce_shard_finish_bf16(float *dlogits, const float *logits,
                                       const int32_t *targets, const float *mx, const double *z,
                                       const double *ly, int64_t n, int64_t V, int64_t v_lo,
                                       int64_t v_valid, float grad_scale, int64_t *count)
{
    const double loss = mt_cpu_ce_shard_finish(dlogits, round_logits(logits, n * V), targets, mx,
                                               z, ly, n, V, v_lo, v_valid, grad_scale, count);
    if (dlogits)
        mt_cpu_round_bf16(dlogits, n * V);
    return loss;
}

/* every entry but the rounding ones, which each table names itself */
#define CPU_COMMON_ENTRIES                                                                   \
    .matmul = mt_cpu_matmul, .embedding_forward = mt_cpu_embedding_forward,                  \
    .embedding_backward = mt_cpu_embedding_backward, .add = mt_cpu_add,                      \
    .rmsnorm_rowsums = mt_cpu_rmsnorm_rowsums,                                               \
    .sum_squares = mt_cpu_sum_squares, .scale = mt_cpu_scale, .adamw = mt_cpu_adamw,         \
    .adamw_bf16_copy = mt_cpu_adamw_bf16_copy, .matmul_f32out = mt_cpu_matmul,               \
    .matmul_add = mt_cpu_matmul_add,                                                         \
    .add_f32 = mt_cpu_add,                                                                   \
    /* context parallelism */                                                                \
    .attention_block_forward = mt_cpu_attention_block_forward,                               \
    .attention_block_backward = mt_cpu_attention_block_backward,                             \
    .copy_to_device = mt_cpu_copy, .copy_to_host = mt_cpu_copy, .copy = mt_cpu_copy,         \
    .zero = mt_cpu_zero, .synchronize = mt_cpu_synchronize, .matmul_bf16 = mt_cpu_matmul_bf16, \
    .round_bf16 = mt_cpu_round_bf16, .to_bf16 = mt_cpu_to_bf16, .from_bf16 = mt_cpu_from_bf16, \
    .moe_router_forward = mt_cpu_moe_router_forward,                                         \
    .moe_router_backward = mt_cpu_moe_router_backward,                                       \
    .moe_prob_sums = mt_cpu_moe_prob_sums, .moe_gather_rows = mt_cpu_moe_gather_rows,        \
    .moe_combine = mt_cpu_moe_combine, .moe_combine_backward = mt_cpu_moe_combine_backward,  \
    .device_alloc = mt_cpu_device_alloc, .device_free = mt_cpu_device_free, .host_memory = true

static const mt_backend_t mt_cpu_backend = {
    CPU_COMMON_ENTRIES,
    .name = "cpu",
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rmsnorm_forward_sums = cpu_rmsnorm_forward_sums,
    .rmsnorm_backward_sums = cpu_rmsnorm_backward_sums,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_forward = mt_cpu_attention_forward,
    .attention_backward = mt_cpu_attention_backward,
    .swiglu_forward = mt_cpu_swiglu_forward,
    .swiglu_backward = mt_cpu_swiglu_backward,
    .cross_entropy = mt_cpu_cross_entropy,
    .ce_shard_max = mt_cpu_ce_shard_max,
    .ce_shard_sum = mt_cpu_ce_shard_sum,
    .ce_shard_finish = mt_cpu_ce_shard_finish,
    .rounds_bf16 = false,
    .reads_bf16 = false,
};

static const mt_backend_t mt_cpu_bf16_backend = {
    CPU_COMMON_ENTRIES,
    .name = "cpu_bf16",
    .rmsnorm_forward = cpu_rmsnorm_forward_bf16,
    .rmsnorm_backward = cpu_rmsnorm_backward_bf16,
    .rmsnorm_forward_sums = cpu_rmsnorm_forward_sums_bf16,
    .rmsnorm_backward_sums = cpu_rmsnorm_backward_sums_bf16,
    .rope_forward = cpu_rope_forward_bf16,
    .rope_backward = cpu_rope_backward_bf16,
    .attention_forward = cpu_attention_forward_bf16,
    .attention_backward = cpu_attention_backward_bf16,
    .swiglu_forward = cpu_swiglu_forward_bf16,
    .swiglu_backward = cpu_swiglu_backward_bf16,
    .cross_entropy = cpu_cross_entropy_bf16,
    .ce_shard_max = cpu_ce_shard_max_bf16,
    .ce_shard_sum = cpu_ce_shard_sum_bf16,
    .ce_shard_finish = cpu_ce_shard_finish_bf16,
    .rounds_bf16 = true,
    .reads_bf16 = false, /* the model rounds GEMM outputs in passes (mt_backend.h) */
};

const mt_backend_t *mt_backend_cpu_bf16(void)
{
    return &mt_cpu_bf16_backend;
}

const mt_backend_t *mt_backend_cpu(void)
{
    return &mt_cpu_backend;
}
