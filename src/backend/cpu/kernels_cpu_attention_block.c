/* kernels_cpu_attention_block.c: block attention of the CPU backend, the
 * compute step of ring attention (context parallelism, ring_attention.c).
 *
 * A block is nq query tokens against nk key/value tokens of the same row,
 * each side a contiguous run of GLOBAL row indices (q0.., k0..): under
 * load-balanced causal sharding a rank holds two chunks of the row and
 * receives the other ranks' chunks around the ring, so neither side starts
 * at 0 and the causal/document mask must be evaluated on global indices.
 * Query i (token q0 + i) sees key j when lo_i <= j <= q0 + i, lo_i =
 * doc_start[i] (global) or 0.
 *
 * The math and tiling are those of kernels_cpu_attention.c (flattened
 * (token, group head) rows, tiles of up to 64 rows, key blocks of 128, a
 * few cblas_sgemm per step), with two differences:
 *  - forward merges the block's result into a running (out, lse) instead
 *    of writing it: with the block's own max m and sum l,
 *      lse' = logaddexp(lse, m + log l),
 *      out' = out * exp(lse - lse') + (O / l) * exp(m + log l - lse'),
 *    so the caller never holds more than one block of keys (online
 *    softmax across the ring);
 *  - backward adds into dq, dk and dv, because every block contributes to
 *    the same dq and the travelling dk/dv collect the blocks of all ranks.
 * Inside a tile only the key range that some row of the tile sees is
 * visited; fully masked blocks are the caller's to skip (they cost a tile
 * scan here, no products).
 *
 * Determinism: the forward runs (g, tile) items in parallel, each owning
 * its rows of out and lse; the backward runs one task per kv head g, which
 * owns dk/dv of that head and dq of its query heads and walks tiles and
 * key blocks in order.  As in the dense kernel every sgemm runs whole on
 * its thread (nested BLAS threading off), so results do not depend on the
 * OpenMP thread count.
 *
 * It uses mt_cpu_expf rather than the dense kernel's faster exp: the
 * blocks here are a few hundred tokens, and sharing the helper would mean
 * reshaping the dense file.  Not done: batching several rows in one call
 * (the ring calls per row and chunk), reduced precision. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels_cpu_internal.h"
#include "kernels_cpu_tile.h"

#define ROWS 64          /* flattened query rows per tile, at most */
#define TILE_FLOATS 4096 /* rows * hd <= this */
#define KB 128           /* keys per block */
#define HD_MAX 1024

typedef struct {
    int64_t nq, nk, q0, k0, nh, nkv, hd, group, qs, kvs, rows, ntiles, lse_stride;
    float scale;
    const int32_t *doc_start;
    const char *kernel;
} bgeom_t;

static bgeom_t make_bgeom(const char *kernel, const int32_t *doc_start, int64_t nq, int64_t nk,
                          int64_t q0, int64_t k0, int64_t nh, int64_t nkv, int64_t hd,
                          int64_t lse_stride)
{
    MT_CPU_REQUIRE(nq >= 0 && nk >= 0 && q0 >= 0 && k0 >= 0 && nkv >= 1 && nh >= nkv &&
                       nh % nkv == 0 && lse_stride >= nq,
                   kernel, "nq=%lld nk=%lld q0=%lld k0=%lld nh=%lld nkv=%lld lse_stride=%lld",
                   (long long)nq, (long long)nk, (long long)q0, (long long)k0, (long long)nh,
                   (long long)nkv, (long long)lse_stride);
    MT_CPU_REQUIRE(hd >= 1 && hd <= HD_MAX && nh * hd <= INT_MAX, kernel, "hd=%lld",
                   (long long)hd);
    bgeom_t G = {.nq = nq, .nk = nk, .q0 = q0, .k0 = k0, .nh = nh, .nkv = nkv, .hd = hd,
                 .group = nh / nkv, .qs = nh * hd, .kvs = nkv * hd, .lse_stride = lse_stride,
                 .doc_start = doc_start, .kernel = kernel};
    G.rows = TILE_FLOATS / hd < ROWS ? TILE_FLOATS / hd : ROWS;
    G.ntiles = (nq * G.group + G.rows - 1) / G.rows;
    G.scale = (float)(1.0 / sqrt((double)hd));
    return G;
}

