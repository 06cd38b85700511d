/* cuda_backend.cu: the CUDA backend's mt_backend_t tables,
 * mt_backend_cuda() and the bf16-numerics one mt_backend_cuda_bf16(), the
 * public bf16 and MoE entry points of mt_cuda.h, and the backend's
 * teardown (mt_cuda_backend_free).
 *
 * The table's functions have the CPU backend's signatures, with device
 * pointers; they run the launchers of the cuda_*.cu files on the stream
 * of the context (cuda_context.cu).  Functions that return a value
 * (cross_entropy, ce_shard_finish, sum_squares) copy per-row or per-part
 * sums to the context's pinned host memory, wait for the stream and add
 * them in order on the host, so the result is the CPU's row-order sum of
 * the same terms.  It does not overlap anything: communication streams
 * live in nccl_comm.c. */
#include <string.h>

#include "cuda_common.cuh"

#define S (mt_cuda_ctx(__func__)->stream)

/* Everything the backend's files keep: the context, then the GEMMs'
 * cuBLASLt plans (their descriptors need no handle; the context's
 * teardown has drained the stream that used them). */
extern "C" void mt_cuda_backend_free(void)
{
    mt_cuda_context_free();
    mt_cuda_lt_plans_free();
}

/* ------------------------------------------------------------------ table */

static void t_matmul(float *c, const float *a, const float *b, int64_t m, int64_t n, int64_t k,
                     bool ta, bool tb, float beta)
{
    mt_cuda_launch_matmul(S, c, a, b, m, n, k, ta, tb, beta);
}

/* c = r + op(a) op(b) through mm (the table's matmul): r into c on the
 * stream, then beta 1 (mt_backend_t.matmul_add) */
static void matmul_add_copying(void (*mm)(float *, const float *, const float *, int64_t,
                                          int64_t, int64_t, bool, bool, float),
                               float *c, const float *r, const float *a, const float *b,
                               int64_t m, int64_t n, int64_t k, bool ta, bool tb)
{
    if (c != r && m > 0 && n > 0)
        MT_CUDA_CHECK(cudaMemcpyAsync(c, r, sizeof(float) * (size_t)(m * n),
                                      cudaMemcpyDeviceToDevice, S));
    mm(c, a, b, m, n, k, ta, tb, 1.0f);
}

static void t_matmul_add(float *c, const float *r, const float *a, const float *b, int64_t m,
                         int64_t n, int64_t k, bool ta, bool tb)
{
    matmul_add_copying(t_matmul, c, r, a, b, m, n, k, ta, tb);
}

static void t_embedding_forward(float *out, const int32_t *tokens, const float *table,
                                int64_t n_tokens, int64_t dim)
{
    mt_cuda_launch_embedding_forward(S, out, tokens, table, n_tokens, dim);
}

static void t_embedding_backward(float *dtable, const float *dout, const int32_t *tokens,
                                 int64_t n_tokens, int64_t dim)
{
    mt_cuda_launch_embedding_backward(S, dtable, dout, tokens, n_tokens, dim);
}

/* The entries that round their outputs on the bf16 table, and read their
 * activation inputs as bf16 values there (mt_backend_t.rounds_bf16,
 * reads_bf16), twice: the cuda table's (round false) and the bf16
 * table's (true). */
#define MT_ARGS(...) __VA_ARGS__
#define ROUNDING_ENTRY(name, launch, params, args)                                           \
    static void t_##name params { launch(S, MT_ARGS args, false); }                          \
    static void t_##name##_bf16 params { launch(S, MT_ARGS args, true); }
/* the same for an entry that returns a value, through a host function */
#define ROUNDING_ENTRY_RET(name, ret, fn, params, args)                                      \
    static ret t_##name params { return fn(MT_ARGS args, false); }                           \
    static ret t_##name##_bf16 params { return fn(MT_ARGS args, true); }

