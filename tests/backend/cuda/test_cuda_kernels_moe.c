/* test_cuda_kernels_moe.c: the CUDA backend's mixture-of-experts kernels.
 * The table's entries (router forward/backward, row gather, combine and
 * its backward) against the CPU backend on the same inputs, and the
 * device-side permutation of mt_cuda.h (route, permute, unpermute)
 * against host loops.  Cases: top-k ties (logits and biases from a small
 * set, and a hand-made row whose expected picks are asserted directly),
 * bias NULL and not, norm_topk on and off, the load-balancing gradient
 * dp_all NULL and not, dropped slots (slot_row -1) in the combine and its
 * backward, a residual and none, weights and none, the combine in place
 * on its residual.
 * Bounds: bitwise for the top-k indices, the gathers and the combine
 * backward's dy (copies and one product) and the probability sums (the
 * same double sums in the same order); 1e-6 normwise for the
 * probabilities, routing weights, router gradient, combine output and
 * dw (the CPU's double sums in another order, or one FMA contraction,
 * before one rounding to float). */
#include <stdbool.h>

#include "test_cuda_kernels.h"

#define I(n) ((size_t)(n) * sizeof(int32_t))
#define MOE_TOL 1e-6

static void router_case(uint64_t *s, int64_t n, int64_t E, int64_t k, bool norm, bool bias_on,
                        bool ties, bool dp_on)
{
    char tag[96];
    snprintf(tag, sizeof tag, "n=%lld E=%lld k=%lld%s%s%s%s", (long long)n, (long long)E,
             (long long)k, norm ? " norm" : "", bias_on ? " bias" : "", ties ? " ties" : "",
             dp_on ? " dp_all" : "");
    float *logits = tc_rand(s, n * E, 3.0f), *bias = NULL, *dp_all = NULL;
    if (ties) /* many equal probabilities in every row */
        for (int64_t i = 0; i < n * E; i++)
            logits[i] = 0.5f * (float)(tc_rng_next(s) % 3);
    if (bias_on) {
        bias = tc_rand(s, E, 0.05f);
        if (ties)
            for (int64_t e = 0; e < E; e++)
                bias[e] = 0.25f * (float)(tc_rng_next(s) % 2);
    }
    if (dp_on)
        dp_all = tc_rand(s, E, 0.1f);
    float *probs = malloc(F(n * E)), *w = malloc(F(n * k));
    int32_t *idx = malloc(I(n * k));
    memcpy(probs, logits, F(n * E));
    tc_cpu->moe_router_forward(probs, idx, w, bias, n, E, k, norm);

    float *d_probs = tc_up(logits, F(n * E)), *d_w = tc_dev(F(n * k));
    float *d_bias = bias ? tc_up(bias, F(E)) : NULL;
    int32_t *d_idx = tc_dev(I(n * k));
    tc_gpu->moe_router_forward(d_probs, d_idx, d_w, d_bias, n, E, k, norm);
    float *g_probs = tc_down(d_probs, F(n * E)), *g_w = tc_down(d_w, F(n * k));
    int32_t *g_idx = tc_down(d_idx, I(n * k));
    char what[160];
    snprintf(what, sizeof what, "moe_router_forward probs %s", tag);
    CHECK_CLOSE(what, g_probs, probs, n * E, MOE_TOL);
    snprintf(what, sizeof what, "moe_router_forward idx %s", tag);
    CHECK_SAME_BYTES(what, g_idx, idx, I(n * k));
    snprintf(what, sizeof what, "moe_router_forward w %s", tag);
    CHECK_CLOSE(what, g_w, w, n * k, MOE_TOL);

    /* the probability sums of the CPU's probabilities: the same order, bitwise */
    double *sums = malloc((size_t)E * sizeof(double));
    for (int64_t e = 0; e < E; e++) /* running totals to add onto */
        sums[e] = 0.01 * (double)(e + 1);
    double *d_sums = tc_up(sums, (size_t)E * sizeof(double));
    tc_cpu->moe_prob_sums(sums, probs, n, E);
    float *c_pr = tc_up(probs, F(n * E));
    tc_gpu->moe_prob_sums(d_sums, c_pr, n, E);
    double *g_sums = tc_down(d_sums, (size_t)E * sizeof(double));
    snprintf(what, sizeof what, "moe_prob_sums %s", tag);
    CHECK_SAME_BYTES(what, g_sums, sums, (size_t)E * sizeof(double));
    free(sums), free(g_sums);

    /* backward from the CPU's forward, so it is checked alone */
    float *dw = tc_rand(s, n * k, 1.0f), *dl = malloc(F(n * E));
    tc_cpu->moe_router_backward(dl, dw, probs, idx, w, dp_all, n, E, k, norm);
    float *c_probs = tc_up(probs, F(n * E)), *c_w = tc_up(w, F(n * k)), *d_dw = tc_up(dw, F(n * k));
    int32_t *c_idx = tc_up(idx, I(n * k));
    float *d_dp = dp_all ? tc_up(dp_all, F(E)) : NULL, *d_dl = tc_dev(F(n * E));
    tc_gpu->moe_router_backward(d_dl, d_dw, c_probs, c_idx, c_w, d_dp, n, E, k, norm);
    float *g_dl = tc_down(d_dl, F(n * E));
    snprintf(what, sizeof what, "moe_router_backward dlogits %s", tag);
    CHECK_CLOSE(what, g_dl, dl, n * E, MOE_TOL);

    free(logits), free(bias), free(dp_all), free(probs), free(w), free(idx), free(g_probs);
    free(g_w), free(g_idx), free(dw), free(dl), free(g_dl);
    mt_cuda_arena_reset(&tc_arena);
}

