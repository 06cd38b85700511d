/* test_cuda_attention.c: the CUDA attention kernels against the CPU
 * backend's, forward and backward, with grouped-query heads, with and
 * without the doc_start document mask, with sliding windows (first
 * visible keys max(document start, t - W + 1)), at head dims that are and
 * are not multiples of 32; and the backward's determinism (two runs, same
 * bytes).
 * The ring-attention block kernels (attention_block_forward/backward)
 * likewise, at global offsets q0/k0 that put the causal diagonal inside
 * the block, before it and after it, with rows that see no key of the
 * block (asserted untouched), a document boundary inside the block,
 * random documents, windows on global indices (one wholly left of the
 * keys), a running (out, lse) to merge into, lse_stride > nq
 * (padding asserted untouched) and nonzero dq/dk/dv to add to; and a
 * row's keys split into two blocks against the dense kernels on the GPU.
 * Bound: 2e-5 normwise; both sides are fp32 with different summation
 * orders (CPU: sgemm blocks of 128 keys; GPU: warp tiles of 32), whose
 * rounding differences are a few u = 6e-8 times the reduction depth. */
#include <stdbool.h>

#include "test_cuda_kernels.h"

#define ATT_TOL 2e-5

/* CHECK_CLOSE_FLOOR at ATT_TOL, the message naming the tensor and the
 * case.  The floor: one visible key makes dq and dk exactly 0, rounding
 * noise of O(1) terms on both sides (about 1e-8 here); 1e-2 allows 2e-7,
 * room for the device's other order and FMA contraction, and is below
 * every other case's largest gradient. */
static void check_att(const char *name, const char *tag, const float *got, const float *ref,
                      int64_t n)
{
    char what[256];
    snprintf(what, sizeof what, "%s %s", name, tag);
    CHECK_CLOSE_FLOOR(what, got, ref, n, ATT_TOL, 1e-2);
}

static void one_case(uint64_t *s, int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd,
                     int docs, int64_t W)
{
    char tag[128];
    snprintf(tag, sizeof tag, "B=%lld T=%lld nh=%lld nkv=%lld hd=%lld%s W=%lld", (long long)B,
             (long long)T, (long long)nh, (long long)nkv, (long long)hd, docs ? " docs" : "",
             (long long)W);
    if (tc_verbose)
        printf(" attention %s\n", tag);
    const int64_t nq = B * T * nh * hd, nk = B * T * nkv * hd, nl = B * nh * T;
    float *q = tc_rand(s, nq, 1.0f), *k = tc_rand(s, nk, 1.0f), *v = tc_rand(s, nk, 1.0f);
    float *dout = tc_rand(s, nq, 1.0f);
    int32_t *doc = NULL;
    if (docs)
        doc = tc_make_docs(s, B, T);
    if (W > 0)
        doc = tc_window(doc, B, T, W);
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
    check_att("attention out", tag, g_out, out, nq);
    check_att("attention lse", tag, g_lse, lse, nl);
    check_att("attention dq", tag, g_dq, dq, nq);
    check_att("attention dk", tag, g_dk, dk, nk);
    check_att("attention dv", tag, g_dv, dv, nk);
    char what[160];

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

/* ------------------------------------------------------------------ ring-attention blocks */

enum { DOCS_NONE, DOCS_BOUNDARY, DOCS_RANDOM, DOCS_WINDOW, DOCS_RANDOM_WINDOW };
#define BLOCK_W 29 /* the window of the DOCS_*WINDOW cases */

/* visible keys of block query i as LOCAL key indices [*lo, *hi] */
static void block_range(const int32_t *doc, int64_t i, int64_t nk, int64_t q0, int64_t k0,
                        int64_t *lo, int64_t *hi)
{
    const int64_t f = doc ? doc[i] : 0, t = q0 + i;
    *lo = (f > k0 ? f : k0) - k0;
    *hi = (t < k0 + nk - 1 ? t : k0 + nk - 1) - k0;
}

/* doc_start of queries q0..q0+nq (global indices) */
static int32_t *block_docs(uint64_t *s, int kind, int64_t nq, int64_t nk, int64_t q0, int64_t k0)
{
    if (kind == DOCS_NONE)
        return NULL;
    int32_t *doc = malloc((size_t)nq * sizeof(int32_t));
    if (kind == DOCS_WINDOW || kind == DOCS_RANDOM_WINDOW) { /* the window on global indices */
        int32_t *d = kind == DOCS_RANDOM_WINDOW ? block_docs(s, DOCS_RANDOM, nq, nk, q0, k0) : NULL;
        for (int64_t i = 0; i < nq; i++) {
            const int64_t t = q0 + i, f = d ? d[i] : 0;
            doc[i] = (int32_t)(t - BLOCK_W + 1 > f ? t - BLOCK_W + 1 : f);
        }
        free(d);
        return doc;
    }
    if (kind == DOCS_BOUNDARY) { /* one document ends inside the key block */
        const int64_t bnd = k0 + nk / 2;
        for (int64_t i = 0; i < nq; i++)
            doc[i] = (int32_t)(q0 + i >= bnd ? bnd : 0);
        return doc;
    }
    int64_t start = 0, left = 0;
    for (int64_t t = 0; t < q0 + nq; t++) { /* documents of 1..nk/3+1 tokens over the row */
        if (left == 0) {
            start = t;
            left = 1 + (int64_t)(tc_rng_next(s) % (uint64_t)(nk / 3 + 1));
        }
        if (t >= q0)
            doc[t - q0] = (int32_t)start;
        left--;
    }
    return doc;
}

/* lse may hold -inf (rows that saw no key yet): the same positions must
 * be -inf on both sides; the rest is compared normwise */
static void check_lse(const char *what, const float *got, const float *ref, int64_t n, double tol)
{
    float *g = malloc((size_t)n * sizeof(float)), *r = malloc((size_t)n * sizeof(float));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const int gi = isinf(got[i]) && got[i] < 0, ri = isinf(ref[i]) && ref[i] < 0;
        bad += gi != ri;
        g[i] = gi ? 0.0f : got[i];
        r[i] = ri ? 0.0f : ref[i];
    }
    CHECK(bad == 0, "%s: %lld entries -inf on one side only", what, (long long)bad);
    CHECK_CLOSE(what, g, r, n, tol);
    free(g), free(r);
}

