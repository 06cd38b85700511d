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
 * (copy_to_host), and sends its results back with copy_to_device. */
#include "model_moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The router's outputs of a layer (backend memory): kept per layer and
 * slot, also under activation checkpointing with moe.ignore_router_for_ac. */
struct moe_route {
    float *probs;      /* [N,E] router probabilities */
    int32_t *idx;      /* [N,K] chosen experts */
    float *w;          /* [N,K] routing weights */
};

/* A layer's dispatch state: the counts are host memory, the rest the
 * backend's. */
struct moe_acts {
    int32_t *slot_row; /* [N,K] row of (t, j) in the send order */
    int64_t *scnt, *rcnt; /* [ep] rows sent to / received from each EP rank (host) */
    int64_t *ecnt;     /* [ep, El] rows received from rank s for local expert e (host) */
    int64_t R, cap;    /* rows received; rows the next five buffers hold */
    int32_t *perm, *iperm; /* [cap] expert-major row i is received row perm[i] */
    float *xe;         /* [cap,H] expert inputs, expert-major */
    float *g, *u, *a;  /* [cap,Im] */
    float *y;          /* [N K,H] expert outputs, back in send order */
    float *sg, *su, *sa; /* [N,Is] shared experts' gate, up, silu(gate) up */
};

bool mt_moe_is_sparse(const mt_config_t *cfg, int l)
{
    if (cfg->model.num_experts <= 0)
        return false;
    const char *c = cfg->model.mlp_only_layers;
    while (*c) { /* validated: integers separated by commas and spaces */
        char *end;
        long v = strtol(c, &end, 10);
        if (end == c)
            break;
        if (v == l)
            return false;
        c = end + strspn(end, " ,");
    }
    return true;
}

/* The fixed-size buffers, freed together by mt_moe_free. */
struct moe_alloc {
    void *p;
    bool device;       /* the backend's memory, else host */
};

static void *moe_alloc(mt_moe_t *x, size_t bytes, bool device)
{
    if (device) /* parameters and gradients are taken out again */
        x->act_numel += (int64_t)(bytes / 4);
    if (x->nalloc == x->capalloc) {
        int cap = x->capalloc ? 2 * x->capalloc : 64;
        struct moe_alloc *a = realloc(x->allocs, sizeof *a * (size_t)cap);
        if (!a)
            return NULL;
        x->allocs = a, x->capalloc = cap;
    }
    void *p = device ? x->be->device_alloc(bytes) : calloc(bytes ? bytes : 1, 1);
    if (p)
        x->allocs[x->nalloc++] = (struct moe_alloc){p, device};
    return p;
}

/* n elements of *ptr in host memory (ALLOC) or the backend's (DALLOC);
 * DALLOC_ACT: n activation elements (bf16 bits under bf16 storage) */
#define ALLOC(ptr, n) ((ptr) = moe_alloc(x, sizeof *(ptr) * (size_t)(n), false), ok &= (ptr) != NULL)
#define DALLOC(ptr, n) ((ptr) = moe_alloc(x, sizeof *(ptr) * (size_t)(n), true), ok &= (ptr) != NULL)
#define DALLOC_ACT(ptr, n) ((ptr) = moe_alloc(x, (size_t)x->es * (size_t)(n), true), ok &= (ptr) != NULL)

/* Element n of an activation buffer (mt_act_at's rule for the experts) */
static float *at(const mt_moe_t *x, const float *p, int64_t n)
{
    return (float *)((char *)p + (size_t)x->es * (size_t)n);
}

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

/* Room for R received rows in a's row buffers (and the shared scratch). */
static void reserve_rows(mt_moe_t *x, moe_acts_t *a, int64_t R, int64_t H)
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

static bool route_alloc(mt_moe_t *x, moe_route_t *r)
{
    bool ok = true;
    DALLOC(r->probs, x->N * x->E);
    DALLOC(r->idx, x->N * x->K);
    DALLOC(r->w, x->N * x->K);
    return ok;
}

