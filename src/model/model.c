/* model.c: Llama forward and hand-written backward for one device.
 *
 * Layer l computes, with h = rmsnorm(x):
 *   x += o_proj(attention(rope(q_proj(h)), rope(k_proj(h)), v_proj(h)))
 *   x += down_proj(silu(gate_proj(h)) * up_proj(h))
 * then the final norm, lm_head and cross-entropy.  Linear weights are
 * [out, in] as in PyTorch, so y = x W^T (+ b where the linear has a bias:
 * q, k, v under attention_bias or Qwen2, o under attention_bias, gate, up,
 * down under mlp_bias).  q and the attention output are nh * head_dim
 * wide, which need not be the hidden size.  Every kernel call goes through
 * m->be.  Under activation checkpointing only each layer's input is kept,
 * and the layer's forward is recomputed into shared scratch right before
 * its backward; the kernels are deterministic, so the gradients are
 * bit-identical to the stored-activation path.  Arenas: model_arena.c;
 * initial weights: model_init.c.
 *
 * Every buffer the kernels use is the backend's memory (device memory on a
 * GPU): host code here never reads or writes it, but goes through the
 * backend (copies, zero, kernels), and the caller's tokens, targets and
 * packing arrays are host arrays the model copies in.  tests/
 * test_device_discipline checks this with a backend that faults on any
 * other access. */
#include "mt_model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model_lora.h"
#include "model_moe.h"
#include "model_qknorm.h"
#include "model_rope.h"

mt_param_t *mt_model_param(mt_model_t *m, const char *name)
{
    for (int i = 0; i < m->nparams; i++)
        if (strcmp(m->params[i].name, name) == 0)
            return &m->params[i];
    return NULL;
}

void mt_model_set_packing(mt_model_t *m, const int32_t *pos, const int32_t *doc_start)
{
    size_t bytes = sizeof(int32_t) * (size_t)m->N;
    if (pos) {
        m->be->copy_to_device(m->pos, pos, bytes);
    } else {
        for (int64_t i = 0; i < m->N; i++)
            m->host_i32[i] = (int32_t)(i % m->T);
        m->be->copy_to_device(m->pos, m->host_i32, bytes);
    }
    m->doc_start = NULL;
    if (!pos)
        doc_start = NULL;
    /* Sliding window (doc/sliding-window.md): the kernels' mask is a first
     * visible key per query, so the window is folded into it here, lo =
     * max(document start, g - W + 1), g the token's index in its row:
     * document start + position (global under context parallelism, whose
     * chunks are not contiguous).  Where it narrows no query's keys the
     * mask stays what it was without a window (no mask work for rows
     * shorter than the window). */
    bool narrowed = false;
    for (int64_t i = 0; m->window > 0 && i < m->N; i++) {
        const int64_t d = doc_start ? doc_start[i] : 0;
        const int64_t g = pos ? d + pos[i] : i % m->T, lo = g - m->window + 1;
        m->host_i32[i] = (int32_t)(lo > d ? lo : d);
        narrowed = narrowed || lo > d;
    }
    if (narrowed) {
        m->be->copy_to_device(m->doc_mem, m->host_i32, bytes); /* (synchronous) */
        m->doc_start = m->doc_mem;
    } else if (doc_start) {
        m->be->copy_to_device(m->doc_mem, doc_start, bytes);
        m->doc_start = m->doc_mem;
    }
    mt_rope_update(m, pos);
}

/* Start a TP collective, asynchronously where the parallelize layer
 * offers it (mt_model_t.tp_start); tp_end joins it. */
static void *tp_begin(const mt_model_t *m, const void *in, void *out, int64_t n, mt_tp_op_t op)
{
    if (!m->tp_start) {
        m->tp_allreduce(m->tp_ctx, in, out, n, op);
        return NULL;
    }
    return m->tp_start(m->tp_ctx, in, out, n, op);
}

static void tp_end(const mt_model_t *m, void *ticket)
{
    if (ticket)
        m->tp_join(m->tp_ctx, ticket);
}

/* Sum a partial result over the TP group (row-parallel outputs, the input
 * gradients of column-parallel layers).  Under mixed precision the caller
 * rounds the partials (bf16 on the wire) and the sum is rounded, as a bf16
 * all-reduce leaves it. */
static void tp_sum(const mt_model_t *m, float *buf, int64_t n)
{
    if (m->tp > 1) {
        m->tp_allreduce(m->tp_ctx, buf, buf, n, MT_TP_SUM_FLOAT);
        mt_model_round(m, buf, n);
    }
}

/* Reduce-scatter partial sums of [N,H] over the TP group (sequence
 * parallelism): out gets this rank's Ns rows, rounded like tp_sum's. */
static void tp_scatter(const mt_model_t *m, const float *in, float *out)
{
    m->tp_allreduce(m->tp_ctx, in, out, m->Ns * m->H, MT_TP_SCATTER_FLOAT);
    mt_model_round(m, out, m->Ns * m->H);
}