/* Rows whose picks are known: all logits equal (ties to the lowest
 * index), then the same with a bias that lifts expert 5 above the rest. */
static void router_known(void)
{
    enum { E = 8, K = 3 };
    float logits[2 * E] = {0}, bias[E] = {0};
    bias[5] = 0.5f;
    const int32_t want[2][K] = {{0, 1, 2}, {5, 0, 1}};
    for (int norm = 0; norm < 2; norm++)
        for (int b = 0; b < 2; b++) {
            float *d_p = tc_up(logits, sizeof logits), *d_w = tc_dev(F(2 * K));
            int32_t *d_idx = tc_dev(I(2 * K));
            float *d_b = b ? tc_up(bias, sizeof bias) : NULL;
            tc_gpu->moe_router_forward(d_p, d_idx, d_w, d_b, 2, E, K, norm);
            int32_t *g_idx = tc_down(d_idx, I(2 * K));
            float *g_w = tc_down(d_w, F(2 * K)), *g_p = tc_down(d_p, F(2 * E));
            const float wexp = norm ? 1.0f / K : 1.0f / E;
            for (int t = 0; t < 2; t++)
                for (int j = 0; j < K; j++) {
                    CHECK(g_idx[t * K + j] == want[b][j],
                          "moe_router_forward ties: norm=%d bias=%d row %d pick %d = %d, want %d",
                          norm, b, t, j, g_idx[t * K + j], want[b][j]);
                    CHECK(fabsf(g_w[t * K + j] - wexp) <= 1e-7f,
                          "moe_router_forward ties: norm=%d bias=%d w = %.9g, want %.9g", norm,
                          b, g_w[t * K + j], wexp);
                }
            for (int e = 0; e < 2 * E; e++)
                CHECK(fabsf(g_p[e] - 1.0f / E) <= 1e-7f, "moe_router_forward ties: p = %.9g",
                      g_p[e]);
            free(g_idx), free(g_w), free(g_p);
            mt_cuda_arena_reset(&tc_arena);
        }
}

/* slot_row [n, k] over R rows of y: a permutation of the slots with about
 * one in five dropped (-1); R - used rows are referenced by no slot. */
static int32_t *make_slots(uint64_t *s, int64_t n, int64_t k, int64_t R)
{
    int32_t *slot = malloc(I(n * k));
    for (int64_t a = 0; a < n * k; a++)
        slot[a] = (int32_t)a;
    for (int64_t a = n * k - 1; a > 0; a--) { /* Fisher-Yates */
        const int64_t b = (int64_t)(tc_rng_next(s) % (uint64_t)(a + 1));
        const int32_t x = slot[a];
        slot[a] = slot[b], slot[b] = x;
    }
    for (int64_t a = 0; a < n * k; a++)
        if (slot[a] >= R || tc_rng_next(s) % 5 == 0)
            slot[a] = -1;
    return slot;
}