ROUNDING_ENTRY(rmsnorm_forward, mt_cuda_launch_rmsnorm_forward,
               (float *out, float *rstd, const float *x, const float *w, int64_t n, int64_t dim,
                float eps), (out, rstd, x, w, n, dim, eps))
ROUNDING_ENTRY(rmsnorm_backward, mt_cuda_launch_rmsnorm_backward,
               (float *dx, float *dw, const float *dout, const float *x, const float *w,
                const float *rstd, int64_t n, int64_t dim, bool acc),
               (dx, dw, dout, x, w, rstd, n, dim, acc))
ROUNDING_ENTRY(rmsnorm_rowsums, mt_cuda_launch_rmsnorm_rowsums,
               (double *sums, const float *a, const float *b, const float *w, int64_t n,
                int64_t dim), (sums, a, b, w, n, dim))
ROUNDING_ENTRY(rmsnorm_forward_sums, mt_cuda_launch_rmsnorm_forward_sums,
               (float *out, float *rstd, const float *x, const float *w, const double *sums,
                int64_t n, int64_t dim, int64_t full_dim, float eps),
               (out, rstd, x, w, sums, n, dim, full_dim, eps))
ROUNDING_ENTRY(rmsnorm_backward_sums, mt_cuda_launch_rmsnorm_backward_sums,
               (float *dx, float *dw, const float *dout, const float *x, const float *w,
                const float *rstd, const double *sums, int64_t n, int64_t dim, int64_t full_dim,
                bool acc), (dx, dw, dout, x, w, rstd, sums, n, dim, full_dim, acc))
ROUNDING_ENTRY(rope_forward, mt_cuda_launch_rope,
               (float *x, const int32_t *pos, int64_t n, int64_t nh, int64_t hd,
                const double *inv_freq, double scale),
               (x, pos, n, nh, hd, inv_freq, scale, 1.0))
ROUNDING_ENTRY(rope_backward, mt_cuda_launch_rope,
               (float *dx, const int32_t *pos, int64_t n, int64_t nh, int64_t hd,
                const double *inv_freq, double scale),
               (dx, pos, n, nh, hd, inv_freq, scale, -1.0))
ROUNDING_ENTRY(swiglu_forward, mt_cuda_launch_swiglu_forward,
               (float *out, const float *gate, const float *up, int64_t n), (out, gate, up, n))
ROUNDING_ENTRY(swiglu_backward, mt_cuda_launch_swiglu_backward,
               (float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                int64_t n), (dgate, dup, dout, gate, up, n))

static void t_attention_forward(float *out, float *lse, const float *q, const float *k,
                                const float *v, const int32_t *doc_start, int64_t B, int64_t T,
                                int64_t nh, int64_t nkv, int64_t hd)
{
    mt_cuda_launch_attention_forward(S, out, lse, q, k, v, doc_start, B, T, nh, nkv, hd, false);
}

static void t_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                 const float *out, const float *lse, const float *q,
                                 const float *k, const float *v, const int32_t *doc_start,
                                 int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd)
{
    mt_cuda_launch_attention_backward(S, dq, dk, dv, dout, out, lse, q, k, v, doc_start, B, T, nh,
                                      nkv, hd, false);
}

/* Copy the n row losses and targets back, wait, and add the non-ignored
 * rows in row order (the CPU's sum), onto `total`; *count gets their
 * number (added to what it holds when `add` is set). */
