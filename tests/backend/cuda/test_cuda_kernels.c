/* test_cuda_kernels: every kernel of the CUDA backend (mt_backend_cuda)
 * against the CPU backend (mt_backend_cpu) on the same random inputs:
 * inputs are copied to the device, both backends run, the GPU's results
 * come back and are compared NORMWISE (max |gpu - cpu| / max |cpu|).
 * Also the bf16 pieces (GEMM, cross-entropy, the chunked LM head with
 * its cross-entropy, mixed AdamW) against host loops, and the kept
 * cuBLASLt plans.  MoE kernels:
 * test_cuda_kernels_moe.c; attention: test_cuda_attention.c.  Exits 77 (skip) when no CUDA device
 * is visible, which is the case on the build machines and in CI: there
 * it only proves that the test builds and links.  No MPI.
 *
 * Bounds (u = 6e-8, the fp32 unit roundoff; bf16 keeps 8 significant
 * bits: rounding is within 2^-8 = 3.9e-3 relative, one bf16 ulp is at most
 * 2^-7 = 7.8e-3 of the largest element of its binade):
 *  - bitwise equal: embedding forward and backward (the GPU backward adds
 *    the rows in the CPU's token order), bf16 conversion, MoE permutation
 *    and row gathers, router top-k indices;
 *  - 1e-6: elementwise kernels, RoPE, AdamW parameters (one or two
 *    roundings apart: CUDA's expf vs the CPU's, FMA contraction);
 *  - 1e-5: matmul (k <= 100 terms in different orders), RMSNorm forward
 *    and backward, cross-entropy loss and gradient, the sharded passes;
 *  - 1e-6: MoE router, combine and their backwards
 *    (test_cuda_kernels_moe.c);
 *  - 2e-5: attention, dense and ring-attention blocks
 *    (test_cuda_attention.c);
 *  - 1.6e-2: bf16 GEMM against the CPU's bf16 reference: two fp32 sums
 *    in different orders can round to neighbouring bf16 values, one ulp
 *    (7.8e-3 normwise) apart; the bound allows two;
 *  - 8e-3: bf16 cross-entropy gradients against fp32: one rounding
 *    (3.9e-3 normwise) plus order;
 *  - sum_squares: 1e-12 relative (double sums of exact float squares).
 * Set MT_TEST_VERBOSE=1 to print every measured error. */
#include "test_cuda_kernels.h"

mt_cuda_arena_t tc_arena;
const mt_backend_t *tc_cpu, *tc_gpu;
int tc_verbose;


static void test_matmul(uint64_t *s)
{
    const int64_t m = 67, n = 45, k = 33;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int acc = 0; acc < 2; acc++) {
                float *a = tc_rand(s, m * k, 1.0f), *b = tc_rand(s, k * n, 1.0f);
                float *c = tc_rand(s, m * n, 1.0f);
                if (!acc) /* beta 0 must not read C, even NaN */
                    for (int64_t i = 0; i < m * n; i++)
                        c[i] = NAN;
                float *da = tc_up(a, F(m * k)), *db = tc_up(b, F(k * n)), *dc = tc_up(c, F(m * n));
                tc_cpu->matmul(c, a, b, m, n, k, ta, tb, acc ? 1.0f : 0.0f);
                tc_gpu->matmul(dc, da, db, m, n, k, ta, tb, acc ? 1.0f : 0.0f);
                float *g = tc_down(dc, F(m * n));
                char what[64];
                snprintf(what, sizeof what, "matmul ta=%d tb=%d beta=%d", ta, tb, acc);
                CHECK_CLOSE(what, g, c, m * n, 1e-5);
                free(a), free(b), free(c), free(g);
                mt_cuda_arena_reset(&tc_arena);
            }
    /* k = 0: C = beta C */
    float c[6] = {1, 2, 3, 4, 5, 6}, ref[6] = {2, 4, 6, 8, 10, 12};
    float *dc = tc_up(c, sizeof c);
    tc_gpu->matmul(dc, dc, dc, 2, 3, 0, false, false, 2.0f);
    float *g = tc_down(dc, sizeof c);
    CHECK_CLOSE("matmul k=0", g, ref, 6, 0.0);
    free(g);
    mt_cuda_arena_reset(&tc_arena);
    /* matmul_add (c = r + a b^T, the residual GEMM) against the CPU's */
    float *a = tc_rand(s, m * k, 1.0f), *b = tc_rand(s, n * k, 1.0f), *r = tc_rand(s, m * n, 1.0f);
    float *cc = malloc(F(m * n));
    float *da = tc_up(a, F(m * k)), *db = tc_up(b, F(n * k)), *dr = tc_up(r, F(m * n));
    float *dd = tc_dev(F(m * n));
    tc_cpu->matmul_add(cc, r, a, b, m, n, k, false, true);
    tc_gpu->matmul_add(dd, dr, da, db, m, n, k, false, true);
    g = tc_down(dd, F(m * n));
    CHECK_CLOSE("matmul_add", g, cc, m * n, 1e-5);
    free(a), free(b), free(r), free(cc), free(g);
    mt_cuda_arena_reset(&tc_arena);
}

/* bf16 against the CPU's bf16 reference.  Dimensions are multiples of 8
 * (16-byte rows), what cuBLASLt's tensor-core kernels want and what model
 * shapes are; whether odd shapes find an algorithm is left to the
 * heuristic (the launcher stops with the shape if none does). */
