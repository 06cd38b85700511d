/* kernels_cpu_norm.c: RMSNorm and token-embedding kernels of the CPU backend,
 * forward and backward.
 *
 * The parameter gradients (rmsnorm dw, embedding dtable) are reductions over
 * rows.  Instead of per-thread partial buffers (the contract forbids kernel
 * allocations) or atomics, each thread owns a slice of COLUMNS and walks the
 * rows in order, so every gradient element is summed in row (token) order:
 * the same bits at any thread count.  The embedding does not know the
 * vocabulary size, so it can only reject negative token ids; the data layer
 * must guarantee tokens < vocab. */
#include <math.h>

#include "kernels_cpu_internal.h"

/* Columns per task of the column-sliced reductions: 64 floats = 4 cache
 * lines per row, enough to amortise the row loop, small enough to keep
 * several tasks per thread at model widths. */
#define COL_CHUNK 64

/* ------------------------------------------------------------------ embedding */

void mt_cpu_embedding_forward(float *restrict out, const int32_t *restrict tokens,
                              const float *restrict table, int64_t n_tokens, int64_t dim)
{
#pragma omp parallel for schedule(static) if (n_tokens * dim > MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n_tokens; i++) {
        const int32_t tok = tokens[i];
        MT_CPU_REQUIRE(tok >= -1, "embedding_forward", "tokens[%lld] = %d", (long long)i, tok);
        if (tok == -1) /* another vocabulary shard's token */
            memset(out + i * dim, 0, (size_t)dim * sizeof(float));
        else
            memcpy(out + i * dim, table + (int64_t)tok * dim, (size_t)dim * sizeof(float));
    }
}

void mt_cpu_embedding_backward(float *restrict dtable, const float *restrict dout,
                               const int32_t *restrict tokens, int64_t n_tokens, int64_t dim)
{
    for (int64_t i = 0; i < n_tokens; i++)
        MT_CPU_REQUIRE(tokens[i] >= -1, "embedding_backward", "tokens[%lld] = %d", (long long)i,
                       tokens[i]);
    const int64_t nchunks = (dim + COL_CHUNK - 1) / COL_CHUNK;
#pragma omp parallel for schedule(static) if (nchunks > 1 && n_tokens * dim > MT_CPU_PAR_MIN)
    for (int64_t ch = 0; ch < nchunks; ch++) {
        const int64_t c0 = ch * COL_CHUNK;
        const int64_t nc = dim - c0 < COL_CHUNK ? dim - c0 : COL_CHUNK;
        for (int64_t i = 0; i < n_tokens; i++) {
            if (tokens[i] < 0)
                continue; /* another vocabulary shard's token */
            float *restrict dst = dtable + (int64_t)tokens[i] * dim + c0;
            const float *restrict src = dout + i * dim + c0;
#pragma omp simd
            for (int64_t c = 0; c < nc; c++)
                dst[c] += src[c];
        }
    }
}

/* ------------------------------------------------------------------ RMSNorm */

/* sum_j g_j w_j x_j in double, lanes j % 4 combined in a fixed order
 * (the pattern of mt_cpu_dot_f64). */
static inline double dot3_f64(const float *restrict g, const float *restrict w,
                              const float *restrict x, int64_t n)
{
    mt_v2d a0 = {0, 0}, a1 = {0, 0};
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        a0 += mt_v2d_load_f(g + j) * mt_v2d_load_f(w + j) * mt_v2d_load_f(x + j);
        a1 += mt_v2d_load_f(g + j + 2) * mt_v2d_load_f(w + j + 2) * mt_v2d_load_f(x + j + 2);
    }
    double tail = 0.0;
    for (; j < n; j++)
        tail += (double)g[j] * (double)w[j] * (double)x[j];
    return ((a0[0] + a1[0]) + (a0[1] + a1[1])) + tail;
}

/* sums == NULL: each row's sum of squares here, over dim.  Otherwise
 * sums[i] is the row's sum over full_dim columns, of which this call holds
 * dim (the row split across ranks; the caller added the parts). */
static void norm_forward(float *restrict out, float *restrict rstd, const float *restrict x,
                         const float *restrict w, const double *restrict sums, int64_t n,
                         int64_t dim, int64_t full_dim, float eps, bool round)
{
#pragma omp parallel for schedule(static) if (n * dim > MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float *restrict xr = x + i * dim;
        float *restrict yr = out + i * dim;
        const double ss = sums ? sums[i] : mt_cpu_dot_f64(xr, NULL, dim);
        const float r = (float)(1.0 / sqrt(ss / (double)full_dim + (double)eps));
        rstd[i] = r;
        /* (x * rstd) * w: the order of Hugging Face's LlamaRMSNorm; the
         * loop twice, so the plain one carries no rounding work */
        if (round) {
#pragma omp simd
            for (int64_t j = 0; j < dim; j++)
                yr[j] = mt_cpu_bf16_if((xr[j] * r) * w[j], 1);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < dim; j++)
                yr[j] = (xr[j] * r) * w[j];
        }
    }
}

void mt_cpu_rmsnorm_forward(float *restrict out, float *restrict rstd, const float *restrict x,
                            const float *restrict w, int64_t n, int64_t dim, float eps,
                            bool round)
{
    MT_CPU_REQUIRE(dim > 0, "rmsnorm_forward", "dim=%lld", (long long)dim);
    norm_forward(out, rstd, x, w, NULL, n, dim, dim, eps, round);
}

