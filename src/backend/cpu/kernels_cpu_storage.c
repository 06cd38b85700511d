/* kernels_cpu_storage.c: bf16 storage on the CPU (mt_backend_cpu_bf16_storage,
 * mt_backend.h's stores_bf16).
 *
 * Every entry widens its bf16 arguments (uint16_t bits behind the float
 * pointers) into float32 scratch, runs the CPU rounding table's entry
 * (mt_backend_cpu_bf16) on the scratch and narrows its bf16 outputs back.
 * Widening is exact, and the rounding table's outputs are bf16 values, so
 * narrowing them is exact too; where the rounding table leaves the
 * rounding to a pass of the model's (matmul, add, the router's logits
 * gradient), narrowing is that pass.  So this table computes the rounding
 * table's bits by construction: the reference that the model's bf16
 * storage and the GPU's bf16-storage kernels are checked against
 * (doc/mixed-precision.md, "bf16 storage: the plan").  It is not a fast
 * path.  The scratch is eight grow-only buffers kept for the process, the
 * one exception to "kernels never allocate"; one host thread calls the
 * backend at a time, as everywhere. */
#include <stdlib.h>
#include <string.h>

#include "kernels_cpu_internal.h"
#include "mt_backend.h"

#define SLOTS 8

static const mt_backend_t *in; /* the rounding table */
static float *slot_mem[SLOTS];
static size_t slot_cap[SLOTS];

/* scratch slot s, at least n floats */
static float *scratch(int s, int64_t n)
{
    size_t want = (size_t)(n > 0 ? n : 1);
    if (want > slot_cap[s]) {
        float *p = realloc(slot_mem[s], sizeof(float) * want);
        MT_CPU_REQUIRE(p != NULL, "bf16 storage", "out of memory for %lld floats of scratch",
                       (long long)n);
        slot_mem[s] = p, slot_cap[s] = want;
    }
    return slot_mem[s];
}

/* slot s holding the widened n elements of bf16 bits at p (NULL: NULL) */
static float *widen(int s, const float *p, int64_t n)
{
    if (!p)
        return NULL;
    float *w = scratch(s, n);
    in->from_bf16(w, (const uint16_t *)p, n);
    return w;
}

/* n float32 values into bf16 bits at p, rounded (exact on bf16 values) */
static void narrow(float *p, const float *f, int64_t n)
{
    in->to_bf16((uint16_t *)p, f, n);
}

/* ------------------------------------------------------------ GEMMs */

static void s_matmul(float *c, const float *a, const float *b, int64_t m, int64_t n, int64_t k,
                     bool ta, bool tb, float beta)
{
    float *fc = beta != 0.0f ? widen(2, c, m * n) : scratch(2, m * n);
    in->matmul(fc, widen(0, a, m * k), widen(1, b, k * n), m, n, k, ta, tb, beta);
    narrow(c, fc, m * n);
}

/* c = r + op(a) op(b) on bf16 bits: r's bits into c, then beta 1 */
static void s_matmul_add(float *c, const float *r, const float *a, const float *b, int64_t m,
                         int64_t n, int64_t k, bool ta, bool tb)
{
    mt_cpu_matmul_add_by(s_matmul, sizeof(uint16_t), c, r, a, b, m, n, k, ta, tb);
}

static void s_matmul_f32out(float *c, const float *a, const float *b, int64_t m, int64_t n,
                            int64_t k, bool ta, bool tb, float beta)
{
    in->matmul(c, widen(0, a, m * k), widen(1, b, k * n), m, n, k, ta, tb, beta);
}

/* ------------------------------------------------------------ embedding */

static void s_embedding_forward(float *out, const int32_t *tokens, const float *table,
                                int64_t n, int64_t dim)
{
    /* rows of bf16 bits: the rounding table copies the rows' values */
    uint16_t *o = (uint16_t *)out;
    const uint16_t *t = (const uint16_t *)table;
    for (int64_t i = 0; i < n; i++) {
        MT_CPU_REQUIRE(tokens[i] >= -1, "embedding_forward", "tokens[%lld] = %d",
                       (long long)i, tokens[i]);
        if (tokens[i] < 0)
            memset(o + i * dim, 0, sizeof(uint16_t) * (size_t)dim);
        else
            memcpy(o + i * dim, t + (int64_t)tokens[i] * dim, sizeof(uint16_t) * (size_t)dim);
    }
}

