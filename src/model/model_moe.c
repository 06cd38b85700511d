/* model_moe.c: the routed mixture-of-experts block of a decoder layer,
 * forward and hand-written backward (Hugging Face Qwen3-MoE semantics):
 *
 *   p = softmax(h Wr^T) over E experts; the top K (ties to the lowest
 *   index), weights w = p (divided by their sum when norm_topk_prob);
 *   out = res + sum_j w_j expert_{e_j}(h), expert(x) = down(silu(gate x) * up x)
 *
 * Dispatch is written for expert parallelism from the start: the (token,
 * slot) rows are sorted by expert (token order within an expert), which
 * is also rank order since rank d owns experts [d El, (d+1) El); counts
 * and rows go to the owners through m->ep_alltoall (a plain copy on one
 * rank), the owner regroups what it received by expert and runs one GEMM
 * per expert, and the results travel back the same way.  The combine sums
 * a token's K results in slot order, so every mesh adds the same numbers
 * in the same order.  Backward mirrors it.
 *
 * The load-balancing loss is Hugging Face's load_balancing_loss_func over
 * the rows (layer, token) of all MoE layers of the micro-batch:
 *   aux = E sum_e f_e P_e,  f_e = C_e / R,  P_e = S_e / R
 * with C_e the rows routed to e, S_e their summed probabilities and R =
 * (MoE layers) (tokens); its gradient w.r.t. p is E C_e / R^2 (no gradient
 * through the top-k selection).  The trainer scales it.  C, S and R are
 * sums over every MoE layer and every token of the micro-batch, which a
 * pipeline spreads over stages and tensor and context parallelism over
 * ranks: they accumulate in the micro-batch's route state (mt_model_t.route,
 * MT_MOE_ROUTE), which travels with the pipeline's messages and is summed
 * over the token-holding ranks (m->route_sum) before the loss is formed
 * (mt_moe_finish_forward); the backward reads the totals from it.
 *
 * Shared experts (DeepSeek style, num_shared_experts of them fused into
 * one SwiGLU of width num_shared_experts x moe_intermediate_size) see
 * every token and are added after the routed sum; they are ordinary layer
 * parameters (the layer's wgate/wup/wdown), data-parallel like the router.
 *
 * Aux-loss-free balancing (DeepSeek-V3): a per-layer expert bias, added
 * to the probabilities for the top-k choice only, that the trainer moves
 * after each step towards the mean load (mt_moe_update_bias).
 *
 * A capacity factor (model.moe_capacity_factor) drops the (token, slot)
 * pairs beyond each expert's capacity, in token order, before dispatch;
 * the capacity is taken over the tokens this rank routes (GShard's and
 * Megatron's local capacity), so it depends on the mesh: parity across
 * meshes holds for dropless routing.
 *
 * Memory: the buffers of the rows an EP rank receives start at the
 * balanced load (N K rows) and grow when a step routes more to the rank
 * (a failure there aborts the job, as running out of memory in any other
 * kernel would).  What the kernels read or write is the backend's memory
 * (device memory on a GPU); the dispatch bookkeeping (counts, send order,
 * permutations) runs on the host, on host copies of the router's choices
 * (copy_to_host), and sends its results back with copy_to_device.
 *
 * The expert table, the fixed buffers and their lifetime are
 * model_moe_state.c's; this file grows the received-row buffers when a
 * step needs more (mt_moe_reserve_rows). */
#include "model_moe.h"
#include "model_moe_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void out_of_memory(const char *what, size_t bytes)
{
    fprintf(stderr, "meshtrain: out of memory growing the MoE %s to %zu bytes "
                    "(model_moe.c); aborting\n", what, bytes);
    abort();
}

/* realloc that aborts: a step cannot fail part-way through an exchange */
static void *grow(void *p, size_t bytes, const char *what)
{
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q)
        out_of_memory(what, bytes);
    return q;
}

