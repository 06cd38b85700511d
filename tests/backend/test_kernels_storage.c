/* test_kernels_storage: bf16 storage on the CPU, mt_backend_cpu_bf16_storage
 * (mt_backend.h, stores_bf16; doc/mixed-precision.md, "bf16 storage: the
 * plan").
 *
 * Every entry, on bf16 bits, must give the bits of the CPU rounding table
 * (mt_backend_cpu_bf16) run on the same values in float32 storage: its
 * bf16 outputs are the rounding table's outputs as bf16 bits (rounded
 * where the rounding table leaves the rounding to the model's pass:
 * matmul, add, the router's logits gradient), and its float32 outputs
 * (rstd, lse, dw, the loss and its sums, matmul_f32out, the ring
 * attention's running merge and block sums, the combine's output and dw,
 * the optimizer's p, m, v) the rounding table's bits.  Covered: both GEMM
 * forms with every transpose and beta 0 and 1, the embedding (a token of
 * another vocabulary shard), RMSNorm (dx set and accumulated), RoPE,
 * attention plain and packed, the ring-attention blocks, SwiGLU (also in
 * place), add, the whole and the sharded loss (with and without the
 * gradient), the router's backward, row gathers, the combine with and
 * without residual and weights and with a dropped slot, and AdamW's
 * compute copy.  The entries that take float32 only are the rounding
 * table's own, and the table's flags say what it is.  No MPI. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mt_backend.h"
#include "mt_bf16.h"
#include "mt_test.h"

static const mt_backend_t *rt, *st; /* the rounding table, the storage table */

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float uniform(float lo, float hi)
{
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return lo + (hi - lo) * (float)((rng * 2685821657736338717ull) >> 40) / (float)(1 << 24);
}

/* n random bf16 values in [-scale, scale) as float32 */
static float *values(int64_t n, float scale)
{
    float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++)
        x[i] = mt_bf16_to_f32(mt_f32_to_bf16(uniform(-scale, scale)));
    return x;
}

static float *copy_of(const float *x, int64_t n)
{
    float *y = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    memcpy(y, x, sizeof(float) * (size_t)n);
    return y;
}

/* x's bf16 bits, in a buffer the storage table takes as float * */
static float *packed(const float *x, int64_t n)
{
    uint16_t *p = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++)
        p[i] = mt_f32_to_bf16(x[i]);
    return (float *)p;
}

/* the bf16 bits at got must be those of want (float32), rounded */
static void same16(const char *what, const float *got, const float *want, int64_t n)
{
    const uint16_t *g = (const uint16_t *)got;
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (g[i] != mt_f32_to_bf16(want[i]) && !(isnan(want[i]) && (g[i] & 0x7fffu) > 0x7f80u))
            bad++, first = first < 0 ? i : first;
    CHECK(bad == 0, "%s: %lld of %lld bf16 elements differ (first %lld)", what, (long long)bad,
          (long long)n, (long long)first);
}

static void same32(const char *what, const float *got, const float *want, int64_t n)
{
    CHECK(memcmp(got, want, sizeof(float) * (size_t)n) == 0, "%s: float32 bits differ", what);
}

static void test_matmul(void)
{
    const int64_t m = 7, n = 5, k = 9;
    for (int t = 0; t < 8; t++) {
        bool ta = t & 1, tb = t & 2;
        float beta = t & 4 ? 1.0f : 0.0f;
        float *a = values(m * k, 2), *b = values(k * n, 2), *c = values(m * n, 2);
        float *want = copy_of(c, m * n), *got = packed(c, m * n);
        rt->matmul(want, a, b, m, n, k, ta, tb, beta); /* then the model's pass: */
        rt->round_bf16(want, m * n);
        float *pa = packed(a, m * k), *pb = packed(b, k * n);
        st->matmul(got, pa, pb, m, n, k, ta, tb, beta);
        same16("matmul", got, want, m * n);
        /* float32 result: no rounding, C float32 */
        float *want32 = copy_of(c, m * n), *got32 = copy_of(c, m * n);
        rt->matmul(want32, a, b, m, n, k, ta, tb, beta);
        st->matmul_f32out(got32, pa, pb, m, n, k, ta, tb, beta);
        same32("matmul_f32out", got32, want32, m * n);
        free(a), free(b), free(c), free(want), free(got), free(pa), free(pb), free(want32),
            free(got32);
    }
}