static void test_matmul_bf16(uint64_t *s)
{
    const int64_t m = 72, n = 48, k = 40;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int acc = 0; acc < 2; acc++) {
                uint16_t *ab = malloc((size_t)(m * k) * 2), *bb = malloc((size_t)(k * n) * 2);
                uint16_t *cb = malloc((size_t)(m * n) * 2);
                for (int64_t i = 0; i < m * k; i++)
                    ab[i] = mt_f32_to_bf16(tc_uniform(s));
                for (int64_t i = 0; i < k * n; i++)
                    bb[i] = mt_f32_to_bf16(tc_uniform(s));
                for (int64_t i = 0; i < m * n; i++)
                    cb[i] = mt_f32_to_bf16(acc ? tc_uniform(s) : 0.0f);
                uint16_t *dab = tc_up(ab, (size_t)(m * k) * 2), *dbb = tc_up(bb, (size_t)(k * n) * 2);
                uint16_t *dcb = tc_up(cb, (size_t)(m * n) * 2);
                tc_cpu->matmul_bf16(cb, ab, bb, m, n, k, ta, tb, acc ? 1.0f : 0.0f);
                tc_gpu->matmul_bf16(dcb, dab, dbb, m, n, k, ta, tb, acc ? 1.0f : 0.0f);
                uint16_t *gb = tc_down(dcb, (size_t)(m * n) * 2);
                float *gf = malloc(F(m * n)), *rf = malloc(F(m * n));
                for (int64_t i = 0; i < m * n; i++) {
                    gf[i] = mt_bf16_to_f32(gb[i]);
                    rf[i] = mt_bf16_to_f32(cb[i]);
                }
                char what[64];
                snprintf(what, sizeof what, "matmul_bf16 ta=%d tb=%d beta=%d", ta, tb, acc);
                CHECK_CLOSE(what, gf, rf, m * n, 1.6e-2);
                free(ab), free(bb), free(cb), free(gb), free(gf), free(rf);
                mt_cuda_arena_reset(&tc_arena);
            }
}

/* The kept cuBLASLt plans (mt_cuda_lt_stats): a shape's second and third
 * GEMM reuse the first one's plan and give its bits; an operand of other
 * alignment is another plan; past 128 shapes the least recently used
 * plans go, and a shape whose plan went is planned again and gives the
 * same bits.  Shapes no other test uses, so the counts are this test's. */
static void test_lt_plans(uint64_t *s)
{
    enum { M = 24, N = 32, K = 16, MANY = 130, BIG = 8 * MANY * 8 };
    uint16_t ab[M * K + 8], bb[K * N], cb[M * N], first[M * N];
    for (int64_t i = 0; i < M * K + 8; i++)
        ab[i] = mt_f32_to_bf16(tc_uniform(s));
    for (int64_t i = 0; i < K * N; i++)
        bb[i] = mt_f32_to_bf16(tc_uniform(s));
    uint16_t *dab = tc_up(ab, sizeof ab), *dbb = tc_up(bb, sizeof bb);
    uint16_t *dcb = tc_up(cb, sizeof cb);
    mt_cuda_lt_stats_t s0, s1;
    mt_cuda_lt_stats(&s0);
    bool same = true;
    for (int rep = 0; rep < 3; rep++) {
        tc_gpu->matmul_bf16(dcb, dab, dbb, M, N, K, false, true, 0.0f);
        uint16_t *g = tc_down(dcb, sizeof cb);
        if (rep == 0)
            memcpy(first, g, sizeof first);
        same = same && !memcmp(g, first, sizeof first);
        free(g);
    }
    mt_cuda_lt_stats(&s1);
    CHECK(s1.misses - s0.misses == 1 && s1.hits - s0.hits == 2,
          "one shape three times: 1 plan made and 2 reused, not %lld and %lld",
          (long long)(s1.misses - s0.misses), (long long)(s1.hits - s0.hits));
    CHECK(same, "a reused plan gives the first GEMM's bits");
    tc_cpu->matmul_bf16(cb, ab, bb, M, N, K, false, true, 0.0f);
    float gf[M * N], rf[M * N];
    for (int64_t i = 0; i < M * N; i++)
        gf[i] = mt_bf16_to_f32(first[i]), rf[i] = mt_bf16_to_f32(cb[i]);
    CHECK_CLOSE("matmul_bf16 on a kept plan", gf, rf, M * N, 1.6e-2);

    /* a 4 elements on (8-byte aligned): the same shape, another plan */
    tc_gpu->matmul_bf16(dcb, dab + 4, dbb, M, N, K, false, true, 0.0f);
    mt_cuda_lt_stats(&s0);
    CHECK(s0.misses - s1.misses == 1, "another alignment is another plan");

    /* MANY more shapes [8r, 8] x [8, 8]: the table keeps 128 plans, the
     * older ones go, the first shape's among them */
    uint16_t *big = malloc(BIG * sizeof *big);
    for (int64_t i = 0; i < BIG; i++)
        big[i] = mt_f32_to_bf16(tc_uniform(s));
    uint16_t *dbig = tc_up(big, BIG * sizeof *big), *dout = tc_up(big, BIG * sizeof *big);
    for (int64_t r = 1; r <= MANY; r++)
        tc_gpu->matmul_bf16(dout, dbig, dbig, 8 * r, 8, 8, false, false, 0.0f);
    mt_cuda_lt_stats(&s1);
    CHECK(s1.plans == 128 && s1.evictions - s0.evictions >= MANY - 128 + 2,
          "past 128 shapes: %d plans kept, %lld given up", s1.plans,
          (long long)(s1.evictions - s0.evictions));
    tc_gpu->matmul_bf16(dcb, dab, dbb, M, N, K, false, true, 0.0f);
    mt_cuda_lt_stats(&s0);
    uint16_t *g = tc_down(dcb, sizeof cb);
    CHECK(s0.misses - s1.misses == 1 && !memcmp(g, first, sizeof first),
          "a shape whose plan went: planned again, the same bits");
    free(g), free(big);
    mt_cuda_arena_reset(&tc_arena);
}