static void s_embedding_backward(float *dtable, const float *dout, const int32_t *tokens,
                                 int64_t n, int64_t dim)
{
    in->embedding_backward(dtable, widen(0, dout, n * dim), tokens, n, dim);
}

/* ------------------------------------------------------------ RMSNorm, RoPE */

static void s_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t n,
                              int64_t dim, float eps)
{
    float *fo = scratch(2, n * dim);
    in->rmsnorm_forward(fo, rstd, widen(0, x, n * dim), widen(1, w, dim), n, dim, eps);
    narrow(out, fo, n * dim);
}

static void s_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                               const float *w, const float *rstd, int64_t n, int64_t dim,
                               bool accumulate)
{
    float *fdx = accumulate ? widen(3, dx, n * dim) : scratch(3, n * dim);
    in->rmsnorm_backward(fdx, dw, widen(0, dout, n * dim), widen(1, x, n * dim),
                         widen(2, w, dim), rstd, n, dim, accumulate);
    narrow(dx, fdx, n * dim);
}

static void s_rmsnorm_rowsums(double *sums, const float *a, const float *b, const float *w,
                              int64_t n, int64_t dim)
{
    in->rmsnorm_rowsums(sums, widen(0, a, n * dim), widen(1, b, n * dim), w ? widen(2, w, dim) : NULL,
                        n, dim);
}

static void s_rmsnorm_forward_sums(float *out, float *rstd, const float *x, const float *w,
                                   const double *sums, int64_t n, int64_t dim, int64_t full_dim,
                                   float eps)
{
    float *fo = scratch(2, n * dim);
    in->rmsnorm_forward_sums(fo, rstd, widen(0, x, n * dim), widen(1, w, dim), sums, n, dim,
                             full_dim, eps);
    narrow(out, fo, n * dim);
}

static void s_rmsnorm_backward_sums(float *dx, float *dw, const float *dout, const float *x,
                                    const float *w, const float *rstd, const double *sums,
                                    int64_t n, int64_t dim, int64_t full_dim, bool accumulate)
{
    float *fdx = accumulate ? widen(3, dx, n * dim) : scratch(3, n * dim);
    in->rmsnorm_backward_sums(fdx, dw, widen(0, dout, n * dim), widen(1, x, n * dim),
                              widen(2, w, dim), rstd, sums, n, dim, full_dim, accumulate);
    narrow(dx, fdx, n * dim);
}

static void s_rope_forward(float *x, const int32_t *pos, int64_t n, int64_t nh, int64_t hd,
                           const double *inv_freq, double scale)
{
    float *fx = widen(0, x, n * nh * hd);
    in->rope_forward(fx, pos, n, nh, hd, inv_freq, scale);
    narrow(x, fx, n * nh * hd);
}

static void s_rope_backward(float *x, const int32_t *pos, int64_t n, int64_t nh, int64_t hd,
                            const double *inv_freq, double scale)
{
    float *fx = widen(0, x, n * nh * hd);
    in->rope_backward(fx, pos, n, nh, hd, inv_freq, scale);
    narrow(x, fx, n * nh * hd);
}

/* ------------------------------------------------------------ attention */

static void s_attention_forward(float *out, float *lse, const float *q, const float *k,
                                const float *v, const int32_t *ds, int64_t B, int64_t T,
                                int64_t nh, int64_t nkv, int64_t hd)
{
    int64_t nq = B * T * nh * hd, nk = B * T * nkv * hd;
    float *fo = scratch(3, nq);
    in->attention_forward(fo, lse, widen(0, q, nq), widen(1, k, nk), widen(2, v, nk), ds, B, T,
                          nh, nkv, hd);
    narrow(out, fo, nq);
}

static void s_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                 const float *out, const float *lse, const float *q,
                                 const float *k, const float *v, const int32_t *ds, int64_t B,
                                 int64_t T, int64_t nh, int64_t nkv, int64_t hd)
{
    int64_t nq = B * T * nh * hd, nk = B * T * nkv * hd;
    float *fdq = scratch(5, nq), *fdk = scratch(6, nk), *fdv = scratch(7, nk);
    in->attention_backward(fdq, fdk, fdv, widen(0, dout, nq), widen(1, out, nq), lse,
                           widen(2, q, nq), widen(3, k, nk), widen(4, v, nk), ds, B, T, nh, nkv,
                           hd);
    narrow(dq, fdq, nq);
    narrow(dk, fdk, nk);
    narrow(dv, fdv, nk);
}