static bool acts_alloc(mt_moe_t *x, moe_acts_t *a, int64_t H)
{
    bool ok = true;
    int64_t N = x->N, NK = N * x->K;
    DALLOC(a->slot_row, NK);
    ALLOC(a->scnt, x->ep);
    ALLOC(a->rcnt, x->ep);
    ALLOC(a->ecnt, x->ep * x->El);
    DALLOC_ACT(a->y, NK * H);
    if (x->Is > 0) {
        DALLOC_ACT(a->sg, N * x->Is);
        DALLOC_ACT(a->su, N * x->Is);
        DALLOC_ACT(a->sa, N * x->Is);
    }
    /* the balanced load to begin with: every rank receives N K rows (at
     * most ep N min(K, El), when every token picks this rank's experts) */
    int64_t most = x->ep * N * (x->K < x->El ? x->K : x->El);
    reserve_rows(x, a, NK < most ? NK : most, H);
    return ok;
}

mt_status_t mt_moe_init(mt_model_t *m, const mt_config_t *cfg, int ep_rank, int ep_size,
                        bool no_arenas, bool no_acts)
{
    const mt_model_config_t *mc = &cfg->model;
    if (ep_size < 1 || mc->num_experts % ep_size)
        MT_FAIL(MT_ERR_CONFIG, "%lld experts do not split over ep_size %d",
                (long long)mc->num_experts, ep_size);
    if (m->tp > 1 && m->N % m->tp)
        MT_FAIL(MT_ERR_CONFIG, "MoE layers with tensor parallelism route N / tp_size tokens on "
                "each TP rank: the %lld tokens of a micro-batch do not split over tp_size %d",
                (long long)m->N, m->tp);
    mt_moe_t *x = calloc(1, sizeof *x);
    if (!x)
        MT_FAIL(MT_ERR_NOMEM, "MoE state");
    m->moe = x;
    x->be = m->be;
    x->es = m->bf16_storage ? 2 : 4;
    int L = (int)m->L;
    int64_t H = m->H;
    x->N = m->N / m->tp;
    int64_t N = x->N;
    x->E = mc->num_experts, x->K = mc->num_experts_per_tok, x->Im = mc->moe_intermediate_size;
    x->Is = mc->num_shared_experts * x->Im;
    if (mc->moe_capacity_factor > 0) { /* GShard's capacity, over this rank's tokens */
        double c = ceil(mc->moe_capacity_factor * (double)(N * x->K) / (double)x->E);
        x->cap = c < 1 ? 1 : (int64_t)c;
    }
    x->ep = ep_size, x->ep_rank = ep_rank;
    x->El = x->E / ep_size, x->e_lo = ep_rank * x->El;
    x->norm_topk = mc->norm_topk_prob;
    m->nroute = MT_MOE_ROUTE(x->E);
    bool ok = true;
    ALLOC(x->sparse, L);
    ALLOC(x->xfirst, L);
    ALLOC(x->counts, L * x->E);
    ALLOC(x->dropped, L);
    ALLOC(x->load, m->L_full * x->E);
    if (mc->moe_router_bias_update_rate > 0) { /* aux-loss-free balancing: starts at 0 */
        DALLOC(x->bias, L * x->E);
        ALLOC(x->h_bias, L * x->E);
    }
    ALLOC(x->kept, x->E);
    ALLOC(x->kend, x->E);
    ALLOC(x->act, m->nslots * L);
    ALLOC(x->rt, m->nslots * L);
    ALLOC(x->route_mem, m->nslots * m->nroute);
    ALLOC(x->off, x->E);
    if (!no_acts) {
        DALLOC(x->src_tok, N * x->K);
        DALLOC_ACT(x->sendbuf, N * x->K * H);
        DALLOC(x->dw, N * x->K);
        DALLOC_ACT(x->dlogits, N * x->E); /* an activation gradient: bf16 into the GEMMs */
        DALLOC(x->aux_dp, x->E);
        DALLOC(x->psum, x->E);
        ALLOC(x->h_idx, N * x->K);
        ALLOC(x->h_slot_row, N * x->K);
        ALLOC(x->h_src_tok, N * x->K);
        ALLOC(x->h_aux_dp, x->E);
    }
    if (!ok)
        MT_FAIL(MT_ERR_NOMEM, "MoE buffers for %lld tokens", (long long)N);
    for (int l = 0; l < L; l++) {
        x->sparse[l] = m->layers[l].router != NULL;
        x->xfirst[l] = -1;
        x->nmoe += x->sparse[l];
    }
    ALLOC(x->xp, 3 * x->El * x->nmoe);
    if (!ok)
        MT_FAIL(MT_ERR_NOMEM, "expert parameter table");
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int l = 0; l < L; l++) {
        if (!x->sparse[l])
            continue;
        x->xfirst[l] = x->nxp;
        for (int64_t i = 0; i < x->El; i++)
            for (int k = 0; k < 3; k++) {
                mt_param_t *p = &x->xp[x->nxp++];
                snprintf(p->name, sizeof p->name, "model.layers.%d.mlp.experts.%lld.%s.weight",
                         m->layer_id[l], (long long)(x->e_lo + i), proj[k]);
                p->ndim = 2;
                p->shape[0] = p->full_shape[0] = k == 2 ? H : x->Im;
                p->shape[1] = p->full_shape[1] = k == 2 ? x->Im : H;
                p->numel = p->shape[0] * p->shape[1];
                p->tp_dim = -1;
                p->offset = x->numel;
                x->numel += p->numel;
            }
    }
    if (!no_arenas) { /* the parameters bf16 bits under bf16 storage, as the model's */
        DALLOC_ACT(x->param_mem, x->numel);
        DALLOC(x->grad_mem, x->numel);
        x->act_numel -= x->numel + x->numel * x->es / 4;
        if (!ok)
            MT_FAIL(MT_ERR_NOMEM, "%lld expert parameters", (long long)x->numel);
        for (int i = 0; i < x->nxp; i++) {
            x->xp[i].data = at(x, x->param_mem, x->xp[i].offset);
            x->xp[i].grad = x->grad_mem + x->xp[i].offset;
        }
    }
    /* Routing state per (slot, layer).  Under activation checkpointing a
     * layer's forward is recomputed right before its backward, so one set
     * serves every layer and slot; with moe.ignore_router_for_ac the
     * router's outputs stay per layer and slot all the same. */
    x->keep_router = m->checkpointing && cfg->distributed.moe.ignore_router_for_ac;
    if (no_acts) /* a table of names and shapes */
        return MT_OK;
    moe_acts_t *one = NULL;
    moe_route_t *one_rt = NULL;
    for (int s = 0; s < m->nslots; s++)
        for (int l = 0; l < L; l++) {
            if (!x->sparse[l])
                continue;
            int i = s * L + l;
            if (!m->checkpointing || !one) {
                ALLOC(x->act[i], 1);
                if (!ok || !acts_alloc(x, x->act[i], H))
                    MT_FAIL(MT_ERR_NOMEM, "MoE activations of layer %d", m->layer_id[l]);
                one = x->act[i];
            }
            x->act[i] = one;
            if (!m->checkpointing || x->keep_router || !one_rt) {
                ALLOC(x->rt[i], 1);
                if (!ok || !route_alloc(x, x->rt[i]))
                    MT_FAIL(MT_ERR_NOMEM, "router outputs of layer %d", m->layer_id[l]);
                one_rt = x->rt[i];
            }
            x->rt[i] = one_rt;
        }
    return MT_OK;
}

