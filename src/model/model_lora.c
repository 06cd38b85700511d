/* model_lora.c: LoRA, y = W x + (alpha / r) B (A x), on the linears the
 * peft: section targets (doc/lora.md).
 *
 * The base W is frozen: model_arena.c puts it in its own arena without
 * gradients, so backward forms only W's input gradient.  The adapters are
 * the model's parameters, in the units of the layers they adapt, so the
 * gradient reductions, sharding, optimizer and checkpoints, which all
 * work on the parameters, see them alone.  Their activation is not kept:
 * z = s x A^T ([N, r], r small) is formed again in backward, which costs
 * one N x in x r GEMM and keeps activation checkpointing and the kept
 * buffers as they are.  Every buffer is the backend's memory. */
#include "model_lora.h"

#include <stdlib.h>

#include "model_moe.h" /* mt_model_round */

mt_status_t mt_lora_alloc(mt_model_t *m)
{
    const mt_backend_t *be = m->be;
    int64_t sink = 1;
    for (int i = 0; i < m->nfrozen; i++)
        if (m->frozen[i].ndim == 1 && m->frozen[i].numel > sink)
            sink = m->frozen[i].numel;
    m->frozen_mem = be->device_alloc(sizeof(float) * (size_t)(m->frozen_numel + 1));
    m->lora_sink = be->device_alloc(sizeof(float) * (size_t)sink);
    m->lora_z = be->device_alloc(sizeof(float) * (size_t)(m->N * m->lora_r));
    m->lora_u = be->device_alloc(sizeof(float) * (size_t)(m->N * m->lora_r));
    if (!m->frozen_mem || !m->lora_sink || !m->lora_z || !m->lora_u)
        MT_FAIL(MT_ERR_NOMEM, "the frozen base (%lld parameters) and the LoRA scratch",
                (long long)m->frozen_numel);
    for (int i = 0; i < m->nfrozen; i++) {
        mt_param_t *p = &m->frozen[i];
        p->data = m->frozen_mem + p->offset;
        p->grad = p->ndim == 1 ? m->lora_sink : NULL;
    }
    return MT_OK;
}

/* z [N, r] = s x A^T, summed over TP for a row-parallel w (each rank
 * holds columns of x and of A).  Under bf16 compute each complete value
 * is rounded (the partial sums too: bf16 on the wire), as model.c rounds. */
static void lora_z(const mt_model_t *m, const float *x, const mt_param_t *w)
{
    const mt_param_t *A = w->lora_a;
    int64_t N = m->N, r = m->lora_r;
    m->be->matmul(m->lora_z, x, A->data, N, r, A->shape[1], false, true, 0.0f);
    if (m->tp > 1 && w->tp_dim == 1) {
        mt_model_round(m, m->lora_z, N * r);
        m->tp_allreduce(m->tp_ctx, m->lora_z, m->lora_z, N * r, MT_TP_SUM_FLOAT);
    }
    m->be->scale(m->lora_z, m->lora_scale, N * r);
    mt_model_round(m, m->lora_z, N * r);
}

void mt_lora_forward(const mt_model_t *m, float *y, const float *x, const mt_param_t *w)
{
    const mt_param_t *B = w->lora_b;
    lora_z(m, x, w);
    m->be->matmul(y, m->lora_z, B->data, m->N, B->shape[0], m->lora_r, false, true, 1.0f);
}

void mt_lora_forward_residual(const mt_model_t *m, float *out, const float *x,
                              const mt_param_t *w)
{
    mt_lora_forward(m, out, x, w);
    mt_model_round(m, out, m->N * m->H);
}

void mt_lora_backward(const mt_model_t *m, float *dx, const float *dy, const float *x,
                      const mt_param_t *w)
{
    const mt_param_t *A = w->lora_a, *B = w->lora_b;
    int64_t N = m->N, r = m->lora_r, out = B->shape[0], in = A->shape[1];
    lora_z(m, x, w);
    m->be->matmul_f32out(B->grad, dy, m->lora_z, out, r, N, true, false, 1.0f); /* dB += dy^T z */
    m->be->matmul(m->lora_u, dy, B->data, N, r, out, false, false, 0.0f);        /* u = dy B */
    m->be->scale(m->lora_u, m->lora_scale, N * r);
    mt_model_round(m, m->lora_u, N * r);
    m->be->matmul_f32out(A->grad, m->lora_u, x, r, in, N, true, false, 1.0f);   /* dA += u^T x */
    if (dx)
        m->be->matmul(dx, m->lora_u, A->data, N, in, r, false, false, 1.0f);   /* dx += u A */
}
