/* kernels_cpu_moe.c: the mixture-of-experts kernels of the CPU backend:
 * the router (softmax, top-k, optional renormalisation) with its backward,
 * and the row gathers that move tokens between token order and expert
 * order.  The expert MLPs themselves are plain matmuls and swiglu calls in
 * model_moe.c; the integer bookkeeping of the dispatch (counts, offsets)
 * stays on the host because it decides MPI message sizes.
 *
 * Determinism: every row is computed by one thread in a fixed order, and
 * top-k breaks ties between equal probabilities towards the LOWEST expert
 * index, so routing does not depend on the thread count or on the mesh. */
#include "kernels_cpu_internal.h"

void mt_cpu_moe_router_forward(float *probs, int32_t *idx, float *w, const float *bias,
                               int64_t n, int64_t E, int64_t k, bool norm_topk)
{
    MT_CPU_REQUIRE(k >= 1 && k <= E, "moe_router_forward", "k=%lld E=%lld", (long long)k,
                   (long long)E);
#pragma omp parallel for schedule(static) if (n * E > MT_CPU_PAR_MIN)
    for (int64_t t = 0; t < n; t++) {
        float *p = probs + t * E;
        float mx = p[0];
        for (int64_t e = 1; e < E; e++)
            mx = p[e] > mx ? p[e] : mx;
        double z = 0;
        for (int64_t e = 0; e < E; e++)
            z += exp((double)p[e] - (double)mx);
        for (int64_t e = 0; e < E; e++)
            p[e] = (float)(exp((double)p[e] - (double)mx) / z);
        double s = 0;
        for (int64_t j = 0; j < k; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) { /* strict >: the lowest index wins a tie */
                bool taken = false;
                for (int64_t i = 0; i < j; i++)
                    taken |= idx[t * k + i] == e;
                if (!taken && (best < 0 || (bias ? p[e] + bias[e] > p[best] + bias[best]
                                                 : p[e] > p[best])))
                    best = e;
            }
            idx[t * k + j] = (int32_t)best;
            w[t * k + j] = p[best];
            s += p[best];
        }
        if (norm_topk)
            for (int64_t j = 0; j < k; j++)
                w[t * k + j] = (float)((double)w[t * k + j] / s);
    }
}

void mt_cpu_moe_prob_sums(double *sums, const float *probs, int64_t n, int64_t E)
{
    MT_CPU_REQUIRE(n >= 0 && E >= 1, "moe_prob_sums", "n=%lld E=%lld", (long long)n,
                   (long long)E);
#pragma omp parallel for schedule(static) if (n * E > MT_CPU_PAR_MIN)
    for (int64_t e = 0; e < E; e++) { /* a column each, its rows in order */
        double s = sums[e];
        for (int64_t t = 0; t < n; t++)
            s += (double)probs[t * E + e];
        sums[e] = s;
    }
}

void mt_cpu_moe_router_backward(float *dlogits, const float *dw, const float *probs,
                                const int32_t *idx, const float *w, const float *dp_all,
                                int64_t n, int64_t E, int64_t k, bool norm_topk)
{
#pragma omp parallel for schedule(static) if (n * E > MT_CPU_PAR_MIN)
    for (int64_t t = 0; t < n; t++) {
        float *dl = dlogits + t * E;
        const float *p = probs + t * E;
        /* d/dp: the aux-loss term for every expert, then the selected ones */
        for (int64_t e = 0; e < E; e++)
            dl[e] = dp_all ? dp_all[e] : 0.0f;
        if (norm_topk) { /* w_j = p_j / S, S = sum of the selected p */
            double s = 0, c = 0;
            for (int64_t j = 0; j < k; j++) {
                s += p[idx[t * k + j]];
                c += (double)dw[t * k + j] * (double)w[t * k + j];
            }
            for (int64_t j = 0; j < k; j++)
                dl[idx[t * k + j]] += (float)(((double)dw[t * k + j] - c) / s);
        } else {
            for (int64_t j = 0; j < k; j++)
                dl[idx[t * k + j]] += dw[t * k + j];
        }
        /* softmax backward: dlogit_e = p_e (dp_e - sum_i p_i dp_i) */
        double dot = 0;
        for (int64_t e = 0; e < E; e++)
            dot += (double)p[e] * (double)dl[e];
        for (int64_t e = 0; e < E; e++)
            dl[e] = (float)((double)p[e] * ((double)dl[e] - dot));
    }
}

void mt_cpu_moe_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t n,
                            int64_t width)
{
#pragma omp parallel for schedule(static) if (n * width > MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + i * width, src + (int64_t)rows[i] * width, sizeof(float) * (size_t)width);
}

void mt_cpu_moe_combine(float *out, const float *res, const float *y, const int32_t *slot_row,
                        const float *w, int64_t n, int64_t k, int64_t width)
{
#pragma omp parallel for schedule(static) if (n * width > MT_CPU_PAR_MIN)
    for (int64_t t = 0; t < n; t++) {
        float *o = out + t * width;
        for (int64_t c = 0; c < width; c++)
            o[c] = res ? res[t * width + c] : 0.0f;
        for (int64_t j = 0; j < k; j++) { /* slot order: the same sum on every mesh */
            if (slot_row[t * k + j] < 0)
                continue;
            const float *yr = y + (int64_t)slot_row[t * k + j] * width;
            const float wj = w ? w[t * k + j] : 1.0f;
            for (int64_t c = 0; c < width; c++)
                o[c] += wj * yr[c];
        }
    }
}

void mt_cpu_moe_combine_backward(float *dw, float *dy, const float *dout, const float *y,
                                 const int32_t *slot_row, const float *w, int64_t n, int64_t k,
                                 int64_t width)
{
#pragma omp parallel for schedule(static) if (n * width > MT_CPU_PAR_MIN)
    for (int64_t t = 0; t < n; t++) {
        const float *d = dout + t * width;
        for (int64_t j = 0; j < k; j++) {
            int64_t r = slot_row[t * k + j];
            if (r < 0) {
                dw[t * k + j] = 0.0f;
                continue;
            }
            const float *yr = y + r * width;
            float *dyr = dy + r * width;
            double s = 0;
            for (int64_t c = 0; c < width; c++) {
                s += (double)d[c] * (double)yr[c];
                dyr[c] = w[t * k + j] * d[c];
            }
            dw[t * k + j] = (float)s;
        }
    }
}