/* The ring attention's blocks: q, k, v (and in the backward dout and the
 * final out) bf16; out and lse of the running merge, and the dq, dk, dv
 * the blocks add into, float32 (mt_backend.h) */
static void s_attention_block_forward(float *out, float *lse, int64_t ls, const float *q,
                                      const float *k, const float *v, const int32_t *ds,
                                      int64_t nq, int64_t nk, int64_t q0, int64_t k0,
                                      int64_t nh, int64_t nkv, int64_t hd)
{
    in->attention_block_forward(out, lse, ls, widen(0, q, nq * nh * hd),
                                widen(1, k, nk * nkv * hd), widen(2, v, nk * nkv * hd), ds, nq,
                                nk, q0, k0, nh, nkv, hd);
}

static void s_attention_block_backward(float *dq, float *dk, float *dv, const float *dout,
                                       const float *out, const float *lse, int64_t ls,
                                       const float *q, const float *k, const float *v,
                                       const int32_t *ds, int64_t nq, int64_t nk, int64_t q0,
                                       int64_t k0, int64_t nh, int64_t nkv, int64_t hd)
{
    in->attention_block_backward(dq, dk, dv, widen(0, dout, nq * nh * hd),
                                 widen(1, out, nq * nh * hd), lse, ls, widen(2, q, nq * nh * hd),
                                 widen(3, k, nk * nkv * hd), widen(4, v, nk * nkv * hd), ds, nq,
                                 nk, q0, k0, nh, nkv, hd);
}

/* ------------------------------------------------------------ SwiGLU, add */

static void s_swiglu_forward(float *out, const float *gate, const float *up, int64_t n)
{
    float *fo = scratch(2, n);
    in->swiglu_forward(fo, widen(0, gate, n), widen(1, up, n), n);
    narrow(out, fo, n);
}

static void s_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, int64_t n)
{
    /* every input is widened before any output is narrowed: aliasing holds */
    float *fdg = scratch(3, n), *fdu = scratch(4, n);
    in->swiglu_backward(fdg, fdu, widen(0, dout, n), widen(1, gate, n), widen(2, up, n), n);
    narrow(dgate, fdg, n);
    narrow(dup, fdu, n);
}

static void s_add(float *y, const float *x, int64_t n)
{
    float *fy = widen(0, y, n);
    in->add(fy, widen(1, x, n), n);
    narrow(y, fy, n);
}

/* ------------------------------------------------------------ the loss */

static double s_cross_entropy(float *dlogits, const float *logits, const int32_t *targets,
                              int64_t n, int64_t V, int64_t v_valid, float grad_scale,
                              int64_t *count)
{
    float *fl = widen(0, logits, n * V);
    double r = in->cross_entropy(dlogits ? fl : NULL, fl, targets, n, V, v_valid, grad_scale,
                                 count);
    if (dlogits)
        narrow(dlogits, fl, n * V);
    return r;
}

static void s_ce_shard_max(float *mx, const float *logits, int64_t n, int64_t V, int64_t v_valid)
{
    in->ce_shard_max(mx, widen(0, logits, n * V), n, V, v_valid);
}

static void s_ce_shard_sum(double *z, double *ly, const float *logits, const int32_t *targets,
                           const float *mx, int64_t n, int64_t V, int64_t v_lo, int64_t v_valid)
{
    in->ce_shard_sum(z, ly, widen(0, logits, n * V), targets, mx, n, V, v_lo, v_valid);
}

static double s_ce_shard_finish(float *dlogits, const float *logits, const int32_t *targets,
                                const float *mx, const double *z, const double *ly, int64_t n,
                                int64_t V, int64_t v_lo, int64_t v_valid, float grad_scale,
                                int64_t *count)
{
    float *fl = widen(0, logits, n * V);
    double r = in->ce_shard_finish(dlogits ? fl : NULL, fl, targets, mx, z, ly, n, V, v_lo,
                                   v_valid, grad_scale, count);
    if (dlogits)
        narrow(dlogits, fl, n * V);
    return r;
}

/* ------------------------------------------------------------ MoE */

static void s_moe_router_backward(float *dlogits, const float *dw, const float *probs,
                                  const int32_t *idx, const float *w, const float *dp_all,
                                  int64_t n, int64_t E, int64_t k, bool norm_topk)
{
    float *fd = scratch(0, n * E);
    in->moe_router_backward(fd, dw, probs, idx, w, dp_all, n, E, k, norm_topk);
    narrow(dlogits, fd, n * E);
}