static double sum_rows_onto(const char *kernel, double total, const double *row_loss,
                            const int32_t *targets, int64_t n, int64_t *count, bool add)
{
    const size_t lb = (size_t)n * sizeof(double);
    cudaStream_t s = mt_cuda_ctx(kernel)->stream;
    char *h = mt_cuda_host(kernel, lb + (size_t)n * sizeof(int32_t));
    MT_CUDA_CHECK(cudaMemcpyAsync(h, row_loss, lb, cudaMemcpyDeviceToHost, s));
    MT_CUDA_CHECK(cudaMemcpyAsync(h + lb, targets, (size_t)n * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, s));
    MT_CUDA_CHECK(cudaStreamSynchronize(s));
    const double *loss = (const double *)h;
    const int32_t *tg = (const int32_t *)(h + lb);
    int64_t cnt = 0;
    for (int64_t i = 0; i < n; i++)
        if (tg[i] != -100) {
            total += loss[i];
            cnt++;
        }
    if (count)
        *count = add ? *count + cnt : cnt;
    return total;
}

static double sum_rows(const char *kernel, const double *row_loss, const int32_t *targets,
                       int64_t n, int64_t *count)
{
    return sum_rows_onto(kernel, 0.0, row_loss, targets, n, count, false);
}

/* cross-entropy and its shard passes; with round (the bf16 table) the
 * logits are read as bf16 values and dlogits written as bf16 values */
static double ce(float *dlogits, const float *logits, const int32_t *targets, int64_t n,
                 int64_t V, int64_t v_valid, float grad_scale, int64_t *count, bool round)
{
    double *rows = (double *)mt_cuda_scratch("cross_entropy", (size_t)n * sizeof(double));
    mt_cuda_launch_cross_entropy(S, dlogits, logits,
                                 round ? MT_CUDA_CE_F32_AS_BF16 : MT_CUDA_CE_F32, targets, n, V,
                                 v_valid, grad_scale, rows);
    return sum_rows("cross_entropy", rows, targets, n, count);
}

static double ce_finish(float *dlogits, const float *logits, const int32_t *targets,
                        const float *mx, const double *z, const double *ly, int64_t n, int64_t V,
                        int64_t v_lo, int64_t v_valid, float grad_scale, int64_t *count,
                        bool round)
{
    double *rows = (double *)mt_cuda_scratch("ce_shard_finish", (size_t)n * sizeof(double));
    mt_cuda_launch_ce_shard_finish(S, dlogits, logits, targets, mx, z, ly, n, V, v_lo, v_valid,
                                   grad_scale, rows, round);
    return sum_rows("ce_shard_finish", rows, targets, n, count);
}

ROUNDING_ENTRY_RET(cross_entropy, double, ce,
                   (float *dlogits, const float *logits, const int32_t *targets, int64_t n,
                    int64_t V, int64_t v_valid, float grad_scale, int64_t *count),
                   (dlogits, logits, targets, n, V, v_valid, grad_scale, count))
ROUNDING_ENTRY(ce_shard_max, mt_cuda_launch_ce_shard_max,
               (float *mx, const float *logits, int64_t n, int64_t V, int64_t v_valid),
               (mx, logits, n, V, v_valid))
ROUNDING_ENTRY(ce_shard_sum, mt_cuda_launch_ce_shard_sum,
               (double *z, double *ly, const float *logits, const int32_t *targets,
                const float *mx, int64_t n, int64_t V, int64_t v_lo, int64_t v_valid),
               (z, ly, logits, targets, mx, n, V, v_lo, v_valid))
ROUNDING_ENTRY_RET(ce_shard_finish, double, ce_finish,
                   (float *dlogits, const float *logits, const int32_t *targets, const float *mx,
                    const double *z, const double *ly, int64_t n, int64_t V, int64_t v_lo,
                    int64_t v_valid, float grad_scale, int64_t *count),
                   (dlogits, logits, targets, mx, z, ly, n, V, v_lo, v_valid, grad_scale, count))

static void t_add(float *y, const float *x, int64_t n) { mt_cuda_launch_add(S, y, x, n); }

