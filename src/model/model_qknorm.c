/* model_qknorm.c: the attention block's q/k RMSNorms (see model_qknorm.h). */
#include "model_qknorm.h"

#include <math.h>

#include "model_moe.h"

/* RMSNorm over rows that tensor parallelism splits across its group (the
 * q/k norm over the whole projection, OLMoE): each rank sums the squares
 * of its d columns, the group adds the sums, and each rank normalises its
 * slice with its slice of the weight.  Host loops: model_init admits this
 * only on a host-memory table storing float32.  The per-row sums use the
 * loss's [N] scratch (m->ce_z), which is free between layers. */
static void split_norm_forward(const mt_model_t *m, float *out, float *rstd, const float *x,
                               const float *w, int64_t n, int64_t d)
{
    double *ss = m->ce_z;
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + i * d;
        double acc = 0.0;
        for (int64_t j = 0; j < d; j++)
            acc += (double)xr[j] * (double)xr[j];
        ss[i] = acc;
    }
    m->tp_allreduce(m->tp_ctx, ss, ss, n, MT_TP_SUM_DOUBLE);
    const double full = (double)(d * m->tp);
    for (int64_t i = 0; i < n; i++) {
        const float r = (float)(1.0 / sqrt(ss[i] / full + (double)m->eps));
        rstd[i] = r;
        for (int64_t j = 0; j < d; j++)
            out[i * d + j] = (x[i * d + j] * r) * w[j];
    }
    mt_model_round(m, out, n * d); /* as a rounding table's norm writes it */
}

/* Its backward: dx_j = r g_j w_j - r^3/D (sum over the whole row of
 * g_k w_k x_k) x_j, that sum added over the group; dw (this rank's slice)
 * gathers only local terms. */
static void split_norm_backward(const mt_model_t *m, float *dx, float *dw, const float *g,
                                const float *x, const float *w, const float *rstd, int64_t n,
                                int64_t d)
{
    double *gx = m->ce_z;
    for (int64_t i = 0; i < n; i++) {
        double acc = 0.0;
        for (int64_t j = 0; j < d; j++)
            acc += (double)g[i * d + j] * (double)w[j] * (double)x[i * d + j];
        gx[i] = acc;
    }
    m->tp_allreduce(m->tp_ctx, gx, gx, n, MT_TP_SUM_DOUBLE);
    const double full = (double)(d * m->tp);
    for (int64_t i = 0; i < n; i++) {
        const double r = rstd[i];
        const float coef = (float)(r * r * r * gx[i] / full), rf = (float)r;
        for (int64_t j = 0; j < d; j++)
            dx[i * d + j] = rf * (g[i * d + j] * w[j]) - coef * x[i * d + j];
    }
    for (int64_t j = 0; j < d; j++) {
        double acc = 0.0;
        for (int64_t i = 0; i < n; i++)
            acc += (double)g[i * d + j] * (double)x[i * d + j] * (double)rstd[i];
        dw[j] += (float)acc;
    }
    mt_model_round(m, dx, n * d);
}

/* The q/k norms: per head (Qwen3) or over the whole projection (OLMoE),
 * which under TP spans the group. */
void mt_model_qk_norm_forward(const mt_model_t *m, float *out, float *rstd, const float *x,
                              const float *w, int64_t heads)
{
    const int64_t g = m->qk_norm_whole ? heads : 1;
    if (m->qk_norm_whole && m->tp > 1)
        split_norm_forward(m, out, rstd, x, w, m->N, heads * m->hd);
    else
        m->be->rmsnorm_forward(out, rstd, x, w, m->N * heads / g, m->hd * g, m->eps);
}

void mt_model_qk_norm_backward(const mt_model_t *m, float *dx, float *dw, const float *dout,
                               const float *x, const float *w, const float *rstd,
                               int64_t heads)
{
    const int64_t g = m->qk_norm_whole ? heads : 1;
    if (m->qk_norm_whole && m->tp > 1)
        split_norm_backward(m, dx, dw, dout, x, w, rstd, m->N, heads * m->hd);
    else
        m->be->rmsnorm_backward(dx, dw, dout, x, w, rstd, m->N * heads / g, m->hd * g, false);
}