static void test_embedding(uint64_t *s)
{
    const int64_t n = 300, dim = 70, vocab = 17;
    int32_t tok[300];
    for (int64_t i = 0; i < n; i++) /* many repeats, and other shards' tokens */
        tok[i] = (int32_t)(tc_rng_next(s) % (vocab + 3)) - 1;
    for (int64_t i = 0; i < n; i++)
        if (tok[i] >= vocab)
            tok[i] = -1;
    float *table = tc_rand(s, vocab * dim, 1.0f), *dout = tc_rand(s, n * dim, 1.0f);
    float *dtable = tc_rand(s, vocab * dim, 1.0f), *out = malloc(F(n * dim));
    int32_t *dtok = tc_up(tok, sizeof tok);
    float *dtab = tc_up(table, F(vocab * dim)), *ddout = tc_up(dout, F(n * dim));
    float *ddt = tc_up(dtable, F(vocab * dim)), *dout_ = tc_dev(F(n * dim));
    tc_cpu->embedding_forward(out, tok, table, n, dim);
    tc_gpu->embedding_forward(dout_, dtok, dtab, n, dim);
    float *g = tc_down(dout_, F(n * dim));
    CHECK_SAME_BYTES("embedding_forward", g, out, F(n * dim));
    tc_cpu->embedding_backward(dtable, dout, tok, n, dim);
    tc_gpu->embedding_backward(ddt, ddout, dtok, n, dim);
    float *gd = tc_down(ddt, F(vocab * dim));
    CHECK_SAME_BYTES("embedding_backward (token order)", gd, dtable, F(vocab * dim));
    free(table), free(dout), free(dtable), free(out), free(g), free(gd);
    mt_cuda_arena_reset(&tc_arena);
}

static void test_rmsnorm(uint64_t *s)
{
    const int64_t n = 37, dim = 300;
    float *x = tc_rand(s, n * dim, 2.0f), *w = tc_rand(s, dim, 1.0f), *dout = tc_rand(s, n * dim, 1.0f);
    float *dw = tc_rand(s, dim, 1.0f), *out = malloc(F(n * dim)), *rstd = malloc(F(n));
    float *dx = malloc(F(n * dim));
    float *d_x = tc_up(x, F(n * dim)), *d_w = tc_up(w, F(dim)), *d_g = tc_up(dout, F(n * dim));
    float *d_dw = tc_up(dw, F(dim)), *d_out = tc_dev(F(n * dim)), *d_r = tc_dev(F(n));
    float *d_dx = tc_dev(F(n * dim));
    tc_cpu->rmsnorm_forward(out, rstd, x, w, n, dim, 1e-5f);
    tc_gpu->rmsnorm_forward(d_out, d_r, d_x, d_w, n, dim, 1e-5f);
    tc_cpu->rmsnorm_backward(dx, dw, dout, x, w, rstd, n, dim, false);
    tc_gpu->rmsnorm_backward(d_dx, d_dw, d_g, d_x, d_w, d_r, n, dim, false);
    float *g_out = tc_down(d_out, F(n * dim)), *g_r = tc_down(d_r, F(n));
    float *g_dx = tc_down(d_dx, F(n * dim)), *g_dw = tc_down(d_dw, F(dim));
    CHECK_CLOSE("rmsnorm_forward out", g_out, out, n * dim, 1e-5);
    CHECK_CLOSE("rmsnorm_forward rstd", g_r, rstd, n, 1e-5);
    CHECK_CLOSE("rmsnorm_backward dx", g_dx, dx, n * dim, 1e-5);
    CHECK_CLOSE("rmsnorm_backward dw (accumulated)", g_dw, dw, dim, 1e-5);
    /* accumulate: the residual gradient plus the input gradient */
    float *base = tc_rand(s, n * dim, 3.0f), *want = malloc(F(n * dim));
    for (int64_t i = 0; i < n * dim; i++)
        want[i] = base[i] + dx[i];
    float *d_acc = tc_up(base, F(n * dim));
    tc_gpu->rmsnorm_backward(d_acc, d_dw, d_g, d_x, d_w, d_r, n, dim, true);
    float *g_acc = tc_down(d_acc, F(n * dim));
    CHECK_CLOSE("rmsnorm_backward dx accumulated", g_acc, want, n * dim, 1e-5);
    free(x), free(w), free(dout), free(dw), free(out), free(rstd), free(dx);
    free(g_out), free(g_r), free(g_dx), free(g_dw), free(base), free(want), free(g_acc);
    mt_cuda_arena_reset(&tc_arena);
}

/* The norm over rows split across ranks: the partial row sums (with and
 * without w), the forward and the backward from sums, on a row part of 40
 * of 96 columns, against the CPU's; bf16 storage is test_cuda_storage's
 * pattern, covered by the OLMoE tp 2 runs of cuda_emulation.sh. */
