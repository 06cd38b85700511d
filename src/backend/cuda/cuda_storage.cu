/* cuda_storage.cu: bf16 storage on the GPU, mt_backend_cuda_bf16_storage
 * (mt_backend.h's stores_bf16; doc/mixed-precision.md, "bf16 storage: the
 * plan"); the trainer takes it under MESHTRAIN_BF16_STORAGE=1
 * (src/train/train_device.c).
 *
 * The activation and weight arguments are bf16 bits.  The entries run the
 * rounding table's kernels instantiated on __nv_bfloat16 (the _bf16s
 * launchers): loads are exact, stores round, and the arithmetic is the
 * rounding table's, so each gives the rounding table's bits.  The GEMMs
 * are cuBLASLt's bf16 ones (fp32 accumulation), which sum in their own
 * order: bf16 tolerance against the rounding table's FAST_16BF GEMM, not
 * bits.  The float32 entries (sum_squares, scale, adamw, add_f32, the
 * conversions, copies, device memory, the router's forward and
 * probability sums) are the rounding table's.
 *
 * Attention runs the tensor-core kernels on bf16 tiles loaded straight
 * from bf16 bits for head dims 64 and 128 on sm_80 and up, and the
 * CUDA-core kernels on bf16 bits otherwise; the ring-attention blocks, the
 * vocabulary-parallel loss and the MoE rows are bf16 instantiations too.
 * tests/backend/cuda/test_cuda_bf16 checks every entry against the rounding table. */
#include "cuda_common.cuh"

#define ST (mt_cuda_ctx(__func__)->stream)
#define U16(p) ((uint16_t *)(p))
#define CU16(p) ((const uint16_t *)(p))

static void s_matmul(float *c, const float *a, const float *b, int64_t m, int64_t n, int64_t k,
                     bool ta, bool tb, float beta)
{
    mt_cuda_launch_matmul_bf16(ST, U16(c), CU16(a), CU16(b), m, n, k, ta, tb, beta);
}

static void s_matmul_add(float *c, const float *r, const float *a, const float *b, int64_t m,
                         int64_t n, int64_t k, bool ta, bool tb)
{
    mt_cuda_launch_matmul_bf16_add(ST, U16(c), CU16(r), CU16(a), CU16(b), m, n, k, ta, tb);
}

static void s_matmul_f32out(float *c, const float *a, const float *b, int64_t m, int64_t n,
                            int64_t k, bool ta, bool tb, float beta)
{
    mt_cuda_launch_matmul_bf16_f32out(ST, c, CU16(a), CU16(b), m, n, k, ta, tb, beta);
}

static void s_embedding_forward(float *out, const int32_t *tokens, const float *table,
                                int64_t n, int64_t dim)
{
    mt_cuda_launch_embedding_forward_bf16s(ST, U16(out), tokens, CU16(table), n, dim);
}

static void s_embedding_backward(float *dtable, const float *dout, const int32_t *tokens,
                                 int64_t n, int64_t dim)
{
    mt_cuda_launch_embedding_backward_bf16s(ST, dtable, CU16(dout), tokens, n, dim);
}

static void s_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t n,
                              int64_t dim, float eps)
{
    mt_cuda_launch_rmsnorm_forward_bf16s(ST, U16(out), rstd, CU16(x), CU16(w), n, dim, eps);
}

static void s_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                               const float *w, const float *rstd, int64_t n, int64_t dim,
                               bool accumulate)
{
    mt_cuda_launch_rmsnorm_backward_bf16s(ST, U16(dx), dw, CU16(dout), CU16(x), CU16(w), rstd, n,
                                          dim, accumulate);
}

static void s_rmsnorm_rowsums(double *sums, const float *a, const float *b, const float *w,
                              int64_t n, int64_t dim)
{
    mt_cuda_launch_rmsnorm_rowsums_bf16s(ST, sums, CU16(a), CU16(b), CU16(w), n, dim);
}

static void s_rmsnorm_forward_sums(float *out, float *rstd, const float *x, const float *w,
                                   const double *sums, int64_t n, int64_t dim, int64_t full_dim,
                                   float eps)
{
    mt_cuda_launch_rmsnorm_forward_sums_bf16s(ST, U16(out), rstd, CU16(x), CU16(w), sums, n, dim,
                                              full_dim, eps);
}