void mt_moe_use_slot(mt_model_t *m, int slot)
{
    m->moe->slot = slot;
    m->route = m->moe->route_mem + (int64_t)slot * m->nroute;
}

void mt_moe_free(mt_model_t *m)
{
    mt_moe_t *x = m->moe;
    if (!x)
        return;
    for (int s = 0; s < m->nslots && x->act; s++) /* the grown buffers, once per set */
        for (int l = 0; l < m->L; l++) {
            moe_acts_t *a = x->act[s * m->L + l];
            if (!a || !a->xe)
                continue;
            void *dev[] = {a->perm, a->iperm, a->xe, a->g, a->u, a->a};
            for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
                x->be->device_free(dev[i]);
            a->perm = a->iperm = NULL, a->xe = a->g = a->u = a->a = NULL;
        }
    x->be->device_free(x->recvbuf), x->be->device_free(x->ye), x->be->device_free(x->da);
    x->be->device_free(x->acc32);
    free(x->h_perm), free(x->h_iperm);
    for (int i = 0; i < x->nalloc; i++) {
        if (x->allocs[i].device)
            x->be->device_free(x->allocs[i].p);
        else
            free(x->allocs[i].p);
    }
    free(x->allocs);
    m->route = NULL;
    free(x);
    m->moe = NULL;
}