/* rows of `width` floats at `stride` apart from base: the same bytes? */
static int64_t rows_changed(const float *a, const float *b, int64_t row, int64_t stride,
                            int64_t width)
{
    return memcmp(a + row * stride, b + row * stride, (size_t)width * sizeof(float)) != 0;
}

static void block_case(uint64_t *s, const char *name, int64_t nq, int64_t nk, int64_t q0,
                       int64_t k0, int64_t nh, int64_t nkv, int64_t hd, int docs, int64_t pad,
                       bool fresh)
{
    char tag[160], what[224];
    snprintf(tag, sizeof tag, "%s (nq=%lld nk=%lld q0=%lld k0=%lld nh=%lld nkv=%lld hd=%lld)",
             name, (long long)nq, (long long)nk, (long long)q0, (long long)k0, (long long)nh,
             (long long)nkv, (long long)hd);
    if (tc_verbose)
        printf(" attention block %s\n", tag);
    const int64_t qs = nh * hd, kvs = nkv * hd, ls = nq + pad;
    const int64_t nqe = nq * qs, nke = nk * kvs, nl = nh * ls;
    float *q = tc_rand(s, nqe, 1.0f), *k = tc_rand(s, nke, 1.0f), *v = tc_rand(s, nke, 1.0f);
    float *dout = tc_rand(s, nqe, 1.0f);
    int32_t *doc = block_docs(s, docs, nq, nk, q0, k0);
    /* the running state: nothing yet, or an earlier block's; padding random */
    float *out0 = tc_rand(s, nqe, 1.0f), *lse0 = tc_rand(s, nl, 1.0f);
    for (int64_t i = 0; i < nl; i++)
        lse0[i] = fresh && i % ls < nq ? -INFINITY : lse0[i] + 2.0f;
    if (fresh)
        memset(out0, 0, (size_t)nqe * sizeof(float));
    int64_t masked = 0, unseen = 0;
    bool *row_sees = malloc((size_t)nq), *key_seen = calloc((size_t)(nk > 0 ? nk : 1), 1);
    for (int64_t i = 0; i < nq; i++) {
        int64_t lo, hi;
        block_range(doc, i, nk, q0, k0, &lo, &hi);
        row_sees[i] = lo <= hi;
        masked += !row_sees[i];
        for (int64_t c = lo; c <= hi; c++)
            key_seen[c] = true;
    }
    for (int64_t c = 0; c < nk; c++)
        unseen += !key_seen[c];
    if (tc_verbose)
        printf("  %lld of %lld rows see no key, %lld of %lld keys seen by no row\n",
               (long long)masked, (long long)nq, (long long)unseen, (long long)nk);

    /* forward: CPU and GPU from the same running state */
    float *out = malloc((size_t)nqe * 4), *lse = malloc((size_t)nl * 4);
    memcpy(out, out0, (size_t)nqe * 4), memcpy(lse, lse0, (size_t)nl * 4);
    tc_cpu->attention_block_forward(out, lse, ls, q, k, v, doc, nq, nk, q0, k0, nh, nkv, hd);
    float *d_q = tc_up(q, (size_t)nqe * 4), *d_k = tc_up(k, (size_t)nke * 4);
    float *d_v = tc_up(v, (size_t)nke * 4), *d_dout = tc_up(dout, (size_t)nqe * 4);
    int32_t *d_doc = doc ? tc_up(doc, (size_t)nq * sizeof(int32_t)) : NULL;
    float *d_out = tc_up(out0, (size_t)nqe * 4), *d_lse = tc_up(lse0, (size_t)nl * 4);
    tc_gpu->attention_block_forward(d_out, d_lse, ls, d_q, d_k, d_v, d_doc, nq, nk, q0, k0, nh,
                                    nkv, hd);
    float *g_out = tc_down(d_out, (size_t)nqe * 4), *g_lse = tc_down(d_lse, (size_t)nl * 4);
    check_att("block out", tag, g_out, out, nqe);
    snprintf(what, sizeof what, "block lse %s", tag);
    check_lse(what, g_lse, lse, nl, ATT_TOL);
    int64_t touched = 0;
    for (int64_t i = 0; i < nq; i++)
        if (!row_sees[i])
            touched += rows_changed(g_out, out0, i, qs, qs);
    for (int64_t h = 0; h < nh; h++)
        for (int64_t i = 0; i < ls; i++)
            if (i >= nq || !row_sees[i])
                touched += memcmp(&g_lse[h * ls + i], &lse0[h * ls + i], 4) != 0;
    CHECK(touched == 0, "block forward %s: %lld masked rows or lse padding entries written", tag,
          (long long)touched);

    /* backward from the CPU's merged (out, lse), adding to nonzero gradients */
    float *dq0 = tc_rand(s, nqe, 1.0f), *dk0 = tc_rand(s, nke, 1.0f), *dv0 = tc_rand(s, nke, 1.0f);
    float *dq = malloc((size_t)nqe * 4), *dk = malloc((size_t)nke * 4), *dv = malloc((size_t)nke * 4);
    memcpy(dq, dq0, (size_t)nqe * 4), memcpy(dk, dk0, (size_t)nke * 4);
    memcpy(dv, dv0, (size_t)nke * 4);
    tc_cpu->attention_block_backward(dq, dk, dv, dout, out, lse, ls, q, k, v, doc, nq, nk, q0, k0,
                                     nh, nkv, hd);
    float *c_out = tc_up(out, (size_t)nqe * 4), *c_lse = tc_up(lse, (size_t)nl * 4);
    float *d_dq = tc_up(dq0, (size_t)nqe * 4), *d_dk = tc_up(dk0, (size_t)nke * 4);
    float *d_dv = tc_up(dv0, (size_t)nke * 4);
    tc_gpu->attention_block_backward(d_dq, d_dk, d_dv, d_dout, c_out, c_lse, ls, d_q, d_k, d_v,
                                     d_doc, nq, nk, q0, k0, nh, nkv, hd);
    float *g_dq = tc_down(d_dq, (size_t)nqe * 4), *g_dk = tc_down(d_dk, (size_t)nke * 4);
    float *g_dv = tc_down(d_dv, (size_t)nke * 4);
    check_att("block dq (added)", tag, g_dq, dq, nqe);
    check_att("block dk (added)", tag, g_dk, dk, nke);
    check_att("block dv (added)", tag, g_dv, dv, nke);
    touched = 0;
    for (int64_t i = 0; i < nq; i++)
        if (!row_sees[i])
            touched += rows_changed(g_dq, dq0, i, qs, qs);
    for (int64_t c = 0; c < nk; c++)
        if (!key_seen[c])
            touched += rows_changed(g_dk, dk0, c, kvs, kvs) + rows_changed(g_dv, dv0, c, kvs, kvs);
    CHECK(touched == 0, "block backward %s: %lld rows that see nothing written", tag,
          (long long)touched);

    /* determinism: the same start gives the same bytes */
    tc_gpu->copy_to_device(d_dq, dq0, (size_t)nqe * 4);
    tc_gpu->copy_to_device(d_dk, dk0, (size_t)nke * 4);
    tc_gpu->copy_to_device(d_dv, dv0, (size_t)nke * 4);
    tc_gpu->attention_block_backward(d_dq, d_dk, d_dv, d_dout, c_out, c_lse, ls, d_q, d_k, d_v,
                                     d_doc, nq, nk, q0, k0, nh, nkv, hd);
    float *h_dq = tc_down(d_dq, (size_t)nqe * 4), *h_dk = tc_down(d_dk, (size_t)nke * 4);
    float *h_dv = tc_down(d_dv, (size_t)nke * 4);
    snprintf(what, sizeof what, "block backward twice %s", tag);
    CHECK_SAME_BYTES(what, h_dq, g_dq, (size_t)nqe * 4);
    CHECK_SAME_BYTES(what, h_dk, g_dk, (size_t)nke * 4);
    CHECK_SAME_BYTES(what, h_dv, g_dv, (size_t)nke * 4);

    free(q), free(k), free(v), free(dout), free(doc), free(out0), free(lse0), free(row_sees);
    free(key_seen), free(out), free(lse), free(g_out), free(g_lse), free(dq0), free(dk0);
    free(dv0), free(dq), free(dk), free(dv), free(g_dq), free(g_dk), free(g_dv), free(h_dq);
    free(h_dk), free(h_dv);
    mt_cuda_arena_reset(&tc_arena);
}