/* The same for the backend's memory: keeps the first `old` bytes */
static void *grow_dev(const mt_backend_t *be, void *p, size_t old, size_t bytes, const char *what)
{
    void *q = be->device_alloc(bytes);
    if (!q)
        out_of_memory(what, bytes);
    if (p) {
        be->copy(q, p, old);
        be->device_free(p);
    }
    return q;
}

void mt_moe_reserve_rows(mt_moe_t *x, moe_acts_t *a, int64_t R, int64_t H)
{
    const mt_backend_t *be = x->be;
    if (R > a->cap) {
        int64_t c = R + R / 4;
        /* bytes of a row of indices, of H activations, of Im: now, then */
        size_t o = (size_t)a->cap, n = (size_t)c, i4 = sizeof(int32_t);
        size_t fh = (size_t)x->es * (size_t)H, fi = (size_t)x->es * (size_t)x->Im;
        x->act_numel += (c - a->cap) * (2 + (3 * x->Im + H) * x->es / 4); /* (perm, iperm) */
        a->perm = grow_dev(be, a->perm, i4 * o, i4 * n, "row permutation");
        a->iperm = grow_dev(be, a->iperm, i4 * o, i4 * n, "row permutation");
        a->xe = grow_dev(be, a->xe, fh * o, fh * n, "expert inputs");
        a->g = grow_dev(be, a->g, fi * o, fi * n, "expert activations");
        a->u = grow_dev(be, a->u, fi * o, fi * n, "expert activations");
        a->a = grow_dev(be, a->a, fi * o, fi * n, "expert activations");
        a->cap = c;
    }
    if (R > x->scap) {
        int64_t c = R + R / 4;
        size_t o = (size_t)x->scap, n = (size_t)c, i4 = sizeof(int32_t);
        size_t fh = (size_t)x->es * (size_t)H, fi = (size_t)x->es * (size_t)x->Im;
        x->act_numel += (c - x->scap) * ((2 * H + x->Im) * x->es / 4 + (x->es == 2 ? H : 0));
        x->recvbuf = grow_dev(be, x->recvbuf, fh * o, fh * n, "receive buffer");
        x->ye = grow_dev(be, x->ye, fh * o, fh * n, "expert outputs");
        x->da = grow_dev(be, x->da, fi * o, fi * n, "expert scratch");
        if (x->es == 2) /* its contents need not survive a growth */
            x->acc32 = grow_dev(be, x->acc32, 0, sizeof(float) * (size_t)H * n, "expert sums");
        x->h_perm = grow(x->h_perm, i4 * n, "row permutation");
        x->h_iperm = grow(x->h_iperm, i4 * n, "row permutation");
        x->scap = c;
    }
}

/* The all-to-alls; on one EP rank a copy (counts are host memory, rows
 * the backend's). */
static void exchange(const mt_model_t *m, mt_ep_op_t op, const void *send, const int64_t *scnt,
                     void *recv, const int64_t *rcnt, int64_t width)
{
    if (m->moe->ep == 1) {
        if (op == MT_EP_COUNTS)
            memcpy(recv, send, sizeof(int64_t) * (size_t)width);
        else
            m->be->copy(recv, send, (size_t)m->moe->es * (size_t)(scnt[0] * width));
        return;
    }
    m->ep_alltoall(m->ep_ctx, op, send, scnt, recv, rcnt, width);
}

/* A row exchange (MT_EP_ROWS), started asynchronously where the
 * parallelize layer offers it (mt_model_t.ep_start); exchange_end joins
 * it.  In between: only work that touches neither buffer. */
static void *exchange_start(const mt_model_t *m, const void *send, const int64_t *scnt,
                            void *recv, const int64_t *rcnt, int64_t width)
{
    if (m->moe->ep == 1 || !m->ep_start) {
        exchange(m, MT_EP_ROWS, send, scnt, recv, rcnt, width);
        return NULL;
    }
    return m->ep_start(m->ep_ctx, send, scnt, recv, rcnt, width);
}

static void exchange_end(const mt_model_t *m, void *ticket)
{
    if (ticket)
        m->ep_join(m->ep_ctx, ticket);
}

