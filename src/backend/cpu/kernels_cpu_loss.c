/* kernels_cpu_loss.c: softmax cross-entropy of the CPU backend, loss and
 * gradient together, in two passes over each row of logits.
 *
 * Per row with target y (columns >= v_valid are vocabulary padding and are
 * never read):  m = max_j l_j,  Z = sum_j exp(l_j - m),
 *   loss = (m - l_y) + log Z,
 *   dlogits_j = (exp(l_j - m)/Z - [j == y]) * grad_scale,  0 on padding.
 * Rows whose target is -100 are ignored (loss not summed, dlogits row 0).
 * A -inf logit (a masked column) adds 0 to Z and gets a 0 gradient
 * wherever it falls, a NaN makes the loss NaN, as in the CUDA kernel.
 * Any other target outside [0, v_valid) is a data bug and stops the
 * process (see MT_CPU_REQUIRE).
 *
 * Pass 1 walks the row once in column blocks of COL_BLOCK (L1-resident):
 * block max, running max m, exp(l_j - m) written to dlogits (or a stack
 * buffer for the loss alone) and summed into Z in double, Z rescaled by
 * exp(m_old - m_new) when a block raises the max.  Pass 2 multiplies each
 * block by grad_scale/Z * exp(m_block - m).  One exp per logit (exp is
 * what bounds this kernel) and two sweeps of the row instead of the five
 * of max / exp-sum / normalise.
 *
 * Rows run in parallel in blocks of LOSS_BLOCK; each block's row losses go
 * to a stack array and one thread adds them in row order, so the double sum
 * is exactly the sequential row-order sum, at any thread count.  It does
 * not fuse the LM-head matmul or chunk the vocabulary.
 *
 * The ce_shard_* kernels at the end compute the same loss and gradient
 * for a vocabulary split over tensor-parallel ranks (mt_backend.h): the
 * row max, then the exp-sum and target logit against the global max, then
 * the loss and gradient from the combined figures. */
#include <math.h>

#include "kernels_cpu_internal.h"

#define LOSS_BLOCK 256
#define IGNORE_INDEX (-100)

#define COL_BLOCK 512

/* max of x[0..n), n >= 1; NaNs are skipped here and surface through exp
 * (a NaN at x[0] is returned instead: the row's loss is NaN either way). */
static inline float block_max(const float *x, int64_t n)
{
    mt_v4f m0 = {x[0], x[0], x[0], x[0]}, m1 = m0;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const mt_v4f a = mt_v4f_load(x + j), b = mt_v4f_load(x + j + 4);
        const mt_v4i ga = a > m0, gb = b > m1; /* lane masks: all ones where greater */
        m0 = (mt_v4f)(((mt_v4i)a & ga) | ((mt_v4i)m0 & ~ga));
        m1 = (mt_v4f)(((mt_v4i)b & gb) | ((mt_v4i)m1 & ~gb));
    }
    float m = m0[0];
    for (int l = 1; l < 4; l++)
        m = m0[l] > m ? m0[l] : m;
    for (int l = 0; l < 4; l++)
        m = m1[l] > m ? m1[l] : m;
    for (; j < n; j++)
        m = x[j] > m ? x[j] : m;
    return m;
}

/* Loss of one row; writes its dlogits row when dr is not NULL.  dr may
 * equal lr: l_y is read first, and each block's logits are read (max,
 * then exp) before the same elements are overwritten. */
static double ce_row(float *dr, const float *lr, int32_t y, int64_t V, int64_t v_valid,
                     float grad_scale)
{
    const float ly = lr[y];
    float m = -INFINITY;
    double z = 0.0;
    float e[COL_BLOCK];
    const int64_t nblocks = (v_valid + COL_BLOCK - 1) / COL_BLOCK;
    float bmx[nblocks]; /* running max after each block: 4 bytes per 512 columns */
    for (int64_t j0 = 0, bi = 0; j0 < v_valid; j0 += COL_BLOCK, bi++) {
        const int64_t nb = v_valid - j0 < COL_BLOCK ? v_valid - j0 : COL_BLOCK;
        const float bm = block_max(lr + j0, nb);
        if (bm > m) {
            z *= exp((double)m - (double)bm); /* exp(-inf) = 0 on the first block */
            m = bm;
        }
        bmx[bi] = m;
        float *dst = dr ? dr + j0 : e;
        /* the exponent's offset: the running max, or 0 while no finite
         * one is known (the logits so far -inf, or a NaN first in its
         * block hid the block's max, block_max), so that -inf gives
         * exp(-inf) = 0 and a NaN still makes Z NaN, as in the CUDA kernel */
        const float off = m == -INFINITY ? 0.0f : m;
#pragma omp simd
        for (int64_t j = 0; j < nb; j++)
            dst[j] = mt_cpu_expf(lr[j0 + j] - off);
        z += mt_cpu_sum_f64(dst, nb);
    }
    const double loss = ((double)m - (double)ly) + log(z);
    if (dr) {
        const float ey = mt_cpu_expf(ly - m);
        for (int64_t j0 = 0, bi = 0; j0 < v_valid; j0 += COL_BLOCK, bi++) {
            const int64_t nb = v_valid - j0 < COL_BLOCK ? v_valid - j0 : COL_BLOCK;
            const float f = (float)((double)grad_scale / z * exp((double)bmx[bi] - (double)m));
#pragma omp simd
            for (int64_t j = 0; j < nb; j++)
                dr[j0 + j] *= f;
        }
        dr[y] = (float)(((double)ey / z - 1.0) * (double)grad_scale);
        for (int64_t c = v_valid; c < V; c++)
            dr[c] = 0.0f;
    }
    return loss;
}