static void combine_case(uint64_t *s, bool res_on, bool w_on, bool in_place)
{
    const int64_t n = 37, k = 3, width = 45, R = n * k - 4;
    char tag[64];
    snprintf(tag, sizeof tag, "%s%s%s", res_on ? "res" : "no res", w_on ? ", w" : ", no w",
             in_place ? ", in place" : "");
    int32_t *slot = make_slots(s, n, k, R);
    float *y = tc_rand(s, R * width, 1.0f), *w = w_on ? tc_rand(s, n * k, 1.0f) : NULL;
    float *res = res_on ? tc_rand(s, n * width, 1.0f) : NULL, *out = malloc(F(n * width));
    tc_cpu->moe_combine(out, res, y, slot, w, n, k, width);
    int32_t *d_slot = tc_up(slot, I(n * k));
    float *d_y = tc_up(y, F(R * width)), *d_w = w ? tc_up(w, F(n * k)) : NULL;
    float *d_res = res ? tc_up(res, F(n * width)) : NULL;
    float *d_out = in_place && d_res ? d_res : tc_dev(F(n * width));
    tc_gpu->moe_combine(d_out, d_res, d_y, d_slot, d_w, n, k, width);
    float *g_out = tc_down(d_out, F(n * width));
    char what[96];
    snprintf(what, sizeof what, "moe_combine (%s)", tag);
    CHECK_CLOSE(what, g_out, out, n * width, MOE_TOL);

    if (w_on) { /* the backward needs w */
        float *dout = tc_rand(s, n * width, 1.0f), *dy = tc_rand(s, R * width, 1.0f);
        float *dw = malloc(F(n * k)), *d_dout = tc_up(dout, F(n * width));
        float *d_dy = tc_up(dy, F(R * width)), *d_dw = tc_dev(F(n * k));
        tc_cpu->moe_combine_backward(dw, dy, dout, y, slot, w, n, k, width);
        tc_gpu->moe_combine_backward(d_dw, d_dy, d_dout, d_y, d_slot, d_w, n, k, width);
        float *g_dw = tc_down(d_dw, F(n * k)), *g_dy = tc_down(d_dy, F(R * width));
        snprintf(what, sizeof what, "moe_combine_backward dw (%s)", tag);
        CHECK_CLOSE(what, g_dw, dw, n * k, MOE_TOL);
        snprintf(what, sizeof what, "moe_combine_backward dy, unused rows kept (%s)", tag);
        CHECK_SAME_BYTES(what, g_dy, dy, F(R * width));
        int64_t bad = 0, dropped = 0;
        for (int64_t a = 0; a < n * k; a++)
            if (slot[a] < 0) {
                dropped++;
                bad += g_dw[a] != 0.0f;
            }
        CHECK(dropped > 0 && bad == 0, "moe_combine_backward: %lld of %lld dropped slots have dw != 0",
              (long long)bad, (long long)dropped);
        free(dout), free(dy), free(dw), free(g_dw), free(g_dy);
    }
    free(slot), free(y), free(w), free(res), free(out), free(g_out);
    mt_cuda_arena_reset(&tc_arena);
}