/* c = a op(b) + beta c into a float32 sum under bf16 storage
 * (matmul_f32out), else into c as it is (matmul, the same on float32
 * storage) */
static void sum_gemm(const mt_model_t *m, float *c, const float *a, const float *b, int64_t rows,
                     int64_t n, int64_t k, bool ta, bool tb, float beta)
{
    if (m->bf16_storage)
        m->be->matmul_f32out(c, a, b, rows, n, k, ta, tb, beta);
    else
        m->be->matmul(c, a, b, rows, n, k, ta, tb, beta);
}

static const mt_param_t *expert_w(const mt_moe_t *x, int l, int64_t i, int k)
{
    return &x->xp[x->xfirst[l] + 3 * i + k];
}

/* Rows received for local expert i, from every EP rank (the expert's
 * block in the expert-major order). */
static int64_t expert_rows(const mt_moe_t *x, const moe_acts_t *a, int64_t i)
{
    int64_t n = 0;
    for (int s = 0; s < x->ep; s++)
        n += a->ecnt[s * x->El + i];
    return n;
}

void mt_moe_finish_forward(mt_model_t *m)
{
    mt_moe_t *x = m->moe;
    int64_t E = x->E;
    double *C = m->route, *S = m->route + E, R;
    if (m->route_sum)
        m->route_sum(m->route_ctx, m->route, m->nroute);
    R = m->route[2 * E];
    double s = 0;
    for (int64_t e = 0; e < E; e++)
        s += (C[e] / R) * (S[e] / R);
    x->aux = R > 0 ? (double)E * s : 0.0;
    if (x->training && !m->recomputing)
        x->aux_sum += x->aux;
}

/* Mixed precision: a completed activation or activation gradient becomes
 * bf16 (model.c's rule).  The router's logits, probabilities and weights
 * stay fp32 in the forward, as DeepSeek-V3's gate computes them; the
 * logits' gradient is rounded like any activation gradient before the
 * GEMMs (the tensor-core table takes bf16 GEMM inputs); the expert rows
 * are rounded before they are sent, so the all-to-all carries bf16
 * values. */