/* One row of T tokens (random documents) with its keys in two blocks,
 * [0, T1) and [T1, T), as ring attention splits it: merged forward and
 * summed backward against the dense kernels, both on the GPU. */
static void split_case(uint64_t *s, int64_t T, int64_t T1, int64_t nh, int64_t nkv, int64_t hd)
{
    const int64_t qs = nh * hd, kvs = nkv * hd, nqe = T * qs, nke = T * kvs, nl = nh * T;
    float *q = tc_rand(s, nqe, 1.0f), *k = tc_rand(s, nke, 1.0f), *v = tc_rand(s, nke, 1.0f);
    float *dout = tc_rand(s, nqe, 1.0f), *ninf = malloc((size_t)nl * 4);
    for (int64_t i = 0; i < nl; i++)
        ninf[i] = -INFINITY;
    int32_t *doc = block_docs(s, DOCS_RANDOM, T, T, 0, 0);
    float *d_q = tc_up(q, (size_t)nqe * 4), *d_k = tc_up(k, (size_t)nke * 4);
    float *d_v = tc_up(v, (size_t)nke * 4), *d_dout = tc_up(dout, (size_t)nqe * 4);
    int32_t *d_doc = tc_up(doc, (size_t)T * sizeof(int32_t));
    float *d_out = tc_dev((size_t)nqe * 4), *d_lse = tc_dev((size_t)nl * 4);
    float *d_dq = tc_dev((size_t)nqe * 4), *d_dk = tc_dev((size_t)nke * 4);
    float *d_dv = tc_dev((size_t)nke * 4);
    tc_gpu->attention_forward(d_out, d_lse, d_q, d_k, d_v, d_doc, 1, T, nh, nkv, hd);
    tc_gpu->attention_backward(d_dq, d_dk, d_dv, d_dout, d_out, d_lse, d_q, d_k, d_v, d_doc, 1, T,
                               nh, nkv, hd);

    float *b_out = tc_dev((size_t)nqe * 4), *b_lse = tc_up(ninf, (size_t)nl * 4);
    float *b_dq = tc_dev((size_t)nqe * 4), *b_dk = tc_dev((size_t)nke * 4);
    float *b_dv = tc_dev((size_t)nke * 4);
    tc_gpu->zero(b_out, (size_t)nqe * 4), tc_gpu->zero(b_dq, (size_t)nqe * 4);
    tc_gpu->zero(b_dk, (size_t)nke * 4), tc_gpu->zero(b_dv, (size_t)nke * 4);
    const int64_t k0[2] = {0, T1}, nk[2] = {T1, T - T1};
    for (int b = 0; b < 2; b++)
        tc_gpu->attention_block_forward(b_out, b_lse, T, d_q, d_k + k0[b] * kvs,
                                        d_v + k0[b] * kvs, d_doc, T, nk[b], 0, k0[b], nh, nkv,
                                        hd);
    for (int b = 0; b < 2; b++) /* from the dense (out, lse), so each half is checked alone */
        tc_gpu->attention_block_backward(b_dq, b_dk + k0[b] * kvs, b_dv + k0[b] * kvs, d_dout,
                                         d_out, d_lse, T, d_q, d_k + k0[b] * kvs,
                                         d_v + k0[b] * kvs, d_doc, T, nk[b], 0, k0[b], nh, nkv,
                                         hd);
    float *outs[2][5] = {{tc_down(d_out, (size_t)nqe * 4), tc_down(d_lse, (size_t)nl * 4),
                          tc_down(d_dq, (size_t)nqe * 4), tc_down(d_dk, (size_t)nke * 4),
                          tc_down(d_dv, (size_t)nke * 4)},
                         {tc_down(b_out, (size_t)nqe * 4), tc_down(b_lse, (size_t)nl * 4),
                          tc_down(b_dq, (size_t)nqe * 4), tc_down(b_dk, (size_t)nke * 4),
                          tc_down(b_dv, (size_t)nke * 4)}};
    const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
    const int64_t sizes[5] = {nqe, nl, nqe, nke, nke};
    char tag[64];
    snprintf(tag, sizeof tag, "(two key blocks vs dense, T=%lld T1=%lld)", (long long)T,
             (long long)T1);
    for (int i = 0; i < 5; i++) {
        check_att(names[i], tag, outs[1][i], outs[0][i], sizes[i]);
        free(outs[0][i]), free(outs[1][i]);
    }
    free(q), free(k), free(v), free(dout), free(ninf), free(doc);
    mt_cuda_arena_reset(&tc_arena);
}