static void s_moe_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t n,
                              int64_t width)
{
    uint16_t *d = (uint16_t *)dst;
    const uint16_t *s = (const uint16_t *)src;
    for (int64_t i = 0; i < n; i++)
        memcpy(d + i * width, s + (int64_t)rows[i] * width, sizeof(uint16_t) * (size_t)width);
}

/* rows of y the slots name: 1 + the largest slot_row (0 if none) */
static int64_t slot_rows(const int32_t *slot_row, int64_t n)
{
    int64_t r = 0;
    for (int64_t i = 0; i < n; i++)
        if (slot_row[i] + (int64_t)1 > r)
            r = slot_row[i] + (int64_t)1;
    return r;
}

static void s_moe_combine(float *out, const float *res, const float *y, const int32_t *slot_row,
                          const float *w, int64_t n, int64_t k, int64_t width)
{
    int64_t ry = slot_rows(slot_row, n * k);
    in->moe_combine(out, widen(0, res, n * width), widen(1, y, ry * width), slot_row, w, n, k,
                    width);
}

static void s_moe_combine_backward(float *dw, float *dy, const float *dout, const float *y,
                                   const int32_t *slot_row, const float *w, int64_t n, int64_t k,
                                   int64_t width)
{
    int64_t ry = slot_rows(slot_row, n * k);
    float *fdy = scratch(2, ry * width);
    in->moe_combine_backward(dw, fdy, widen(0, dout, n * width), widen(1, y, ry * width),
                             slot_row, w, n, k, width);
    uint16_t *d = (uint16_t *)dy;
    for (int64_t i = 0; i < n * k; i++) /* only the rows the slots name are written */
        if (slot_row[i] >= 0)
            in->to_bf16(d + (int64_t)slot_row[i] * width, fdy + (int64_t)slot_row[i] * width,
                        width);
}

/* ------------------------------------------------------------ the optimizer */

static void s_adamw_bf16_copy(float *p, float *work, const float *g, float gscale, float *m,
                              float *v, int64_t n, float lr, float b1, float b2, float eps,
                              float wd, int64_t t)
{
    float *fw = scratch(0, n);
    in->adamw_bf16_copy(p, fw, g, gscale, m, v, n, lr, b1, b2, eps, wd, t);
    narrow(work, fw, n);
}

static mt_backend_t table;

const mt_backend_t *mt_backend_cpu_bf16_storage(void)
{
    if (!in) {
        in = mt_backend_cpu_bf16();
        table = *in; /* the float32 entries: the rounding table's */
        table.name = "cpu_bf16_storage";
        table.matmul = s_matmul;
        table.matmul_f32out = s_matmul_f32out;
        table.matmul_add = s_matmul_add;
        table.embedding_forward = s_embedding_forward;
        table.embedding_backward = s_embedding_backward;
        table.rmsnorm_forward = s_rmsnorm_forward;
        table.rmsnorm_backward = s_rmsnorm_backward;
        table.rmsnorm_rowsums = s_rmsnorm_rowsums;
        table.rmsnorm_forward_sums = s_rmsnorm_forward_sums;
        table.rmsnorm_backward_sums = s_rmsnorm_backward_sums;
        table.rope_forward = s_rope_forward;
        table.rope_backward = s_rope_backward;
        table.attention_forward = s_attention_forward;
        table.attention_backward = s_attention_backward;
        table.attention_block_forward = s_attention_block_forward;
        table.attention_block_backward = s_attention_block_backward;
        table.swiglu_forward = s_swiglu_forward;
        table.swiglu_backward = s_swiglu_backward;
        table.add = s_add;
        table.cross_entropy = s_cross_entropy;
        table.ce_shard_max = s_ce_shard_max;
        table.ce_shard_sum = s_ce_shard_sum;
        table.ce_shard_finish = s_ce_shard_finish;
        table.moe_router_backward = s_moe_router_backward;
        table.moe_gather_rows = s_moe_gather_rows;
        table.moe_combine = s_moe_combine;
        table.moe_combine_backward = s_moe_combine_backward;
        table.adamw_bf16_copy = s_adamw_bf16_copy;
        table.rounds_bf16 = table.reads_bf16 = table.stores_bf16 = true;
    }
    return &table;
}