void mt_moe_forward(mt_model_t *m, int l, const float *h, const float *res, float *out)
{
    mt_moe_t *x = m->moe;
    int i0 = x->slot * (int)m->L + l;
    moe_acts_t *a = x->act[i0];
    moe_route_t *rt = x->rt[i0];
    const mt_backend_t *be = m->be;
    int64_t N = x->N, H = m->H, E = x->E, K = x->K, El = x->El, Im = x->Im, NK = N * K;

    if (!(x->keep_router && m->recomputing)) { /* else: the forward's routing, kept */
        /* the router's logits are float32 (DeepSeek-V3's gate; mt_backend.h) */
        be->matmul_f32out(rt->probs, h, m->layers[l].router->data, N, E, H, false, true, 0.0f);
        be->moe_router_forward(rt->probs, rt->idx, rt->w, x->bias ? x->bias + l * E : NULL, N,
                               E, K, x->norm_topk);
    }

    /* counts, probability sums into the micro-batch's totals (once: not
     * again in a recompute), and the send order (expert-major, token order
     * within an expert) */
    const int32_t *idx = x->h_idx;
    be->copy_to_host(x->h_idx, rt->idx, sizeof(int32_t) * (size_t)NK);
    int64_t *cnt = x->counts + l * E;
    memset(cnt, 0, sizeof *cnt * (size_t)E);
    for (int64_t i = 0; i < NK; i++)
        cnt[idx[i]]++;
    if (!m->recomputing) {
        double *C = m->route, *S = m->route + E;
        /* the running totals S go to the device and back (E doubles, not
         * the [N, E] probabilities), each probability added onto them in
         * order */
        be->copy_to_device(x->psum, S, sizeof(double) * (size_t)E);
        be->moe_prob_sums(x->psum, rt->probs, N, E);
        be->copy_to_host(S, x->psum, sizeof(double) * (size_t)E);
        for (int64_t e = 0; e < E; e++)
            C[e] += (double)cnt[e];
        m->route[2 * E] += (double)N;
    }
    /* a capacity limit keeps each expert's first cap (token, slot) pairs
     * in token order; the aux loss and the load figures count them all */
    int64_t *kept = x->kept, rows = 0;
    for (int64_t e = 0; e < E; e++)
        kept[e] = x->cap > 0 && cnt[e] > x->cap ? x->cap : cnt[e], rows += kept[e];
    x->dropped[l] = NK - rows;
    if (x->training && !m->recomputing) {
        int64_t *load = x->load + m->layer_id[l] * E;
        for (int64_t e = 0; e < E; e++)
            load[e] += cnt[e];
        x->load_dropped += x->dropped[l];
    }
    x->off[0] = 0; /* next row of each expert's block, and where the block ends */
    for (int64_t e = 1; e < E; e++)
        x->off[e] = x->off[e - 1] + kept[e - 1];
    for (int64_t e = 0; e < E; e++)
        x->kend[e] = x->off[e] + kept[e];
    int32_t *slot_row = x->h_slot_row, *src_tok = x->h_src_tok;
    for (int64_t i = 0; i < NK; i++) {
        int64_t e = idx[i];
        if (x->off[e] == x->kend[e]) { /* over capacity: dropped */
            slot_row[i] = -1;
            continue;
        }
        int64_t r = x->off[e]++;
        slot_row[i] = (int32_t)r;
        src_tok[r] = (int32_t)(i / K);
    }
    be->copy_to_device(a->slot_row, slot_row, sizeof(int32_t) * (size_t)NK);
    be->copy_to_device(x->src_tok, src_tok, sizeof(int32_t) * (size_t)rows);
    be->moe_gather_rows(x->sendbuf, h, x->src_tok, rows, H);

    /* counts to the owners, then the rows */
    for (int d = 0; d < x->ep; d++) {
        a->scnt[d] = 0;
        for (int64_t e = 0; e < El; e++)
            a->scnt[d] += kept[d * El + e];
    }
    exchange(m, MT_EP_COUNTS, kept, NULL, a->ecnt, NULL, El);
    a->R = 0;
    for (int s = 0; s < x->ep; s++) {
        a->rcnt[s] = 0;
        for (int64_t e = 0; e < El; e++)
            a->rcnt[s] += a->ecnt[s * El + e];
        a->R += a->rcnt[s];
    }
    mt_moe_reserve_rows(x, a, a->R, H);
    void *sent = exchange_start(m, x->sendbuf, a->scnt, x->recvbuf, a->rcnt, H);
    const mt_layer_params_t *p = &m->layers[l];
    if (x->Is > 0) { /* shared experts (every token), behind the dispatch; added at the end */
        be->matmul(a->sg, h, p->wgate->data, N, x->Is, H, false, true, 0.0f);
        be->matmul(a->su, h, p->wup->data, N, x->Is, H, false, true, 0.0f);
        mt_model_round_in(m, a->sg, N * x->Is); /* read by SwiGLU alone, both ways */
        mt_model_round_in(m, a->su, N * x->Is);
        be->swiglu_forward(a->sa, a->sg, a->su, N * x->Is);
        mt_model_round_out(m, a->sa, N * x->Is);
    }
    exchange_end(m, sent);

    /* received rows come by source rank, then expert: regroup by expert */
    int64_t i = 0;
    for (int64_t e = 0; e < El; e++) {
        int64_t base = 0;
        for (int s = 0; s < x->ep; s++) {
            int64_t at = base;
            for (int64_t f = 0; f < e; f++)
                at += a->ecnt[s * El + f];
            for (int64_t q = 0; q < a->ecnt[s * El + e]; q++, i++) {
                x->h_perm[i] = (int32_t)(at + q);
                x->h_iperm[at + q] = (int32_t)i;
            }
            base += a->rcnt[s];
        }
    }
    be->copy_to_device(a->perm, x->h_perm, sizeof(int32_t) * (size_t)a->R);
    be->copy_to_device(a->iperm, x->h_iperm, sizeof(int32_t) * (size_t)a->R);
    be->moe_gather_rows(a->xe, x->recvbuf, a->perm, a->R, H);

    /* one GEMM chain per local expert */
    int64_t o = 0;
    for (int64_t e = 0; e < El; e++) {
        int64_t n = expert_rows(x, a, e);
        if (n > 0) {
            float *g = mt_moe_at(x, a->g, o * Im), *u = mt_moe_at(x, a->u, o * Im), *ae = mt_moe_at(x, a->a, o * Im);
            const float *xe = mt_moe_at(x, a->xe, o * H);
            be->matmul(g, xe, expert_w(x, l, e, 0)->data, n, Im, H, false, true, 0.0f);
            be->matmul(u, xe, expert_w(x, l, e, 1)->data, n, Im, H, false, true, 0.0f);
            mt_model_round_in(m, g, n * Im); /* read by SwiGLU alone */
            mt_model_round_in(m, u, n * Im);
            be->swiglu_forward(ae, g, u, n * Im);
            mt_model_round_out(m, ae, n * Im);
            be->matmul(mt_moe_at(x, x->ye, o * H), ae, expert_w(x, l, e, 2)->data, n, H, Im, false, true,
                       0.0f);
        }
        o += n;
    }
    mt_model_round(m, x->ye, o * H);

    /* back to the received order, back to the senders, weighted sum */
    be->moe_gather_rows(x->recvbuf, x->ye, a->iperm, a->R, H);
    exchange(m, MT_EP_ROWS, x->recvbuf, a->rcnt, a->y, a->scnt, H);
    float *sum = x->es == 2 ? m->dh_acc : out; /* bf16 storage: in float32, rounded once */
    be->moe_combine(sum, res, a->y, a->slot_row, rt->w, N, K, H);
    if (x->Is > 0) /* the shared experts' output, after the routed sum */
        sum_gemm(m, sum, a->sa, p->wdown->data, N, H, x->Is, false, true, 1.0f);
    if (sum != out)
        be->to_bf16((uint16_t *)out, sum, N * H);
}

