/* kernels_cpu_attention.c: causal grouped-query attention of the CPU
 * backend, forward and backward, with the optional doc_start document mask.
 *
 * Math (per batch b, query head h, kv head g = h / (nh/nkv), scale
 * c = 1/sqrt(hd), row t attends t' in [lo_t, t] with lo_t = doc_start[t]
 * or 0; lo_t is any first visible key, a document's start or a sliding
 * window's, doc/sliding-window.md):
 *   forward   S = c q k^T,  lse_t = log sum_t' exp S_tt',  P = exp(S - lse),
 *             out = P v
 *   backward  (FlashAttention-2) P recomputed from lse, D_t = dout_t . out_t,
 *             dP = dout v^T,  dS = P (dP - D),  dq = c dS k,
 *             dk = c dS^T q,  dv = P^T dout  (dk, dv summed over the nh/nkv
 *             query heads of the group).
 *
 * Tiling: the query rows of kv head g are the pairs (token t, query head hh
 * of the group), flattened as f = t*group + hh; a token's group heads are
 * adjacent in q, and stacking them lets GQA share each key block among all
 * of them.  A tile is `rows` consecutive flattened rows (64, fewer when
 * hd > 64), packed into a stack buffer with q scaled by c.  Keys come in
 * blocks of up to KB = 128, read in place.  Each (tile, key block) step is
 * a few cblas_sgemm calls plus one elementwise pass over the block:
 *   forward   S = Qs K^T;  mask, running max/sum, P = exp(S - max)
 *             (online softmax);  O = O*corr + P V
 *   backward  S = Qs K^T, dP = dO V^T;  P = exp(S - lse), dS = P (dP - D);
 *             dV += P^T dO,  dK += dS^T Qs,  dQ += dS K
 * Key blocks run from the tile's first visible key (the smallest doc_start
 * of its rows) to its last token, the last block cut there.  Every key in
 * that range is visible to some row of the tile (each token sees itself),
 * so only masked entries inside the blocks are computed and thrown away:
 * the triangle above the diagonal in the tile's own tokens, about 12% of
 * the products at T = 256 and 1.5% at T = 2048 (plus, with documents or
 * a window, the keys before a row's doc_start).  Keys before the tile's
 * first visible key are never read: a window W costs about T (W + rows)
 * products instead of T^2 / 2.  exp is evaluated for visible entries
 * only, by exp_neg below (a faster mt_cpu_expf for arguments <= 0, its
 * loops also built for AVX2 with the same bits).
 *
 * Memory: all scratch is on the stack, fixed by the constants below
 * whatever the shapes: 64 KiB per thread in the forward, 112 KiB in the
 * backward.  Nothing is allocated here; OpenBLAS packs operands into its
 * own buffer pool, as it does for every matmul.
 *
 * Parallelism and determinism: the forward runs (b, g, tile) items in
 * parallel; the backward runs (b, g) tasks, each owning the dk/dv rows of
 * its kv head and the dq rows of its query heads and walking its tiles in
 * order, key blocks in order inside a tile, so the contributions to dk and
 * dv arrive in a fixed order without atomics.  The decomposition depends on
 * the shapes only, and each sgemm runs whole on the thread that calls it:
 * inside the parallel region every thread sets its own nthreads ICV to 1,
 * so an OpenMP-threaded OpenBLAS (what configure picks) stays
 * single-threaded.  Results are therefore bit-identical at any OpenMP
 * thread count.  (A pthreads OpenBLAS splits the larger calls over its own
 * pool, whose size OPENBLAS_NUM_THREADS fixes: still independent of the
 * OpenMP thread count, but slow beside OpenMP.)  The backward's parallelism
 * is B*nkv: with fewer tasks than threads some threads idle.
 *
 * Not done here: dropout, bias/ALiBi, a KV cache, reduced precision. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels_cpu_internal.h"
#include "kernels_cpu_tile.h"

#define ROWS 64          /* flattened query rows per tile, at most */
#define TILE_FLOATS 4096 /* rows * hd <= this: a packed tile is 16 KiB */
#define KB 128           /* keys per block */
#define HD_MAX 1024      /* largest head_dim served (4 rows per tile) */