static void gather_case(uint64_t *s)
{
    const int64_t n = 90, width = 70, nsrc = 40;
    int32_t rows[90];
    for (int64_t i = 0; i < n; i++) /* repeats, and not every source row */
        rows[i] = (int32_t)(tc_rng_next(s) % (uint64_t)nsrc);
    float *src = tc_rand(s, nsrc * width, 1.0f), *dst = malloc(F(n * width));
    tc_cpu->moe_gather_rows(dst, src, rows, n, width);
    float *d_src = tc_up(src, F(nsrc * width)), *d_dst = tc_dev(F(n * width));
    int32_t *d_rows = tc_up(rows, sizeof rows);
    tc_gpu->moe_gather_rows(d_dst, d_src, d_rows, n, width);
    float *g = tc_down(d_dst, F(n * width));
    CHECK_SAME_BYTES("moe_gather_rows", g, dst, F(n * width));
    free(src), free(dst), free(g);
    mt_cuda_arena_reset(&tc_arena);
}
/* the device-side permutation of mt_cuda.h against host loops */
static void permute_case(uint64_t *s)
{
    const int64_t nt = 50, K = 2, E = 6, dim = 33, na = nt * K;
    int32_t ex[100], pos[100], off[7];
    for (int64_t i = 0; i < na; i++)
        ex[i] = (int32_t)(tc_rng_next(s) % E);
    /* reference: stable counting sort */
    int32_t cnt[6] = {0};
    for (int64_t i = 0; i < na; i++)
        cnt[ex[i]]++;
    off[0] = 0;
    for (int e = 0; e < E; e++)
        off[e + 1] = off[e] + cnt[e];
    int32_t fill[6];
    memcpy(fill, off, sizeof fill);
    for (int64_t i = 0; i < na; i++)
        pos[i] = fill[ex[i]]++;
    int32_t *d_ex = tc_up(ex, sizeof ex), *d_pos = tc_dev(sizeof pos), *d_off = tc_dev(sizeof off);
    mt_cuda_moe_route(d_pos, d_off, d_ex, na, E);
    int32_t *g_pos = tc_down(d_pos, sizeof pos), *g_off = tc_down(d_off, sizeof off);
    CHECK_SAME_BYTES("moe_route pos", g_pos, pos, sizeof pos);
    CHECK_SAME_BYTES("moe_route offsets", g_off, off, sizeof off);

    float *x = tc_rand(s, nt * dim, 1.0f), *w = tc_rand(s, na, 1.0f), *dy = tc_rand(s, nt * dim, 1.0f);
    float *perm = calloc((size_t)(na * dim), 4), *y = calloc((size_t)(nt * dim), 4);
    float *de = calloc((size_t)(na * dim), 4), *dw = calloc((size_t)na, 4);
    for (int64_t a = 0; a < na; a++)
        memcpy(perm + (int64_t)pos[a] * dim, x + (a / K) * dim, F(dim));
    for (int64_t t = 0; t < nt; t++)
        for (int64_t c = 0; c < dim; c++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++)
                acc += w[t * K + k] * perm[(int64_t)pos[t * K + k] * dim + c];
            y[t * dim + c] = acc;
        }
    for (int64_t a = 0; a < na; a++) {
        double d = 0.0;
        for (int64_t c = 0; c < dim; c++) {
            de[(int64_t)pos[a] * dim + c] = w[a] * dy[(a / K) * dim + c];
            d += (double)dy[(a / K) * dim + c] * perm[(int64_t)pos[a] * dim + c];
        }
        dw[a] = (float)d;
    }
    float *d_x = tc_up(x, F(nt * dim)), *d_w = tc_up(w, F(na)), *d_dy = tc_up(dy, F(nt * dim));
    float *d_perm = tc_dev(F(na * dim)), *d_y = tc_dev(F(nt * dim)), *d_de = tc_dev(F(na * dim));
    float *d_dw = tc_dev(F(na));
    mt_cuda_moe_permute(d_perm, d_x, d_pos, nt, K, dim);
    mt_cuda_moe_unpermute(d_y, d_perm, d_pos, d_w, nt, K, dim);
    mt_cuda_moe_unpermute_backward(d_de, d_dw, d_dy, d_perm, d_pos, d_w, nt, K, dim);
    float *g_perm = tc_down(d_perm, F(na * dim)), *g_y = tc_down(d_y, F(nt * dim));
    float *g_de = tc_down(d_de, F(na * dim)), *g_dw = tc_down(d_dw, F(na));
    CHECK_SAME_BYTES("moe_permute", g_perm, perm, F(na * dim));
    CHECK_CLOSE("moe_unpermute", g_y, y, nt * dim, 1e-6);
    CHECK_CLOSE("moe_unpermute_backward de", g_de, de, na * dim, 0.0);
    CHECK_CLOSE("moe_unpermute_backward dw", g_dw, dw, na, 1e-5);
    free(g_pos), free(g_off), free(x), free(w), free(dy), free(perm), free(y), free(de), free(dw);
    free(g_perm), free(g_y), free(g_de), free(g_dw);
    mt_cuda_arena_reset(&tc_arena);
}

tc_counts_t tc_test_moe(uint64_t *seed)
{
    /* E not a multiple of the warp, k = 1 and k = E, every option */
    router_case(seed, 64, 16, 2, false, false, false, false);
    router_case(seed, 64, 16, 2, true, false, false, true);
    router_case(seed, 50, 37, 4, true, true, false, true);
    router_case(seed, 50, 37, 4, false, true, false, false);
    router_case(seed, 70, 8, 3, true, false, true, true);  /* ties */
    router_case(seed, 70, 8, 3, false, true, true, false); /* ties with bias */
    router_case(seed, 9, 70, 6, true, true, true, true);   /* ties, E > 64 */
    router_case(seed, 5, 6, 1, false, false, false, false);
    router_case(seed, 5, 6, 6, true, true, false, true);
    router_known();
    gather_case(seed);
    for (int r = 0; r < 2; r++)
        for (int w = 0; w < 2; w++)
            combine_case(seed, r, w, false);
    combine_case(seed, true, true, true);
    permute_case(seed);
    return tc_counts();
}
