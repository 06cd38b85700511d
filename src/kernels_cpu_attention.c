/* kernels_cpu_attention.c: causal grouped-query attention of the CPU
 * backend, forward and backward, with the optional doc_start document mask.
 *
 * Math (per batch b, query head h, kv head g = h / (nh/nkv), scale
 * c = 1/sqrt(hd), row t attends t' in [lo_t, t] with lo_t = doc_start[t]
 * or 0):
 *   forward   S = c q k^T,  lse_t = log sum_t' exp S_tt',  P = exp(S - lse),
 *             out = P v
 *   backward  (FlashAttention-2) P recomputed from lse, D_t = dout_t . out_t,
 *             dP = dout v^T,  dS = P (dP - D),  dq = c dS k,
 *             dk = c dS^T q,  dv = P^T dout  (dk, dv summed over the nh/nkv
 *             query heads of the group).
 *
 * Layout: keys are processed in blocks of KB rows transposed into a small
 * [hd][KB] buffer, so scores and dP are unit-stride AXPYs over the block
 * instead of horizontal dot products; fully masked blocks (t' > t, or
 * t' < lo_t) are skipped.  The forward keeps a running max and sum (online
 * softmax) so scratch does not grow with T.  All scratch is on the stack
 * (a few tens of KiB for hd = 64..128), nothing is allocated.
 *
 * Parallelism and determinism: the forward runs (b, h, query tile) items
 * in parallel; each output row is computed by one thread with a fixed
 * sequence of operations.  The backward runs (b, kv head) tasks in
 * parallel; each task owns its dk/dv rows and the dq rows of its query
 * heads and adds contributions in a fixed order (key block, query head,
 * query row), so no atomics are needed.  Results are bit-identical at any
 * thread count.  The backward's parallelism is B*nkv: with fewer tasks than
 * threads some threads idle (a two-pass dq/dkdv split would fix that at
 * ~40% more arithmetic).  No dropout, no sliding window, no bias/ALiBi,
 * no KV cache. */
#include <math.h>

#include "kernels_cpu_internal.h"

#define FWD_QT 32       /* query rows per forward item */
#define BWD_QT 16       /* query rows per backward tile */
#define KB_MAX 64       /* keys per block */
#define KT_FLOATS 16384 /* a transposed key block holds at most this many floats */
#define HD_MAX 1024     /* largest head_dim served (KB >= 16) */

#define LANES 16       /* register tile: 16 floats = 4 SSE / 2 AVX registers */

/* Keys per block: a multiple of LANES, at most KB_MAX, and kbw * hd <= KT_FLOATS. */
static int64_t key_block(int64_t hd)
{
    int64_t kb = KT_FLOATS / hd / LANES * LANES;
    return kb > KB_MAX ? KB_MAX : kb;
}

static void check_shapes(const char *kernel, int64_t B, int64_t T, int64_t nh, int64_t nkv,
                         int64_t hd)
{
    MT_CPU_REQUIRE(B >= 0 && T >= 0 && nkv >= 1 && nh >= nkv && nh % nkv == 0, kernel,
                   "B=%lld T=%lld nh=%lld nkv=%lld (nh must be a multiple of nkv)",
                   (long long)B, (long long)T, (long long)nh, (long long)nkv);
    MT_CPU_REQUIRE(hd >= 1 && hd <= HD_MAX, kernel, "hd=%lld, supported 1..%d", (long long)hd,
                   HD_MAX);
}

/* First key of row t of batch row b (0 without a document mask). */
static inline int64_t row_lo(const int32_t *doc_start, int64_t b, int64_t T, int64_t t,
                             const char *kernel)
{
    if (!doc_start)
        return 0;
    const int64_t lo = doc_start[b * T + t];
    MT_CPU_REQUIRE(lo >= 0 && lo <= t, kernel, "doc_start[%lld] = %lld, must be in [0, %lld]",
                   (long long)(b * T + t), (long long)lo, (long long)t);
    return lo;
}

/* kt[d][c] = k_(j0+c)[d] for c < nj, zero for nj <= c < kbw. */
static inline void transpose_block(float *restrict kt, const float *restrict k, int64_t stride,
                                   int64_t nj, int64_t kbw, int64_t hd)
{
    for (int64_t c = 0; c < nj; c++) {
        const float *restrict kr = k + c * stride;
        for (int64_t d = 0; d < hd; d++)
            kt[d * kbw + c] = kr[d];
    }
    if (nj < kbw)
        for (int64_t d = 0; d < hd; d++)
            for (int64_t c = nj; c < kbw; c++)
                kt[d * kbw + c] = 0.0f;
}