typedef struct {
    int64_t B, T, nh, nkv, hd, group, qstride, kvstride, rows, ntiles;
    float scale;
    const int32_t *doc_start;
    const char *kernel;
} geom_t;

static geom_t make_geom(const char *kernel, const int32_t *doc_start, int64_t B, int64_t T,
                        int64_t nh, int64_t nkv, int64_t hd)
{
    MT_CPU_REQUIRE(B >= 0 && T >= 0 && nkv >= 1 && nh >= nkv && nh % nkv == 0, kernel,
                   "B=%lld T=%lld nh=%lld nkv=%lld (nh must be a multiple of nkv)",
                   (long long)B, (long long)T, (long long)nh, (long long)nkv);
    MT_CPU_REQUIRE(hd >= 1 && hd <= HD_MAX && nh * hd <= INT_MAX, kernel,
                   "hd=%lld, supported 1..%d (and nh*hd <= INT_MAX)", (long long)hd, HD_MAX);
    geom_t G = {.B = B, .T = T, .nh = nh, .nkv = nkv, .hd = hd, .group = nh / nkv,
                .qstride = nh * hd, .kvstride = nkv * hd, .doc_start = doc_start,
                .kernel = kernel};
    G.rows = TILE_FLOATS / hd < ROWS ? TILE_FLOATS / hd : ROWS;
    G.ntiles = (T * G.group + G.rows - 1) / G.rows;
    G.scale = (float)(1.0 / sqrt((double)hd));
    return G;
}

/* S = A B^T into the score buffer s (rows KB apart).  Zeroing it here and
 * accumulating gives the bits of beta = 0 and is faster than OpenBLAS's
 * own beta = 0 pass over C (about 15% on these small products). */
static inline void scores(float *s, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                          const float *b, int64_t ldb)
{
    memset(s, 0, (size_t)(m * KB) * sizeof(float));
    mt_tile_sgemm(false, true, m, n, k, a, lda, b, ldb, 1.0f, s, KB);
}

/* Rows f0..f0+n of kv head g of batch row b: the token hi[r] (also its last
 * visible key), the first visible key lo[r], the row's offset in q, out,
 * dout, dq (qoff[r]) and in lse (loff[r]).  Returns the smallest lo. */
static int64_t tile_rows(const geom_t *G, int64_t b, int64_t g, int64_t f0, int64_t n,
                         int64_t *lo, int64_t *hi, int64_t *qoff, int64_t *loff)
{
    int64_t minlo = INT64_MAX;
    for (int64_t r = 0; r < n; r++) {
        const int64_t t = (f0 + r) / G->group, h = g * G->group + (f0 + r) % G->group;
        int64_t l = 0;
        if (G->doc_start) {
            l = G->doc_start[b * G->T + t];
            MT_CPU_REQUIRE(l >= 0 && l <= t, G->kernel,
                           "doc_start[%lld] = %lld, must be in [0, %lld]",
                           (long long)(b * G->T + t), (long long)l, (long long)t);
        }
        lo[r] = l;
        hi[r] = t;
        qoff[r] = (b * G->T + t) * G->qstride + h * G->hd;
        loff[r] = (b * G->nh + h) * G->T + t;
        minlo = l < minlo ? l : minlo;
    }
    return minlo;
}

/* ------------------------------------------------------------------ row helpers */

/* exp(x) for the softmax arguments here, all <= 0 (up to rounding):
 * mt_cpu_expf's range reduction, polynomial and exponent bits, with the
 * polynomial in Estrin form (a shorter dependency chain, about 25% faster)
 * and only the lower clamp.  Max relative error 8.1e-8 over [-87, 0], the
 * same as mt_cpu_expf, whose bits it gives on all but 1e-4 of the inputs;
 * exactly 0 below -87 and for -inf; NaN for NaN.  Not valid above 88. */
