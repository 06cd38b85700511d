/* test_kernels_window: the CPU attention kernels with a sliding window
 * (Mistral's, doc/sliding-window.md) against a float64 masked softmax
 * written here from the rule itself: query t sees key j iff j <= t,
 * t - j < W and j lies in t's document.  The kernels take the window as
 * each query's first visible key, lo_t = max(doc_start[t], t - W + 1),
 * which is what the model builds; the reference never sees lo.  Windows
 * smaller than, equal to and larger than a tile (64 rows) and a key
 * block (128 keys), with and without documents, forward and backward;
 * then the block kernel of ring attention on one query chunk against a
 * key chunk on global indices; then that a key left of every window of a
 * tile is never read (the window's saving).  No MPI. */
#include "test_kernels.h"

typedef struct {
    int64_t B, T, nh, nkv, hd, W;
    const int32_t *doc; /* [B*T] document id of each token, or NULL */
    float *q, *k, *v, *R;
} win_case_t;

static bool visible(const win_case_t *c, int64_t b, int64_t t, int64_t j)
{
    if (j > t || (c->W > 0 && t - j >= c->W))
        return false;
    return !c->doc || c->doc[b * c->T + j] == c->doc[b * c->T + t];
}

/* Masked softmax attention in double, over every key with visible(). */
static void ref_window(const win_case_t *c, double *out, double *lse, double *dq, double *dk,
                       double *dv)
{
    const int64_t T = c->T, nh = c->nh, nkv = c->nkv, hd = c->hd;
    const double scale = 1.0 / sqrt((double)hd);
    double *S = dnew(T), *dP = dnew(T);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < nh; h++) {
            const int64_t g = h / (nh / nkv);
            for (int64_t t = 0; t < T; t++) {
                const float *qt = c->q + (b * T + t) * nh * hd + h * hd;
                const float *gt = c->R + (b * T + t) * nh * hd + h * hd;
                double m = -INFINITY, z = 0.0, D = 0.0;
                for (int64_t j = 0; j < T; j++) {
                    S[j] = -INFINITY;
                    if (!visible(c, b, t, j))
                        continue;
                    const float *kj = c->k + (b * T + j) * nkv * hd + g * hd;
                    double s = 0.0;
                    for (int64_t d = 0; d < hd; d++)
                        s += (double)qt[d] * kj[d];
                    S[j] = s * scale;
                    m = S[j] > m ? S[j] : m;
                }
                for (int64_t j = 0; j < T; j++)
                    z += S[j] == -INFINITY ? 0.0 : exp(S[j] - m);
                lse[(b * nh + h) * T + t] = m + log(z);
                for (int64_t j = 0; j < T; j++) {
                    S[j] = S[j] == -INFINITY ? 0.0 : exp(S[j] - m) / z;
                    const float *vj = c->v + (b * T + j) * nkv * hd + g * hd;
                    dP[j] = 0.0;
                    for (int64_t d = 0; d < hd && S[j] != 0.0; d++) {
                        out[(b * T + t) * nh * hd + h * hd + d] += S[j] * vj[d];
                        dP[j] += (double)gt[d] * vj[d];
                    }
                    D += S[j] * dP[j];
                }
                for (int64_t j = 0; j < T; j++) {
                    if (S[j] == 0.0)
                        continue;
                    const double dS = S[j] * (dP[j] - D);
                    const float *kj = c->k + (b * T + j) * nkv * hd + g * hd;
                    for (int64_t d = 0; d < hd; d++) {
                        dq[(b * T + t) * nh * hd + h * hd + d] += scale * dS * kj[d];
                        dk[(b * T + j) * nkv * hd + g * hd + d] += scale * dS * qt[d];
                        dv[(b * T + j) * nkv * hd + g * hd + d] += S[j] * gt[d];
                    }
                }
            }
        }
    free(S), free(dP);
}

/* Random documents (ids) of lengths 1..maxlen, and their starts. */
static void make_docs(int64_t B, int64_t T, int64_t maxlen, int32_t *id, int32_t *start)
{
    for (int64_t b = 0; b < B; b++) {
        int64_t s = 0, left = 1 + irand(maxlen), n = 0;
        for (int64_t t = 0; t < T; t++) {
            if (left-- == 0)
                s = t, left = irand(maxlen), n++;
            id[b * T + t] = (int32_t)n;
            start[b * T + t] = (int32_t)s;
        }
    }
}

/* lo_t = max(doc_start[t], t - W + 1): the mask the model hands the kernels */
static int32_t *window_lo(const int32_t *start, int64_t B, int64_t T, int64_t W)
{
    int32_t *lo = malloc(sizeof(int32_t) * (size_t)(B * T));
    for (int64_t i = 0; i < B * T; i++) {
        const int64_t t = i % T, d = start ? start[i] : 0;
        lo[i] = (int32_t)(W > 0 && t - W + 1 > d ? t - W + 1 : d);
    }
    return lo;
}