static void test_embedding(void)
{
    const int64_t V = 11, dim = 6, n = 5;
    int32_t tok[5] = {3, -1, 10, 3, 0};
    float *table = values(V * dim, 1), *pt = packed(table, V * dim);
    float *want = values(n * dim, 1), *got = packed(want, n * dim);
    rt->embedding_forward(want, tok, table, n, dim);
    st->embedding_forward(got, tok, pt, n, dim);
    same16("embedding_forward", got, want, n * dim);
    float *dout = values(n * dim, 1), *pd = packed(dout, n * dim);
    float *dt1 = values(V * dim, 1), *dt2 = copy_of(dt1, V * dim);
    rt->embedding_backward(dt1, dout, tok, n, dim);
    st->embedding_backward(dt2, pd, tok, n, dim);
    same32("embedding_backward (dtable float32)", dt2, dt1, V * dim);
    free(table), free(pt), free(want), free(got), free(dout), free(pd), free(dt1), free(dt2);
}

static void test_rmsnorm(void)
{
    const int64_t n = 6, dim = 10;
    float *x = values(n * dim, 3), *w = values(dim, 1), *px = packed(x, n * dim),
          *pw = packed(w, dim);
    float *o1 = values(n * dim, 1), *o2 = packed(o1, n * dim), r1[6], r2[6];
    rt->rmsnorm_forward(o1, r1, x, w, n, dim, 1e-5f);
    st->rmsnorm_forward(o2, r2, px, pw, n, dim, 1e-5f);
    same16("rmsnorm_forward", o2, o1, n * dim);
    same32("rmsnorm_forward rstd", r2, r1, n);
    for (int acc = 0; acc < 2; acc++) {
        float *d = values(n * dim, 1), *pd = packed(d, n * dim);
        float *dx1 = values(n * dim, 1), *dx2 = packed(dx1, n * dim);
        float *dw1 = values(dim, 1), *dw2 = copy_of(dw1, dim);
        rt->rmsnorm_backward(dx1, dw1, d, x, w, r1, n, dim, acc);
        st->rmsnorm_backward(dx2, dw2, pd, px, pw, r1, n, dim, acc);
        same16(acc ? "rmsnorm_backward dx (accumulated)" : "rmsnorm_backward dx", dx2, dx1,
               n * dim);
        same32("rmsnorm_backward dw", dw2, dw1, dim);
        free(d), free(pd), free(dx1), free(dx2), free(dw1), free(dw2);
    }
    /* the row split across ranks: this part's sums, then the norm over a
     * row of 3 dim (the other parts' sums stand in as a multiple) */
    double s1[6], s2[6];
    rt->rmsnorm_rowsums(s1, x, x, NULL, n, dim);
    st->rmsnorm_rowsums(s2, px, px, NULL, n, dim);
    CHECK(memcmp(s1, s2, sizeof s1) == 0, "rmsnorm_rowsums differ on bf16 storage");
    for (int i = 0; i < 6; i++)
        s1[i] *= 3.0;
    rt->rmsnorm_forward_sums(o1, r1, x, w, s1, n, dim, 3 * dim, 1e-5f);
    st->rmsnorm_forward_sums(o2, r2, px, pw, s1, n, dim, 3 * dim, 1e-5f);
    same16("rmsnorm_forward_sums", o2, o1, n * dim);
    same32("rmsnorm_forward_sums rstd", r2, r1, n);
    float *d = values(n * dim, 1), *pd = packed(d, n * dim);
    rt->rmsnorm_rowsums(s1, d, x, w, n, dim);
    st->rmsnorm_rowsums(s2, pd, px, pw, n, dim);
    CHECK(memcmp(s1, s2, sizeof s1) == 0, "rmsnorm_rowsums with w differ on bf16 storage");
    float *dx1 = values(n * dim, 1), *dx2 = packed(dx1, n * dim);
    float *dw1 = values(dim, 1), *dw2 = copy_of(dw1, dim);
    rt->rmsnorm_backward_sums(dx1, dw1, d, x, w, r1, s1, n, dim, 3 * dim, true);
    st->rmsnorm_backward_sums(dx2, dw2, pd, px, pw, r1, s1, n, dim, 3 * dim, true);
    same16("rmsnorm_backward_sums dx (accumulated)", dx2, dx1, n * dim);
    same32("rmsnorm_backward_sums dw", dw2, dw1, dim);
    free(d), free(pd), free(dx1), free(dx2), free(dw1), free(dw2);
    free(x), free(w), free(px), free(pw), free(o1), free(o2);
}