/* y[n, out] = the bias b in every row (beta 0), or y += it (beta 1): the
 * rank-1 GEMM ones b^T, exact (1 * b is b) before the rounding of whatever
 * y then holds */
static void bias_rows(const mt_model_t *m, float *y, const mt_param_t *b, int64_t n, float beta)
{
    m->be->matmul(y, m->ones, b->data, n, b->shape[0], 1, false, false, beta);
}

/* db += dy^T ones, the column sums of dy [N, out]: a bias's gradient is
 * the weight gradient of a constant-1 input (float32, as dW's).  b NULL:
 * no bias. */
static void bias_grad(const mt_model_t *m, const mt_param_t *b, const float *dy)
{
    if (b)
        m->be->matmul_f32out(b->grad, dy, m->ones, b->shape[0], 1, m->N, true, false, 1.0f);
}

/* out [N,H] = the whole sequence of a norm's output: under sequence
 * parallelism this rank normalises its Ns tokens (into dtmp) and gathers. */
static void norm_in(const mt_model_t *m, float *out, float *rstd, const float *x, const float *w)
{
    if (!m->sp) {
        m->be->rmsnorm_forward(out, rstd, x, w, m->N, m->H, m->eps);
        mt_model_round_out(m, out, m->N * m->H);
        return;
    }
    m->be->rmsnorm_forward(m->dtmp, rstd, x, w, m->Ns, m->H, m->eps);
    mt_model_round_out(m, m->dtmp, m->Ns * m->H);
    m->tp_allreduce(m->tp_ctx, m->dtmp, out, m->Ns * m->H, MT_TP_GATHER_FLOAT);
}

/* A layer's norm: out keeps this rank's tokens of the output (all of them
 * without sequence parallelism); returns the whole sequence for the
 * column-parallel layers: out itself, or under sequence parallelism its
 * all-gather in m->gather (Megatron's layout: only the local part is kept
 * for backward, which gathers it again with regather). */
static const float *norm_in_kept(const mt_model_t *m, float *out, float *rstd, const float *x,
                                 const float *w)
{
    m->be->rmsnorm_forward(out, rstd, x, w, m->Ns, m->H, m->eps);
    mt_model_round_out(m, out, m->Ns * m->H);
    if (!m->sp)
        return out;
    m->tp_allreduce(m->tp_ctx, out, m->gather, m->Ns * m->H, MT_TP_GATHER_FLOAT);
    return m->gather;
}

/* The whole sequence of a kept norm output, for a weight gradient: kept
 * itself, or under sequence parallelism its all-gather into m->gather,
 * started (*ticket; NULL when complete) for tp_end. */
static const float *regather_start(const mt_model_t *m, const float *kept, void **ticket)
{
    *ticket = NULL;
    if (!m->sp)
        return kept;
    *ticket = tp_begin(m, kept, m->gather, m->Ns * m->H, MT_TP_GATHER_FLOAT);
    return m->gather;
}

static const float *regather(const mt_model_t *m, const float *kept)
{
    void *t;
    const float *g = regather_start(m, kept, &t);
    tp_end(m, t);
    return g;
}

/* A norm's backward over this rank's Ns tokens from d, the whole
 * gradient of their outputs; the result goes into dx [Ns,H] (= or +=, the
 * kernel adding), rounded once under bf16. */
static void norm_backward(mt_model_t *m, float *dx, bool accumulate, const float *d, float *dw,
                          const float *x, const float *w, const float *rstd)
{
    m->be->rmsnorm_backward(dx, dw, d, x, w, rstd, m->Ns, m->H, accumulate);
    mt_model_round_out(m, dx, m->Ns * m->H);
}

/* Backward of norm_in, in two halves so that work can run between them.
 * dnorm_start: dfull [N,H] is this rank's (partial under TP) gradient of
 * the norm's output; it is rounded (complete: this rank's part under TP)
 * and its TP reduction started (a reduce-scatter into dh_local under
 * sequence parallelism, else an in-place sum); *d is where this rank's Ns
 * rows of the whole gradient land.  dnorm_finish joins the reduction and
 * runs the norm's backward into dx [Ns,H] (= or +=). */
static void *dnorm_start(mt_model_t *m, float *dfull, float **d)
{
    if (m->tp == 1) /* read by the norm's backward alone */
        mt_model_round_in(m, dfull, m->N * m->H);
    else /* on the wire */
        mt_model_round(m, dfull, m->N * m->H);
    *d = m->sp ? m->dh_local : dfull;
    if (m->tp == 1)
        return NULL;
    return tp_begin(m, dfull, *d, m->Ns * m->H, m->sp ? MT_TP_SCATTER_FLOAT : MT_TP_SUM_FLOAT);
}

static void dnorm_finish(mt_model_t *m, void *ticket, float *d, float *dx, bool accumulate,
                         float *dw, const float *x, const float *w, const float *rstd)
{
    tp_end(m, ticket);
    if (m->tp > 1) /* the sum, rounded as a bf16 all-reduce leaves it */
        mt_model_round(m, d, m->Ns * m->H);
    norm_backward(m, dx, accumulate, d, dw, x, w, rstd);
}