static void test_dense(void)
{
    /* B, T, nh, nkv, hd, W, max document length (0: none) */
    const int64_t cfg[][7] = {
        {2, 40, 2, 1, 16, 1, 0},    {2, 40, 4, 2, 8, 5, 0},     {1, 40, 2, 2, 8, 7, 9},
        {1, 300, 2, 1, 16, 64, 0},  {1, 300, 2, 1, 16, 63, 80}, {1, 300, 4, 2, 8, 128, 0},
        {1, 300, 2, 2, 16, 129, 0}, {1, 300, 2, 1, 16, 200, 150}, {2, 260, 3, 3, 24, 100, 0},
        {1, 130, 2, 1, 64, 300, 0}, {1, 130, 2, 1, 64, 300, 50}, {1, 450, 2, 1, 8, 17, 400},
    };
    for (size_t s = 0; s < sizeof cfg / sizeof cfg[0]; s++) {
        win_case_t c = {.B = cfg[s][0], .T = cfg[s][1], .nh = cfg[s][2], .nkv = cfg[s][3],
                        .hd = cfg[s][4], .W = cfg[s][5]};
        const int64_t B = c.B, T = c.T, nh = c.nh, nkv = c.nkv, hd = c.hd;
        const int64_t nq = B * T * nh * hd, nk = B * T * nkv * hd;
        int32_t *id = NULL, *start = NULL;
        if (cfg[s][6]) {
            id = malloc(sizeof(int32_t) * (size_t)(B * T));
            start = malloc(sizeof(int32_t) * (size_t)(B * T));
            make_docs(B, T, cfg[s][6], id, start);
        }
        c.doc = id;
        int32_t *lo = window_lo(start, B, T, c.W);
        c.q = frand(nq, 1.5), c.k = frand(nk, 1.5), c.v = frand(nk, 1.0), c.R = frand(nq, 1.0);
        float *out = fnew(nq), *lse = fnew(B * nh * T), *dq = fnew(nq), *dk = fnew(nk),
              *dv = fnew(nk);
        be->attention_forward(out, lse, c.q, c.k, c.v, lo, B, T, nh, nkv, hd);
        be->attention_backward(dq, dk, dv, c.R, out, lse, c.q, c.k, c.v, lo, B, T, nh, nkv, hd);
        double *rout = dnew(nq), *rlse = dnew(B * nh * T), *rdq = dnew(nq), *rdk = dnew(nk),
               *rdv = dnew(nk);
        ref_window(&c, rout, rlse, rdq, rdk, rdv);
        char what[128];
#define WCHK(name, got, ref, n, tol)                                                            \
    do {                                                                                        \
        snprintf(what, sizeof what, "window %s B=%lld T=%lld nh=%lld nkv=%lld W=%lld%s", name,  \
                 (long long)B, (long long)T, (long long)nh, (long long)nkv, (long long)c.W,     \
                 id ? " docs" : "");                                                            \
        check_close(what, got, ref, n, tol);                                                    \
    } while (0)
        WCHK("out", out, rout, nq, 2e-6);
        WCHK("lse", lse, rlse, B * nh * T, 2e-6);
        WCHK("dq", dq, rdq, nq, 1e-5);
        WCHK("dk", dk, rdk, nk, 1e-5);
        WCHK("dv", dv, rdv, nk, 1e-5);
        free(id), free(start), free(lo), free(c.q), free(c.k), free(c.v), free(c.R);
        free(out), free(lse), free(dq), free(dk), free(dv);
        free(rout), free(rlse), free(rdq), free(rdk), free(rdv);
    }
}

/* The block kernel: query chunk [q0, q0 + nq) against key chunk [k0, k0 +
 * nk) of one row (global indices), merged from -inf, equals the dense
 * reference restricted to those keys; the chunk pairs cover a window that
 * starts inside the key chunk, ends in it, and misses it. */