static void test_rmsnorm_split(uint64_t *s)
{
    const int64_t n = 21, d = 40, full = 96;
    float *x = tc_rand(s, n * d, 2.0f), *w = tc_rand(s, d, 1.0f), *g = tc_rand(s, n * d, 1.0f);
    double *ss = malloc((size_t)n * sizeof(double)), *gx = malloc((size_t)n * sizeof(double));
    float *d_x = tc_up(x, F(n * d)), *d_w = tc_up(w, F(d)), *d_g = tc_up(g, F(n * d));
    double *d_ss = tc_dev((size_t)n * sizeof(double)), *d_gx = tc_dev((size_t)n * sizeof(double));
    tc_cpu->rmsnorm_rowsums(ss, x, x, NULL, n, d);
    tc_gpu->rmsnorm_rowsums(d_ss, d_x, d_x, NULL, n, d);
    tc_cpu->rmsnorm_rowsums(gx, g, x, w, n, d);
    tc_gpu->rmsnorm_rowsums(d_gx, d_g, d_x, d_w, n, d);
    double *g_ss = tc_down(d_ss, (size_t)n * sizeof(double));
    double *g_gx = tc_down(d_gx, (size_t)n * sizeof(double));
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs(g_ss[i] - ss[i]) / ss[i]);
        worst = fmax(worst, fabs(g_gx[i] - gx[i]) / (fabs(gx[i]) + 1e-30));
    }
    CHECK(worst <= 1e-12, "rmsnorm_rowsums: relative difference %.3e > 1e-12", worst);
    /* the other ranks' part of the sums: the same sums, scaled */
    for (int64_t i = 0; i < n; i++)
        ss[i] *= 2.3, gx[i] *= -1.7;
    d_ss = tc_up(ss, (size_t)n * sizeof(double)), d_gx = tc_up(gx, (size_t)n * sizeof(double));
    float *out = malloc(F(n * d)), *rstd = malloc(F(n)), *dx = malloc(F(n * d));
    float *dw = tc_rand(s, d, 1.0f), *d_dw = tc_up(dw, F(d));
    float *d_out = tc_dev(F(n * d)), *d_r = tc_dev(F(n)), *d_dx = tc_dev(F(n * d));
    tc_cpu->rmsnorm_forward_sums(out, rstd, x, w, ss, n, d, full, 1e-5f);
    tc_gpu->rmsnorm_forward_sums(d_out, d_r, d_x, d_w, d_ss, n, d, full, 1e-5f);
    tc_cpu->rmsnorm_backward_sums(dx, dw, g, x, w, rstd, gx, n, d, full, false);
    tc_gpu->rmsnorm_backward_sums(d_dx, d_dw, d_g, d_x, d_w, d_r, d_gx, n, d, full, false);
    float *g_out = tc_down(d_out, F(n * d)), *g_r = tc_down(d_r, F(n));
    float *g_dx = tc_down(d_dx, F(n * d)), *g_dw = tc_down(d_dw, F(d));
    CHECK_CLOSE("rmsnorm_forward_sums out", g_out, out, n * d, 1e-5);
    CHECK_CLOSE("rmsnorm_forward_sums rstd", g_r, rstd, n, 1e-5);
    CHECK_CLOSE("rmsnorm_backward_sums dx", g_dx, dx, n * d, 1e-5);
    CHECK_CLOSE("rmsnorm_backward_sums dw (accumulated)", g_dw, dw, d, 1e-5);
    free(x), free(w), free(g), free(ss), free(gx), free(g_ss), free(g_gx), free(out), free(rstd);
    free(dx), free(dw), free(g_out), free(g_r), free(g_dx), free(g_dw);
    mt_cuda_arena_reset(&tc_arena);
}

/* RoPE at four shapes: few pairs per token (groups of 16 tokens, the
 * last one short); more pairs than the block's 256 threads (32 heads of
 * 128, groups of 4, the fifth token alone); head_dim/2 = 512 table
 * entries, more than the block fills in one pass (one token a group);
 * the 1B model's head_dim 64 (groups of 8, 37 tokens: the last group
 * short); each with theta^(-2i/hd) and scale 1, and with a scaled table
 * (every other frequency divided by 8) and scale 1.3 */
static void test_rope(uint64_t *s)
{
    const int64_t shapes[4][3] = {{40, 3, 16}, {5, 32, 128}, {3, 2, 1024}, {37, 8, 64}};
    for (int c = 0; c < 8; c++) {
        const int64_t n = shapes[c / 2][0], nh = shapes[c / 2][1], hd = shapes[c / 2][2];
        const int64_t ne = n * nh * hd;
        const bool scaled = c % 2;
        const double scale = scaled ? 1.3 : 1.0;
        double *inv = malloc(sizeof(double) * (size_t)(hd / 2));
        for (int64_t i = 0; i < hd / 2; i++)
            inv[i] = pow(500000.0, -2.0 * (double)i / (double)hd) / (scaled && i % 2 ? 8.0 : 1.0);
        int32_t pos[40];
        for (int64_t i = 0; i < n; i++)
            pos[i] = (int32_t)(i * 97 % 5000);
        float *x = tc_rand(s, ne, 1.0f);
        float *dx = tc_up(x, F(ne));
        int32_t *dp = tc_up(pos, sizeof(int32_t) * (size_t)n);
        double *dinv = tc_up(inv, sizeof(double) * (size_t)(hd / 2));
        tc_cpu->rope_forward(x, pos, n, nh, hd, inv, scale);
        tc_gpu->rope_forward(dx, dp, n, nh, hd, dinv, scale);
        float *g = tc_down(dx, F(ne));
        CHECK_CLOSE(scaled ? "rope_forward (scaled table, scale 1.3)" : "rope_forward", g, x, ne,
                    1e-6);
        tc_cpu->rope_backward(x, pos, n, nh, hd, inv, scale);
        tc_gpu->rope_backward(dx, dp, n, nh, hd, dinv, scale);
        float *g2 = tc_down(dx, F(ne));
        CHECK_CLOSE(scaled ? "rope_backward (scaled table, scale 1.3)" : "rope_backward", g2, x,
                    ne, 1e-6);
        free(x), free(g), free(g2), free(inv);
        mt_cuda_arena_reset(&tc_arena);
    }
}

/* elements lo..n of the device's to_bf16 bits gb and from_bf16 floats gf
 * that differ from the CPU's hb, hf (NaN: any NaN) */
static void roundtrip_diffs(const uint16_t *gb, const float *gf, const uint16_t *hb,
                            const float *hf, int64_t lo, int64_t n, int64_t *dbits,
                            int64_t *dvals)
{
    *dbits = *dvals = 0;
    for (int64_t i = lo; i < n; i++) {
        bool nan = isnan(hf[i]) && isnan(gf[i]);
        *dbits += gb[i] != hb[i] && !nan;
        uint32_t a, b;
        memcpy(&a, &gf[i], 4), memcpy(&b, &hf[i], 4);
        *dvals += a != b && !nan;
    }
}