static void norm_in_backward(mt_model_t *m, float *dx, bool accumulate, float *dfull,
                             float *dw, const float *x, const float *w, const float *rstd)
{
    float *d;
    void *t = dnorm_start(m, dfull, &d);
    dnorm_finish(m, t, d, dx, accumulate, dw, x, w, rstd);
}

/* The backward of the column-parallel layers w[0..nw) (q, k, v or gate,
 * up) that read a norm's output, kept as this rank's rows in `kept`,
 * from their output gradients dy[i], and then of the norm, whose input
 * gradient is added into dres:
 *   dh = sum_i dy_i W_i;  dW_i += dy_i^T (norm output);  db_i += dy_i^T 1;
 *   the norm.
 * The biases b[i] (NULL: none) are split with W_i's rows, so each rank's
 * column sums over all N tokens are its rows' whole gradient.
 * Under TP in Megatron's order: the gather of the norm output (sequence
 * parallelism) runs behind the input-gradient GEMMs, and the reduction
 * of dh behind the weight-gradient GEMMs.  With defer the weight
 * gradients are left to layer_weights. */
static void column_backward(mt_model_t *m, int nw, float *const *dy, mt_param_t *const *w,
                            mt_param_t *const *b, const float *kept, bool defer,
                            mt_param_t *norm, const float *x, const float *rstd)
{
    void *gathered = NULL;
    const float *in = defer ? NULL : regather_start(m, kept, &gathered);
    /* a sum of nw GEMMs, rounded once: in float32 (dh_acc) under bf16
     * storage, then rounded into dh; in dh itself on float32 storage */
    float *acc = m->bf16_storage ? m->dh_acc : m->dh;
    for (int i = 0; i < nw; i++)
        m->be->matmul_f32out(acc, dy[i], w[i]->data, m->N, w[i]->shape[1], w[i]->shape[0],
                             false, false, i ? 1.0f : 0.0f);
    /* the adapters read the whole sequence: under sequence parallelism the
     * gather is joined here, before the sum below is reduce-scattered */
    bool adapted = false;
    for (int i = 0; i < nw; i++)
        adapted = adapted || w[i]->lora_a;
    const float *lx = kept;
    if (m->sp && adapted) {
        tp_end(m, gathered);
        gathered = NULL;
        lx = defer ? regather(m, kept) : in;
    }
    for (int i = 0; i < nw; i++)
        if (w[i]->lora_a)
            mt_lora_backward(m, acc, dy[i], lx, w[i]);
    if (m->bf16_storage)
        m->be->to_bf16((uint16_t *)m->dh, m->dh_acc, m->N * m->H);
    float *d;
    void *reduced = dnorm_start(m, m->dh, &d);
    tp_end(m, gathered);
    for (int i = 0; !defer && i < nw; i++) {
        if (w[i]->grad)
            m->be->matmul_f32out(w[i]->grad, dy[i], in, w[i]->shape[0], w[i]->shape[1], m->N,
                                 true, false, 1.0f);
        bias_grad(m, b[i], dy[i]);
    }
    dnorm_finish(m, reduced, d, m->dres, true, norm->grad, x, norm->data, rstd);
}

/* The whole sequence of the residual gradient: dres itself, or under
 * sequence parallelism gathered into buf [N,H]. */
static const float *whole_grad(const mt_model_t *m, float *buf)
{
    if (!m->sp)
        return m->dres;
    m->tp_allreduce(m->tp_ctx, m->dres, buf, m->Ns * m->H, MT_TP_GATHER_FLOAT);
    return buf;
}

/* out = res + a W^T (+ b) for a row-parallel W ([Ns,H] rows of this rank):
 * on one device the GEMM adds onto the residual (matmul_add: without a
 * copy of it on bf16 storage), or with a bias, as Hugging Face's Linear
 * rounds, o_proj's output a W^T + b (bias first, the GEMM adding onto it:
 * one rounding) and then the residual sum; under TP the partial products
 * are summed first (reduce-scattered under sequence parallelism, through
 * dh) and the bias, whole on every TP rank, is added once to the sum of
 * the rank's rows.  out and res are distinct buffers. */
static void row_parallel_residual(const mt_model_t *m, float *out, const float *res,
                                  const float *a, const mt_param_t *w, const mt_param_t *b)
{
    int64_t N = m->N, H = m->H;
    if (m->tp == 1 && !b) {
        m->be->matmul_add(out, res, a, w->data, N, H, w->shape[1], false, true);
        mt_model_round(m, out, N * H);
        return;
    }
    if (m->tp == 1) {
        bias_rows(m, out, b, N, 0.0f);
        m->be->matmul(out, a, w->data, N, H, w->shape[1], false, true, 1.0f);
        mt_model_round(m, out, N * H);
    } else if (m->sp) {
        m->be->matmul(m->dh, a, w->data, N, H, w->shape[1], false, true, 0.0f);
        mt_model_round(m, m->dh, N * H);
        tp_scatter(m, m->dh, out);
    } else {
        m->be->matmul(out, a, w->data, N, H, w->shape[1], false, true, 0.0f);
        mt_model_round(m, out, N * H);
        tp_sum(m, out, N * H);
    }
    if (m->tp > 1 && b) {
        bias_rows(m, out, b, m->Ns, 1.0f);
        mt_model_round(m, out, m->Ns * H);
    }
    m->be->add(out, res, m->Ns * H);
    mt_model_round(m, out, m->Ns * H);
}