static inline float exp_neg(float x)
{
    const int under = x < -87.0f;
    const float xc = mt_cpu_select(under, -87.0f, x);
    const float t = xc * 1.44269504088896341f + 12582912.0f; /* + 1.5*2^23 rounds */
    const float n = t - 12582912.0f;
    float r = xc - n * 0.693359375f; /* ln2 split in two for an exact n ln2 */
    r = r - n * -2.12194440e-4f;
    const float r2 = r * r;
    const float a = r * 1.9875691500e-4f + 1.3981999507e-3f;
    const float b = r * 8.3334519073e-3f + 4.1665795894e-2f;
    const float c = r * 1.6666665459e-1f + 5.0000001201e-1f;
    const float p = (a * r2 + b) * r2 + c;
    uint32_t ti, ei;
    memcpy(&ti, &t, sizeof ti);
    ei = (ti - 0x4B400000u + 127u) << 23; /* 2^n from the low bits of t */
    float e;
    memcpy(&e, &ei, sizeof e);
    return mt_cpu_select(under, 0.0f, ((p * r2 + r) + 1.0f) * e);
}

/* The exp loops are the largest cost outside BLAS.  On x86-64 GCC compiles
 * them twice, for SSE2 and for AVX2 (8 lanes), and the loader picks one
 * for the CPU (ifunc).  Both do the same IEEE operations lane by lane (no
 * FMA: AVX2 does not imply it), so the results are the same bits on any
 * x86-64; a -march build that already has AVX2 skips the clones. */
#if defined(__GNUC__) && __GNUC__ >= 6 && !defined(__clang__) && defined(__x86_64__) && \
    defined(__linux__) && !defined(__AVX2__)
#define MT_EXP_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MT_EXP_CLONES
#endif

/* s[c] = exp(s[c] - m) for c < n */
MT_EXP_CLONES static void exp_row(float *restrict s, int64_t n, float m)
{
#pragma omp simd
    for (int64_t c = 0; c < n; c++)
        s[c] = exp_neg(s[c] - m);
}

/* p[c] = exp(p[c] - L) (P from S), ds[c] = p[c] (ds[c] - D) (dS from dP),
 * for c < n */
MT_EXP_CLONES static void grad_row(float *restrict p, float *restrict ds, int64_t n, float L,
                                   float D)
{
#pragma omp simd
    for (int64_t c = 0; c < n; c++) {
        const float pc = exp_neg(p[c] - L);
        p[c] = pc;
        ds[c] = pc * (ds[c] - D);
    }
}

/* max of s[0..n), n >= 1 (exact, so the order does not matter), 8 lanes
 * in two independent chains */
static inline float row_max(const float *s, int64_t n)
{
    mt_v4f m0 = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, m1 = m0;
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        const mt_v4f x0 = mt_v4f_load(s + c), x1 = mt_v4f_load(s + c + 4);
        const mt_v4i g0 = x0 > m0, g1 = x1 > m1;
        m0 = (mt_v4f)((g0 & (mt_v4i)x0) | (~g0 & (mt_v4i)m0));
        m1 = (mt_v4f)((g1 & (mt_v4i)x1) | (~g1 & (mt_v4i)m1));
    }
    float mx = s[0];
    for (int i = 0; i < 4; i++) {
        mx = m0[i] > mx ? m0[i] : mx;
        mx = m1[i] > mx ? m1[i] : mx;
    }
    for (; c < n; c++)
        mx = s[c] > mx ? s[c] : mx;
    return mx;
}

/* ------------------------------------------------------------------ forward */