static void test_elementwise(uint64_t *s)
{
    const int64_t n = 100003;
    float *gate = tc_rand(s, n, 6.0f), *up = tc_rand(s, n, 2.0f), *dout = tc_rand(s, n, 1.0f);
    float *out = malloc(F(n)), *dg = malloc(F(n)), *du = malloc(F(n));
    float *d_gate = tc_up(gate, F(n)), *d_up = tc_up(up, F(n)), *d_dout = tc_up(dout, F(n));
    float *d_out = tc_dev(F(n));
    tc_cpu->swiglu_forward(out, gate, up, n);
    tc_gpu->swiglu_forward(d_out, d_gate, d_up, n);
    float *g = tc_down(d_out, F(n));
    CHECK_CLOSE("swiglu_forward", g, out, n, 1e-6);
    tc_cpu->swiglu_backward(dg, du, dout, gate, up, n);
    tc_gpu->swiglu_backward(d_gate, d_up, d_dout, d_gate, d_up, n); /* in place */
    float *gg = tc_down(d_gate, F(n)), *gu = tc_down(d_up, F(n));
    CHECK_CLOSE("swiglu_backward dgate (in place)", gg, dg, n, 1e-6);
    CHECK_CLOSE("swiglu_backward dup (in place)", gu, du, n, 1e-6);

    tc_cpu->add(out, dout, n);
    tc_gpu->add(d_out, d_dout, n);
    tc_cpu->scale(out, 0.37f, n);
    tc_gpu->scale(d_out, 0.37f, n);
    float *ga = tc_down(d_out, F(n));
    CHECK_CLOSE("add, scale", ga, out, n, 1e-6);
    const double ss_c = tc_cpu->sum_squares(gate, n), ss_g = tc_gpu->sum_squares(d_gate, 0);
    CHECK(ss_g == 0.0, "sum_squares of 0 elements = %g", ss_g);
    float *d_g2 = tc_up(gate, F(n));
    const double ss1 = tc_gpu->sum_squares(d_g2, n), ss2 = tc_gpu->sum_squares(d_g2, n);
    CHECK(fabs(ss1 - ss_c) <= 1e-12 * ss_c, "sum_squares %.17g vs cpu %.17g", ss1, ss_c);
    CHECK(ss1 == ss2, "sum_squares twice: %.17g vs %.17g", ss1, ss2);
    /* round_bf16 (mixed precision): bit for bit, with exact ties both
     * ways, values that round up into the exponent, infinities and NaN */
    float *r = tc_rand(s, n, 3.0f);
    const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f7fffffu, 0x7f7fffffu,
                                0x7f800000u, 0xff800000u, 0x7fc00001u, 0x80000000u, 0x00000001u};
    for (int i = 0; i < (int)(sizeof special / sizeof special[0]); i++)
        memcpy(&r[i * 1000], &special[i], sizeof(float));
    float *d_r = tc_up(r, F(n));
    tc_cpu->round_bf16(r, n);
    tc_gpu->round_bf16(d_r, n);
    float *gr = tc_down(d_r, F(n));
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &gr[i], 4), memcpy(&b, &r[i], 4);
        diff += a != b && !(isnan(gr[i]) && isnan(r[i]));
    }
    CHECK(diff == 0, "round_bf16: %lld of %lld elements differ from the CPU's bits", (long long)diff,
          (long long)n);
    /* to_bf16 and from_bf16 (activation checkpointing's bf16 storage):
     * the CPU's bits both ways (NaN: any NaN) */
    float *cv = tc_rand(s, n, 3.0f);
    for (int i = 0; i < (int)(sizeof special / sizeof special[0]); i++)
        memcpy(&cv[i * 1000], &special[i], sizeof(float));
    uint16_t *hb = malloc(sizeof(uint16_t) * (size_t)n);
    float *hf = malloc(F(n));
    tc_cpu->to_bf16(hb, cv, n);
    tc_cpu->from_bf16(hf, hb, n);
    float *d_cv = tc_up(cv, F(n)), *d_f = tc_up(cv, F(n));
    uint16_t *d_b = tc_up(hb, sizeof(uint16_t) * (size_t)n);
    tc_gpu->zero(d_b, sizeof(uint16_t) * (size_t)n);
    tc_gpu->to_bf16(d_b, d_cv, n);
    tc_gpu->from_bf16(d_f, d_b, n);
    uint16_t *gb = tc_down(d_b, sizeof(uint16_t) * (size_t)n);
    float *gf = tc_down(d_f, F(n));
    int64_t dbits, dvals;
    roundtrip_diffs(gb, gf, hb, hf, 0, n, &dbits, &dvals);
    CHECK(dbits == 0 && dvals == 0, "to_bf16/from_bf16: %lld and %lld of %lld elements differ "
          "from the CPU's bits", (long long)dbits, (long long)dvals, (long long)n);
    /* again one element in (2 and 4 bytes: off 16-byte alignment), the
     * kernels' one-element path; the aligned calls above took 16-byte
     * packs and then the last n % 8 one by one */
    tc_gpu->zero(d_b, sizeof(uint16_t) * (size_t)n);
    tc_gpu->to_bf16(d_b + 1, d_cv + 1, n - 1);
    tc_gpu->from_bf16(d_f + 1, d_b + 1, n - 1);
    free(gb), free(gf);
    gb = tc_down(d_b, sizeof(uint16_t) * (size_t)n);
    gf = tc_down(d_f, F(n));
    roundtrip_diffs(gb, gf, hb, hf, 1, n, &dbits, &dvals);
    CHECK(gb[0] == 0 && dbits == 0 && dvals == 0,
          "to_bf16/from_bf16 unaligned: %lld and %lld of %lld elements differ from the CPU's "
          "bits (or element 0 was written)", (long long)dbits, (long long)dvals, (long long)n - 1);
    free(cv), free(hb), free(hf), free(gb), free(gf);
    free(gate), free(up), free(dout), free(out), free(dg), free(du), free(g), free(gg), free(gu);
    free(ga), free(r), free(gr);
    mt_cuda_arena_reset(&tc_arena);
}