/* y[N,out] = x[N,in] W^T (+ b: the bias first, the GEMM adding onto it,
 * so y is rounded once, as Hugging Face's Linear rounds), W [out,in], b
 * [out] or NULL; the caller rounds y (mt_model_round, or mt_model_round_in
 * when only entries that read bf16 take it) */
static void linear(const mt_model_t *m, float *y, const float *x, const mt_param_t *w,
                   const mt_param_t *b)
{
    if (b)
        bias_rows(m, y, b, m->N, 0.0f);
    m->be->matmul(y, x, w->data, m->N, w->shape[0], w->shape[1], false, true, b ? 1.0f : 0.0f);
    if (w->lora_a)
        mt_lora_forward(m, y, x, w);
}

/* dx[N,in] (= or +=) dy[N,out] W; dW += dy^T x */
static void linear_backward(const mt_model_t *m, float *dx, float beta_dx, const float *dy,
                            const float *x, const mt_param_t *w)
{
    if (w->grad) /* NULL: frozen (LoRA), only the input gradient */
        m->be->matmul_f32out(w->grad, dy, x, w->shape[0], w->shape[1], m->N, true, false, 1.0f);
    if (dx)
        m->be->matmul(dx, dy, w->data, m->N, w->shape[1], w->shape[0], false, false, beta_dx);
    if (w->lora_a)
        mt_lora_backward(m, dx, dy, x, w);
}

/* A MoE layer under TP: each TP rank routes its own N / tp tokens (rows
 * [tp_rank N / tp, ...) of the micro-batch), through whole experts
 * (model_moe.h).  Under sequence parallelism those are the tokens the
 * rank holds, so nothing moves; without it the residual stream is whole
 * on every TP rank, and the outputs of the rank's rows are all-gathered. */
static int64_t moe_row0(const mt_model_t *m)
{
    return m->tp > 1 && !m->sp ? m->tp_rank * (m->N / m->tp) * m->H : 0;
}

static void moe_forward(const mt_model_t *m, int l, const mt_layer_acts_t *a, float *x_out)
{
    mt_model_t *mm = (mt_model_t *)m;
    if (m->tp == 1 || m->sp) {
        mt_moe_forward(mm, l, a->h2, a->x_mid, x_out);
        mt_model_round(m, x_out, m->Ns * m->H);
        return;
    }
    int64_t r0 = moe_row0(m);
    mt_moe_forward(mm, l, mt_act_at(m, a->h2, r0), mt_act_at(m, a->x_mid, r0), m->dtmp);
    mt_model_round(m, m->dtmp, m->N / m->tp * m->H);
    m->tp_allreduce(m->tp_ctx, m->dtmp, x_out, m->N / m->tp * m->H, MT_TP_GATHER_FLOAT);
}

/* Its backward: m->dh gets d(norm output) for the rows this rank's mlp
 * norm covers (all N without sequence parallelism), already summed. */
static void moe_backward(mt_model_t *m, int l, const mt_layer_acts_t *a)
{
    if (m->tp == 1 || m->sp) {
        mt_moe_backward(m, l, a->h2, m->dres, m->dh);
        mt_model_round_in(m, m->dh, m->Ns * m->H); /* read by the norm's backward alone */
        return;
    }
    int64_t r0 = moe_row0(m);
    mt_moe_backward(m, l, mt_act_at(m, a->h2, r0), mt_act_at(m, m->dres, r0), m->datt);
    mt_model_round(m, m->datt, m->N / m->tp * m->H);
    m->tp_allreduce(m->tp_ctx, m->datt, m->dh, m->N / m->tp * m->H, MT_TP_GATHER_FLOAT);
}

/* A GEMM output that attention alone reads (v, d(attention output)): a
 * pass left to the loads of a table that reads bf16, except under context
 * parallelism, whose ring attention sends it and whose block kernels read
 * fp32 */
static void round_attention_input(const mt_model_t *m, float *x, int64_t n)
{
    if (m->attn_forward)
        mt_model_round(m, x, n);
    else
        mt_model_round_in(m, x, n);
}