static void s_rmsnorm_backward_sums(float *dx, float *dw, const float *dout, const float *x,
                                    const float *w, const float *rstd, const double *sums,
                                    int64_t n, int64_t dim, int64_t full_dim, bool accumulate)
{
    mt_cuda_launch_rmsnorm_backward_sums_bf16s(ST, U16(dx), dw, CU16(dout), CU16(x), CU16(w),
                                               rstd, sums, n, dim, full_dim, accumulate);
}

static void s_rope_forward(float *x, const int32_t *pos, int64_t n, int64_t nh, int64_t hd,
                           const double *inv_freq, double scale)
{
    mt_cuda_launch_rope_bf16s(ST, U16(x), pos, n, nh, hd, inv_freq, scale, 1.0);
}

static void s_rope_backward(float *x, const int32_t *pos, int64_t n, int64_t nh, int64_t hd,
                            const double *inv_freq, double scale)
{
    mt_cuda_launch_rope_bf16s(ST, U16(x), pos, n, nh, hd, inv_freq, scale, -1.0);
}

static void s_swiglu_forward(float *out, const float *gate, const float *up, int64_t n)
{
    mt_cuda_launch_swiglu_forward_bf16s(ST, U16(out), CU16(gate), CU16(up), n);
}

static void s_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, int64_t n)
{
    mt_cuda_launch_swiglu_backward_bf16s(ST, U16(dgate), U16(dup), CU16(dout), CU16(gate),
                                         CU16(up), n);
}

static void s_add(float *y, const float *x, int64_t n)
{
    mt_cuda_launch_add_bf16s(ST, U16(y), CU16(x), n);
}

static double s_cross_entropy(float *dlogits, const float *logits, const int32_t *targets,
                              int64_t n, int64_t V, int64_t v_valid, float grad_scale,
                              int64_t *count)
{
    return mt_cuda_cross_entropy_bf16(U16(dlogits), CU16(logits), targets, n, V, v_valid,
                                      grad_scale, count);
}

/* ring attention's blocks (context parallelism): out and the gradients
 * float32 sums */
static void s_attention_block_forward(float *out, float *lse, int64_t ls, const float *q,
                                      const float *k, const float *v, const int32_t *ds,
                                      int64_t nq, int64_t nk, int64_t q0, int64_t k0, int64_t nh,
                                      int64_t nkv, int64_t hd)
{
    mt_cuda_launch_attention_block_forward_bf16s(ST, out, lse, ls, CU16(q), CU16(k), CU16(v), ds,
                                                 nq, nk, q0, k0, nh, nkv, hd);
}

static void s_attention_block_backward(float *dq, float *dk, float *dv, const float *dout,
                                       const float *out, const float *lse, int64_t ls,
                                       const float *q, const float *k, const float *v,
                                       const int32_t *ds, int64_t nq, int64_t nk, int64_t q0,
                                       int64_t k0, int64_t nh, int64_t nkv, int64_t hd)
{
    mt_cuda_launch_attention_block_backward_bf16s(ST, dq, dk, dv, CU16(dout), CU16(out), lse, ls,
                                                  CU16(q), CU16(k), CU16(v), ds, nq, nk, q0, k0,
                                                  nh, nkv, hd);
}

/* the vocabulary-parallel loss (tensor parallelism) */
static void s_ce_shard_max(float *mx, const float *logits, int64_t n, int64_t V, int64_t v_valid)
{
    mt_cuda_launch_ce_shard_max_bf16s(ST, mx, CU16(logits), n, V, v_valid);
}

static void s_ce_shard_sum(double *z, double *ly, const float *logits, const int32_t *targets,
                           const float *mx, int64_t n, int64_t V, int64_t v_lo, int64_t v_valid)
{
    mt_cuda_launch_ce_shard_sum_bf16s(ST, z, ly, CU16(logits), targets, mx, n, V, v_lo, v_valid);
}

static double s_ce_shard_finish(float *dlogits, const float *logits, const int32_t *targets,
                                const float *mx, const double *z, const double *ly, int64_t n,
                                int64_t V, int64_t v_lo, int64_t v_valid, float grad_scale,
                                int64_t *count)
{
    return mt_cuda_ce_shard_finish_bf16(U16(dlogits), CU16(logits), targets, mx, z, ly, n, V,
                                        v_lo, v_valid, grad_scale, count);
}