static void test_rope(void)
{
    const int64_t n = 5, nh = 3, hd = 8;
    int32_t pos[5] = {0, 1, 7, 300, 4};
    /* a scaled table (the upper half divided by 4) and a scale */
    double inv[4];
    for (int i = 0; i < 4; i++)
        inv[i] = pow(10000.0, -2.0 * i / (double)hd) / (i < 2 ? 1.0 : 4.0);
    for (int back = 0; back < 2; back++) {
        float *x = values(n * nh * hd, 2), *px = packed(x, n * nh * hd);
        (back ? rt->rope_backward : rt->rope_forward)(x, pos, n, nh, hd, inv, 1.25);
        (back ? st->rope_backward : st->rope_forward)(px, pos, n, nh, hd, inv, 1.25);
        same16(back ? "rope_backward" : "rope_forward", px, x, n * nh * hd);
        free(x), free(px);
    }
}

static void test_attention(void)
{
    const int64_t B = 2, T = 6, nh = 4, nkv = 2, hd = 8, NQ = B * T * nh * hd,
                  NK = B * T * nkv * hd;
    int32_t ds[12] = {0, 0, 0, 3, 3, 5, 0, 1, 1, 1, 4, 4};
    for (int packing = 0; packing < 2; packing++) {
        const int32_t *d = packing ? ds : NULL;
        float *q = values(NQ, 1), *k = values(NK, 1), *v = values(NK, 1);
        float *pq = packed(q, NQ), *pk = packed(k, NK), *pv = packed(v, NK);
        float *o1 = values(NQ, 1), *o2 = packed(o1, NQ), *l1 = values(B * nh * T, 1),
              *l2 = values(B * nh * T, 1);
        rt->attention_forward(o1, l1, q, k, v, d, B, T, nh, nkv, hd);
        st->attention_forward(o2, l2, pq, pk, pv, d, B, T, nh, nkv, hd);
        same16("attention_forward out", o2, o1, NQ);
        same32("attention_forward lse", l2, l1, B * nh * T);
        float *dout = values(NQ, 1), *pdo = packed(dout, NQ);
        float *dq1 = values(NQ, 1), *dk1 = values(NK, 1), *dv1 = values(NK, 1);
        float *dq2 = packed(dq1, NQ), *dk2 = packed(dk1, NK), *dv2 = packed(dv1, NK);
        rt->attention_backward(dq1, dk1, dv1, dout, o1, l1, q, k, v, d, B, T, nh, nkv, hd);
        st->attention_backward(dq2, dk2, dv2, pdo, o2, l1, pq, pk, pv, d, B, T, nh, nkv, hd);
        same16("attention_backward dq", dq2, dq1, NQ);
        same16("attention_backward dk", dk2, dk1, NK);
        same16("attention_backward dv", dv2, dv1, NK);
        /* a ring block: queries 6..11 of row 0 against keys 0..5 */
        int64_t nq = 6, nk = 6, bq = nq * nh * hd, bk = nk * nkv * hd;
        float *bo1 = calloc((size_t)bq, sizeof(float)), *bo2 = calloc((size_t)bq, sizeof(float));
        float *bl1 = malloc(sizeof(float) * (size_t)(nh * nq)),
              *bl2 = malloc(sizeof(float) * (size_t)(nh * nq));
        for (int64_t i = 0; i < nh * nq; i++)
            bl1[i] = bl2[i] = -INFINITY;
        rt->attention_block_forward(bo1, bl1, nq, q, k, v, NULL, nq, nk, 6, 0, nh, nkv, hd);
        st->attention_block_forward(bo2, bl2, nq, pq, pk, pv, NULL, nq, nk, 6, 0, nh, nkv, hd);
        same32("attention_block_forward out (float32)", bo2, bo1, bq);
        same32("attention_block_forward lse", bl2, bl1, nh * nq);
        float *bdq1 = values(bq, 1), *bdk1 = values(bk, 1), *bdv1 = values(bk, 1);
        float *bdq2 = copy_of(bdq1, bq), *bdk2 = copy_of(bdk1, bk), *bdv2 = copy_of(bdv1, bk);
        rt->attention_block_backward(bdq1, bdk1, bdv1, dout, o1, bl1, nq, q, k, v, NULL, nq, nk,
                                     6, 0, nh, nkv, hd);
        st->attention_block_backward(bdq2, bdk2, bdv2, pdo, o2, bl1, nq, pq, pk, pv, NULL, nq,
                                     nk, 6, 0, nh, nkv, hd);
        same32("attention_block_backward dq (float32)", bdq2, bdq1, bq);
        same32("attention_block_backward dk", bdk2, bdk1, bk);
        same32("attention_block_backward dv", bdv2, bdv1, bk);
        free(q), free(k), free(v), free(pq), free(pk), free(pv), free(o1), free(o2), free(l1),
            free(l2), free(dout), free(pdo), free(dq1), free(dk1), free(dv1), free(dq2),
            free(dk2), free(dv2), free(bo1), free(bo2), free(bl1), free(bl2), free(bdq1),
            free(bdk1), free(bdv1), free(bdq2), free(bdk2), free(bdv2);
    }
}