static void layer_forward(const mt_model_t *m, int l, const mt_layer_acts_t *a, float *x_out)
{
    const mt_backend_t *be = m->be;
    const mt_layer_params_t *p = &m->layers[l];
    int64_t N = m->N;

    const float *h1 = norm_in_kept(m, a->h1, a->rstd1, a->x, p->attn_norm->data);
    /* q, k, v, g, u below are read only by entries that read bf16 (the q/k
     * norms, RoPE, attention, SwiGLU: mt_model_round_in), but for v under
     * context parallelism: the ring attention sends it */
    if (m->qk_norm) {
        linear(m, a->q_raw, h1, p->wq, p->bq);
        linear(m, a->k_raw, h1, p->wk, p->bk);
        mt_model_round_in(m, a->q_raw, N * m->nh * m->hd);
        mt_model_round_in(m, a->k_raw, N * m->nkv * m->hd);
        mt_model_qk_norm_forward(m, a->q, a->q_rstd, a->q_raw, p->q_norm->data, m->nh);
        mt_model_qk_norm_forward(m, a->k, a->k_rstd, a->k_raw, p->k_norm->data, m->nkv);
        mt_model_round_out(m, a->q, N * m->nh * m->hd);
        mt_model_round_out(m, a->k, N * m->nkv * m->hd);
    } else {
        linear(m, a->q, h1, p->wq, p->bq);
        linear(m, a->k, h1, p->wk, p->bk);
        mt_model_round_in(m, a->q, N * m->nh * m->hd);
        mt_model_round_in(m, a->k, N * m->nkv * m->hd);
    }
    linear(m, a->v, h1, p->wv, p->bv);
    round_attention_input(m, a->v, N * m->nkv * m->hd);
    be->rope_forward(a->q, m->pos, N, m->nh, m->hd, m->rope->inv_freq, m->rope->scale);
    be->rope_forward(a->k, m->pos, N, m->nkv, m->hd, m->rope->inv_freq, m->rope->scale);
    mt_model_round_out(m, a->q, N * m->nh * m->hd);
    mt_model_round_out(m, a->k, N * m->nkv * m->hd);
    if (m->attn_forward) { /* context parallelism: ring attention over the CP group */
        m->attn_forward(m->attn_ctx, a->att, a->lse, a->q, a->k, a->v, m->doc_start, m->B, m->T,
                        m->nh, m->nkv, m->hd);
        mt_model_round(m, a->att, N * m->nh * m->hd);
    } else {
        be->attention_forward(a->att, a->lse, a->q, a->k, a->v, m->doc_start, m->B, m->T, m->nh,
                              m->nkv, m->hd);
        mt_model_round_out(m, a->att, N * m->nh * m->hd);
    }
    row_parallel_residual(m, a->x_mid, a->x, a->att, p->wo, p->bo); /* x_mid = x + o_proj(att) */
    if (p->wo->lora_a)
        mt_lora_forward_residual(m, a->x_mid, a->att, p->wo);

    if (p->router) { /* a MoE layer (model_moe.c): no gather, see moe_forward */
        be->rmsnorm_forward(a->h2, a->rstd2, a->x_mid, p->mlp_norm->data, m->Ns, m->H, m->eps);
        mt_model_round_out(m, a->h2, m->Ns * m->H);
        moe_forward(m, l, a, x_out);
        return;
    }
    const float *h2 = norm_in_kept(m, a->h2, a->rstd2, a->x_mid, p->mlp_norm->data);
    linear(m, a->g, h2, p->wgate, p->bgate);
    linear(m, a->u, h2, p->wup, p->bup);
    mt_model_round_in(m, a->g, N * m->I);
    mt_model_round_in(m, a->u, N * m->I);
    be->swiglu_forward(a->a, a->g, a->u, N * m->I);
    mt_model_round_out(m, a->a, N * m->I);
    row_parallel_residual(m, x_out, a->x_mid, a->a, p->wdown, p->bdown);
    if (p->wdown->lora_a)
        mt_lora_forward_residual(m, x_out, a->a, p->wdown);
}

/* dst = src, n floats in the backend's memory */
static void keep(const mt_model_t *m, float *dst, const float *src, int64_t n)
{
    m->be->copy(dst, src, mt_act_bytes(m, n));
}

/* m->dres holds d(loss)/d(layer output); on return, d/d(layer input).
 * defer: leave the linear weight gradients to layer_weights (split
 * backward), keeping the output gradients they need in a. */