static void test_adamw(uint64_t *s)
{
    const int64_t n = 5000;
    float *p = tc_rand(s, n, 1.0f), *g = tc_rand(s, n, 1.0f), *m = tc_rand(s, n, 0.1f);
    float *v = tc_rand(s, n, 0.1f);
    for (int64_t i = 0; i < n; i++)
        v[i] = fabsf(v[i]);
    float *d_p = tc_up(p, F(n)), *d_g = tc_up(g, F(n)), *d_m = tc_up(m, F(n)), *d_v = tc_up(v, F(n));
    uint16_t *d_pb = tc_dev((size_t)n * 2);
    tc_cpu->adamw(p, g, 1.0f, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7);
    mt_cuda_adamw_mixed(d_p, d_pb, d_g, d_m, d_v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7);
    float *gp = tc_down(d_p, F(n)), *gm = tc_down(d_m, F(n)), *gv = tc_down(d_v, F(n));
    uint16_t *gb = tc_down(d_pb, (size_t)n * 2);
    CHECK_CLOSE("adamw p", gp, p, n, 1e-6);
    CHECK_CLOSE("adamw m", gm, m, n, 1e-6);
    CHECK_CLOSE("adamw v", gv, v, n, 1e-6);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += gb[i] != mt_f32_to_bf16(gp[i]);
    CHECK(bad == 0, "adamw_mixed: %lld bf16 copies are not the rounded fp32 weights",
          (long long)bad);
    /* the conversions round to nearest even, like the host's */
    uint16_t *d_b2 = tc_dev((size_t)n * 2);
    float *d_f2 = tc_dev(F(n));
    mt_cuda_f32_to_bf16(d_b2, d_g, n);
    mt_cuda_bf16_to_f32(d_f2, d_b2, n);
    float *gf = tc_down(d_f2, F(n));
    bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += gf[i] != mt_bf16_to_f32(mt_f32_to_bf16(g[i]));
    CHECK(bad == 0, "bf16 conversion: %lld values differ from the host's rounding", (long long)bad);

    /* adamw_bf16_copy: adamw's bits, and the compute copy its rounding */
    float *e_p = tc_up(gp, F(n)), *e_m = tc_up(gm, F(n)), *e_v = tc_up(gv, F(n));
    float *d_w = tc_dev(F(n));
    tc_gpu->adamw(d_p, d_g, 1.0f, d_m, d_v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 8);
    tc_gpu->adamw_bf16_copy(e_p, d_w, d_g, 1.0f, e_m, e_v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 8);
    float *hp = tc_down(d_p, F(n)), *hm = tc_down(d_m, F(n)), *hv = tc_down(d_v, F(n));
    float *ep = tc_down(e_p, F(n)), *em = tc_down(e_m, F(n)), *ev = tc_down(e_v, F(n));
    float *hw = tc_down(d_w, F(n));
    CHECK_SAME_BYTES("adamw_bf16_copy p", ep, hp, F(n));
    CHECK_SAME_BYTES("adamw_bf16_copy m", em, hm, F(n));
    CHECK_SAME_BYTES("adamw_bf16_copy v", ev, hv, F(n));
    bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += hw[i] != mt_bf16_to_f32(mt_f32_to_bf16(hp[i]));
    CHECK(bad == 0, "adamw_bf16_copy: %lld compute copies are not the rounded master weights",
          (long long)bad);
    /* gscale (clipping): the bits of the scale pass first */
    float *d_gs = tc_up(g, F(n)), *f_p = tc_up(hp, F(n)), *f_m = tc_up(hm, F(n));
    float *f_v = tc_up(hv, F(n));
    tc_gpu->scale(d_gs, 0.37f, n);
    tc_gpu->adamw(d_p, d_gs, 1.0f, d_m, d_v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 9);
    tc_gpu->adamw(f_p, d_g, 0.37f, f_m, f_v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 9);
    float *sp = tc_down(d_p, F(n)), *fp = tc_down(f_p, F(n)), *fv = tc_down(f_v, F(n));
    float *sv = tc_down(d_v, F(n));
    CHECK_SAME_BYTES("adamw gscale p", fp, sp, F(n));
    CHECK_SAME_BYTES("adamw gscale v", fv, sv, F(n));
    free(sp), free(fp), free(fv), free(sv);
    free(p), free(g), free(m), free(v), free(gp), free(gm), free(gv), free(gb), free(gf);
    free(hp), free(hm), free(hv), free(ep), free(em), free(ev), free(hw);
    mt_cuda_arena_reset(&tc_arena);
}