static void test_swiglu_add(void)
{
    const int64_t n = 37;
    float *g = values(n, 4), *u = values(n, 4), *pg = packed(g, n), *pu = packed(u, n);
    float *o1 = values(n, 1), *o2 = packed(o1, n);
    rt->swiglu_forward(o1, g, u, n);
    st->swiglu_forward(o2, pg, pu, n);
    same16("swiglu_forward", o2, o1, n);
    float *d = values(n, 1), *pd = packed(d, n);
    float *dg1 = values(n, 1), *du1 = values(n, 1), *dg2 = packed(dg1, n), *du2 = packed(du1, n);
    rt->swiglu_backward(dg1, du1, d, g, u, n);
    st->swiglu_backward(dg2, du2, pd, pg, pu, n);
    same16("swiglu_backward dgate", dg2, dg1, n);
    same16("swiglu_backward dup", du2, du1, n);
    st->swiglu_backward(pg, pu, pd, pg, pu, n); /* in place, as the model calls it */
    same16("swiglu_backward dgate, in place", pg, dg1, n);
    same16("swiglu_backward dup, in place", pu, du1, n);
    float *y = values(n, 8), *x = values(n, 8), *py = packed(y, n), *px = packed(x, n);
    rt->add(y, x, n);
    rt->round_bf16(y, n);
    st->add(py, px, n);
    same16("add", py, y, n);
    free(g), free(u), free(pg), free(pu), free(o1), free(o2), free(d), free(pd), free(dg1),
        free(du1), free(dg2), free(du2), free(y), free(x), free(py), free(px);
}