static double t_sum_squares(const float *x, int64_t n)
{
    const size_t bytes = MT_CUDA_SUMSQ_PARTS * sizeof(double);
    double *part = (double *)mt_cuda_scratch("sum_squares", bytes);
    cudaStream_t s = S;
    mt_cuda_launch_sum_squares(s, part, x, n);
    double *h = (double *)mt_cuda_host("sum_squares", bytes);
    MT_CUDA_CHECK(cudaMemcpyAsync(h, part, bytes, cudaMemcpyDeviceToHost, s));
    MT_CUDA_CHECK(cudaStreamSynchronize(s));
    double total = 0.0;
    for (int i = 0; i < MT_CUDA_SUMSQ_PARTS; i++)
        total += h[i];
    return total;
}

static void t_scale(float *x, float s, int64_t n) { mt_cuda_launch_scale(S, x, s, n); }
static void t_round_bf16(float *x, int64_t n) { mt_cuda_launch_round_bf16(S, x, n); }
static void t_to_bf16(uint16_t *dst, const float *src, int64_t n)
{
    mt_cuda_launch_convert(S, dst, src, n, true);
}
static void t_from_bf16(float *dst, const uint16_t *src, int64_t n)
{
    mt_cuda_launch_convert(S, dst, src, n, false);
}

static void t_adamw(float *p, const float *g, float gscale, float *m, float *v, int64_t n,
                    float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    mt_cuda_launch_adamw(S, p, NULL, NULL, g, gscale, m, v, n, lr, b1, b2, eps, wd, t);
}

static void t_adamw_bf16_copy(float *p, float *work, const float *g, float gscale, float *m,
                              float *v, int64_t n, float lr, float b1, float b2, float eps,
                              float wd, int64_t t)
{
    mt_cuda_launch_adamw(S, p, NULL, work, g, gscale, m, v, n, lr, b1, b2, eps, wd, t);
}

static void t_copy_to_device(void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    cudaStream_t s = S;
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    MT_CUDA_CHECK(cudaStreamSynchronize(s));
}

static void t_copy_to_host(void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    cudaStream_t s = S;
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    MT_CUDA_CHECK(cudaStreamSynchronize(s));
}

/* Device to device: ordered with the kernels on the stream like one of
 * them, so the host does not wait (the residual copies of every layer,
 * pipeline hand-overs); no host memory is involved. */
static void t_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, S));
}

static void t_zero(void *dst, size_t bytes)
{
    if (bytes)
        MT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, S));
}

static void t_synchronize(void) { MT_CUDA_CHECK(cudaStreamSynchronize(S)); }

/* One cudaMalloc per call (the model makes few, large ones: doc/gpu.md),
 * zeroed in order with the kernels on the backend's stream. */
static void *t_device_alloc(size_t bytes)
{
    cudaStream_t s = S;
    size_t size = 0, used = 0, peak = 0;
    mt_cuda_pool_stats(&size, &used, &peak);
    void *p = NULL;
    if (size > 0) { /* the trainer's pool: one cudaMalloc (mt_cuda_setup) */
        if (!(p = mt_cuda_pool_alloc(bytes)))
            return NULL;
    } else if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); /* not a sticky error: the caller reports NOMEM */
        return NULL;
    }
    if (bytes) {
        MT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s));
        MT_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    return p;
}

static void t_device_free(void *p)
{
    if (p && !mt_cuda_pool_free(p)) /* the pool waits for the stream itself */
        MT_CUDA_CHECK(cudaFree(p)); /* waits for the device, so for every kernel using p */
}

static void t_matmul_bf16(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                          int64_t k, bool ta, bool tb, float beta)
{
    mt_cuda_launch_matmul_bf16(S, c, a, b, m, n, k, ta, tb, beta);
}

static void t_attention_block_forward(float *out, float *lse, int64_t lse_stride,
                                      const float *q, const float *k, const float *v,
                                      const int32_t *doc_start, int64_t nq, int64_t nk,
                                      int64_t q0, int64_t k0, int64_t nh, int64_t nkv, int64_t hd)
{
    mt_cuda_launch_attention_block_forward(S, out, lse, lse_stride, q, k, v, doc_start, nq, nk,
                                           q0, k0, nh, nkv, hd);
}