/* s[c] = sum_d x[d] kt[d][c] for c in [c0, c1), accumulated over d in
 * order, LANES columns at a time held in registers.  Whole LANES-aligned
 * chunks are computed, so s[] entries just outside [c0, c1) get values too
 * (kt is zero-padded to kbw columns); callers ignore them.  Each s[c] gets
 * the same bits whatever the range, and forward and backward both form
 * scores here, so the backward's S matches the forward's exactly. */
static inline void block_dots(float *restrict s, const float *restrict x, const float *restrict kt,
                              int64_t kbw, int64_t hd, int64_t c0, int64_t c1)
{
    for (int64_t cb = c0 / LANES * LANES; cb < c1; cb += LANES) {
        mt_v4f a0 = {0, 0, 0, 0}, a1 = a0, a2 = a0, a3 = a0;
        const float *restrict kr = kt + cb;
        for (int64_t d = 0; d < hd; d++, kr += kbw) {
            const float xd = x[d];
            a0 += xd * mt_v4f_load(kr);
            a1 += xd * mt_v4f_load(kr + 4);
            a2 += xd * mt_v4f_load(kr + 8);
            a3 += xd * mt_v4f_load(kr + 12);
        }
        mt_v4f_store(s + cb, a0);
        mt_v4f_store(s + cb + 4, a1);
        mt_v4f_store(s + cb + 8, a2);
        mt_v4f_store(s + cb + 12, a3);
    }
}

/* y[d] += sum_r a[r] X[r][d] for d < hd, X rows `stride` apart, summed over
 * r in order (so each y[d] gets the bits of n successive AXPYs), LANES
 * outputs at a time held in registers. */
static inline void gemv_t_acc(float *restrict y, const float *restrict a, const float *restrict X,
                              int64_t stride, int64_t n, int64_t hd)
{
    int64_t d0 = 0;
    for (; d0 + LANES <= hd; d0 += LANES) {
        mt_v4f y0 = mt_v4f_load(y + d0), y1 = mt_v4f_load(y + d0 + 4),
               y2 = mt_v4f_load(y + d0 + 8), y3 = mt_v4f_load(y + d0 + 12);
        const float *restrict xr = X + d0;
        for (int64_t r = 0; r < n; r++, xr += stride) {
            const float ar = a[r];
            y0 += ar * mt_v4f_load(xr);
            y1 += ar * mt_v4f_load(xr + 4);
            y2 += ar * mt_v4f_load(xr + 8);
            y3 += ar * mt_v4f_load(xr + 12);
        }
        mt_v4f_store(y + d0, y0);
        mt_v4f_store(y + d0 + 4, y1);
        mt_v4f_store(y + d0 + 8, y2);
        mt_v4f_store(y + d0 + 12, y3);
    }
    for (; d0 + 4 <= hd; d0 += 4) {
        mt_v4f y0 = mt_v4f_load(y + d0);
        const float *restrict xr = X + d0;
        for (int64_t r = 0; r < n; r++, xr += stride)
            y0 += a[r] * mt_v4f_load(xr);
        mt_v4f_store(y + d0, y0);
    }
    for (; d0 < hd; d0++) {
        float y0 = y[d0];
        for (int64_t r = 0; r < n; r++)
            y0 += a[r] * X[r * stride + d0];
        y[d0] = y0;
    }
}

/* ------------------------------------------------------------------ forward */

