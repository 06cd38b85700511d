/* model_moe_state.c: the MoE block's state (model_moe.h): the expert
 * parameter table and arenas, the routing and dispatch buffers, sized for
 * the balanced load, and their release; the aux-loss-free bias's update
 * between steps, and the figures the trainer reports.  Nothing of a step
 * is computed here: routing, dispatch, the experts and their backward are
 * model_moe.c's. */
#include "model_moe.h"
#include "model_moe_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    mt_moe_reserve_rows(x, a, NK < most ? NK : most, H);
    return ok;
}

static const char *moe_block(mt_arch_t arch)
{
    return arch == MT_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp";
}

void mt_moe_router_name(mt_arch_t arch, int l, char *buf, size_t cap)
{
    snprintf(buf, cap, "model.layers.%d.%s.gate.weight", l, moe_block(arch));
}

void mt_moe_expert_name(mt_arch_t arch, int l, int64_t e, int k, char *buf,
                        size_t cap)
{
    static const char *const hf[3] = {"gate_proj", "up_proj", "down_proj"};
    static const char *const mixtral[3] = {"w1", "w3", "w2"};
    const char *proj = (arch == MT_ARCH_MIXTRAL ? mixtral : hf)[k];
    snprintf(buf, cap, "model.layers.%d.%s.experts.%lld.%s.weight", l, moe_block(arch),
             (long long)e, proj);
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
    x->arch = mt_model_arch(mc);
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

    for (int l = 0; l < L; l++) {
        if (!x->sparse[l])
            continue;
        x->xfirst[l] = x->nxp;
        for (int64_t i = 0; i < x->El; i++)
            for (int k = 0; k < 3; k++) {
                mt_param_t *p = &x->xp[x->nxp++];
                mt_moe_expert_name(mt_model_arch(mc), m->layer_id[l], x->e_lo + i, k, p->name, sizeof p->name);
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
            x->xp[i].data = mt_moe_at(x, x->param_mem, x->xp[i].offset);
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