/* Rows f0..f0+n of kv head g: visible keys [lo[r], hi[r]] as LOCAL key
 * indices (clipped to the block; empty when lo > hi), offsets in q/out
 * and lse.  *kmin, *kmax: the union of the rows' ranges (kmin > kmax when
 * the tile sees nothing). */
static void tile_rows(const bgeom_t *G, int64_t g, int64_t f0, int64_t n, int64_t *lo,
                      int64_t *hi, int64_t *qoff, int64_t *loff, int64_t *kmin, int64_t *kmax)
{
    *kmin = INT64_MAX, *kmax = -1;
    for (int64_t r = 0; r < n; r++) {
        const int64_t i = (f0 + r) / G->group, h = g * G->group + (f0 + r) % G->group;
        const int64_t t = G->q0 + i;
        int64_t l = 0;
        if (G->doc_start) {
            l = G->doc_start[i];
            MT_CPU_REQUIRE(l >= 0 && l <= t, G->kernel, "doc_start[%lld] = %lld, must be in "
                           "[0, %lld]", (long long)i, (long long)l, (long long)t);
        }
        int64_t a = (l > G->k0 ? l : G->k0) - G->k0;
        int64_t b = (t < G->k0 + G->nk - 1 ? t : G->k0 + G->nk - 1) - G->k0;
        lo[r] = a, hi[r] = b;
        qoff[r] = i * G->qs + h * G->hd;
        loff[r] = h * G->lse_stride + i;
        if (a <= b) {
            *kmin = a < *kmin ? a : *kmin;
            *kmax = b > *kmax ? b : *kmax;
        }
    }
}

/* ------------------------------------------------------------------ forward */

static void forward_tile(const bgeom_t *G, float *restrict out, float *restrict lse,
                         const float *restrict q, const float *restrict k,
                         const float *restrict v, int64_t g, int64_t f0, int64_t n)
{
    const int64_t hd = G->hd, kvs = G->kvs;
    float Qs[TILE_FLOATS], O[TILE_FLOATS], S[ROWS * KB], m[ROWS], l[ROWS];
    int64_t lo[ROWS], hi[ROWS], qoff[ROWS], loff[ROWS], kmin, kmax;
    tile_rows(G, g, f0, n, lo, hi, qoff, loff, &kmin, &kmax);
    if (kmin > kmax)
        return; /* no row of the tile sees this block */
    mt_tile_pack_rows(Qs, q, qoff, n, hd, G->scale);
    memset(O, 0, (size_t)(n * hd) * sizeof(float));
    for (int64_t r = 0; r < n; r++)
        m[r] = -INFINITY, l[r] = 0.0f;
    const float *kg = k + g * hd, *vg = v + g * hd;

    for (int64_t j0 = kmin; j0 <= kmax; j0 += KB) {
        const int64_t nj = kmax + 1 - j0 < KB ? kmax + 1 - j0 : KB;
        memset(S, 0, sizeof(float) * (size_t)(n * KB));
        mt_tile_sgemm(false, true, n, nj, hd, Qs, hd, kg + j0 * kvs, kvs, 1.0f, S, KB);
        for (int64_t r = 0; r < n; r++) {
            float *restrict s = S + r * KB;
            int64_t c0, c1;
            mt_tile_row_cols(lo, hi, r, j0, nj, &c0, &c1);
            if (c0 >= c1) {
                memset(s, 0, (size_t)nj * sizeof(float));
                continue;
            }
            float bmax = s[c0];
            for (int64_t c = c0 + 1; c < c1; c++)
                bmax = s[c] > bmax ? s[c] : bmax;
            const float mnew = bmax > m[r] ? bmax : m[r];
            const float corr = mt_cpu_expf(m[r] - mnew); /* 0 on the row's first block */
            float sum = 0.0f;
            for (int64_t c = c0; c < c1; c++) {
                s[c] = mt_cpu_expf(s[c] - mnew);
                sum += s[c];
            }
            mt_tile_zero_outside(s, c0, c1, nj);
            l[r] = l[r] * corr + sum;
            m[r] = mnew;
            if (corr != 1.0f)
                for (int64_t d = 0; d < hd; d++)
                    O[r * hd + d] *= corr;
        }
        mt_tile_sgemm(false, false, n, hd, nj, S, KB, vg + j0 * kvs, kvs, 1.0f, O, hd);
    }

    /* merge into the running (out, lse) */
    for (int64_t r = 0; r < n; r++) {
        if (l[r] == 0.0f)
            continue; /* the row saw no key of this block */
        float *restrict orow = out + qoff[r];
        const float *restrict o = O + r * hd;
        const float blse = m[r] + logf(l[r]), old = lse[loff[r]];
        if (old == -INFINITY) {
            const float inv = 1.0f / l[r];
            for (int64_t d = 0; d < hd; d++)
                orow[d] = o[d] * inv;
            lse[loff[r]] = blse;
            continue;
        }
        const float mx = old > blse ? old : blse;
        const float nl = mx + logf(expf(old - mx) + expf(blse - mx));
        const float a = expf(old - nl), b = expf(blse - nl) / l[r];
        for (int64_t d = 0; d < hd; d++)
            orow[d] = orow[d] * a + o[d] * b;
        lse[loff[r]] = nl;
    }
}