void mt_cpu_attention_forward(float *restrict out, float *restrict lse, const float *restrict q,
                              const float *restrict k, const float *restrict v,
                              const int32_t *restrict doc_start, int64_t B, int64_t T, int64_t nh,
                              int64_t nkv, int64_t hd)
{
    const char *kernel = "attention_forward";
    check_shapes(kernel, B, T, nh, nkv, hd);
    const int64_t group = nh / nkv, qstride = nh * hd, kvstride = nkv * hd;
    const int64_t kbw = key_block(hd);
    const float scale = (float)(1.0 / sqrt((double)hd));
    const int64_t ntiles = (T + FWD_QT - 1) / FWD_QT;
    const int64_t nitems = B * nh * ntiles;

    const int par = nitems > 1 && B * T * T * nh * hd > MT_CPU_PAR_MIN;
    /* Items cycle over threads one at a time so the cheap early tiles and
     * the expensive late tiles of each head spread evenly. */
#pragma omp parallel for schedule(static, 1) if (par)
    for (int64_t item = 0; item < nitems; item++) {
        const int64_t bh = item / ntiles, i0 = item % ntiles * FWD_QT;
        const int64_t b = bh / nh, h = bh % nh, g = h / group;
        const int64_t nr = T - i0 < FWD_QT ? T - i0 : FWD_QT;
        float qs[FWD_QT * hd], kt[hd * kbw], s[KB_MAX];
        float m[FWD_QT], l[FWD_QT];
        int64_t lo[FWD_QT];
        int64_t minlo = i0;
        for (int64_t r = 0; r < nr; r++) {
            const int64_t i = i0 + r;
            lo[r] = row_lo(doc_start, b, T, i, kernel);
            minlo = lo[r] < minlo ? lo[r] : minlo;
            const float *restrict qr = q + (b * T + i) * qstride + h * hd;
            float *restrict orow = out + (b * T + i) * qstride + h * hd;
            for (int64_t d = 0; d < hd; d++) {
                qs[r * hd + d] = qr[d] * scale;
                orow[d] = 0.0f; /* the output row doubles as the accumulator */
            }
            m[r] = -INFINITY;
            l[r] = 0.0f;
        }
        const int64_t last = i0 + nr - 1;
        for (int64_t j0 = minlo / kbw * kbw; j0 <= last; j0 += kbw) {
            const int64_t nj = last + 1 - j0 < kbw ? last + 1 - j0 : kbw;
            transpose_block(kt, k + (b * T + j0) * kvstride + g * hd, kvstride, nj, kbw, hd);
            for (int64_t r = 0; r < nr; r++) {
                const int64_t i = i0 + r;
                const int64_t c0 = (lo[r] > j0 ? lo[r] : j0) - j0;
                const int64_t c1 = (i < j0 + nj - 1 ? i : j0 + nj - 1) - j0 + 1;
                if (c0 >= c1)
                    continue; /* block fully masked for this row */
                block_dots(s, qs + r * hd, kt, kbw, hd, c0, c1);
                float bmax = s[c0];
                for (int64_t c = c0 + 1; c < c1; c++)
                    bmax = s[c] > bmax ? s[c] : bmax;
                const float mnew = bmax > m[r] ? bmax : m[r];
                const float corr = mt_cpu_expf(m[r] - mnew); /* 0 on the first block */
#pragma omp simd
                for (int64_t c = c0; c < c1; c++)
                    s[c] = mt_cpu_expf(s[c] - mnew);
                l[r] = l[r] * corr + mt_cpu_sum8(s + c0, c1 - c0);
                m[r] = mnew;
                float *restrict orow = out + (b * T + i) * qstride + h * hd;
                if (corr != 1.0f) {
#pragma omp simd
                    for (int64_t d = 0; d < hd; d++)
                        orow[d] *= corr;
                }
                const float *restrict vb = v + (b * T + j0 + c0) * kvstride + g * hd;
                gemv_t_acc(orow, s + c0, vb, kvstride, c1 - c0, hd);
            }
        }
        for (int64_t r = 0; r < nr; r++) {
            const int64_t i = i0 + r;
            float *restrict orow = out + (b * T + i) * qstride + h * hd;
            const float inv = 1.0f / l[r];
#pragma omp simd
            for (int64_t d = 0; d < hd; d++)
                orow[d] *= inv;
            lse[(b * nh + h) * T + i] = m[r] + logf(l[r]);
        }
    }
}

/* ------------------------------------------------------------------ backward */