static void t_attention_block_backward(float *dq, float *dk, float *dv, const float *dout,
                                       const float *out, const float *lse, int64_t lse_stride,
                                       const float *q, const float *k, const float *v,
                                       const int32_t *doc_start, int64_t nq, int64_t nk,
                                       int64_t q0, int64_t k0, int64_t nh, int64_t nkv,
                                       int64_t hd)
{
    mt_cuda_launch_attention_block_backward(S, dq, dk, dv, dout, out, lse, lse_stride, q, k, v,
                                            doc_start, nq, nk, q0, k0, nh, nkv, hd);
}

static void t_moe_router_forward(float *probs, int32_t *idx, float *w, const float *bias,
                                 int64_t n, int64_t E, int64_t k, bool norm_topk)
{
    mt_cuda_launch_moe_router_forward(S, probs, idx, w, bias, n, E, k, norm_topk);
}

static void t_moe_router_backward(float *dlogits, const float *dw, const float *probs,
                                  const int32_t *idx, const float *w, const float *dp_all,
                                  int64_t n, int64_t E, int64_t k, bool norm_topk)
{
    mt_cuda_launch_moe_router_backward(S, dlogits, dw, probs, idx, w, dp_all, n, E, k,
                                       norm_topk);
}

static void t_moe_prob_sums(double *sums, const float *probs, int64_t n, int64_t E)
{
    mt_cuda_launch_moe_prob_sums(S, sums, probs, n, E);
}

static void t_moe_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t n,
                              int64_t width)
{
    mt_cuda_launch_moe_gather_rows(S, dst, src, rows, n, width);
}

/* the unpermute kernels with a residual and dropped slots (slot_row -1) */
static void t_moe_combine(float *out, const float *res, const float *y, const int32_t *slot_row,
                          const float *w, int64_t n, int64_t k, int64_t width)
{
    mt_cuda_launch_moe_unpermute(S, out, res, y, slot_row, w, n, k, width);
}

static void t_moe_combine_backward(float *dw, float *dy, const float *dout, const float *y,
                                   const int32_t *slot_row, const float *w, int64_t n, int64_t k,
                                   int64_t width)
{
    mt_cuda_launch_moe_unpermute_backward(S, dy, dw, dout, y, slot_row, w, n, k, width);
}

static mt_backend_t make_table(void)
{
    mt_backend_t t;
    memset(&t, 0, sizeof t);
    t.name = "cuda";
    t.matmul = t_matmul;
    t.matmul_f32out = t_matmul; /* float32 storage: matmul itself (mt_backend.h) */
    t.matmul_add = t_matmul_add;
    t.add_f32 = t_add; /* float32 storage: add itself */
    t.embedding_forward = t_embedding_forward;
    t.embedding_backward = t_embedding_backward;
    t.rmsnorm_forward = t_rmsnorm_forward;
    t.rmsnorm_backward = t_rmsnorm_backward;
    t.rmsnorm_rowsums = t_rmsnorm_rowsums;
    t.rmsnorm_forward_sums = t_rmsnorm_forward_sums;
    t.rmsnorm_backward_sums = t_rmsnorm_backward_sums;
    t.rope_forward = t_rope_forward;
    t.rope_backward = t_rope_backward;
    t.attention_forward = t_attention_forward;
    t.attention_backward = t_attention_backward;
    t.swiglu_forward = t_swiglu_forward;
    t.swiglu_backward = t_swiglu_backward;
    t.cross_entropy = t_cross_entropy;
    t.ce_shard_max = t_ce_shard_max;
    t.ce_shard_sum = t_ce_shard_sum;
    t.ce_shard_finish = t_ce_shard_finish;
    t.add = t_add;
    t.sum_squares = t_sum_squares;
    t.scale = t_scale;
    t.round_bf16 = t_round_bf16;
    t.to_bf16 = t_to_bf16;
    t.from_bf16 = t_from_bf16;
    t.adamw = t_adamw;
    t.adamw_bf16_copy = t_adamw_bf16_copy;
    t.copy_to_device = t_copy_to_device;
    t.copy_to_host = t_copy_to_host;
    t.copy = t_copy;
    t.zero = t_zero;
    t.synchronize = t_synchronize;
    t.matmul_bf16 = t_matmul_bf16;
    t.attention_block_forward = t_attention_block_forward;
    t.attention_block_backward = t_attention_block_backward;
    t.moe_router_forward = t_moe_router_forward;
    t.moe_router_backward = t_moe_router_backward;
    t.moe_prob_sums = t_moe_prob_sums;
    t.moe_gather_rows = t_moe_gather_rows;
    t.moe_combine = t_moe_combine;
    t.moe_combine_backward = t_moe_combine_backward;
    t.device_alloc = t_device_alloc;
    t.device_free = t_device_free;
    return t;
}