/* Forward of tile f0..f0+n of (b, g): its out rows and lse entries. */
static void forward_tile(const geom_t *G, float *restrict out, float *restrict lse,
                         const float *restrict q, const float *restrict k,
                         const float *restrict v, int64_t b, int64_t g, int64_t f0, int64_t n)
{
    const int64_t hd = G->hd, kvs = G->kvstride;
    float Qs[TILE_FLOATS], O[TILE_FLOATS], S[ROWS * KB], m[ROWS], l[ROWS];
    int64_t lo[ROWS], hi[ROWS], qoff[ROWS], loff[ROWS];
    const int64_t minlo = tile_rows(G, b, g, f0, n, lo, hi, qoff, loff);
    const int64_t last = hi[n - 1];
    mt_tile_pack_rows(Qs, q, qoff, n, hd, G->scale);
    memset(O, 0, (size_t)(n * hd) * sizeof(float));
    for (int64_t r = 0; r < n; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    const int64_t kvoff = b * G->T * kvs + g * hd;

    for (int64_t j0 = minlo; j0 <= last; j0 += KB) {
        const int64_t nj = last + 1 - j0 < KB ? last + 1 - j0 : KB;
        scores(S, n, nj, hd, Qs, hd, k + kvoff + j0 * kvs, kvs);
        for (int64_t r = 0; r < n; r++) {
            float *restrict s = S + r * KB;
            int64_t c0, c1;
            mt_tile_row_cols(lo, hi, r, j0, nj, &c0, &c1);
            if (c0 >= c1) { /* row fully masked in this block */
                memset(s, 0, (size_t)nj * sizeof(float));
                continue;
            }
            const float bmax = row_max(s + c0, c1 - c0);
            const float mnew = bmax > m[r] ? bmax : m[r];
            const float corr = exp_neg(m[r] - mnew); /* 0 on the row's first block */
            exp_row(s + c0, c1 - c0, mnew);
            mt_tile_zero_outside(s, c0, c1, nj);
            l[r] = l[r] * corr + mt_cpu_sum8(s + c0, c1 - c0);
            m[r] = mnew;
            if (corr != 1.0f) {
                float *restrict o = O + r * hd;
#pragma omp simd
                for (int64_t d = 0; d < hd; d++)
                    o[d] *= corr;
            }
        }
        mt_tile_sgemm(false, false, n, hd, nj, S, KB, v + kvoff + j0 * kvs, kvs, 1.0f, O, hd);
    }

    for (int64_t r = 0; r < n; r++) {
        float *restrict orow = out + qoff[r];
        const float *restrict o = O + r * hd;
        const float inv = 1.0f / l[r];
#pragma omp simd
        for (int64_t d = 0; d < hd; d++)
            orow[d] = o[d] * inv;
        lse[loff[r]] = m[r] + logf(l[r]);
    }
}

/* ------------------------------------------------------------------ backward */

/* Backward of tile f0..f0+n of (b, g): writes its dq rows, adds to the
 * dk/dv rows of the key blocks it sees. */
static void backward_tile(const geom_t *G, float *restrict dq, float *restrict dk,
                          float *restrict dv, const float *restrict dout,
                          const float *restrict out, const float *restrict lse,
                          const float *restrict q, const float *restrict k,
                          const float *restrict v, int64_t b, int64_t g, int64_t f0, int64_t n)
{
    const int64_t hd = G->hd, kvs = G->kvstride;
    float Qs[TILE_FLOATS], dO[TILE_FLOATS], dQ[TILE_FLOATS], P[ROWS * KB], dS[ROWS * KB];
    float D[ROWS], L[ROWS];
    int64_t lo[ROWS], hi[ROWS], qoff[ROWS], loff[ROWS];
    const int64_t minlo = tile_rows(G, b, g, f0, n, lo, hi, qoff, loff);
    const int64_t last = hi[n - 1];
    mt_tile_pack_rows(Qs, q, qoff, n, hd, G->scale);
    mt_tile_pack_rows(dO, dout, qoff, n, hd, 1.0f);
    memset(dQ, 0, (size_t)(n * hd) * sizeof(float));
    for (int64_t r = 0; r < n; r++) {
        D[r] = mt_cpu_dot8(dO + r * hd, out + qoff[r], hd);
        L[r] = lse[loff[r]];
    }
    const int64_t kvoff = b * G->T * kvs + g * hd;

    for (int64_t j0 = minlo; j0 <= last; j0 += KB) {
        const int64_t nj = last + 1 - j0 < KB ? last + 1 - j0 : KB;
        const float *kb = k + kvoff + j0 * kvs, *vb = v + kvoff + j0 * kvs;
        scores(P, n, nj, hd, Qs, hd, kb, kvs);  /* S, as in the forward */
        scores(dS, n, nj, hd, dO, hd, vb, kvs); /* dP */
        for (int64_t r = 0; r < n; r++) {
            float *restrict p = P + r * KB, *restrict ds = dS + r * KB;
            int64_t c0, c1;
            mt_tile_row_cols(lo, hi, r, j0, nj, &c0, &c1);
            if (c0 >= c1)
                c0 = c1 = nj; /* row fully masked in this block: all zeros */
            grad_row(p + c0, ds + c0, c1 - c0, L[r], D[r]);
            mt_tile_zero_outside(p, c0, c1, nj); /* masked entries: exact zeros for the products */
            mt_tile_zero_outside(ds, c0, c1, nj);
        }
        mt_tile_sgemm(true, false, nj, hd, n, P, KB, dO, hd, 1.0f, dv + kvoff + j0 * kvs, kvs);
        mt_tile_sgemm(true, false, nj, hd, n, dS, KB, Qs, hd, 1.0f, dk + kvoff + j0 * kvs, kvs);
        mt_tile_sgemm(false, false, n, hd, nj, dS, KB, kb, kvs, 1.0f, dQ, hd);
    }

    for (int64_t r = 0; r < n; r++) {
        float *restrict dqr = dq + qoff[r];
        const float *restrict x = dQ + r * hd;
#pragma omp simd
        for (int64_t d = 0; d < hd; d++)
            dqr[d] = x[d] * G->scale;
    }
}

/* ------------------------------------------------------------------ entry points */

void mt_cpu_attention_forward(float *restrict out, float *restrict lse, const float *restrict q,
                              const float *restrict k, const float *restrict v,
                              const int32_t *restrict doc_start, int64_t B, int64_t T, int64_t nh,
                              int64_t nkv, int64_t hd)
{
    const geom_t G = make_geom("attention_forward", doc_start, B, T, nh, nkv, hd);
    const int64_t nbg = B * nkv, nitems = nbg * G.ntiles, nflat = T * G.group;
    const int par = nitems > 1 && B * T * T * nh * hd > MT_CPU_PAR_MIN;
    /* Items go out latest tile first (the causal triangle makes late tiles
     * the expensive ones), so the dynamic schedule balances; who runs an
     * item never changes its arithmetic. */
#pragma omp parallel if (par)
    {
        mt_tile_single_threaded_blas();
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < nitems; item++) {
            const int64_t tile = G.ntiles - 1 - item / nbg, bg = item % nbg;
            const int64_t f0 = tile * G.rows;
            const int64_t n = nflat - f0 < G.rows ? nflat - f0 : G.rows;
            forward_tile(&G, out, lse, q, k, v, bg / nkv, bg % nkv, f0, n);
        }
    }
}