static void test_block(void)
{
    const int64_t T = 320, nh = 4, nkv = 2, hd = 16, W = 70;
    const int64_t pairs[][4] = {{192, 64, 128, 64}, {160, 96, 96, 80}, {256, 64, 0, 128}};
    win_case_t c = {.B = 1, .T = T, .nh = nh, .nkv = nkv, .hd = hd, .W = W};
    int32_t *lo = window_lo(NULL, 1, T, W);
    c.q = frand(T * nh * hd, 1.5), c.k = frand(T * nkv * hd, 1.5), c.v = frand(T * nkv * hd, 1.0);
    c.R = frand(T * nh * hd, 1.0);
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        const int64_t q0 = pairs[p][0], nq = pairs[p][1], k0 = pairs[p][2], nk = pairs[p][3];
        /* the reference: the keys outside the chunk masked by moving them
         * out of every window (a copy of the case whose keys are cut) */
        float *out = fnew(nq * nh * hd), *lse = fnew(nh * nq);
        ffill(out, nq * nh * hd, 0.0f), ffill(lse, nh * nq, -INFINITY);
        be->attention_block_forward(out, lse, nq, c.q + q0 * nh * hd, c.k + k0 * nkv * hd,
                                    c.v + k0 * nkv * hd, lo + q0, nq, nk, q0, k0, nh, nkv, hd);
        int64_t seen = 0, touched = 0;
        double err = 0.0;
        for (int64_t i = 0; i < nq; i++)
            for (int64_t h = 0; h < nh; h++) {
                const int64_t t = q0 + i, g = h / (nh / nkv);
                double m = -INFINITY, z = 0.0, o[16] = {0};
                for (int64_t j = k0; j < k0 + nk; j++) {
                    if (!visible(&c, 0, t, j))
                        continue;
                    double sc = 0.0;
                    for (int64_t d = 0; d < hd; d++)
                        sc += (double)c.q[t * nh * hd + h * hd + d] * c.k[j * nkv * hd + g * hd + d];
                    sc /= sqrt((double)hd);
                    const double mn = sc > m ? sc : m;
                    z = z * exp(m - mn) + exp(sc - mn);
                    for (int64_t d = 0; d < hd; d++)
                        o[d] = o[d] * exp(m - mn) + exp(sc - mn) * c.v[j * nkv * hd + g * hd + d];
                    m = mn;
                }
                const float got_l = lse[h * nq + i];
                if (z == 0.0) { /* no key of the chunk in the window: untouched */
                    touched += got_l != -INFINITY || out[i * nh * hd + h * hd] != 0.0f;
                    continue;
                }
                seen++;
                const double rl = m + log(z);
                err = fmax(err, fabs(got_l - rl) / fmax(1.0, fabs(rl)));
                for (int64_t d = 0; d < hd; d++)
                    err = fmax(err, fabs(out[i * nh * hd + h * hd + d] - o[d] / z));
            }
        CHECK(err <= 2e-6 && touched == 0, "window block q0=%lld nq=%lld k0=%lld nk=%lld: out "
              "and lse off by %.3g (> 2e-6), %lld rows that see none of the chunk written",
              (long long)q0, (long long)nq, (long long)k0, (long long)nk, err, (long long)touched);
        CHECK(p == 2 ? seen == 0 : seen > 0, "window block q0=%lld k0=%lld: %lld queries see "
              "the chunk", (long long)q0, (long long)k0, (long long)seen);
        free(out), free(lse);
    }
    free(lo), free(c.q), free(c.k), free(c.v), free(c.R);
}

/* A key left of every window of a tile is not read: with K and V of key
 * 3 NaN and W = 16, the queries from 3 + 16 + 64 on (their tiles' first
 * visible key is past it) come out finite, forward and dq; a kernel that
 * ran its key blocks from 0 would carry the NaN (0 * NaN) into all. */
static void test_skip(void)
{
    const int64_t T = 300, nh = 2, nkv = 1, hd = 16, W = 16, bad = 3;
    const int64_t nq = T * nh * hd, nk = T * nkv * hd;
    int32_t *lo = window_lo(NULL, 1, T, W);
    float *q = frand(nq, 1.0), *k = frand(nk, 1.0), *v = frand(nk, 1.0), *R = frand(nq, 1.0);
    for (int64_t d = 0; d < hd; d++)
        k[bad * hd + d] = v[bad * hd + d] = NAN;
    float *out = fnew(nq), *lse = fnew(nh * T), *dq = fnew(nq), *dk = fnew(nk), *dv = fnew(nk);
    be->attention_forward(out, lse, q, k, v, lo, 1, T, nh, nkv, hd);
    be->attention_backward(dq, dk, dv, R, out, lse, q, k, v, lo, 1, T, nh, nkv, hd);
    int64_t bad_out = 0, bad_dq = 0;
    for (int64_t t = bad + W + 64; t < T; t++)
        for (int64_t e = 0; e < nh * hd; e++) {
            bad_out += !isfinite(out[t * nh * hd + e]);
            bad_dq += !isfinite(dq[t * nh * hd + e]);
        }
    CHECK(bad_out == 0 && bad_dq == 0, "window skip: %lld out and %lld dq entries past the "
          "window of the NaN key are not finite (a key block left of the window was read)",
          (long long)bad_out, (long long)bad_dq);
    CHECK(!isfinite(out[(bad + 1) * nh * hd]), "window skip: the query after the NaN key "
          "should see it (the test's poison did not reach)");
    free(lo), free(q), free(k), free(v), free(R), free(out), free(lse), free(dq), free(dk),
        free(dv);
}

int main(void)
{
    kernels_test_begin();
    test_dense();
    test_block();
    test_skip();
    return mt_test_exit("test_kernels_window");
}