/* filled field by field (C++ has no designated initialisers before C++20),
 * so an entry another branch appends to mt_backend_t stays NULL here until
 * this file sets it */
static const mt_backend_t cuda_table = make_table();

extern "C" const mt_backend_t *mt_backend_cuda(void)
{
    return &cuda_table;
}

/* ------------------------------------------------------------------ bf16-numerics table */

static void t_matmul_fast_bf16(float *c, const float *a, const float *b, int64_t m, int64_t n,
                               int64_t k, bool ta, bool tb, float beta)
{
    mt_cuda_launch_matmul_fast_bf16(S, c, a, b, m, n, k, ta, tb, beta);
}

static void t_matmul_add_fast_bf16(float *c, const float *r, const float *a, const float *b,
                                   int64_t m, int64_t n, int64_t k, bool ta, bool tb)
{
    matmul_add_copying(t_matmul_fast_bf16, c, r, a, b, m, n, k, ta, tb);
}

static void t_attention_tc_forward(float *out, float *lse, const float *q, const float *k,
                                   const float *v, const int32_t *doc_start, int64_t B,
                                   int64_t T, int64_t nh, int64_t nkv, int64_t hd)
{
    mt_cuda_launch_attention_tc_forward(S, out, lse, q, k, v, doc_start, B, T, nh, nkv, hd, true);
}

static void t_attention_tc_backward(float *dq, float *dk, float *dv, const float *dout,
                                    const float *out, const float *lse, const float *q,
                                    const float *k, const float *v, const int32_t *doc_start,
                                    int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd)
{
    mt_cuda_launch_attention_tc_backward(S, dq, dk, dv, dout, out, lse, q, k, v, doc_start, B, T,
                                         nh, nkv, hd, true);
}

/* the cuda table (a copy, so it has every entry of the plain table)
 * with the GEMM and the attention on tensor cores, and the activations of
 * RMSNorm, RoPE, SwiGLU and attention rounded to bf16 in their kernels,
 * as they are stored and as they are loaded */
static mt_backend_t make_bf16_table(void)
{
    mt_backend_t t = make_table();
    t.name = "cuda_bf16";
    t.matmul = t_matmul_fast_bf16;
    t.matmul_f32out = t_matmul_fast_bf16;
    t.matmul_add = t_matmul_add_fast_bf16;
    t.attention_forward = t_attention_tc_forward;
    t.attention_backward = t_attention_tc_backward;
    t.rmsnorm_forward = t_rmsnorm_forward_bf16;
    t.rmsnorm_backward = t_rmsnorm_backward_bf16;
    t.rmsnorm_rowsums = t_rmsnorm_rowsums_bf16;
    t.rmsnorm_forward_sums = t_rmsnorm_forward_sums_bf16;
    t.rmsnorm_backward_sums = t_rmsnorm_backward_sums_bf16;
    t.rope_forward = t_rope_forward_bf16;
    t.rope_backward = t_rope_backward_bf16;
    t.swiglu_forward = t_swiglu_forward_bf16;
    t.swiglu_backward = t_swiglu_backward_bf16;
    t.cross_entropy = t_cross_entropy_bf16;
    t.ce_shard_max = t_ce_shard_max_bf16;
    t.ce_shard_sum = t_ce_shard_sum_bf16;
    t.ce_shard_finish = t_ce_shard_finish_bf16;
    t.rounds_bf16 = true;
    t.reads_bf16 = true; /* the same entries round their activation inputs as they load them */
    return t;
}

