/* test_cuda_kernels_moe.c: the CUDA backend's mixture-of-experts kernels:
 * the device-side permutation of mt_cuda.h (route, permute, unpermute)
 * against host loops. */
#include "test_cuda_kernels.h"

#define F(n) ((size_t)(n) * sizeof(float))

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
    permute_case(seed);
    return tc_counts();
}