static void layer_backward(mt_model_t *m, int l, mt_layer_acts_t *a, bool defer)
{
    const mt_backend_t *be = m->be;
    mt_layer_params_t *p = &m->layers[l];
    int64_t N = m->N, H = m->H, Q = m->nh * m->hd, KV = m->nkv * m->hd;

    /* MLP: out = x_mid + a Wd^T */
    const float *dout;
    if (p->router) { /* a MoE layer (model_moe.c): dh = d h2, whole */
        moe_backward(m, l, a);
        norm_backward(m, m->dres, true, m->dh, p->mlp_norm->grad, a->x_mid, p->mlp_norm->data,
                      a->rstd2);                                    /* d x_mid */
    } else {
        dout = whole_grad(m, m->datt);
        if (defer) {
            keep(m, a->w_dmlp, dout, N * H);
            be->matmul(m->dI, dout, p->wdown->data, N, p->wdown->shape[1], H, false, false, 0.0f);
        } else {
            linear_backward(m, m->dI, 0.0f, dout, a->a, p->wdown);     /* dI = d a */
            /* dout is the whole gradient on every TP rank (whole_grad), so
             * the column sums are the bias's whole gradient on each: no TP
             * sum, also under sequence parallelism */
            bias_grad(m, p->bdown, dout);
        }
        mt_model_round_in(m, m->dI, N * m->I); /* read by SwiGLU's backward alone */
        be->swiglu_backward(a->g, a->u, m->dI, a->g, a->u, N * m->I);  /* g, u <- dg, du */
        mt_model_round_out(m, a->g, N * m->I);
        mt_model_round_out(m, a->u, N * m->I);
        float *dy[2] = {a->g, a->u};
        mt_param_t *w[2] = {p->wgate, p->wup}, *b[2] = {p->bgate, p->bup};
        column_backward(m, 2, dy, w, b, a->h2, defer, p->mlp_norm, a->x_mid, a->rstd2); /* d x_mid */
    }

    /* attention: x_mid = x + att Wo^T */
    dout = whole_grad(m, m->dh);
    if (defer) {
        keep(m, a->w_datt, dout, N * H);
        be->matmul(m->datt, dout, p->wo->data, N, p->wo->shape[1], H, false, false, 0.0f);
    } else {
        linear_backward(m, m->datt, 0.0f, dout, a->att, p->wo);
        bias_grad(m, p->bo, dout); /* whole, as down_proj's */
    }
    round_attention_input(m, m->datt, N * Q);
    if (m->attn_backward) {
        m->attn_backward(m->attn_ctx, m->dq, m->dk, m->dv, m->datt, a->att, a->lse, a->q, a->k,
                         a->v, m->doc_start, m->B, m->T, m->nh, m->nkv, m->hd);
        mt_model_round(m, m->dq, N * Q);
        mt_model_round(m, m->dk, N * KV);
        mt_model_round(m, m->dv, N * KV);
    } else {
        be->attention_backward(m->dq, m->dk, m->dv, m->datt, a->att, a->lse, a->q, a->k, a->v,
                               m->doc_start, m->B, m->T, m->nh, m->nkv, m->hd);
        mt_model_round_out(m, m->dq, N * Q);
        mt_model_round_out(m, m->dk, N * KV);
        mt_model_round_out(m, m->dv, N * KV);
    }
    be->rope_backward(m->dq, m->pos, N, m->nh, m->hd, m->rope->inv_freq, m->rope->scale);
    be->rope_backward(m->dk, m->pos, N, m->nkv, m->hd, m->rope->inv_freq, m->rope->scale);
    mt_model_round_out(m, m->dq, N * Q);
    mt_model_round_out(m, m->dk, N * KV);
    if (m->qk_norm) { /* dq, dk are w.r.t. the normed q, k: back through the norms */
        mt_model_qk_norm_backward(m, m->datt, p->q_norm->grad, m->dq, a->q_raw, p->q_norm->data,
                         a->q_rstd, m->nh);
        mt_model_round_out(m, m->datt, N * Q);
        keep(m, m->dq, m->datt, N * m->nh * m->hd);
        mt_model_qk_norm_backward(m, m->datt, p->k_norm->grad, m->dk, a->k_raw, p->k_norm->data,
                         a->k_rstd, m->nkv);
        mt_model_round_out(m, m->datt, N * KV);
        keep(m, m->dk, m->datt, N * m->nkv * m->hd);
    }
    if (defer) {
        keep(m, a->w_dq, m->dq, N * Q);
        keep(m, a->w_dk, m->dk, N * KV);
        keep(m, a->w_dv, m->dv, N * KV);
    }
    float *dy[3] = {m->dq, m->dk, m->dv};
    mt_param_t *w[3] = {p->wq, p->wk, p->wv}, *b[3] = {p->bq, p->bk, p->bv};
    column_backward(m, 3, dy, w, b, a->h1, defer, p->attn_norm, a->x, a->rstd1); /* d x */
}

/* The weight-gradient pass W of a layer whose backward was deferred: the
 * same products linear_backward and bias_grad form, from the kept output
 * gradients. */
static void layer_weights(mt_model_t *m, int l, const mt_layer_acts_t *a)
{
    const mt_backend_t *be = m->be;
    mt_layer_params_t *p = &m->layers[l];
    int64_t N = m->N, H = m->H, Q = m->nh * m->hd, KV = m->nkv * m->hd;
    if (!p->router) { /* a MoE layer formed its weight gradients in B */
        be->matmul_f32out(p->wdown->grad, a->w_dmlp, a->a, H, m->I, N, true, false, 1.0f);
        bias_grad(m, p->bdown, a->w_dmlp);
        const float *h2 = regather(m, a->h2);
        be->matmul_f32out(p->wgate->grad, a->g, h2, m->I, H, N, true, false, 1.0f);
        be->matmul_f32out(p->wup->grad, a->u, h2, m->I, H, N, true, false, 1.0f);
        bias_grad(m, p->bgate, a->g);
        bias_grad(m, p->bup, a->u);
    }
    be->matmul_f32out(p->wo->grad, a->w_datt, a->att, H, Q, N, true, false, 1.0f);
    bias_grad(m, p->bo, a->w_datt);
    const float *h1 = regather(m, a->h1);
    be->matmul_f32out(p->wq->grad, a->w_dq, h1, Q, H, N, true, false, 1.0f);
    be->matmul_f32out(p->wk->grad, a->w_dk, h1, KV, H, N, true, false, 1.0f);
    be->matmul_f32out(p->wv->grad, a->w_dv, h1, KV, H, N, true, false, 1.0f);
    bias_grad(m, p->bq, a->w_dq);
    bias_grad(m, p->bk, a->w_dk);
    bias_grad(m, p->bv, a->w_dv);
}

