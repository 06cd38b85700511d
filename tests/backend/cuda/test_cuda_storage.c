/* test_cuda_storage: the bf16-storage CUDA table
 * (mt_backend_cuda_bf16_storage, cuda_storage.cu) against the rounding
 * table (mt_backend_cuda_bf16) on the same values, part of the
 * test_cuda_bf16 program (its main runs tc_test_storage):
 *  - on bf16 bits, RMSNorm, RoPE, SwiGLU (also in place), add, the
 *    embedding, the loss and the vocabulary-parallel passes, AdamW's
 *    compute copy, the MoE rows (gather, combine with and without the
 *    residual and weights, its backward, the router's backward), the
 *    tensor-core attention, both kinds (head dims 64 with GQA and 128
 *    with documents, T not a multiple of the tile, and bf16 tensors off
 *    8-byte alignment: the scalar loads; a sliding window over
 *    documents), the CUDA-core attention (head dim 32, GQA, documents
 *    and a window) and ring attention's blocks give the rounding table's
 *    bits (its float32 outputs byte for byte, its bf16 ones as rounded);
 *  - its GEMMs (cuBLASLt bf16) are within bf16 tolerance of the
 *    rounding table's (1.6e-2 for a bf16 result, 1e-4 for float32);
 *  - add_f32 and the other float32 entries are the rounding table's. */
#include "test_cuda_kernels.h"

#define MM_TOL 1e-4

/* ---- bf16 storage (mt_backend_cuda_bf16_storage, cuda_storage.cu) ----
 * On bf16 bits, each built entry gives the bits of the rounding table's
 * entry (tc_gpu) on the same values in float32 storage; the GEMMs are
 * cuBLASLt's bf16 ones, so they are checked to bf16 tolerance instead. */

/* a device copy of host x's bf16 bits */
static void *up16(const float *x, int64_t n)
{
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++)
        h[i] = mt_f32_to_bf16(x[i]);
    void *d = tc_up(h, sizeof(uint16_t) * (size_t)n);
    free(h);
    return d;
}

/* the same, shifted by `skew` bf16 elements (2 bytes each) from an
 * aligned start: the tile loaders' scalar path */
static void *up16_skewed(const float *x, int64_t n, int skew)
{
    uint16_t *h = calloc((size_t)(n + skew > 0 ? n + skew : 1), sizeof(uint16_t));
    for (int64_t i = 0; i < n; i++)
        h[skew + i] = mt_f32_to_bf16(x[i]);
    uint16_t *d = tc_up(h, sizeof(uint16_t) * (size_t)(n + skew));
    free(h);
    return d + skew;
}

/* the device bf16 bits at d16 must be those of the device floats d_ref */
static void check16(const char *what, const void *d16, const float *d_ref, int64_t n)
{
    uint16_t *g = tc_down(d16, sizeof(uint16_t) * (size_t)n);
    float *r = tc_down(d_ref, F(n));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += g[i] != mt_f32_to_bf16(r[i]) && !(isnan(r[i]) && (g[i] & 0x7fffu) > 0x7f80u);
    CHECK(bad == 0, "bf16 storage %s: %lld of %lld elements differ from the rounding table's",
          what, (long long)bad, (long long)n);
    free(g), free(r);
}

/* the device bf16 bits at d16 widened, within tol normwise of the floats */
static void close16(const char *what, const void *d16, const float *d_ref, int64_t n, double tol)
{
    uint16_t *g = tc_down(d16, sizeof(uint16_t) * (size_t)n);
    float *r = tc_down(d_ref, F(n)), *w = malloc(F(n));
    for (int64_t i = 0; i < n; i++)
        w[i] = mt_bf16_to_f32(g[i]);
    char name[96];
    snprintf(name, sizeof name, "bf16 storage %s", what);
    CHECK_CLOSE(name, w, r, n, tol);
    free(g), free(r), free(w);
}