void mt_moe_update_bias(mt_model_t *m, const int64_t *load, double rate)
{
    mt_moe_t *x = m->moe;
    if (!x->bias)
        return;
    size_t bytes = sizeof(float) * (size_t)(m->L * x->E);
    x->be->copy_to_host(x->h_bias, x->bias, bytes);
    for (int l = 0; l < m->L; l++) {
        if (!x->sparse[l])
            continue;
        const int64_t *c = load + m->layer_id[l] * x->E;
        double mean = 0;
        for (int64_t e = 0; e < x->E; e++)
            mean += (double)c[e];
        mean /= (double)x->E;
        for (int64_t e = 0; e < x->E; e++) /* underloaded experts up, overloaded down */
            x->h_bias[l * x->E + e] += (float)((double)c[e] < mean ? rate
                                                : (double)c[e] > mean ? -rate : 0.0);
    }
    x->be->copy_to_device(x->bias, x->h_bias, bytes);
}

void mt_moe_zero_grad(mt_model_t *m)
{
    if (m->moe->grad_mem)
        m->be->zero(m->moe->grad_mem, sizeof(float) * (size_t)m->moe->numel);
}

int64_t mt_moe_act_numel(const mt_model_t *m)
{
    return m->moe->act_numel;
}

int64_t mt_moe_logical_numel(const mt_model_t *m)
{
    const mt_moe_t *x = m->moe;
    return x->numel * x->ep;
}

double mt_moe_flops_per_token(const mt_model_t *m)
{
    const mt_moe_t *x = m->moe;
    return 6.0 * (double)x->nmoe * (double)x->K * 3.0 * (double)m->H * (double)x->Im;
}

mt_model_t mt_moe_param_view(const mt_model_t *m, int64_t *unit_lo)
{
    const mt_moe_t *x = m->moe;
    mt_model_t v;
    memset(&v, 0, sizeof v);
    v.be = m->be;
    v.bf16 = m->bf16; /* mixed precision: the experts' masters too (train_mp.c) */
    v.bf16_storage = m->bf16_storage; /* and their arena's bf16 bits */
    v.L = m->L;
    v.init_std = m->init_std; /* mt_model_init_range reads it */
    v.params = x->xp, v.nparams = x->nxp, v.numel = x->numel;
    v.param_mem = x->param_mem, v.grad_mem = x->grad_mem;
    v.nunits = (int)m->L + 2;
    v.unit_lo = unit_lo;
    unit_lo[0] = unit_lo[1] = 0;
    for (int l = 0; l < m->L; l++) /* layer l's experts end where the next layer's begin */
        unit_lo[l + 2] = x->sparse[l] ? x->xp[x->xfirst[l] + 3 * x->El - 1].offset +
                                            x->xp[x->xfirst[l] + 3 * x->El - 1].numel
                                      : unit_lo[l + 1];
    unit_lo[m->L + 2] = x->numel;
    return v;
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
    reserve_rows(x, a, a->R, H);
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
            float *g = at(x, a->g, o * Im), *u = at(x, a->u, o * Im), *ae = at(x, a->a, o * Im);
            const float *xe = at(x, a->xe, o * H);
            be->matmul(g, xe, expert_w(x, l, e, 0)->data, n, Im, H, false, true, 0.0f);
            be->matmul(u, xe, expert_w(x, l, e, 1)->data, n, Im, H, false, true, 0.0f);
            mt_model_round_in(m, g, n * Im); /* read by SwiGLU alone */
            mt_model_round_in(m, u, n * Im);
            be->swiglu_forward(ae, g, u, n * Im);
            mt_model_round_out(m, ae, n * Im);
            be->matmul(at(x, x->ye, o * H), ae, expert_w(x, l, e, 2)->data, n, H, Im, false, true,
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
            float *dy = at(x, x->ye, o * H), *g = at(x, a->g, o * Im), *u = at(x, a->u, o * Im);
            const float *xe = at(x, a->xe, o * H);
            be->matmul(x->da, dy, wd->data, n, Im, H, false, false, 0.0f);
            be->matmul_f32out(wd->grad, dy, at(x, a->a, o * Im), H, Im, n, true, false, 1.0f);
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