static const mt_backend_t cuda_bf16_table = make_bf16_table();

extern "C" const mt_backend_t *mt_backend_cuda_bf16(void)
{
    return &cuda_bf16_table;
}

/* ------------------------------------------------------------------ mt_cuda.h extras */

extern "C" void mt_cuda_attention_tc_forward(float *out, float *lse, const float *q,
                                             const float *k, const float *v,
                                             const int32_t *doc_start, int64_t B, int64_t T,
                                             int64_t nh, int64_t nkv, int64_t hd, bool round)
{
    mt_cuda_launch_attention_tc_forward(S, out, lse, q, k, v, doc_start, B, T, nh, nkv, hd,
                                        round);
}

extern "C" void mt_cuda_attention_tc_backward(float *dq, float *dk, float *dv, const float *dout,
                                              const float *out, const float *lse,
                                              const float *q, const float *k, const float *v,
                                              const int32_t *doc_start, int64_t B, int64_t T,
                                              int64_t nh, int64_t nkv, int64_t hd, bool round)
{
    mt_cuda_launch_attention_tc_backward(S, dq, dk, dv, dout, out, lse, q, k, v, doc_start, B, T,
                                         nh, nkv, hd, round);
}

extern "C" void mt_cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t n)
{
    t_to_bf16(dst, src, n);
}

extern "C" void mt_cuda_bf16_to_f32(float *dst, const uint16_t *src, int64_t n)
{
    t_from_bf16(dst, src, n);
}

extern "C" void mt_cuda_matmul_bf16(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m,
                                    int64_t n, int64_t k, bool trans_a, bool trans_b, float beta)
{
    mt_cuda_launch_matmul_bf16(S, c, a, b, m, n, k, trans_a, trans_b, beta);
}

extern "C" double mt_cuda_cross_entropy_bf16(uint16_t *dlogits, const uint16_t *logits,
                                             const int32_t *targets, int64_t n, int64_t V,
                                             int64_t v_valid, float grad_scale, int64_t *count)
{
    double *rows = (double *)mt_cuda_scratch("cross_entropy_bf16", (size_t)n * sizeof(double));
    mt_cuda_launch_cross_entropy(S, dlogits, logits, MT_CUDA_CE_BF16, targets, n, V, v_valid,
                                 grad_scale, rows);
    return sum_rows("cross_entropy_bf16", rows, targets, n, count);
}

/* the vocabulary-parallel loss's last pass on bf16 bits (bf16 storage) */
extern "C" double mt_cuda_ce_shard_finish_bf16(uint16_t *dlogits, const uint16_t *logits,
                                               const int32_t *targets, const float *mx,
                                               const double *z, const double *ly, int64_t n,
                                               int64_t V, int64_t v_lo, int64_t v_valid,
                                               float grad_scale, int64_t *count)
{
    double *rows = (double *)mt_cuda_scratch("ce_shard_finish_bf16", (size_t)n * sizeof(double));
    mt_cuda_launch_ce_shard_finish_bf16s(S, dlogits, logits, targets, mx, z, ly, n, V, v_lo,
                                         v_valid, grad_scale, rows);
    return sum_rows("ce_shard_finish_bf16", rows, targets, n, count);
}