static void test_cross_entropy(uint64_t *s)
{
    const int64_t n = 23, V = 1100, v_valid = 1037;
    float *lg = tc_rand(s, n * V, 8.0f);
    int32_t tg[23];
    for (int64_t i = 0; i < n; i++)
        tg[i] = i % 5 == 3 ? -100 : (int32_t)(tc_rng_next(s) % v_valid);
    float *dl = malloc(F(n * V));
    int64_t cnt_c = 0, cnt_g = 0;
    const double lc = tc_cpu->cross_entropy(dl, lg, tg, n, V, v_valid, 0.25f, &cnt_c);
    float *d_lg = tc_up(lg, F(n * V));
    int32_t *d_tg = tc_up(tg, sizeof tg);
    const double lgpu = tc_gpu->cross_entropy(d_lg, d_lg, d_tg, n, V, v_valid, 0.25f, &cnt_g);
    float *g = tc_down(d_lg, F(n * V)); /* in place */
    CHECK(cnt_c == cnt_g, "cross_entropy count %lld vs cpu %lld", (long long)cnt_g, (long long)cnt_c);
    CHECK(fabs(lgpu - lc) <= 1e-5 * fabs(lc), "cross_entropy loss %.9g vs cpu %.9g", lgpu, lc);
    CHECK_CLOSE("cross_entropy dlogits (in place)", g, dl, n * V, 1e-5);
    /* a row of 8192 (16-byte packs, two a thread) whose first 4096 logits
     * are NaN: the loss is NaN; or -inf: they add nothing, the CPU's loss
     * on the whole row and on the other 4096.  (The one-pass max and sum
     * once dropped a NaN a thread met before its first finite logit.) */
    for (int inf = 0; inf < 2; inf++) {
        const int64_t W = 8192;
        float *row = malloc(F(W)), *drow = malloc(F(W));
        int32_t t = 5000;
        for (int64_t j = 0; j < W; j++)
            row[j] = j < W / 2 ? (inf ? -INFINITY : NAN) : 0.1f * (float)(j % 7);
        float *d_row = tc_up(row, F(W));
        int32_t *d_t = tc_up(&t, sizeof t);
        int64_t c1 = 0, c2 = 0;
        const double l1 = tc_gpu->cross_entropy(NULL, d_row, d_t, 1, W, W, 1.0f, &c1);
        int32_t t0 = t - (int32_t)(W / 2);
        const double l0 = tc_cpu->cross_entropy(drow, row + W / 2, &t0, 1, W / 2, W / 2, 1.0f, &c2);
        int64_t c3 = 0;
        const double lw = tc_cpu->cross_entropy(NULL, row, &t, 1, W, W, 1.0f, &c3);
        if (inf)
            CHECK(fabs(l1 - l0) <= 1e-6 * fabs(l0) && fabs(lw - l0) <= 1e-6 * fabs(l0),
                  "cross_entropy, -inf logits: %.9g vs cpu %.9g (whole row %.9g)", l1, l0, lw);
        else
            CHECK(isnan(l1), "cross_entropy, NaN logits: loss %.9g, not NaN", l1);
        free(row), free(drow);
    }

    /* the vocabulary-parallel passes: two shards of 600 + 500 columns */
    const int64_t V0 = 600, V1 = V - V0; /* shard 1 holds v_valid - V0 real columns */
    float *sh[2];
    for (int r = 0; r < 2; r++) {
        const int64_t w = r ? V1 : V0;
        sh[r] = malloc(F(n * w));
        for (int64_t i = 0; i < n; i++)
            memcpy(sh[r] + i * w, lg + i * V + (r ? V0 : 0), F(w));
    }
    const int64_t lo[2] = {0, V0}, wv[2] = {V0, V1}, valid[2] = {V0, v_valid - V0};
    float mx_c[2][23], mx[23];
    double z_c[2][23], ly_c[2][23], z[23], ly[23];
    for (int r = 0; r < 2; r++)
        tc_cpu->ce_shard_max(mx_c[r], sh[r], n, wv[r], valid[r]);
    for (int64_t i = 0; i < n; i++)
        mx[i] = mx_c[0][i] > mx_c[1][i] ? mx_c[0][i] : mx_c[1][i];
    for (int r = 0; r < 2; r++)
        tc_cpu->ce_shard_sum(z_c[r], ly_c[r], sh[r], tg, mx, n, wv[r], lo[r], valid[r]);
    for (int64_t i = 0; i < n; i++) {
        z[i] = z_c[0][i] + z_c[1][i];
        ly[i] = ly_c[0][i] + ly_c[1][i];
    }
    for (int r = 0; r < 2; r++) {
        float *d_sh = tc_up(sh[r], F(n * wv[r]));
        float *d_mx = tc_dev(F(n)), *d_mxg = tc_up(mx, F(n));
        double *d_z = tc_dev(n * sizeof(double)), *d_ly = tc_dev(n * sizeof(double));
        tc_gpu->ce_shard_max(d_mx, d_sh, n, wv[r], valid[r]);
        tc_gpu->ce_shard_sum(d_z, d_ly, d_sh, d_tg, d_mxg, n, wv[r], lo[r], valid[r]);
        float *g_mx = tc_down(d_mx, F(n));
        double *g_z = tc_down(d_z, n * sizeof(double)), *g_ly = tc_down(d_ly, n * sizeof(double));
        CHECK_SAME_BYTES("ce_shard_max", g_mx, mx_c[r], F(n));
        double ez = 0.0;
        for (int64_t i = 0; i < n; i++) {
            ez = fmax(ez, fabs(g_z[i] - z_c[r][i]) / z_c[r][i]);
            CHECK(g_ly[i] == ly_c[r][i], "ce_shard_sum ly[%lld] %g vs cpu %g", (long long)i,
                  g_ly[i], ly_c[r][i]);
        }
        CHECK(ez <= 1e-6, "ce_shard_sum z: relative error %.3g", ez);
        /* finish from the CPU's combined figures, in place */
        double *d_zc = tc_up(z, sizeof z), *d_lyc = tc_up(ly, sizeof ly);
        float *dref = malloc(F(n * wv[r]));
        int64_t c1 = 0, c2 = 0;
        const double l1 = tc_cpu->ce_shard_finish(dref, sh[r], tg, mx, z, ly, n, wv[r], lo[r],
                                                  valid[r], 0.25f, &c1);
        const double l2 = tc_gpu->ce_shard_finish(d_sh, d_sh, d_tg, d_mxg, d_zc, d_lyc, n, wv[r],
                                                  lo[r], valid[r], 0.25f, &c2);
        float *gd = tc_down(d_sh, F(n * wv[r]));
        CHECK(c1 == c2 && fabs(l1 - l2) <= 1e-12 * fabs(l1), "ce_shard_finish %.17g/%lld vs %.17g/%lld",
              l2, (long long)c2, l1, (long long)c1);
        CHECK_CLOSE("ce_shard_finish dlogits (in place)", gd, dref, n * wv[r], 1e-5);
        free(g_mx), free(g_z), free(g_ly), free(dref), free(gd), free(sh[r]);
    }
    mt_cuda_arena_reset(&tc_arena);

    /* bf16 logits: the CPU's fp32 loss of the same (bf16-exact) values */
    uint16_t *lb = malloc((size_t)(n * V) * 2);
    for (int64_t i = 0; i < n * V; i++) {
        lb[i] = mt_f32_to_bf16(lg[i]);
        lg[i] = mt_bf16_to_f32(lb[i]);
    }
    const double lc2 = tc_cpu->cross_entropy(dl, lg, tg, n, V, v_valid, 0.25f, &cnt_c);
    uint16_t *d_lb = tc_up(lb, (size_t)(n * V) * 2);
    d_tg = tc_up(tg, sizeof tg);
    const double lb2 = mt_cuda_cross_entropy_bf16(d_lb, d_lb, d_tg, n, V, v_valid, 0.25f, &cnt_g);
    uint16_t *gb = tc_down(d_lb, (size_t)(n * V) * 2);
    for (int64_t i = 0; i < n * V; i++)
        g[i] = mt_bf16_to_f32(gb[i]);
    CHECK(fabs(lb2 - lc2) <= 1e-5 * fabs(lc2), "cross_entropy_bf16 loss %.9g vs cpu %.9g", lb2, lc2);
    CHECK_CLOSE("cross_entropy_bf16 dlogits (bf16)", g, dl, n * V, 8e-3);
    free(lg), free(dl), free(g), free(lb), free(gb);
    mt_cuda_arena_reset(&tc_arena);
}