static void hook(const mt_model_t *m, int unit, mt_unit_event_t ev)
{
    if (m->unit_hook)
        m->unit_hook(m->hook_ctx, unit, ev);
}

/* Where layer l's input goes: its kept float32 input or, when it is kept
 * as bf16 bits (x_bf16), x_final (mt_model.h). */
static float *layer_input(mt_model_t *m, int l)
{
    mt_layer_acts_t *a = &m->acts[l];
    if (a->x16)
        a->x = m->x_final;
    return a->x;
}

float *mt_model_stage_input(mt_model_t *m, int c)
{
    return m->acts[m->chunk_lo[c]].x;
}

/* The host array tokens in backend memory: under TP the vocabulary
 * shard's tokens (others give zero rows), else tokens themselves. */
static const int32_t *shard_tokens(mt_model_t *m, const int32_t *tokens)
{
    const int32_t *src = tokens;
    if (m->tp > 1) {
        for (int64_t i = 0; i < m->N; i++)
            m->host_i32[i] = tokens[i] >= m->v_lo && tokens[i] < m->v_lo + m->V
                                 ? (int32_t)(tokens[i] - m->v_lo) : -1;
        src = m->host_i32;
    }
    m->be->copy_to_device(m->tok_local, src, sizeof(int32_t) * (size_t)m->N);
    return m->tok_local;
}

/* The head: the final norm, then the LM head and the loss over row chunks
 * of at most m->head_chunk rows, so the logits never exist whole (for a
 * large vocabulary the [N, V] float32 logits are the largest activation).
 * With backward each chunk's dlogits goes into its rows of dh and into the
 * lm_head gradient before the next chunk reuses the buffer. */
static double head_pass(mt_model_t *m, const int32_t *host_targets, bool backward,
                        float grad_scale, int64_t *count)
{
    const mt_backend_t *be = m->be;
    int64_t N = m->N, H = m->H, V = m->V;
    be->copy_to_device(m->targets_dev, host_targets, sizeof(int32_t) * (size_t)N);
    norm_in(m, m->xf, m->rstdf, m->x_final, m->final_norm->data);
    double loss = 0.0;
    *count = 0;
    for (int64_t c0 = 0; c0 < N; c0 += m->head_chunk) {
        int64_t n = N - c0 < m->head_chunk ? N - c0 : m->head_chunk, cnt = 0;
        const float *x = mt_act_at(m, m->xf, c0 * H);
        const int32_t *t = m->targets_dev + c0;
        float *dl = backward ? m->logits : NULL;
        be->matmul(m->logits, x, m->lm_head->data, n, V, H, false, true, 0.0f);
        /* bf16 logits, the loss itself fp32 (doc/mixed-precision.md); a
         * rounding table's loss entries round the logits as they read them */
        mt_model_round_out(m, m->logits, n * V);
        if (m->tp == 1) {
            loss += be->cross_entropy(dl, m->logits, t, n, V, m->V_valid, grad_scale, &cnt);
        } else { /* vocabulary-parallel: combine row max, then exp-sums and target logits */
            float *mx = m->ce_mx + c0;
            double *z = m->ce_z + c0, *ly = m->ce_ly + c0;
            be->ce_shard_max(mx, m->logits, n, V, m->V_valid);
            m->tp_allreduce(m->tp_ctx, mx, mx, n, MT_TP_MAX_FLOAT);
            be->ce_shard_sum(z, ly, m->logits, t, mx, n, V, m->v_lo, m->V_valid);
            m->tp_allreduce(m->tp_ctx, z, z, n, MT_TP_SUM_DOUBLE);
            m->tp_allreduce(m->tp_ctx, ly, ly, n, MT_TP_SUM_DOUBLE);
            loss += be->ce_shard_finish(dl, m->logits, t, mx, z, ly, n, V, m->v_lo, m->V_valid,
                                        grad_scale, &cnt);
        }
        *count += cnt;
        if (!backward)
            continue;
        mt_model_round_out(m, m->logits, n * V); /* dlogits: written rounded by a rounding table */
        /* dW += dl^T x (none for a frozen lm_head) */
        if (m->lm_head->grad)
            be->matmul_f32out(m->lm_head->grad, m->logits, x, V, H, n, true, false, 1.0f);
        be->matmul(mt_act_at(m, m->dh, c0 * H), m->logits, m->lm_head->data, n, H, V, false,
                   false, 0.0f);
    }
    return loss;
}