extern "C" void mt_cuda_matmul_bf16_f32out(float *c, const uint16_t *a, const uint16_t *b,
                                           int64_t m, int64_t n, int64_t k, bool trans_a,
                                           bool trans_b, float beta)
{
    mt_cuda_launch_matmul_bf16_f32out(S, c, a, b, m, n, k, trans_a, trans_b, beta);
}

extern "C" double mt_cuda_lm_head_cross_entropy_bf16(uint16_t *dh, float *dW, const uint16_t *h,
                                                     const uint16_t *W, const int32_t *targets,
                                                     int64_t n, int64_t H, int64_t V,
                                                     int64_t v_valid, float grad_scale,
                                                     uint16_t *work, int64_t chunk_rows,
                                                     int64_t *count)
{
    MT_CUDA_REQUIRE(chunk_rows > 0 && n >= 0 && H > 0, "lm_head_cross_entropy_bf16",
                    "chunk_rows=%lld n=%lld H=%lld", (long long)chunk_rows, (long long)n,
                    (long long)H);
    cudaStream_t s = S;
    double *rows = (double *)mt_cuda_scratch("lm_head_cross_entropy_bf16",
                                             (size_t)chunk_rows * sizeof(double));
    const bool grad = dh || dW;
    double total = 0.0;
    if (count)
        *count = 0;
    for (int64_t r0 = 0; r0 < n; r0 += chunk_rows) {
        const int64_t c = n - r0 < chunk_rows ? n - r0 : chunk_rows;
        const uint16_t *hc = h + r0 * H;
        mt_cuda_launch_matmul_bf16(s, work, hc, W, c, V, H, false, true, 0.0f);
        mt_cuda_launch_cross_entropy(s, grad ? work : NULL, work, MT_CUDA_CE_BF16, targets + r0,
                                     c, V, v_valid, grad_scale, rows);
        if (dh)
            mt_cuda_launch_matmul_bf16(s, dh + r0 * H, work, W, c, H, V, false, false, 0.0f);
        if (dW)
            mt_cuda_launch_matmul_bf16_f32out(s, dW, work, hc, V, H, c, true, false, 1.0f);
        /* waits for the chunk: its row losses are read on the host */
        total = sum_rows_onto("lm_head_cross_entropy_bf16", total, rows, targets + r0, c, count,
                              true);
    }
    return total;
}

extern "C" void mt_cuda_adamw_mixed(float *p, uint16_t *p_bf16, const float *g, float *m,
                                    float *v, int64_t n, float lr, float b1, float b2, float eps,
                                    float wd, int64_t t)
{
    mt_cuda_launch_adamw(S, p, p_bf16, NULL, g, 1.0f, m, v, n, lr, b1, b2, eps, wd, t);
}

extern "C" void mt_cuda_moe_route(int32_t *pos, int32_t *offsets, const int32_t *expert,
                                  int64_t n_assign, int64_t n_experts)
{
    mt_cuda_launch_moe_route(S, pos, offsets, expert, n_assign, n_experts);
}

extern "C" void mt_cuda_moe_permute(float *out, const float *x, const int32_t *pos,
                                    int64_t n_tokens, int64_t top_k, int64_t dim)
{
    mt_cuda_launch_moe_permute(S, out, x, pos, n_tokens, top_k, dim);
}

extern "C" void mt_cuda_moe_unpermute(float *y, const float *e, const int32_t *pos,
                                      const float *w, int64_t n_tokens, int64_t top_k,
                                      int64_t dim)
{
    mt_cuda_launch_moe_unpermute(S, y, NULL, e, pos, w, n_tokens, top_k, dim);
}

extern "C" void mt_cuda_moe_unpermute_backward(float *de, float *dw, const float *dy,
                                               const float *e, const int32_t *pos,
                                               const float *w, int64_t n_tokens, int64_t top_k,
                                               int64_t dim)
{
    mt_cuda_launch_moe_unpermute_backward(S, de, dw, dy, e, pos, w, n_tokens, top_k, dim);
}