/* ------------------------------------------------------------------ backward */

static void backward_tile(const bgeom_t *G, float *restrict dq, float *restrict dk,
                          float *restrict dv, const float *restrict dout,
                          const float *restrict out, const float *restrict lse,
                          const float *restrict q, const float *restrict k,
                          const float *restrict v, int64_t g, int64_t f0, int64_t n)
{
    const int64_t hd = G->hd, kvs = G->kvs;
    float Qs[TILE_FLOATS], dO[TILE_FLOATS], dQ[TILE_FLOATS], P[ROWS * KB], dS[ROWS * KB];
    float D[ROWS], L[ROWS];
    int64_t lo[ROWS], hi[ROWS], qoff[ROWS], loff[ROWS], kmin, kmax;
    tile_rows(G, g, f0, n, lo, hi, qoff, loff, &kmin, &kmax);
    if (kmin > kmax)
        return;
    mt_tile_pack_rows(Qs, q, qoff, n, hd, G->scale);
    mt_tile_pack_rows(dO, dout, qoff, n, hd, 1.0f);
    memset(dQ, 0, (size_t)(n * hd) * sizeof(float));
    for (int64_t r = 0; r < n; r++) {
        D[r] = mt_cpu_dot8(dO + r * hd, out + qoff[r], hd);
        L[r] = lse[loff[r]];
    }
    const float *kg = k + g * hd, *vg = v + g * hd;
    float *dkg = dk + g * hd, *dvg = dv + g * hd;

    for (int64_t j0 = kmin; j0 <= kmax; j0 += KB) {
        const int64_t nj = kmax + 1 - j0 < KB ? kmax + 1 - j0 : KB;
        memset(P, 0, sizeof(float) * (size_t)(n * KB));
        memset(dS, 0, sizeof(float) * (size_t)(n * KB));
        mt_tile_sgemm(false, true, n, nj, hd, Qs, hd, kg + j0 * kvs, kvs, 1.0f, P, KB);
        mt_tile_sgemm(false, true, n, nj, hd, dO, hd, vg + j0 * kvs, kvs, 1.0f, dS, KB);
        for (int64_t r = 0; r < n; r++) {
            float *restrict p = P + r * KB, *restrict ds = dS + r * KB;
            int64_t c0, c1;
            mt_tile_row_cols(lo, hi, r, j0, nj, &c0, &c1);
            for (int64_t c = c0; c < c1; c++) {
                const float pc = mt_cpu_expf(p[c] - L[r]);
                p[c] = pc;
                ds[c] = pc * (ds[c] - D[r]);
            }
            mt_tile_zero_outside(p, c0, c1, nj);
            mt_tile_zero_outside(ds, c0, c1, nj);
        }
        mt_tile_sgemm(true, false, nj, hd, n, P, KB, dO, hd, 1.0f, dvg + j0 * kvs, kvs);
        mt_tile_sgemm(true, false, nj, hd, n, dS, KB, Qs, hd, 1.0f, dkg + j0 * kvs, kvs);
        mt_tile_sgemm(false, false, n, hd, nj, dS, KB, kg + j0 * kvs, kvs, 1.0f, dQ, hd);
    }

    for (int64_t r = 0; r < n; r++) {
        float *restrict dqr = dq + qoff[r];
        const float *restrict x = dQ + r * hd;
        for (int64_t d = 0; d < hd; d++)
            dqr[d] += x[d] * G->scale;
    }
}