double mt_cpu_cross_entropy(float *dlogits, const float *logits, const int32_t *targets,
                            int64_t n, int64_t V, int64_t v_valid, float grad_scale,
                            int64_t *count)
{
    MT_CPU_REQUIRE(n >= 0 && v_valid >= 1 && v_valid <= V, "cross_entropy",
                   "n=%lld V=%lld v_valid=%lld", (long long)n, (long long)V,
                   (long long)v_valid);
    double row_loss[LOSS_BLOCK];
    double total = 0.0;
    int64_t cnt = 0;

#pragma omp parallel if (n * V > MT_CPU_PAR_MIN)
    for (int64_t r0 = 0; r0 < n; r0 += LOSS_BLOCK) {
        const int64_t nb = n - r0 < LOSS_BLOCK ? n - r0 : LOSS_BLOCK;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < nb; r++) {
            const int64_t i = r0 + r;
            const int32_t y = targets[i];
            float *dr = dlogits ? dlogits + i * V : NULL;
            if (y == IGNORE_INDEX) {
                if (dr)
                    memset(dr, 0, (size_t)V * sizeof(float));
                row_loss[r] = 0.0;
                continue;
            }
            MT_CPU_REQUIRE(y >= 0 && y < v_valid, "cross_entropy",
                           "targets[%lld] = %d, outside [0, %lld) and not -100", (long long)i, y,
                           (long long)v_valid);
            row_loss[r] = ce_row(dr, logits + i * V, y, V, v_valid, grad_scale);
        }
        /* the barrier above ends the block; one thread sums it in row order */
#pragma omp single
        for (int64_t r = 0; r < nb; r++)
            if (targets[r0 + r] != IGNORE_INDEX) {
                total += row_loss[r];
                cnt++;
            }
    }
    if (count)
        *count = cnt;
    return total;
}

/* ------------------------------------------------ vocabulary-parallel */

void mt_cpu_ce_shard_max(float *mx, const float *logits, int64_t n, int64_t V, int64_t v_valid)
{
    MT_CPU_REQUIRE(n >= 0 && v_valid >= 0 && v_valid <= V, "ce_shard_max",
                   "n=%lld V=%lld v_valid=%lld", (long long)n, (long long)V, (long long)v_valid);
#pragma omp parallel for schedule(static) if (n * V > MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        mx[i] = v_valid > 0 ? block_max(logits + i * V, v_valid) : -INFINITY;
}

void mt_cpu_ce_shard_sum(double *z, double *ly, const float *logits, const int32_t *targets,
                         const float *mx, int64_t n, int64_t V, int64_t v_lo, int64_t v_valid)
{
    MT_CPU_REQUIRE(n >= 0 && v_valid >= 0 && v_valid <= V, "ce_shard_sum",
                   "n=%lld V=%lld v_valid=%lld", (long long)n, (long long)V, (long long)v_valid);
#pragma omp parallel for schedule(static) if (n * V > MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float *lr = logits + i * V;
        float e[COL_BLOCK];
        double sum = 0.0;
        for (int64_t j0 = 0; j0 < v_valid; j0 += COL_BLOCK) {
            const int64_t nb = v_valid - j0 < COL_BLOCK ? v_valid - j0 : COL_BLOCK;
#pragma omp simd
            for (int64_t j = 0; j < nb; j++)
                e[j] = mt_cpu_expf(lr[j0 + j] - mx[i]);
            sum += mt_cpu_sum_f64(e, nb);
        }
        z[i] = sum;
        const int64_t y = (int64_t)targets[i] - v_lo;
        ly[i] = targets[i] != IGNORE_INDEX && y >= 0 && y < v_valid ? (double)lr[y] : 0.0;
    }
}

double mt_cpu_ce_shard_finish(float *dlogits, const float *logits, const int32_t *targets,
                              const float *mx, const double *z, const double *ly, int64_t n,
                              int64_t V, int64_t v_lo, int64_t v_valid, float grad_scale,
                              int64_t *count)
{
    double total = 0.0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < n; i++) /* row order: the same sum on every shard */
        if (targets[i] != IGNORE_INDEX) {
            total += ((double)mx[i] - ly[i]) + log(z[i]);
            cnt++;
        }
    if (dlogits) {
#pragma omp parallel for schedule(static) if (n * V > MT_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            const float *lr = logits + i * V;
            float *dr = dlogits + i * V;
            if (targets[i] == IGNORE_INDEX) {
                memset(dr, 0, (size_t)V * sizeof(float));
                continue;
            }
            const float f = (float)((double)grad_scale / z[i]);
            const int64_t y = (int64_t)targets[i] - v_lo;
            const float ey = y >= 0 && y < v_valid ? mt_cpu_expf(lr[y] - mx[i]) : 0.0f;
#pragma omp simd
            for (int64_t j = 0; j < v_valid; j++)
                dr[j] = mt_cpu_expf(lr[j] - mx[i]) * f;
            if (y >= 0 && y < v_valid)
                dr[y] = (float)(((double)ey / z[i] - 1.0) * (double)grad_scale);
            for (int64_t j = v_valid; j < V; j++)
                dr[j] = 0.0f;
        }
    }
    if (count)
        *count = cnt;
    return total;
}