static void s_adamw_bf16_copy(float *p, float *work, const float *g, float gscale, float *m,
                              float *v, int64_t n, float lr, float b1, float b2, float eps,
                              float wd, int64_t t)
{
    mt_cuda_launch_adamw(ST, p, U16(work), NULL, g, gscale, m, v, n, lr, b1, b2, eps, wd, t);
}

static void s_attention_forward(float *out, float *lse, const float *q, const float *k,
                                const float *v, const int32_t *doc_start, int64_t B, int64_t T,
                                int64_t nh, int64_t nkv, int64_t hd)
{
    mt_cuda_launch_attention_tc_forward_bf16s(ST, U16(out), lse, CU16(q), CU16(k), CU16(v),
                                              doc_start, B, T, nh, nkv, hd);
}

static void s_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                 const float *out, const float *lse, const float *q,
                                 const float *k, const float *v, const int32_t *doc_start,
                                 int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd)
{
    mt_cuda_launch_attention_tc_backward_bf16s(ST, U16(dq), U16(dk), U16(dv), CU16(dout),
                                               CU16(out), lse, CU16(q), CU16(k), CU16(v),
                                               doc_start, B, T, nh, nkv, hd);
}

/* the MoE rows (model_moe.c): the combine's sum and dw float32 */
static void s_moe_router_backward(float *dlogits, const float *dw, const float *probs,
                                  const int32_t *idx, const float *w, const float *dp_all,
                                  int64_t n, int64_t E, int64_t k, bool norm_topk)
{
    mt_cuda_launch_moe_router_backward_bf16s(ST, U16(dlogits), dw, probs, idx, w, dp_all, n, E, k,
                                             norm_topk);
}

static void s_moe_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t n,
                              int64_t width)
{
    mt_cuda_launch_moe_gather_rows_bf16s(ST, U16(dst), CU16(src), rows, n, width);
}

static void s_moe_combine(float *out, const float *res, const float *y, const int32_t *slot_row,
                          const float *w, int64_t n, int64_t k, int64_t width)
{
    mt_cuda_launch_moe_unpermute_bf16s(ST, out, CU16(res), CU16(y), slot_row, w, n, k, width);
}

static void s_moe_combine_backward(float *dw, float *dy, const float *dout, const float *y,
                                   const int32_t *slot_row, const float *w, int64_t n, int64_t k,
                                   int64_t width)
{
    mt_cuda_launch_moe_unpermute_backward_bf16s(ST, U16(dy), dw, CU16(dout), CU16(y), slot_row, w,
                                                n, k, width);
}

static mt_backend_t make_storage_table(void)
{
    mt_backend_t t = *mt_backend_cuda_bf16(); /* the float32 entries: the rounding table's */
    t.name = "cuda_bf16_storage";
    t.matmul = s_matmul;
    t.matmul_f32out = s_matmul_f32out;
    t.matmul_add = s_matmul_add;
    t.embedding_forward = s_embedding_forward;
    t.embedding_backward = s_embedding_backward;
    t.rmsnorm_forward = s_rmsnorm_forward;
    t.rmsnorm_backward = s_rmsnorm_backward;
    t.rmsnorm_rowsums = s_rmsnorm_rowsums;
    t.rmsnorm_forward_sums = s_rmsnorm_forward_sums;
    t.rmsnorm_backward_sums = s_rmsnorm_backward_sums;
    t.rope_forward = s_rope_forward;
    t.rope_backward = s_rope_backward;
    t.swiglu_forward = s_swiglu_forward;
    t.swiglu_backward = s_swiglu_backward;
    t.add = s_add;
    t.cross_entropy = s_cross_entropy;
    t.adamw_bf16_copy = s_adamw_bf16_copy;
    t.attention_forward = s_attention_forward;
    t.attention_backward = s_attention_backward;
    t.attention_block_forward = s_attention_block_forward;
    t.attention_block_backward = s_attention_block_backward;
    t.ce_shard_max = s_ce_shard_max;
    t.ce_shard_sum = s_ce_shard_sum;
    t.ce_shard_finish = s_ce_shard_finish;
    t.moe_router_backward = s_moe_router_backward;
    t.moe_gather_rows = s_moe_gather_rows;
    t.moe_combine = s_moe_combine;
    t.moe_combine_backward = s_moe_combine_backward;
    t.rounds_bf16 = t.reads_bf16 = t.stores_bf16 = true;
    return t;
}

extern "C" const mt_backend_t *mt_backend_cuda_bf16_storage(void)
{
    static const mt_backend_t table = make_storage_table();
    return &table;
}