/* ------------------------------------------------------------------ entry points */

void mt_cpu_attention_block_forward(float *restrict out, float *restrict lse, int64_t lse_stride,
                                    const float *restrict q, const float *restrict k,
                                    const float *restrict v, const int32_t *restrict doc_start,
                                    int64_t nq, int64_t nk, int64_t q0, int64_t k0, int64_t nh,
                                    int64_t nkv, int64_t hd)
{
    const bgeom_t G = make_bgeom("attention_block_forward", doc_start, nq, nk, q0, k0, nh, nkv,
                                 hd, lse_stride);
    const int64_t nitems = nkv * G.ntiles, nflat = nq * G.group;
    const int par = nitems > 1 && nq * nk * nh * hd > MT_CPU_PAR_MIN;
#pragma omp parallel if (par)
    {
        mt_tile_single_threaded_blas();
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < nitems; item++) {
            const int64_t tile = G.ntiles - 1 - item / nkv, g = item % nkv;
            const int64_t f0 = tile * G.rows;
            const int64_t n = nflat - f0 < G.rows ? nflat - f0 : G.rows;
            forward_tile(&G, out, lse, q, k, v, g, f0, n);
        }
    }
}

void mt_cpu_attention_block_backward(float *restrict dq, float *restrict dk, float *restrict dv,
                                     const float *restrict dout, const float *restrict out,
                                     const float *restrict lse, int64_t lse_stride,
                                     const float *restrict q, const float *restrict k,
                                     const float *restrict v, const int32_t *restrict doc_start,
                                     int64_t nq, int64_t nk, int64_t q0, int64_t k0, int64_t nh,
                                     int64_t nkv, int64_t hd)
{
    const bgeom_t G = make_bgeom("attention_block_backward", doc_start, nq, nk, q0, k0, nh, nkv,
                                 hd, lse_stride);
    const int64_t nflat = nq * G.group;
    const int par = nkv > 1 && nq * nk * nh * hd > MT_CPU_PAR_MIN;
#pragma omp parallel if (par)
    {
        mt_tile_single_threaded_blas();
#pragma omp for schedule(dynamic, 1)
        for (int64_t g = 0; g < nkv; g++)
            for (int64_t tile = 0; tile < G.ntiles; tile++) {
                const int64_t f0 = tile * G.rows;
                const int64_t n = nflat - f0 < G.rows ? nflat - f0 : G.rows;
                backward_tile(&G, dq, dk, dv, dout, out, lse, q, k, v, g, f0, n);
            }
    }
}