void mt_cpu_rmsnorm_forward_sums(float *restrict out, float *restrict rstd,
                                 const float *restrict x, const float *restrict w,
                                 const double *restrict sums, int64_t n, int64_t dim,
                                 int64_t full_dim, float eps, bool round)
{
    MT_CPU_REQUIRE(dim > 0 && full_dim >= dim && sums, "rmsnorm_forward_sums",
                   "dim=%lld full_dim=%lld sums=%p", (long long)dim, (long long)full_dim,
                   (const void *)sums);
    norm_forward(out, rstd, x, w, sums, n, dim, full_dim, eps, round);
}

void mt_cpu_rmsnorm_rowsums(double *restrict sums, const float *restrict a,
                            const float *restrict b, const float *restrict w, int64_t n,
                            int64_t dim)
{
    MT_CPU_REQUIRE(dim > 0, "rmsnorm_rowsums", "dim=%lld", (long long)dim);
#pragma omp parallel for schedule(static) if (n * dim > MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        sums[i] = w ? dot3_f64(a + i * dim, w, b + i * dim, dim)
                    : mt_cpu_dot_f64(a + i * dim, b + i * dim, dim);
}

/* One row of dx: the gradient, added to what dr holds when ACC, rounded to
 * bf16 when RND (both constants: four loops, none carrying another's work) */
#define DX_ROW(ACC, RND)                                                                \
    _Pragma("omp simd")                                                                 \
    for (int64_t j = 0; j < dim; j++) {                                                 \
        const float v = rf * (gr[j] * w[j]) - coef * xr[j];                            \
        dr[j] = mt_cpu_bf16_if((ACC) ? dr[j] + v : v, (RND));                           \
    }

/* sums as in norm_forward: sums[i] = sum over the whole row of
 * dout_k w_k x_k, or NULL to form it here over dim */
static void norm_backward(float *restrict dx, float *restrict dw, const float *restrict dout,
                          const float *restrict x, const float *restrict w,
                          const float *restrict rstd, const double *restrict sums, int64_t n,
                          int64_t dim, int64_t full_dim, bool accumulate, bool round)
{
    const int par = n * dim > MT_CPU_PAR_MIN;
    const int64_t nchunks = (dim + COL_CHUNK - 1) / COL_CHUNK;

#pragma omp parallel if (par)
    {
        /* dx_j = r (dout_j w_j) - r^3/D (sum_k dout_k w_k x_k) x_j, D the full row */
#pragma omp for schedule(static) nowait
        for (int64_t i = 0; i < n; i++) {
            const float *restrict xr = x + i * dim;
            const float *restrict gr = dout + i * dim;
            float *restrict dr = dx + i * dim;
            const double r = rstd[i];
            const double gx = sums ? sums[i] : dot3_f64(gr, w, xr, dim);
            const float coef = (float)(r * r * r * gx / (double)full_dim);
            const float rf = (float)r;
            if (accumulate && round)
                DX_ROW(1, 1)
            else if (accumulate)
                DX_ROW(1, 0)
            else if (round)
                DX_ROW(0, 1)
            else
                DX_ROW(0, 0)
        }

        /* dw_j += sum_i dout_ij x_ij rstd_i, rows in order per column */
#pragma omp for schedule(static)
        for (int64_t ch = 0; ch < nchunks; ch++) {
            const int64_t c0 = ch * COL_CHUNK;
            const int64_t nc = dim - c0 < COL_CHUNK ? dim - c0 : COL_CHUNK;
            double acc[COL_CHUNK];
            for (int64_t c = 0; c < nc; c++)
                acc[c] = 0.0;
            for (int64_t i = 0; i < n; i++) {
                const float *restrict xr = x + i * dim + c0;
                const float *restrict gr = dout + i * dim + c0;
                const double r = rstd[i];
#pragma omp simd
                for (int64_t c = 0; c < nc; c++)
                    acc[c] += (double)gr[c] * (double)xr[c] * r;
            }
            for (int64_t c = 0; c < nc; c++)
                dw[c0 + c] += (float)acc[c];
        }
    }
}

void mt_cpu_rmsnorm_backward(float *restrict dx, float *restrict dw, const float *restrict dout,
                             const float *restrict x, const float *restrict w,
                             const float *restrict rstd, int64_t n, int64_t dim, bool accumulate,
                             bool round)
{
    MT_CPU_REQUIRE(dim > 0, "rmsnorm_backward", "dim=%lld", (long long)dim);
    norm_backward(dx, dw, dout, x, w, rstd, NULL, n, dim, dim, accumulate, round);
}

void mt_cpu_rmsnorm_backward_sums(float *restrict dx, float *restrict dw,
                                  const float *restrict dout, const float *restrict x,
                                  const float *restrict w, const float *restrict rstd,
                                  const double *restrict sums, int64_t n, int64_t dim,
                                  int64_t full_dim, bool accumulate, bool round)
{
    MT_CPU_REQUIRE(dim > 0 && full_dim >= dim && sums, "rmsnorm_backward_sums",
                   "dim=%lld full_dim=%lld sums=%p", (long long)dim, (long long)full_dim,
                   (const void *)sums);
    norm_backward(dx, dw, dout, x, w, rstd, sums, n, dim, full_dim, accumulate, round);
}
