/* test_cuda_attention.c: the CUDA attention kernels against the CPU
 * backend's, forward and backward, with grouped-query heads, with and
 * without the doc_start document mask, at head dims that are and are not
 * multiples of 32; and the backward's determinism (two runs, same bytes).
 * Bound: 2e-5 normwise; both sides are fp32 with different summation
 * orders (CPU: sgemm blocks of 128 keys; GPU: warp tiles of 32), whose
 * rounding differences are a few u = 6e-8 times the reduction depth. */
#include "test_cuda_kernels.h"

#define ATT_TOL 2e-5

static void one_case(uint64_t *s, int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd,
                     int docs)
{
    char tag[96];
    snprintf(tag, sizeof tag, "B=%lld T=%lld nh=%lld nkv=%lld hd=%lld%s", (long long)B,
             (long long)T, (long long)nh, (long long)nkv, (long long)hd, docs ? " docs" : "");
    if (tc_verbose)
        printf(" attention %s\n", tag);
    const int64_t nq = B * T * nh * hd, nk = B * T * nkv * hd, nl = B * nh * T;
    float *q = tc_rand(s, nq, 1.0f), *k = tc_rand(s, nk, 1.0f), *v = tc_rand(s, nk, 1.0f);
    float *dout = tc_rand(s, nq, 1.0f);
    int32_t *doc = NULL;
    if (docs) { /* documents of 1..T/3+1 tokens */
        doc = (int32_t *)malloc((size_t)(B * T) * sizeof(int32_t));
        for (int64_t b = 0; b < B; b++) {
            int64_t start = 0, left = 0;
            for (int64_t t = 0; t < T; t++) {
                if (left == 0) {
                    start = t;
                    left = 1 + (int64_t)(tc_rng_next(s) % (uint64_t)(T / 3 + 1));
                }
                doc[b * T + t] = (int32_t)start;
                left--;
            }
        }
    }
    float *out = malloc((size_t)nq * sizeof(float)), *lse = malloc((size_t)nl * sizeof(float));
    float *dq = malloc((size_t)nq * sizeof(float)), *dk = malloc((size_t)nk * sizeof(float));
    float *dv = malloc((size_t)nk * sizeof(float));
    tc_cpu->attention_forward(out, lse, q, k, v, doc, B, T, nh, nkv, hd);
    tc_cpu->attention_backward(dq, dk, dv, dout, out, lse, q, k, v, doc, B, T, nh, nkv, hd);

    float *d_q = tc_up(q, (size_t)nq * 4), *d_k = tc_up(k, (size_t)nk * 4);
    float *d_v = tc_up(v, (size_t)nk * 4), *d_dout = tc_up(dout, (size_t)nq * 4);
    int32_t *d_doc = doc ? tc_up(doc, (size_t)(B * T) * 4) : NULL;
    float *d_out = tc_dev((size_t)nq * 4), *d_lse = tc_dev((size_t)nl * 4);
    float *d_dq = tc_dev((size_t)nq * 4), *d_dk = tc_dev((size_t)nk * 4);
    float *d_dv = tc_dev((size_t)nk * 4);
    tc_gpu->attention_forward(d_out, d_lse, d_q, d_k, d_v, d_doc, B, T, nh, nkv, hd);
    /* backward from the CPU's out and lse, so each half is checked alone */
    float *c_out = tc_up(out, (size_t)nq * 4), *c_lse = tc_up(lse, (size_t)nl * 4);
    tc_gpu->attention_backward(d_dq, d_dk, d_dv, d_dout, c_out, c_lse, d_q, d_k, d_v, d_doc, B, T,
                               nh, nkv, hd);
    float *g_out = tc_down(d_out, (size_t)nq * 4), *g_lse = tc_down(d_lse, (size_t)nl * 4);
    float *g_dq = tc_down(d_dq, (size_t)nq * 4), *g_dk = tc_down(d_dk, (size_t)nk * 4);
    float *g_dv = tc_down(d_dv, (size_t)nk * 4);
    char what[160];
    snprintf(what, sizeof what, "attention out %s", tag);
    CHECK_CLOSE(what, g_out, out, nq, ATT_TOL);
    snprintf(what, sizeof what, "attention lse %s", tag);
    CHECK_CLOSE(what, g_lse, lse, nl, ATT_TOL);
    snprintf(what, sizeof what, "attention dq %s", tag);
    CHECK_CLOSE(what, g_dq, dq, nq, ATT_TOL);
    snprintf(what, sizeof what, "attention dk %s", tag);
    CHECK_CLOSE(what, g_dk, dk, nk, ATT_TOL);
    snprintf(what, sizeof what, "attention dv %s", tag);
    CHECK_CLOSE(what, g_dv, dv, nk, ATT_TOL);

    /* determinism: a second backward gives the same bytes */
    tc_gpu->attention_backward(d_dq, d_dk, d_dv, d_dout, c_out, c_lse, d_q, d_k, d_v, d_doc, B, T,
                               nh, nkv, hd);
    float *h_dq = tc_down(d_dq, (size_t)nq * 4), *h_dk = tc_down(d_dk, (size_t)nk * 4);
    snprintf(what, sizeof what, "attention backward twice %s", tag);
    CHECK_SAME_BYTES(what, h_dq, g_dq, (size_t)nq * 4);
    CHECK_SAME_BYTES(what, h_dk, g_dk, (size_t)nk * 4);

    free(q), free(k), free(v), free(dout), free(doc), free(out), free(lse), free(dq), free(dk);
    free(dv), free(g_out), free(g_lse), free(g_dq), free(g_dk), free(g_dv), free(h_dq);
    free(h_dk);
    mt_cuda_arena_reset(&tc_arena);
}

tc_counts_t tc_test_attention(uint64_t *seed)
{
    one_case(seed, 2, 70, 4, 2, 40, 0);  /* GQA, hd not a multiple of 32, T not of the tiles */
    one_case(seed, 2, 70, 4, 2, 40, 1);  /* the document mask */
    one_case(seed, 1, 33, 2, 2, 64, 1);  /* MHA */
    one_case(seed, 1, 130, 8, 1, 128, 0); /* MQA, the largest head dim served */
    one_case(seed, 1, 1, 1, 1, 8, 0);    /* one token */
    return tc_counts();
}