double mt_model_forward_chunk(mt_model_t *m, int c, const int32_t *tokens,
                              const int32_t *targets, bool backward, float grad_scale,
                              int64_t *count)
{
    const mt_backend_t *be = m->be;
    int64_t N = m->N, H = m->H;
    int lo = m->chunk_lo[c], hi = m->chunk_lo[c + 1], head = (int)m->L + 1;
    *count = 0;
    if (m->moe) { /* a new micro-batch's routing totals begin at the first stage */
        m->moe->training = backward;
        if (c == 0 && m->has_embed)
            memset(m->route, 0, sizeof(double) * (size_t)m->nroute);
    }
    if (c == 0 && m->has_embed) {
        const int32_t *tok = shard_tokens(m, tokens);
        float *x0 = mt_model_stage_input(m, 0);
        hook(m, 0, MT_UNIT_PRE_FORWARD);
        if (m->sp) { /* partial rows of the whole sequence; keep this rank's tokens */
            be->embedding_forward(m->dh, tok, m->embed->data, N, H);
            m->tp_allreduce(m->tp_ctx, m->dh, x0, m->Ns * H, MT_TP_SCATTER_FLOAT);
        } else {
            be->embedding_forward(x0, tok, m->embed->data, N, H);
            tp_sum(m, x0, N * H);
        }
        hook(m, 0, MT_UNIT_POST_FORWARD);
    }
    for (int l = lo; l < hi; l++) {
        float *out = l + 1 < hi ? layer_input(m, l + 1) : m->x_final;
        hook(m, l + 1, MT_UNIT_PRE_FORWARD);
        layer_forward(m, l, &m->acts[l], out);
        if (l + 1 < hi && m->acts[l + 1].x16) /* kept as bf16 bits: exact */
            be->to_bf16(m->acts[l + 1].x16, out, m->Ns * H);
        hook(m, l + 1, MT_UNIT_POST_FORWARD);
    }
    if (!(m->has_head && c == m->nchunks - 1))
        return 0.0;
    if (m->moe) /* every MoE layer has routed this micro-batch */
        mt_moe_finish_forward(m);
    hook(m, head, MT_UNIT_PRE_FORWARD);
    /* The head's backward needs nothing but the loss: it runs with the
     * forward, chunk by chunk (head_pass), so a pipeline keeps dres (N x H)
     * until the chunk's backward instead of the logits' gradient, and the
     * logits are scratch of head_chunk rows. */
    if (backward)
        hook(m, head, MT_UNIT_PRE_BACKWARD);
    double loss = head_pass(m, targets, backward, grad_scale, count);
    if (!backward) {
        hook(m, head, MT_UNIT_POST_FORWARD);
        return loss;
    }
    norm_in_backward(m, m->dres, false, m->dh, m->final_norm->grad, m->x_final,
                     m->final_norm->data, m->rstdf);
    hook(m, head, MT_UNIT_POST_BACKWARD);
    return loss;
}

void mt_model_backward_chunk(mt_model_t *m, int c, const int32_t *tokens, bool defer_weights)
{
    const mt_backend_t *be = m->be;
    int lo = m->chunk_lo[c], hi = m->chunk_lo[c + 1];
    /* the head's part ran in the forward (mt_model_forward_chunk) */
    for (int l = hi - 1; l >= lo; l--) {
        mt_layer_acts_t *a = &m->acts[l];
        hook(m, l + 1, MT_UNIT_PRE_BACKWARD);
        if (m->checkpointing) { /* recompute this layer's activations into scratch */
            if (a->x16) /* its input back from bf16 bits */
                be->from_bf16(layer_input(m, l), a->x16, m->Ns * m->H);
            m->recomputing = true; /* a MoE layer may keep its routing (model_moe.c) */
            layer_forward(m, l, a, m->datt);
            m->recomputing = false;
        }
        layer_backward(m, l, a, defer_weights && m->split_bw);
        hook(m, l + 1, MT_UNIT_POST_BACKWARD);
    }
    if (c == 0 && m->has_embed) {
        const int32_t *tok = shard_tokens(m, tokens);
        hook(m, 0, MT_UNIT_PRE_BACKWARD);
        if (m->embed->grad) /* NULL: frozen */
            be->embedding_backward(m->embed->grad, whole_grad(m, m->dh), tok, m->N, m->H);
        hook(m, 0, MT_UNIT_POST_BACKWARD);
    }
}

void mt_model_weight_chunk(mt_model_t *m, int c)
{
    for (int l = m->chunk_lo[c + 1] - 1; l >= m->chunk_lo[c]; l--)
        layer_weights(m, l, &m->acts[l]);
}

double mt_model_step(mt_model_t *m, const int32_t *tokens, const int32_t *targets,
                     bool backward, float grad_scale, int64_t *count)
{
    double loss = mt_model_forward_chunk(m, 0, tokens, targets, backward, grad_scale, count);
    if (backward)
        mt_model_backward_chunk(m, 0, tokens, false);
    return loss;
}