void mt_moe_backward(mt_model_t *m, int l, const float *h, const float *dout, float *dh)
{
    mt_moe_t *x = m->moe;
    int i0 = x->slot * (int)m->L + l;
    moe_acts_t *a = x->act[i0];
    moe_route_t *rt = x->rt[i0];
    const mt_backend_t *be = m->be;
    int64_t N = x->N, H = m->H, E = x->E, K = x->K, El = x->El, Im = x->Im;
    const mt_param_t *router = m->layers[l].router;

    /* d routing weights, and the expert outputs' gradients in send order */
    be->moe_combine_backward(x->dw, x->sendbuf, dout, a->y, a->slot_row, rt->w, N, K, H);
    if (m->bf16) {
        int64_t sent = 0;
        for (int d = 0; d < x->ep; d++)
            sent += a->scnt[d];
        mt_model_round(m, x->sendbuf, sent * H);
    }
    void *moved = exchange_start(m, x->sendbuf, a->scnt, x->recvbuf, a->rcnt, H);
    const mt_layer_params_t *p = &m->layers[l];
    int64_t Is = x->Is;
    if (Is > 0) { /* the shared experts behind it, but for their dh (added at the end);
                   * x->da ([rows, Im]) is too narrow: sa takes its gradient */
        be->matmul_f32out(p->wdown->grad, dout, a->sa, H, Is, N, true, false, 1.0f);
        be->matmul(a->sa, dout, p->wdown->data, N, Is, H, false, false, 0.0f);
        mt_model_round_in(m, a->sa, N * Is); /* read by SwiGLU's backward alone */
        be->swiglu_backward(a->sg, a->su, a->sa, a->sg, a->su, N * Is); /* sg, su <- d */
        mt_model_round_out(m, a->sg, N * Is);
        mt_model_round_out(m, a->su, N * Is);
        be->matmul_f32out(p->wgate->grad, a->sg, h, Is, H, N, true, false, 1.0f);
        be->matmul_f32out(p->wup->grad, a->su, h, Is, H, N, true, false, 1.0f);
    }
    exchange_end(m, moved);
    be->moe_gather_rows(x->ye, x->recvbuf, a->perm, a->R, H); /* expert-major */

    int64_t o = 0;
    for (int64_t e = 0; e < El; e++) {
        int64_t n = expert_rows(x, a, e);
        if (n > 0) {
            const mt_param_t *wg = expert_w(x, l, e, 0), *wu = expert_w(x, l, e, 1);
            const mt_param_t *wd = expert_w(x, l, e, 2);
            float *dy = mt_moe_at(x, x->ye, o * H), *g = mt_moe_at(x, a->g, o * Im), *u = mt_moe_at(x, a->u, o * Im);
            const float *xe = mt_moe_at(x, a->xe, o * H);
            be->matmul(x->da, dy, wd->data, n, Im, H, false, false, 0.0f);
            be->matmul_f32out(wd->grad, dy, mt_moe_at(x, a->a, o * Im), H, Im, n, true, false, 1.0f);
            mt_model_round_in(m, x->da, n * Im);
            be->swiglu_backward(g, u, x->da, g, u, n * Im); /* g, u <- dg, du */
            mt_model_round_out(m, g, n * Im);
            mt_model_round_out(m, u, n * Im);
            be->matmul_f32out(wg->grad, g, xe, Im, H, n, true, false, 1.0f);
            be->matmul_f32out(wu->grad, u, xe, Im, H, n, true, false, 1.0f);
            /* dy is no longer needed: the input gradient takes its rows
             * (summed in float32 under bf16 storage, then rounded once) */
            float *dx = x->es == 2 ? x->acc32 : dy;
            sum_gemm(m, dx, g, wg->data, n, H, Im, false, false, 0.0f);
            sum_gemm(m, dx, u, wu->data, n, H, Im, false, false, 1.0f);
            if (dx != dy)
                be->to_bf16((uint16_t *)dy, dx, n * H);
        }
        o += n;
    }
    mt_model_round(m, x->ye, o * H);
    /* the load-balancing loss's gradient, from the micro-batch's totals
     * (a host copy: before the exchange, so as not to wait inside it) */
    double R = m->route[2 * E];
    for (int64_t e = 0; e < E; e++)
        x->h_aux_dp[e] = R > 0 ? (float)((double)x->aux_scale * (double)E * m->route[e] / (R * R))
                               : 0.0f;
    be->copy_to_device(x->aux_dp, x->h_aux_dp, sizeof(float) * (size_t)E);
    be->moe_gather_rows(x->recvbuf, x->ye, a->iperm, a->R, H);
    moved = exchange_start(m, x->recvbuf, a->rcnt, x->sendbuf, a->scnt, H);

    /* behind it, the router (routing weights and the loss), but for its dh */
    be->moe_router_backward(x->dlogits, x->dw, rt->probs, rt->idx, rt->w, x->aux_dp, N, E, K,
                            x->norm_topk);
    mt_model_round(m, x->dlogits, N * E); /* an activation gradient: bf16 into the GEMMs */
    be->matmul_f32out(router->grad, x->dlogits, h, E, H, N, true, false, 1.0f);
    exchange_end(m, moved);

    /* dh: the routed experts', the router's, the shared experts' (in
     * float32 under bf16 storage, rounded once) */
    float *sum = x->es == 2 ? m->dh_acc : dh;
    be->moe_combine(sum, NULL, x->sendbuf, a->slot_row, NULL, N, K, H);
    sum_gemm(m, sum, x->dlogits, router->data, N, H, E, false, false, 1.0f);
    if (Is > 0) {
        sum_gemm(m, sum, a->sg, p->wgate->data, N, H, Is, false, false, 1.0f);
        sum_gemm(m, sum, a->su, p->wup->data, N, H, Is, false, false, 1.0f);
    }
    if (sum != dh)
        be->to_bf16((uint16_t *)dh, sum, N * H);
}