/* LM head + cross-entropy in bf16 chunks against the CPU's fp32 matmuls
 * and cross-entropy on the same (bf16-exact) values.  The GPU rounds the
 * logits and dlogits to bf16 (2^-8 relative), which moves the loss by
 * ~1e-3 relative and the gradients by ~1e-2 normwise: bounds 5e-3, 2e-2.
 * Chunks of 16 rows start 256-byte aligned; chunks of 3 do not (3 x 64
 * bf16 = 384 bytes), which cuBLASLt must be told, and end in a chunk of
 * one row. */
static void test_lm_head(uint64_t *s, int64_t chunk)
{
    const int64_t n = 40, H = 64, V = 136, v_valid = 130;
    uint16_t *hb = malloc((size_t)(n * H) * 2), *wb = malloc((size_t)(V * H) * 2);
    float *h = malloc(F(n * H)), *w = malloc(F(V * H)), *dw0 = tc_rand(s, V * H, 1.0f);
    for (int64_t i = 0; i < n * H; i++)
        h[i] = mt_bf16_to_f32(hb[i] = mt_f32_to_bf16(tc_uniform(s)));
    for (int64_t i = 0; i < V * H; i++)
        w[i] = mt_bf16_to_f32(wb[i] = mt_f32_to_bf16(tc_uniform(s)));
    int32_t tg[40];
    for (int64_t i = 0; i < n; i++)
        tg[i] = i % 7 == 2 ? -100 : (int32_t)(tc_rng_next(s) % v_valid);
    /* CPU: logits, loss and dlogits, dh = dlogits W, dW += dlogits^T h */
    float *lg = malloc(F(n * V)), *dh = malloc(F(n * H)), *dw = malloc(F(V * H));
    memcpy(dw, dw0, F(V * H));
    tc_cpu->matmul(lg, h, w, n, V, H, false, true, 0.0f);
    int64_t cc = 0, cg = 0;
    const double lc = tc_cpu->cross_entropy(lg, lg, tg, n, V, v_valid, 0.5f, &cc);
    tc_cpu->matmul(dh, lg, w, n, H, V, false, false, 0.0f);
    tc_cpu->matmul(dw, lg, h, V, H, n, true, false, 1.0f);

    uint16_t *d_h = tc_up(hb, (size_t)(n * H) * 2), *d_w = tc_up(wb, (size_t)(V * H) * 2);
    uint16_t *d_dh = tc_dev((size_t)(n * H) * 2), *d_work = tc_dev((size_t)(chunk * V) * 2);
    float *d_dw = tc_up(dw0, F(V * H));
    int32_t *d_tg = tc_up(tg, sizeof tg);
    const double lgpu = mt_cuda_lm_head_cross_entropy_bf16(d_dh, d_dw, d_h, d_w, d_tg, n, H, V,
                                                           v_valid, 0.5f, d_work, chunk, &cg);
    uint16_t *g_dhb = tc_down(d_dh, (size_t)(n * H) * 2);
    float *g_dw = tc_down(d_dw, F(V * H)), *g_dh = malloc(F(n * H));
    for (int64_t i = 0; i < n * H; i++)
        g_dh[i] = mt_bf16_to_f32(g_dhb[i]);
    CHECK(cc == cg, "lm_head count %lld vs cpu %lld", (long long)cg, (long long)cc);
    CHECK(fabs(lgpu - lc) <= 5e-3 * fabs(lc), "lm_head loss %.9g vs cpu %.9g (chunk %lld)", lgpu,
          lc, (long long)chunk);
    CHECK_CLOSE("lm_head_cross_entropy_bf16 dh", g_dh, dh, n * H, 2e-2);
    CHECK_CLOSE("lm_head_cross_entropy_bf16 dW (fp32, accumulated)", g_dw, dw, V * H, 2e-2);
    /* loss only: no gradients, the same loss */
    int64_t c2 = 0;
    const double l2 = mt_cuda_lm_head_cross_entropy_bf16(NULL, NULL, d_h, d_w, d_tg, n, H, V,
                                                         v_valid, 0.5f, d_work, chunk, &c2);
    CHECK(l2 == lgpu && c2 == cg, "lm_head loss only %.17g vs %.17g", l2, lgpu);
    free(hb), free(wb), free(h), free(w), free(dw0), free(lg), free(dh), free(dw), free(g_dhb);
    free(g_dw), free(g_dh);
    mt_cuda_arena_reset(&tc_arena);
}

int main(void)
{
    tc_setup("test_cuda_kernels", mt_backend_cuda);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    test_matmul(&seed);
    test_matmul_bf16(&seed);
    test_lt_plans(&seed);
    test_embedding(&seed);
    test_rmsnorm(&seed);
    test_rmsnorm_split(&seed);
    test_rope(&seed);
    test_elementwise(&seed);
    test_adamw(&seed);
    test_cross_entropy(&seed);
    test_lm_head(&seed, 16);
    test_lm_head(&seed, 3);
    /* the other files' checks count through their returned counts */
    tc_add_counts(tc_test_moe(&seed));
    tc_add_counts(tc_test_attention(&seed));
    tc_teardown();
    return mt_test_exit("test_cuda_kernels");
}