tc_counts_t tc_test_attention(uint64_t *seed)
{
    one_case(seed, 2, 70, 4, 2, 40, 0, 0);  /* GQA, hd not a multiple of 32, T not of the tiles */
    one_case(seed, 2, 70, 4, 2, 40, 1, 0);  /* the document mask */
    one_case(seed, 1, 33, 2, 2, 64, 1, 0);  /* MHA */
    one_case(seed, 1, 130, 8, 1, 128, 0, 0); /* MQA, the largest head dim served */
    one_case(seed, 1, 1, 1, 1, 8, 0, 0);    /* one token */
    /* sliding windows (as first visible keys): below, at and above the
     * kernels' 32-row tiles, with documents */
    one_case(seed, 2, 100, 4, 2, 40, 0, 7);
    one_case(seed, 1, 100, 2, 1, 64, 0, 32);
    one_case(seed, 1, 100, 2, 2, 32, 1, 45);

    block_case(seed, "diagonal inside", 50, 45, 100, 70, 4, 2, 40, DOCS_NONE, 3, false);
    block_case(seed, "masked rows", 40, 30, 0, 20, 2, 1, 64, DOCS_NONE, 0, true);
    block_case(seed, "document boundary", 70, 70, 64, 64, 4, 4, 32, DOCS_BOUNDARY, 0, false);
    block_case(seed, "random documents", 37, 90, 200, 0, 8, 1, 128, DOCS_RANDOM, 5, false);
    block_case(seed, "random documents, diagonal", 66, 66, 33, 33, 4, 2, 24, DOCS_RANDOM, 0, true);
    block_case(seed, "keys after every query", 10, 20, 0, 50, 2, 2, 16, DOCS_NONE, 0, false);
    block_case(seed, "one query, one key", 1, 1, 5, 5, 1, 1, 8, DOCS_NONE, 0, true);
    block_case(seed, "window", 60, 70, 100, 40, 4, 2, 40, DOCS_WINDOW, 2, false);
    block_case(seed, "window left of the block", 40, 30, 120, 40, 2, 1, 32, DOCS_WINDOW, 0, true);
    block_case(seed, "window, documents", 66, 66, 33, 33, 4, 2, 24, DOCS_RANDOM_WINDOW, 0, false);
    split_case(seed, 77, 40, 4, 2, 48);
    return tc_counts();
}
