/* model_qknorm.c: the attention block's q/k RMSNorms (see model_qknorm.h). */
#include "model_qknorm.h"

/* RMSNorm over rows that tensor parallelism splits across its group (the
 * q/k norm over the whole projection, OLMoE): each rank sums its d
 * columns of each row, the group adds the sums, and each rank normalises
 * its slice with its slice of the weight; the backward does the same with
 * the row sums of g w x (mt_backend_t.rmsnorm_rowsums).  The per-row sums
 * use the loss's [N] scratch (m->ce_z), which is free between layers. */
static void split_norm_forward(const mt_model_t *m, float *out, float *rstd, const float *x,
                               const float *w, int64_t n, int64_t d)
{
    double *ss = m->ce_z;
    m->be->rmsnorm_rowsums(ss, x, x, NULL, n, d);
    m->tp_allreduce(m->tp_ctx, ss, ss, n, MT_TP_SUM_DOUBLE);
    m->be->rmsnorm_forward_sums(out, rstd, x, w, ss, n, d, d * m->tp, m->eps);
}

static void split_norm_backward(const mt_model_t *m, float *dx, float *dw, const float *g,
                                const float *x, const float *w, const float *rstd, int64_t n,
                                int64_t d)
{
    double *gx = m->ce_z;
    m->be->rmsnorm_rowsums(gx, g, x, w, n, d);
    m->tp_allreduce(m->tp_ctx, gx, gx, n, MT_TP_SUM_DOUBLE);
    m->be->rmsnorm_backward_sums(dx, dw, g, x, w, rstd, gx, n, d, d * m->tp, false);
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