static void test_loss(void)
{
    const int64_t n = 5, V = 13, vv = 11;
    int32_t tgt[5] = {2, -100, 10, 0, 7};
    float *l = values(n * V, 6), *pl = packed(l, n * V);
    int64_t c1, c2;
    float *dl1 = copy_of(l, n * V), *dl2 = packed(l, n * V);
    double r1 = rt->cross_entropy(dl1, l, tgt, n, V, vv, 0.25f, &c1);
    double r2 = st->cross_entropy(dl2, pl, tgt, n, V, vv, 0.25f, &c2);
    CHECK(r1 == r2 && c1 == c2, "cross_entropy: %.17g/%lld vs %.17g/%lld", r2, (long long)c2, r1,
          (long long)c1);
    same16("cross_entropy dlogits", dl2, dl1, n * V);
    double r3 = st->cross_entropy(NULL, pl, tgt, n, V, vv, 0.25f, &c2);
    CHECK(r3 == r1, "cross_entropy without the gradient: %.17g vs %.17g", r3, r1);
    st->cross_entropy(pl, pl, tgt, n, V, vv, 0.25f, &c2); /* in place */
    same16("cross_entropy dlogits, in place", pl, dl1, n * V);
    free(pl);
    pl = packed(l, n * V);
    /* a shard holding columns [4, 17), of which 7 are real */
    const int64_t v_lo = 4, sv = 7;
    float mx1[5], mx2[5];
    double z1[5], z2[5], ly1[5], ly2[5];
    float *l1 = copy_of(l, n * V);
    rt->ce_shard_max(mx1, l1, n, V, sv);
    st->ce_shard_max(mx2, pl, n, V, sv);
    same32("ce_shard_max", mx2, mx1, n);
    rt->ce_shard_sum(z1, ly1, l1, tgt, mx1, n, V, v_lo, sv);
    st->ce_shard_sum(z2, ly2, pl, tgt, mx1, n, V, v_lo, sv);
    CHECK(!memcmp(z1, z2, sizeof z1) && !memcmp(ly1, ly2, sizeof ly1), "ce_shard_sum differs");
    float *sd1 = copy_of(l, n * V), *sd2 = packed(l, n * V);
    r1 = rt->ce_shard_finish(sd1, l1, tgt, mx1, z1, ly1, n, V, v_lo, sv, 0.5f, &c1);
    r2 = st->ce_shard_finish(sd2, pl, tgt, mx1, z1, ly1, n, V, v_lo, sv, 0.5f, &c2);
    CHECK(r1 == r2 && c1 == c2, "ce_shard_finish: %.17g vs %.17g", r2, r1);
    same16("ce_shard_finish dlogits", sd2, sd1, n * V);
    free(l), free(pl), free(dl1), free(dl2), free(l1), free(sd1), free(sd2);
}

static void test_moe(void)
{
    const int64_t n = 4, E = 5, k = 2, width = 6, ny = 7;
    int32_t idx[8] = {0, 3, 1, 2, 4, 0, 2, 3};
    int32_t slot_row[8] = {0, 5, 2, -1, 6, 1, 3, 4}; /* one slot dropped */
    float *probs = values(n * E, 1), *w = values(n * k, 1), *dw = values(n * k, 1);
    float *dl1 = values(n * E, 1), *dl2 = packed(dl1, n * E);
    rt->moe_router_backward(dl1, dw, probs, idx, w, NULL, n, E, k, true);
    rt->round_bf16(dl1, n * E); /* the model's pass */
    st->moe_router_backward(dl2, dw, probs, idx, w, NULL, n, E, k, true);
    same16("moe_router_backward dlogits", dl2, dl1, n * E);
    float *src = values(ny * width, 2), *ps = packed(src, ny * width);
    int32_t rows[5] = {6, 0, 3, 3, 1};
    float *g1 = values(5 * width, 1), *g2 = packed(g1, 5 * width);
    rt->moe_gather_rows(g1, src, rows, 5, width);
    st->moe_gather_rows(g2, ps, rows, 5, width);
    same16("moe_gather_rows", g2, g1, 5 * width);
    float *res = values(n * width, 2), *pr = packed(res, n * width);
    for (int form = 0; form < 3; form++) { /* residual and weights, no residual, no weights */
        const float *r1 = form == 1 ? NULL : res, *r2 = form == 1 ? NULL : pr;
        const float *ww = form == 2 ? NULL : w;
        float o1[24], o2[24];
        rt->moe_combine(o1, r1, src, slot_row, ww, n, k, width);
        st->moe_combine(o2, r2, ps, slot_row, ww, n, k, width);
        same32("moe_combine out (float32)", o2, o1, n * width);
    }
    float *dout = values(n * width, 1), *pdo = packed(dout, n * width);
    float *dy1 = values(ny * width, 1), *dy2 = packed(dy1, ny * width);
    float cw1[8], cw2[8];
    rt->moe_combine_backward(cw1, dy1, dout, src, slot_row, w, n, k, width);
    st->moe_combine_backward(cw2, dy2, pdo, ps, slot_row, w, n, k, width);
    same32("moe_combine_backward dw", cw2, cw1, n * k);
    same16("moe_combine_backward dy (and the rows no slot names, untouched)", dy2, dy1,
           ny * width);
    free(probs), free(w), free(dw), free(dl1), free(dl2), free(src), free(ps), free(g1),
        free(g2), free(res), free(pr), free(dout), free(pdo), free(dy1), free(dy2);
}