void mt_cpu_attention_backward(float *restrict dq, float *restrict dk, float *restrict dv,
                               const float *restrict dout, const float *restrict out,
                               const float *restrict lse, const float *restrict q,
                               const float *restrict k, const float *restrict v,
                               const int32_t *restrict doc_start, int64_t B, int64_t T,
                               int64_t nh, int64_t nkv, int64_t hd)
{
    const char *kernel = "attention_backward";
    check_shapes(kernel, B, T, nh, nkv, hd);
    const int64_t group = nh / nkv, qstride = nh * hd, kvstride = nkv * hd;
    const int64_t kbw = key_block(hd);
    const float scale = (float)(1.0 / sqrt((double)hd));
    const int64_t ntasks = B * nkv;

    const int par = ntasks > 1 && B * T * T * nh * hd > MT_CPU_PAR_MIN;
    /* dynamic: document masks can make tasks uneven; who runs a task never
     * changes its arithmetic */
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int64_t task = 0; task < ntasks; task++) {
        const int64_t b = task / nkv, g = task % nkv;
        float kt[hd * kbw], vt[hd * kbw], qs[hd];
        float P[BWD_QT * kbw], dS[BWD_QT * kbw], dp[KB_MAX];

        for (int64_t t = 0; t < T; t++) {
            memset(dk + (b * T + t) * kvstride + g * hd, 0, (size_t)hd * sizeof(float));
            memset(dv + (b * T + t) * kvstride + g * hd, 0, (size_t)hd * sizeof(float));
            for (int64_t h = g * group; h < (g + 1) * group; h++)
                memset(dq + (b * T + t) * qstride + h * hd, 0, (size_t)hd * sizeof(float));
        }

        for (int64_t j0 = 0; j0 < T; j0 += kbw) {
            const int64_t nj = T - j0 < kbw ? T - j0 : kbw;
            const float *restrict kb = k + (b * T + j0) * kvstride + g * hd;
            const float *restrict vb = v + (b * T + j0) * kvstride + g * hd;
            transpose_block(kt, kb, kvstride, nj, kbw, hd);
            transpose_block(vt, vb, kvstride, nj, kbw, hd);
            float *restrict dkb = dk + (b * T + j0) * kvstride + g * hd;
            float *restrict dvb = dv + (b * T + j0) * kvstride + g * hd;

            for (int64_t h = g * group; h < (g + 1) * group; h++) {
                const float *restrict lse_bh = lse + (b * nh + h) * T;
                /* rows before j0 see none of this block (causal) */
                for (int64_t i0 = j0; i0 < T; i0 += BWD_QT) {
                    const int64_t nr = T - i0 < BWD_QT ? T - i0 : BWD_QT;
                    int64_t cmin = kbw, cmax = 0;
                    for (int64_t r = 0; r < nr; r++) {
                        const int64_t i = i0 + r;
                        const int64_t lo = row_lo(doc_start, b, T, i, kernel);
                        const int64_t c0 = (lo > j0 ? lo : j0) - j0;
                        const int64_t c1 = (i < j0 + nj - 1 ? i : j0 + nj - 1) - j0 + 1;
                        float *restrict pr = P + r * kbw;
                        float *restrict sr = dS + r * kbw;
                        if (c0 >= c1) { /* row fully masked in this block */
                            memset(pr, 0, (size_t)kbw * sizeof(float));
                            memset(sr, 0, (size_t)kbw * sizeof(float));
                            continue;
                        }
                        cmin = c0 < cmin ? c0 : cmin;
                        cmax = c1 > cmax ? c1 : cmax;
                        const float *restrict qr = q + (b * T + i) * qstride + h * hd;
                        const float *restrict gr = dout + (b * T + i) * qstride + h * hd;
                        const float *restrict orow = out + (b * T + i) * qstride + h * hd;
                        for (int64_t d = 0; d < hd; d++)
                            qs[d] = qr[d] * scale;
                        const float Di = mt_cpu_dot8(gr, orow, hd);
                        const float li = lse_bh[i];
                        block_dots(pr, qs, kt, kbw, hd, c0, c1);
                        block_dots(dp, gr, vt, kbw, hd, c0, c1);
#pragma omp simd
                        for (int64_t c = c0; c < c1; c++) {
                            const float p = mt_cpu_expf(pr[c] - li);
                            pr[c] = p;
                            sr[c] = p * (dp[c] - Di) * scale;
                        }
                        /* masked entries are exact zeros for the column pass below */
                        for (int64_t c = 0; c < c0; c++)
                            pr[c] = sr[c] = 0.0f;
                        for (int64_t c = c1; c < kbw; c++)
                            pr[c] = sr[c] = 0.0f;
                        /* dq_i += sum_c dS_ic k_c, keys in order */
                        gemv_t_acc(dq + (b * T + i) * qstride + h * hd, sr + c0,
                                   kb + c0 * kvstride, kvstride, c1 - c0, hd);
                    }
                    /* dk_c += sum_r dS_rc q_r, dv_c += sum_r P_rc dout_r, rows in
                     * order; rows before key c are causally masked (zeros) */
                    for (int64_t c = cmin; c < cmax; c++) {
                        const int64_t rs = j0 + c > i0 ? j0 + c - i0 : 0;
                        float ak[BWD_QT], av[BWD_QT];
                        for (int64_t r = rs; r < nr; r++) {
                            ak[r - rs] = dS[r * kbw + c];
                            av[r - rs] = P[r * kbw + c];
                        }
                        const int64_t row0 = (b * T + i0 + rs) * qstride + h * hd;
                        gemv_t_acc(dkb + c * kvstride, ak, q + row0, qstride, nr - rs, hd);
                        gemv_t_acc(dvb + c * kvstride, av, dout + row0, qstride, nr - rs, hd);
                    }
                }
            }
        }
    }
}