tc_counts_t tc_test_storage(uint64_t *s)
{
    const mt_backend_t *b = tc_gpu, *st = mt_backend_cuda_bf16_storage();
    CHECK(st->stores_bf16 && st->rounds_bf16 && st->reads_bf16 && !b->stores_bf16 &&
              !strcmp(st->name, "cuda_bf16_storage"),
          "bf16 storage table flags");
    CHECK(st->sum_squares == b->sum_squares && st->adamw == b->adamw &&
              st->to_bf16 == b->to_bf16 && st->copy == b->copy &&
              st->device_alloc == b->device_alloc,
          "bf16 storage: a float32 entry is not the rounding table's");
    const int64_t n = 70, dim = 136, nh = 3, hd = 64, ntok = 41, ne = 5001;
    /* RMSNorm */
    float *x = rand_bf16(s, n * dim, 3.0f), *w = rand_bf16(s, dim, 2.0f);
    float *dout = rand_bf16(s, n * dim, 1.0f), *res = rand_bf16(s, n * dim, 1.0f);
    float *dx = tc_up(x, F(n * dim)), *dw = tc_up(w, F(dim));
    void *sx = up16(x, n * dim), *sw = up16(w, dim);
    float *o1 = tc_dev(F(n * dim)), *r1 = tc_dev(F(n)), *r2 = tc_dev(F(n));
    void *o2 = tc_dev(2 * (size_t)(n * dim));
    b->rmsnorm_forward(o1, r1, dx, dw, n, dim, 1e-5f);
    st->rmsnorm_forward(o2, r2, sx, sw, n, dim, 1e-5f);
    check16("rmsnorm_forward", o2, o1, n * dim);
    check_same("bf16 storage rmsnorm_forward rstd", r2, r1, n);
    /* the rows one element off 16-byte alignment: element-wise accesses,
     * the same bits (a thread's share of a row does not change) */
    void *sx3 = up16_skewed(x, n * dim, 1), *sw3 = up16_skewed(w, dim, 1);
    void *o3 = up16_skewed(x, n * dim, 1);
    float *r3 = tc_dev(F(n));
    st->rmsnorm_forward(o3, r3, sx3, sw3, n, dim, 1e-5f);
    check16("rmsnorm_forward (unaligned)", o3, o1, n * dim);
    check_same("bf16 storage rmsnorm_forward rstd (unaligned)", r3, r1, n);
    for (int acc = 0; acc < 2; acc++) {
        float *dd = tc_up(dout, F(n * dim)), *gx1 = tc_up(res, F(n * dim));
        void *sd = up16(dout, n * dim), *gx2 = up16(res, n * dim);
        void *sd3 = up16_skewed(dout, n * dim, 1), *gx3 = up16_skewed(res, n * dim, 1);
        float *gw1 = tc_up(w, F(dim)), *gw2 = tc_up(w, F(dim)), *gw3 = tc_up(w, F(dim));
        b->rmsnorm_backward(gx1, gw1, dd, dx, dw, r1, n, dim, acc);
        st->rmsnorm_backward(gx2, gw2, sd, sx, sw, r1, n, dim, acc);
        st->rmsnorm_backward(gx3, gw3, sd3, sx3, sw3, r1, n, dim, acc);
        check16(acc ? "rmsnorm_backward dx (accumulated)" : "rmsnorm_backward dx", gx2, gx1,
                n * dim);
        check_same("bf16 storage rmsnorm_backward dw", gw2, gw1, dim);
        check16(acc ? "rmsnorm_backward dx (accumulated, unaligned)"
                    : "rmsnorm_backward dx (unaligned)",
                gx3, gx1, n * dim);
        check_same("bf16 storage rmsnorm_backward dw (unaligned)", gw3, gw1, dim);
    }
    /* RoPE both ways */
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)ntok);
    for (int64_t i = 0; i < ntok; i++)
        pos[i] = (int32_t)(i * 37 % 500);
    int32_t *d_pos = tc_up(pos, sizeof(int32_t) * (size_t)ntok);
    float *q = rand_bf16(s, ntok * nh * hd, 2.0f);
    float *q1 = tc_up(q, F(ntok * nh * hd));
    void *q2 = up16(q, ntok * nh * hd);
    b->rope_forward(q1, d_pos, ntok, nh, hd, 10000.0);
    st->rope_forward(q2, d_pos, ntok, nh, hd, 10000.0);
    check16("rope_forward", q2, q1, ntok * nh * hd);
    b->rope_backward(q1, d_pos, ntok, nh, hd, 500000.0);
    st->rope_backward(q2, d_pos, ntok, nh, hd, 500000.0);
    check16("rope_backward", q2, q1, ntok * nh * hd);
    /* SwiGLU, add */
    float *g = rand_bf16(s, ne, 4.0f), *u = rand_bf16(s, ne, 4.0f), *d = rand_bf16(s, ne, 1.0f);
    float *g1 = tc_up(g, F(ne)), *u1 = tc_up(u, F(ne)), *d1 = tc_up(d, F(ne));
    void *g2 = up16(g, ne), *u2 = up16(u, ne), *d2 = up16(d, ne);
    float *a1 = tc_dev(F(ne));
    void *a2 = tc_dev(2 * (size_t)ne);
    /* and one element off 16-byte alignment: the kernels' one-element
     * path (aligned: 16-byte packs, then the last ne % 8 one by one) */
    void *g3 = up16_skewed(g, ne, 1), *u3 = up16_skewed(u, ne, 1);
    void *d3 = up16_skewed(d, ne, 1), *a3 = up16_skewed(d, ne, 1);
    b->swiglu_forward(a1, g1, u1, ne);
    st->swiglu_forward(a2, g2, u2, ne);
    check16("swiglu_forward", a2, a1, ne);
    st->swiglu_forward(a3, g3, u3, ne);
    check16("swiglu_forward (unaligned)", a3, a1, ne);
    b->swiglu_backward(g1, u1, d1, g1, u1, ne); /* in place, as the model calls it */
    st->swiglu_backward(g2, u2, d2, g2, u2, ne);
    check16("swiglu_backward dgate", g2, g1, ne);
    check16("swiglu_backward dup", u2, u1, ne);
    st->swiglu_backward(g3, u3, d3, g3, u3, ne);
    check16("swiglu_backward dgate (unaligned)", g3, g1, ne);
    check16("swiglu_backward dup (unaligned)", u3, u1, ne);
    b->add(a1, d1, ne);
    mt_backend_cuda()->round_bf16(a1, ne); /* the model's pass after the rounding table's add */
    st->add(a2, d2, ne);
    check16("add", a2, a1, ne);
    /* embedding: a token of another vocabulary shard; the backward's dtable float32 */
    const int64_t V = 29, edim = 40, etok = 9;
    int32_t tok[9] = {3, -1, 28, 3, 0, 7, 7, 1, 28};
    int32_t *d_tok = tc_up(tok, sizeof tok);
    float *table = rand_bf16(s, V * edim, 1.0f), *eg = rand_bf16(s, etok * edim, 1.0f);
    float *t1 = tc_up(table, F(V * edim)), *e1 = tc_dev(F(etok * edim));
    void *t2 = up16(table, V * edim), *e2 = tc_dev(2 * (size_t)(etok * edim));
    b->embedding_forward(e1, d_tok, t1, etok, edim);
    st->embedding_forward(e2, d_tok, t2, etok, edim);
    check16("embedding_forward", e2, e1, etok * edim);
    float *eg1 = tc_up(eg, F(etok * edim));
    void *eg2 = up16(eg, etok * edim);
    float *dt1 = tc_up(table, F(V * edim)), *dt2 = tc_up(table, F(V * edim));
    b->embedding_backward(dt1, eg1, d_tok, etok, edim);
    st->embedding_backward(dt2, eg2, d_tok, etok, edim);
    check_same("bf16 storage embedding_backward dtable", dt2, dt1, V * edim);
    /* the loss, its gradient in place */
    const int64_t cn = 7, cV = 53, cvv = 50;
    int32_t tg[7] = {2, -100, 49, 0, 13, 7, 30};
    int32_t *d_tg = tc_up(tg, sizeof tg);
    float *l = rand_bf16(s, cn * cV, 6.0f), *l1 = tc_up(l, F(cn * cV));
    void *l2 = up16(l, cn * cV);
    int64_t c1, c2;
    double ls1 = b->cross_entropy(l1, l1, d_tg, cn, cV, cvv, 0.25f, &c1);
    double ls2 = st->cross_entropy(l2, l2, d_tg, cn, cV, cvv, 0.25f, &c2);
    CHECK(ls1 == ls2 && c1 == c2, "bf16 storage cross_entropy: %.17g (%lld) vs %.17g (%lld)", ls2,
          (long long)c2, ls1, (long long)c1);
    check16("cross_entropy dlogits", l2, l1, cn * cV);
    /* rows of 64 (16-byte packs), and the same one element off 16-byte
     * alignment (element-wise accesses): the same bits all three ways */
    {
        const int64_t aV = 64, avv = 61;
        float *al = rand_bf16(s, cn * aV, 6.0f), *al1 = tc_up(al, F(cn * aV));
        void *al2 = up16(al, cn * aV), *al3 = up16_skewed(al, cn * aV, 1);
        int64_t a1, a2, a3;
        double la1 = b->cross_entropy(al1, al1, d_tg, cn, aV, avv, 0.25f, &a1);
        double la2 = st->cross_entropy(al2, al2, d_tg, cn, aV, avv, 0.25f, &a2);
        double la3 = st->cross_entropy(al3, al3, d_tg, cn, aV, avv, 0.25f, &a3);
        CHECK(la1 == la2 && la2 == la3 && a1 == a2 && a2 == a3,
              "bf16 storage cross_entropy, rows of 64: %.17g, unaligned %.17g vs %.17g", la2, la3,
              la1);
        check16("cross_entropy dlogits (rows of 64)", al2, al1, cn * aV);
        check16("cross_entropy dlogits (rows of 64, unaligned)", al3, al1, cn * aV);
        free(al);
    }
    /* the vocabulary-parallel passes on a shard [20, 70) of 50 valid
     * columns (targets outside it too), dlogits in place */
    {
        float *sl = rand_bf16(s, cn * cV, 6.0f), *sl1 = tc_up(sl, F(cn * cV));
        void *sl2 = up16(sl, cn * cV);
        float *mx1 = tc_dev(F(cn)), *mx2 = tc_dev(F(cn));
        double *z1 = tc_dev(8 * (size_t)cn), *z2 = tc_dev(8 * (size_t)cn);
        double *y1 = tc_dev(8 * (size_t)cn), *y2 = tc_dev(8 * (size_t)cn);
        b->ce_shard_max(mx1, sl1, cn, cV, cvv);
        st->ce_shard_max(mx2, sl2, cn, cV, cvv);
        check_same("bf16 storage ce_shard_max", mx2, mx1, cn);
        b->ce_shard_sum(z1, y1, sl1, d_tg, mx1, cn, cV, 20, cvv);
        st->ce_shard_sum(z2, y2, sl2, d_tg, mx1, cn, cV, 20, cvv);
        double *hz1 = tc_down(z1, 8 * (size_t)cn), *hz2 = tc_down(z2, 8 * (size_t)cn);
        double *hy1 = tc_down(y1, 8 * (size_t)cn), *hy2 = tc_down(y2, 8 * (size_t)cn);
        CHECK_SAME_BYTES("bf16 storage ce_shard_sum z", hz2, hz1, (size_t)cn * 8);
        CHECK_SAME_BYTES("bf16 storage ce_shard_sum ly", hy2, hy1, (size_t)cn * 8);
        double f1 = b->ce_shard_finish(sl1, sl1, d_tg, mx1, z1, y1, cn, cV, 20, cvv, 0.25f, &c1);
        double f2 = st->ce_shard_finish(sl2, sl2, d_tg, mx1, z1, y1, cn, cV, 20, cvv, 0.25f, &c2);
        CHECK(f1 == f2 && c1 == c2, "bf16 storage ce_shard_finish: %.17g (%lld) vs %.17g (%lld)",
              f2, (long long)c2, f1, (long long)c1);
        check16("ce_shard_finish dlogits", sl2, sl1, cn * cV);
        free(sl), free(hz1), free(hz2), free(hy1), free(hy2);
    }
    /* the CUDA-core attention (head dims the tensor-core kernels do not
     * serve) on bf16 bits: the rounding table's fallback bits (its
     * rounded loads, then rounding passes), GQA with documents at head
     * dim 32 */
    {
        const int64_t B = 2, T = 45, ah = 4, akv = 2, ahd = 32, NQ = B * T * ah * ahd,
                      NK = B * T * akv * ahd;
        int32_t *h = malloc(sizeof(int32_t) * (size_t)(B * T));
        for (int64_t i = 0; i < B * T; i++)
            h[i] = (int32_t)(i % T < 20 ? 0 : 20);
        tc_window(h, B, T, 15); /* and a sliding window of 15 */
        int32_t *ds = tc_up(h, sizeof(int32_t) * (size_t)(B * T));
        float *hq = rand_bf16(s, NQ, 1.0f), *hk = rand_bf16(s, NK, 1.0f),
              *hv = rand_bf16(s, NK, 1.0f), *hdo = rand_bf16(s, NQ, 1.0f);
        float *q1 = tc_up(hq, F(NQ)), *k1 = tc_up(hk, F(NK)), *v1 = tc_up(hv, F(NK)),
              *do1 = tc_up(hdo, F(NQ));
        void *q2 = up16(hq, NQ), *k2 = up16(hk, NK), *v2 = up16(hv, NK), *do2 = up16(hdo, NQ);
        float *o1 = tc_dev(F(NQ)), *l1 = tc_dev(F(B * ah * T)), *l2 = tc_dev(F(B * ah * T));
        void *o2 = tc_dev(2 * (size_t)NQ);
        b->attention_forward(o1, l1, q1, k1, v1, ds, B, T, ah, akv, ahd);
        st->attention_forward(o2, l2, q2, k2, v2, ds, B, T, ah, akv, ahd);
        check16("attention_forward out (CUDA cores)", o2, o1, NQ);
        check_same("bf16 storage attention_forward lse (CUDA cores)", l2, l1, B * ah * T);
        float *dq1 = tc_dev(F(NQ)), *dk1 = tc_dev(F(NK)), *dv1 = tc_dev(F(NK));
        void *dq2 = tc_dev(2 * (size_t)NQ), *dk2 = tc_dev(2 * (size_t)NK),
             *dv2 = tc_dev(2 * (size_t)NK);
        b->attention_backward(dq1, dk1, dv1, do1, o1, l1, q1, k1, v1, ds, B, T, ah, akv, ahd);
        st->attention_backward(dq2, dk2, dv2, do2, o2, l1, q2, k2, v2, ds, B, T, ah, akv, ahd);
        check16("attention_backward dq (CUDA cores)", dq2, dq1, NQ);
        check16("attention_backward dk (CUDA cores)", dk2, dk1, NK);
        check16("attention_backward dv (CUDA cores)", dv2, dv1, NK);
        free(h), free(hq), free(hk), free(hv), free(hdo);
    }
    /* the MoE rows: 9 tokens, top 2 of 5 experts, width 40, one slot
     * dropped; the combine's sum and dw float32, the rest bf16 bits */
    {
        const int64_t n = 9, k = 2, E = 5, wd = 40, rows = n * k - 1;
        int32_t slot[18], idx[18], rsel[17];
        for (int64_t a = 0; a < n * k; a++) {
            slot[a] = a == 7 ? -1 : (int32_t)(a < 7 ? a : a - 1);
            idx[a] = (int32_t)((a * 3 + a / k) % E);
        }
        for (int64_t i = 0; i < rows; i++)
            rsel[i] = (int32_t)((i * 5) % rows);
        int32_t *d_slot = tc_up(slot, sizeof slot), *d_idx = tc_up(idx, sizeof idx);
        int32_t *d_rsel = tc_up(rsel, sizeof rsel);
        float *hy = rand_bf16(s, rows * wd, 1.0f), *hres = rand_bf16(s, n * wd, 1.0f);
        float *hdo = rand_bf16(s, n * wd, 1.0f), *hw = tc_rand(s, n * k, 1.0f);
        float *y1 = tc_up(hy, F(rows * wd)), *res1 = tc_up(hres, F(n * wd));
        float *do1 = tc_up(hdo, F(n * wd)), *dw_ = tc_up(hw, F(n * k));
        void *y2 = up16(hy, rows * wd), *res2 = up16(hres, n * wd), *do2 = up16(hdo, n * wd);
        /* gather */
        float *g1 = tc_dev(F(rows * wd));
        void *g2 = tc_dev(2 * (size_t)(rows * wd));
        b->moe_gather_rows(g1, y1, d_rsel, rows, wd);
        st->moe_gather_rows(g2, y2, d_rsel, rows, wd);
        check16("moe_gather_rows", g2, g1, rows * wd);
        /* combine, with the residual and without (the backward's form) */
        for (int r = 0; r < 2; r++) {
            float *o1 = tc_dev(F(n * wd)), *o2 = tc_dev(F(n * wd));
            b->moe_combine(o1, r ? NULL : res1, y1, d_slot, r ? NULL : dw_, n, k, wd);
            st->moe_combine(o2, r ? NULL : res2, y2, d_slot, r ? NULL : dw_, n, k, wd);
            check_same(r ? "bf16 storage moe_combine (no weights)" : "bf16 storage moe_combine",
                       o2, o1, n * wd);
        }
        /* combine's backward */
        float *de1 = tc_dev(F(rows * wd)), *dww1 = tc_dev(F(n * k)), *dww2 = tc_dev(F(n * k));
        void *de2 = tc_dev(2 * (size_t)(rows * wd));
        b->moe_combine_backward(dww1, de1, do1, y1, d_slot, dw_, n, k, wd);
        st->moe_combine_backward(dww2, de2, do2, y2, d_slot, dw_, n, k, wd);
        check16("moe_combine_backward dy", de2, de1, rows * wd);
        check_same("bf16 storage moe_combine_backward dw", dww2, dww1, n * k);
        /* the router's backward, normalised top-k and not */
        float *hp = tc_rand(s, n * E, 1.0f), *hdp = tc_rand(s, E, 0.1f);
        for (int64_t i = 0; i < n * E; i++)
            hp[i] = fabsf(hp[i]) + 0.01f;
        float *p1 = tc_up(hp, F(n * E)), *dp1 = tc_up(hdp, F(E));
        for (int norm = 0; norm < 2; norm++) {
            float *l1 = tc_dev(F(n * E));
            void *l2 = tc_dev(2 * (size_t)(n * E));
            b->moe_router_backward(l1, dww1, p1, d_idx, dw_, dp1, n, E, k, norm);
            st->moe_router_backward(l2, dww1, p1, d_idx, dw_, dp1, n, E, k, norm);
            check16(norm ? "moe_router_backward dlogits (norm_topk)" : "moe_router_backward dlogits",
                    l2, l1, n * E);
        }
        free(hy), free(hres), free(hdo), free(hw), free(hp), free(hdp);
    }
    /* ring attention's blocks: the float32 table's kernels on the same
     * values, bit for bit (out and the gradients are float32 sums); a
     * diagonal block with documents, then one of earlier keys merged and
     * added onto it */
    {
        const int64_t bq = 37, bh = 4, bkv = 2, bd = 64, NQ = bq * bh * bd, NK = bq * bkv * bd;
        const mt_backend_t *f = mt_backend_cuda();
        int32_t hds[37];
        for (int64_t i = 0; i < bq; i++)
            hds[i] = (int32_t)(37 + (i < 11 ? 0 : 11)); /* global first keys: two documents */
        int32_t *d_ds = tc_up(hds, sizeof hds);
        float *hq = rand_bf16(s, NQ, 1.0f), *hk = rand_bf16(s, NK, 1.0f);
        float *hv = rand_bf16(s, NK, 1.0f), *hdo = rand_bf16(s, NQ, 1.0f);
        float *q1 = tc_up(hq, F(NQ)), *k1 = tc_up(hk, F(NK)), *v1 = tc_up(hv, F(NK));
        float *do1 = tc_up(hdo, F(NQ));
        void *q2 = up16(hq, NQ), *k2 = up16(hk, NK), *v2 = up16(hv, NK), *do2 = up16(hdo, NQ);
        float *linit = malloc(F(bh * bq));
        for (int64_t i = 0; i < bh * bq; i++)
            linit[i] = -INFINITY;
        float *o1 = tc_dev(F(NQ)), *o2 = tc_dev(F(NQ));
        float *l1 = tc_up(linit, F(bh * bq)), *l2 = tc_up(linit, F(bh * bq));
        f->zero(o1, F(NQ)), f->zero(o2, F(NQ));
        for (int blk = 0; blk < 2; blk++) { /* keys [37, 74) (diagonal), then [0, 37) */
            const int64_t k0 = blk ? 0 : 37;
            f->attention_block_forward(o1, l1, bq, q1, k1, v1, blk ? NULL : d_ds, bq, bq, 37, k0,
                                       bh, bkv, bd);
            st->attention_block_forward(o2, l2, bq, q2, k2, v2, blk ? NULL : d_ds, bq, bq, 37, k0,
                                        bh, bkv, bd);
        }
        check_same("bf16 storage attention_block_forward out", o2, o1, NQ);
        check_same("bf16 storage attention_block_forward lse", l2, l1, bh * bq);
        /* backward reads out as the model stores it: rounded, bf16 bits */
        float *ho = tc_down(o1, F(NQ));
        float *hob = bf16_copy(ho, NQ), *ob1 = tc_up(hob, F(NQ));
        void *ob2 = up16(hob, NQ);
        float *dq1 = tc_dev(F(NQ)), *dq2 = tc_dev(F(NQ)), *dk1 = tc_dev(F(NK)), *dk2 = tc_dev(F(NK));
        float *dv1 = tc_dev(F(NK)), *dv2 = tc_dev(F(NK));
        f->zero(dq1, F(NQ)), f->zero(dq2, F(NQ)), f->zero(dk1, F(NK)), f->zero(dk2, F(NK));
        f->zero(dv1, F(NK)), f->zero(dv2, F(NK));
        for (int blk = 0; blk < 2; blk++) {
            const int64_t k0 = blk ? 0 : 37;
            f->attention_block_backward(dq1, dk1, dv1, do1, ob1, l1, bq, q1, k1, v1,
                                        blk ? NULL : d_ds, bq, bq, 37, k0, bh, bkv, bd);
            st->attention_block_backward(dq2, dk2, dv2, do2, ob2, l1, bq, q2, k2, v2,
                                         blk ? NULL : d_ds, bq, bq, 37, k0, bh, bkv, bd);
        }
        check_same("bf16 storage attention_block_backward dq", dq2, dq1, NQ);
        check_same("bf16 storage attention_block_backward dk", dk2, dk1, NK);
        check_same("bf16 storage attention_block_backward dv", dv2, dv1, NK);
        free(hq), free(hk), free(hv), free(hdo), free(linit), free(ho), free(hob);
    }
    /* AdamW's compute copy as bf16 bits */
    float *p = rand_bf16(s, ne, 1.0f), *gr = tc_rand(s, ne, 1.0f), *mm = tc_rand(s, ne, 0.1f);
    float *vv = tc_rand(s, ne, 0.1f);
    for (int64_t i = 0; i < ne; i++)
        vv[i] = fabsf(vv[i]);
    float *p1 = tc_up(p, F(ne)), *p2 = tc_up(p, F(ne)), *dg = tc_up(gr, F(ne));
    float *m1 = tc_up(mm, F(ne)), *m2 = tc_up(mm, F(ne)), *v1 = tc_up(vv, F(ne)),
          *v2 = tc_up(vv, F(ne));
    float *w1 = tc_dev(F(ne));
    void *w2 = tc_dev(2 * (size_t)ne);
    b->adamw_bf16_copy(p1, w1, dg, 0.5f, m1, v1, ne, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
    st->adamw_bf16_copy(p2, w2, dg, 0.5f, m2, v2, ne, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
    check_same("bf16 storage adamw_bf16_copy p", p2, p1, ne);
    check_same("bf16 storage adamw_bf16_copy m", m2, m1, ne);
    check_same("bf16 storage adamw_bf16_copy v", v2, v1, ne);
    check16("adamw_bf16_copy work", w2, w1, ne);
    /* attention on bf16 tiles loaded from bf16 bits: the rounding table's
     * tensor-core kernels on the same values, bit for bit (plain causal
     * with GQA at head dim 64, documents at 128, T not a multiple of 64) */
    /* each kind of tensor-core kernels: mma.sync (the default), then WMMA */
    for (int kind = 1; kind >= 0; kind--) {
        mt_cuda_attention_tc_select(kind);
        if (!mt_cuda_attention_tc_supported(64) || !mt_cuda_attention_tc_supported(128))
            continue;
        /* the third: the first with every bf16 tensor 2 bytes off 8-byte
         * alignment (the loaders' scalar path) */
        /* the fourth: a sliding window of 40 over documents (first
         * visible keys max(document start, t - 39)) */
        const int64_t cases[4][5] = {{2, 70, 4, 2, 64}, {1, 100, 2, 1, 128}, {2, 70, 4, 2, 64},
                                     {1, 150, 2, 1, 64}};
        for (int c = 0; c < 4; c++) {
            const int skew = c == 2;
            const int64_t B = cases[c][0], T = cases[c][1], ah = cases[c][2], akv = cases[c][3],
                          ahd = cases[c][4], NQ = B * T * ah * ahd, NK = B * T * akv * ahd;
            int32_t *ds = NULL;
            if (c == 1) { /* three documents */
                int32_t *h = malloc(sizeof(int32_t) * (size_t)(B * T));
                for (int64_t i = 0; i < B * T; i++)
                    h[i] = (int32_t)(i % T < 30 ? 0 : i % T < 71 ? 30 : 71);
                ds = tc_up(h, sizeof(int32_t) * (size_t)(B * T));
                free(h);
            }
            if (c == 3) {
                int32_t *h = malloc(sizeof(int32_t) * (size_t)(B * T));
                for (int64_t i = 0; i < B * T; i++)
                    h[i] = (int32_t)(i % T < 90 ? 0 : 90);
                ds = tc_up(tc_window(h, B, T, 40), sizeof(int32_t) * (size_t)(B * T));
                free(h);
            }
            float *hq = rand_bf16(s, NQ, 1.0f), *hk = rand_bf16(s, NK, 1.0f),
                  *hv = rand_bf16(s, NK, 1.0f), *hdo = rand_bf16(s, NQ, 1.0f);
            float *q1 = tc_up(hq, F(NQ)), *k1 = tc_up(hk, F(NK)), *v1 = tc_up(hv, F(NK)),
                  *do1 = tc_up(hdo, F(NQ));
            void *q2 = up16_skewed(hq, NQ, skew), *k2 = up16_skewed(hk, NK, skew),
                 *v2 = up16_skewed(hv, NK, skew), *do2 = up16_skewed(hdo, NQ, skew);
            float *o1 = tc_dev(F(NQ)), *lse1 = tc_dev(F(B * ah * T)), *lse2 = tc_dev(F(B * ah * T));
            void *o2 = (uint16_t *)tc_dev(2 * (size_t)(NQ + skew)) + skew;
            b->attention_forward(o1, lse1, q1, k1, v1, ds, B, T, ah, akv, ahd);
            st->attention_forward(o2, lse2, q2, k2, v2, ds, B, T, ah, akv, ahd);
            check16("attention_forward out", o2, o1, NQ);
            check_same("bf16 storage attention_forward lse", lse2, lse1, B * ah * T);
            float *dq1 = tc_dev(F(NQ)), *dk1 = tc_dev(F(NK)), *dv1 = tc_dev(F(NK));
            void *dq2 = (uint16_t *)tc_dev(2 * (size_t)(NQ + skew)) + skew,
                 *dk2 = (uint16_t *)tc_dev(2 * (size_t)(NK + skew)) + skew,
                 *dv2 = (uint16_t *)tc_dev(2 * (size_t)(NK + skew)) + skew;
            b->attention_backward(dq1, dk1, dv1, do1, o1, lse1, q1, k1, v1, ds, B, T, ah, akv, ahd);
            st->attention_backward(dq2, dk2, dv2, do2, o2, lse1, q2, k2, v2, ds, B, T, ah, akv,
                                   ahd);
            check16("attention_backward dq", dq2, dq1, NQ);
            check16("attention_backward dk", dk2, dk1, NK);
            check16("attention_backward dv", dv2, dv1, NK);
            free(hq), free(hk), free(hv), free(hdo);
        }
    }
    mt_cuda_attention_tc_select(-1);
    /* the GEMMs: cuBLASLt bf16 against FAST_16BF (then the model's pass) */
    for (int t = 0; t < 8; t++) {
        const int64_t mm_ = 67, nn = 45, kk = 33;
        bool ta = t & 1, tb = t & 2;
        float beta = t & 4 ? 1.0f : 0.0f;
        float *A = rand_bf16(s, mm_ * kk, 1.0f), *B = rand_bf16(s, kk * nn, 1.0f),
              *C = rand_bf16(s, mm_ * nn, 1.0f);
        float *A1 = tc_up(A, F(mm_ * kk)), *B1 = tc_up(B, F(kk * nn)), *C1 = tc_up(C, F(mm_ * nn));
        float *C3 = tc_up(C, F(mm_ * nn)), *C4 = tc_up(C, F(mm_ * nn));
        void *A2 = up16(A, mm_ * kk), *B2 = up16(B, kk * nn), *C2 = up16(C, mm_ * nn);
        b->matmul(C1, A1, B1, mm_, nn, kk, ta, tb, beta);
        mt_backend_cuda()->round_bf16(C1, mm_ * nn);
        st->matmul(C2, A2, B2, mm_, nn, kk, ta, tb, beta);
        close16("matmul", C2, C1, mm_ * nn, 1.6e-2);
        b->matmul(C3, A1, B1, mm_, nn, kk, ta, tb, beta);
        st->matmul_f32out(C4, A2, B2, mm_, nn, kk, ta, tb, beta);
        float *h3 = tc_down(C3, F(mm_ * nn)), *h4 = tc_down(C4, F(mm_ * nn));
        CHECK_CLOSE("bf16 storage matmul_f32out", h4, h3, mm_ * nn, MM_TOL);
        free(A), free(B), free(C), free(h3), free(h4);
    }
    /* matmul_add (c = r + a b^T, the residual GEMM): on each table the
     * bits of r copied into c and a beta-1 matmul (bf16 storage: cuBLASLt
     * reading r as C, no copy), and bf16 storage within bf16 of the
     * rounding table */
    {
        const int64_t mm_ = 64, nn = 40, kk = 32;
        float *A = rand_bf16(s, mm_ * kk, 1.0f), *B = rand_bf16(s, nn * kk, 1.0f),
              *R = rand_bf16(s, mm_ * nn, 1.0f);
        float *A1 = tc_up(A, F(mm_ * kk)), *B1 = tc_up(B, F(nn * kk)), *R1 = tc_up(R, F(mm_ * nn));
        float *D1 = tc_dev(F(mm_ * nn)), *E1 = tc_up(R, F(mm_ * nn));
        b->matmul_add(D1, R1, A1, B1, mm_, nn, kk, false, true);
        b->matmul(E1, A1, B1, mm_, nn, kk, false, true, 1.0f);
        check_same("bf16 table matmul_add (copy, then beta 1)", D1, E1, mm_ * nn);
        void *A2 = up16(A, mm_ * kk), *B2 = up16(B, nn * kk), *R2 = up16(R, mm_ * nn);
        void *D2 = tc_dev(2 * (size_t)(mm_ * nn)), *E2 = up16(R, mm_ * nn);
        st->matmul_add(D2, R2, A2, B2, mm_, nn, kk, false, true);
        st->matmul(E2, A2, B2, mm_, nn, kk, false, true, 1.0f);
        uint16_t *hd = tc_down(D2, 2 * (size_t)(mm_ * nn)), *he = tc_down(E2, 2 * (size_t)(mm_ * nn));
        uint16_t *hr = tc_down(R2, 2 * (size_t)(mm_ * nn));
        int64_t diff = 0, moved = 0;
        for (int64_t i = 0; i < mm_ * nn; i++)
            diff += hd[i] != he[i], moved += hd[i] != hr[i];
        CHECK(diff == 0 && moved > 0,
              "bf16 storage matmul_add: %lld of %lld elements differ from a copy and a beta-1 "
              "matmul (%lld differ from r)",
              (long long)diff, (long long)(mm_ * nn), (long long)moved);
        mt_backend_cuda()->round_bf16(D1, mm_ * nn);
        close16("matmul_add", D2, D1, mm_ * nn, 1.6e-2);
        free(A), free(B), free(R), free(hd), free(he), free(hr);
    }
    free(x), free(w), free(dout), free(res), free(pos), free(q), free(g), free(u), free(d),
        free(table), free(eg), free(l), free(p), free(gr), free(mm), free(vv);
    mt_cuda_arena_reset(&tc_arena);
    return tc_counts();
}