static void test_adamw(void)
{
    const int64_t n = 29;
    float *p1 = values(n, 1), *g = values(n, 1), *m1 = values(n, 0.1f), *v1 = values(n, 0.1f);
    for (int64_t i = 0; i < n; i++)
        v1[i] = fabsf(v1[i]);
    float *p2 = copy_of(p1, n), *m2 = copy_of(m1, n), *v2 = copy_of(v1, n);
    float *w1 = values(n, 1), *w2 = packed(w1, n);
    rt->adamw_bf16_copy(p1, w1, g, 0.5f, m1, v1, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
    st->adamw_bf16_copy(p2, w2, g, 0.5f, m2, v2, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
    same32("adamw_bf16_copy p", p2, p1, n);
    same32("adamw_bf16_copy m", m2, m1, n);
    same32("adamw_bf16_copy v", v2, v1, n);
    same16("adamw_bf16_copy work (bf16 bits)", w2, w1, n);
    free(p1), free(g), free(m1), free(v1), free(p2), free(m2), free(v2), free(w1), free(w2);
}

static void test_table(void)
{
    CHECK(st->stores_bf16 && st->rounds_bf16 && st->reads_bf16, "flags");
    CHECK(!rt->stores_bf16 && !mt_backend_cpu()->stores_bf16, "float32 tables set stores_bf16");
    CHECK(!strcmp(st->name, "cpu_bf16_storage"), "name %s", st->name);
    CHECK(st == mt_backend_cpu_bf16_storage(), "one table");
    /* float32 only: the rounding table's own entries */
    CHECK(st->sum_squares == rt->sum_squares && st->scale == rt->scale && st->adamw == rt->adamw &&
              st->round_bf16 == rt->round_bf16 && st->to_bf16 == rt->to_bf16 &&
              st->from_bf16 == rt->from_bf16 && st->copy == rt->copy && st->zero == rt->zero &&
              st->moe_router_forward == rt->moe_router_forward &&
              st->moe_prob_sums == rt->moe_prob_sums && st->device_alloc == rt->device_alloc &&
              st->matmul_bf16 == rt->matmul_bf16 && st->add_f32 == rt->add_f32,
          "a float32 entry is not the rounding table's");
    /* on float32 storage matmul_f32out is matmul, add_f32 add */
    CHECK(rt->matmul_f32out == rt->matmul && mt_backend_cpu()->matmul_f32out ==
                                                  mt_backend_cpu()->matmul,
          "matmul_f32out is not matmul on a float32 table");
    CHECK(rt->add_f32 == rt->add && mt_backend_cpu()->add_f32 == mt_backend_cpu()->add &&
              st->add != st->add_f32,
          "add_f32 is not add on a float32 table, or is on the storage table");
    /* add_f32 on the storage table: float32 sums, not bf16 bits */
    float y[3] = {1.0f, 1e-3f, -2.5f}, x[3] = {1e-4f, 3.0f, 0.25f};
    st->add_f32(y, x, 3);
    CHECK(y[0] == 1.0f + 1e-4f && y[1] == 1e-3f + 3.0f && y[2] == -2.25f,
          "storage add_f32: %g %g %g", y[0], y[1], y[2]);
}

int main(void)
{
    rt = mt_backend_cpu_bf16();
    st = mt_backend_cpu_bf16_storage();
    test_table();
    test_matmul();
    test_embedding();
    test_rmsnorm();
    test_rope();
    test_attention();
    test_swiglu_add();
    test_loss();
    test_moe();
    test_adamw();
    return mt_test_exit("test_kernels_storage");
}