void mt_cpu_attention_backward(float *restrict dq, float *restrict dk, float *restrict dv,
                               const float *restrict dout, const float *restrict out,
                               const float *restrict lse, const float *restrict q,
                               const float *restrict k, const float *restrict v,
                               const int32_t *restrict doc_start, int64_t B, int64_t T,
                               int64_t nh, int64_t nkv, int64_t hd)
{
    const geom_t G = make_geom("attention_backward", doc_start, B, T, nh, nkv, hd);
    const int64_t ntasks = B * nkv, nflat = T * G.group;
    const int par = ntasks > 1 && B * T * T * nh * hd > MT_CPU_PAR_MIN;
#pragma omp parallel if (par)
    {
        mt_tile_single_threaded_blas();
        /* dynamic: document masks can make tasks uneven */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < ntasks; task++) {
            const int64_t b = task / nkv, g = task % nkv;
            for (int64_t t = 0; t < T; t++) {
                const int64_t off = (b * T + t) * G.kvstride + g * hd;
                memset(dk + off, 0, (size_t)hd * sizeof(float));
                memset(dv + off, 0, (size_t)hd * sizeof(float));
            }
            for (int64_t tile = 0; tile < G.ntiles; tile++) {
                const int64_t f0 = tile * G.rows;
                const int64_t n = nflat - f0 < G.rows ? nflat - f0 : G.rows;
                backward_tile(&G, dq, dk, dv, dout, out, lse, q, k, v, b, g, f0, n);
            }
        }
    }
}
