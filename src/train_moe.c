/* train_moe.c: the training loop's MoE glue (train_moe.h).
 *
 * The router is an ordinary layer parameter and follows the data-parallel
 * strategy (fsdp2 over dp_shard, or ddp).  The experts live in their own
 * arena (model_moe.h): each rank holds num_experts / ep_size of them, and
 * the ranks holding the same experts (ep_shard = dp / ep of them: the
 * MT_GROUP_EP_SHARD group, or all of dp when ep_size is 1) each see
 * different tokens, so the expert gradients are summed over that group
 * once per step, after backward.  Under fsdp2 with ep_shard > 1 the
 * experts are instead FSDP-sharded over ep_shard by a second mt_fsdp over
 * a model-like view of the expert arena whose units mirror the model's,
 * driven by the model's own unit events (chain_hook): gathered before a
 * MoE layer's forward and backward, gradients reduce-scattered after its
 * backward.  Expert gradients are distinct on each EP rank, so their
 * squares are summed over the EP group for the global norm, once. */
#include "train_moe.h"

#include <stdlib.h>
#include <string.h>

#include "model_moe.h"
#include "mt_comm.h"
#include "mt_fsdp.h"

/* Experts are FSDP-sharded over ep_shard under fsdp2 when there is more
 * than one rank to shard over; else replicated there. */
bool mt_train_moe_sharded(const mt_config_t *cfg)
{
    const mt_distributed_config_t *d = &cfg->distributed;
    return cfg->model.num_experts > 0 && d->strategy == MT_STRATEGY_FSDP2 && d->ep_size > 1 &&
           cfg->derived.ep_shard > 1;
}

mt_status_t mt_train_moe_check(const mt_config_t *cfg, int world)
{
    const mt_distributed_config_t *d = &cfg->distributed;
    if (cfg->model.num_experts == 0)
        return MT_OK;
    if (d->tp_size > 1)
        MT_FAIL(MT_ERR_UNSUPPORTED, "MoE training with tensor parallelism (tp_size %lld) is not "
                "in this release: use tp_size 1 and expert parallelism (ep_size)",
                (long long)d->tp_size);
    /* The routing buffers are one micro-batch's (not per pipeline slot), and
     * the load-balancing loss is a product of token means that context
     * parallelism would have to combine over its ranks first. */
    if (d->pp_size > 1 || d->cp_size > 1)
        MT_FAIL(MT_ERR_UNSUPPORTED, "MoE training with %s parallelism (%s %lld) is not in this "
                "release: use expert and data parallelism", d->pp_size > 1 ? "pipeline" : "context",
                d->pp_size > 1 ? "pp_size" : "cp_size",
                (long long)(d->pp_size > 1 ? d->pp_size : d->cp_size));
    if (d->moe.reshard_after_forward && !mt_train_moe_sharded(cfg))
        MT_FAIL(MT_ERR_UNSUPPORTED, "distributed.moe.reshard_after_forward: the experts are not "
                "sharded here (they are sharded over ep_shard = dp x cp / ep_size = %lld ranks "
                "under fsdp2 when it is above 1), so there is nothing to reshard; set it to false",
                (long long)cfg->derived.ep_shard);
    if (d->moe.ignore_router_for_ac && !d->activation_checkpointing)
        MT_FAIL(MT_ERR_CONFIG, "distributed.moe.ignore_router_for_ac keeps the router out of "
                "activation checkpointing, which is off: set "
                "distributed.activation_checkpointing true, or this to false");
    if (!d->moe.wrap_outer_model)
        MT_FAIL(MT_ERR_UNSUPPORTED, "distributed.moe.wrap_outer_model = false: the embedding "
                "and the final norm with lm_head are always FSDP units of their own in this "
                "release; set it to true");
    (void)world;
    return MT_OK;
}

/* The model's unit events go to the non-expert hook (fsdp or ddp), then to
 * the experts' fsdp, whose units mirror the model's. */
static void chain_hook(void *ctx, int unit, mt_unit_event_t ev)
{
    mt_train_moe_t *t = ctx;
    if (t->dense_hook)
        t->dense_hook(t->dense_ctx, unit, ev);
    t->view.unit_hook(t->view.hook_ctx, unit, ev);
}

mt_status_t mt_train_moe_init(mt_train_moe_t *t, mt_model_t *m, const mt_config_t *cfg,
                              const mt_mesh_t *mesh)
{
    memset(t, 0, sizeof *t);
    t->rep = t->ep_comm = MPI_COMM_NULL;
    if (!m->moe)
        return MT_OK;
    t->on = true;
    t->ep = (int)cfg->distributed.ep_size;
    t->dp = mesh->group[MT_GROUP_DP];
    if (t->ep > 1) {
        t->ep_comm = mesh->group[MT_GROUP_EP];
        t->rep = mesh->group[MT_GROUP_EP_SHARD];
        MT_TRY(mt_moe_dispatch_init(&t->dispatch, t->ep_comm));
        mt_moe_dispatch_attach(&t->dispatch, m);
    } else {
        t->rep = mesh->group[MT_GROUP_DP];
    }
    t->coef = cfg->model.router_aux_loss_coef;
    t->capacity = cfg->model.moe_capacity_factor > 0;
    t->micro = cfg->derived.grad_accum_steps * mesh->group_size[MT_GROUP_DP];
    t->E = m->moe->E;
    t->load = calloc((size_t)t->E, sizeof *t->load);
    t->load_l = calloc((size_t)(t->E * m->L), sizeof *t->load_l);
    t->bias_rate = cfg->model.moe_router_bias_update_rate;
    t->unit_lo = malloc(sizeof *t->unit_lo * (size_t)(m->L + 3));
    if (!t->load || !t->load_l || !t->unit_lo)
        MT_FAIL(MT_ERR_NOMEM, "expert load counters");
    t->view = mt_moe_param_view(m, t->unit_lo);
    int64_t owned = m->moe->numel;
    t->sharded = mt_train_moe_sharded(cfg);
    if (t->sharded) {
        mt_fsdp_options_t fo;
        mt_fsdp_options_from_config(cfg, &fo);
        fo.reshard_after_forward = cfg->distributed.moe.reshard_after_forward;
        MT_TRY(mt_fsdp_init(&t->fsdp, &t->view, t->rep, MPI_COMM_NULL, &fo));
        mt_fsdp_init_weights(&t->fsdp, (uint64_t)cfg->rng.seed);
        t->seg = t->fsdp.seg, t->nseg = t->fsdp.nunits, owned = t->fsdp.owned;
        t->dense_hook = m->unit_hook, t->dense_ctx = m->hook_ctx;
        m->unit_hook = chain_hook, m->hook_ctx = t;
    } else {
        mt_moe_init_weights(m, (uint64_t)cfg->rng.seed);
        t->whole = mt_segment_whole(&t->view);
        t->seg = &t->whole, t->nseg = 1;
    }
    MT_TRY(mt_adamw_init(&t->opt, owned));
    return MT_OK;
}

void mt_train_moe_free(mt_train_moe_t *t)
{
    if (t->ep > 1)
        mt_moe_dispatch_free(&t->dispatch);
    if (t->sharded)
        mt_fsdp_free(&t->fsdp);
    mt_adamw_free(&t->opt);
    free(t->load);
    free(t->load_l);
    free(t->unit_lo);
    memset(t, 0, sizeof *t);
}

mt_status_t mt_train_moe_begin_micro(mt_train_moe_t *t, int64_t micro)
{
    return t->sharded ? mt_fsdp_begin(&t->fsdp, micro) : MT_OK;
}

static void set_block(mt_ckpt_tensor_t *e, const char *path, const int64_t shape[2],
                      int64_t rows, float *data)
{
    memset(e, 0, sizeof *e);
    snprintf(e->path, sizeof e->path, "%s", path);
    e->ndim = 2;
    e->shape[0] = shape[0], e->shape[1] = shape[1];
    e->row_count = rows;
    e->data = data;
}

mt_status_t mt_train_moe_ckpt(mt_train_moe_t *t, mt_train_ckpt_t *c, const mt_model_t *m)
{
    if (!t->on)
        return MT_OK;
    int rep_rank = 0;
    MPI_Comm_rank(t->rep, &rep_rank);
    /* sharded: every rank writes its own rows; replicated: the first replica */
    bool writer = t->sharded || rep_rank == 0;
    const mt_moe_t *x = m->moe;
    /* model, exp_avg, exp_avg_sq of every expert tensor, and the biases */
    int add = 3 * 3 * x->nmoe * (int)x->E + (x->bias ? x->nmoe : 0);
    mt_ckpt_tensor_t *nt = realloc(c->t, sizeof *nt * (size_t)(c->n + add));
    if (!nt)
        MT_FAIL(MT_ERR_NOMEM, "checkpoint tensor list");
    c->t = nt;
    nt = realloc(c->t_save, sizeof *nt * (size_t)(c->n + add));
    if (!nt)
        MT_FAIL(MT_ERR_NOMEM, "checkpoint tensor list");
    c->t_save = nt;
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    static const char *const kind[3] = {"/model/%s", "/optim/%s/exp_avg", "/optim/%s/exp_avg_sq"};
    int n = c->n;
    for (int l = 0; l < m->L; l++) {
        if (!x->sparse[l])
            continue;
        for (int64_t e = 0; e < x->E; e++)
            for (int k = 0; k < 3; k++) {
                char name[MT_PARAM_NAME_MAX], path[256];
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%lld.%s.weight", l,
                         (long long)e, proj[k]);
                int64_t shape[2] = {k == 2 ? m->H : x->Im, k == 2 ? x->Im : m->H};
                /* this rank's rows of it: none unless it holds the expert; then
                 * the rows its segment covers (shards end on row boundaries) */
                int64_t first = 0, rows = 0;
                float *pd = NULL, *m1 = NULL, *m2 = NULL;
                if (e >= x->e_lo && e < x->e_lo + x->El) {
                    const mt_param_t *p = &x->xp[x->xfirst[l] + 3 * (e - x->e_lo) + k];
                    for (int g = 0; g < t->nseg && rows == 0; g++) {
                        const mt_segment_t *sg = &t->seg[g];
                        int64_t a, cnt = mt_param_overlap(p, sg->offset, sg->offset + sg->count, &a);
                        if (cnt == 0)
                            continue;
                        first = (a - p->offset) / shape[1], rows = cnt / shape[1];
                        pd = sg->param + (a - sg->offset);
                        m1 = t->opt.exp_avg + sg->state + (a - sg->offset);
                        m2 = t->opt.exp_avg_sq + sg->state + (a - sg->offset);
                    }
                }
                float *data[3] = {pd, m1, m2};
                for (int s = 0; s < 3; s++) {
                    snprintf(path, sizeof path, kind[s], name);
                    set_block(&c->t[n], path, shape, rows, data[s]);
                    c->t[n].row_offset = first;
                    c->t_save[n] = c->t[n];
                    if (!writer) /* another replica of these experts writes them */
                        c->t_save[n].row_count = 0;
                    n++;
                }
            }
    }
    /* the balancing biases: the same on every rank; the first dp rank writes */
    int dp_rank = 0;
    MPI_Comm_rank(t->dp, &dp_rank);
    for (int l = 0; x->bias && l < m->L; l++) {
        if (!x->sparse[l])
            continue;
        char path[256];
        snprintf(path, sizeof path, "/model/model.layers.%d.mlp.gate.e_score_correction_bias", l);
        mt_ckpt_tensor_t *e = &c->t[n];
        memset(e, 0, sizeof *e);
        snprintf(e->path, sizeof e->path, "%s", path);
        e->ndim = 1;
        e->shape[0] = x->E, e->shape[1] = 1;
        e->row_count = x->E;
        e->data = x->bias + l * x->E;
        c->t_save[n] = *e;
        if (dp_rank != 0)
            c->t_save[n].row_count = 0;
        n++;
    }
    c->n = n;
    return MT_OK;
}

void mt_train_moe_begin_step(mt_train_moe_t *t, mt_model_t *m)
{
    if (!t->on)
        return;
    m->moe->aux_scale = (float)(t->coef / (double)t->micro);
    t->aux_sum = 0;
    t->dropped = 0;
    memset(t->load, 0, sizeof *t->load * (size_t)m->moe->E);
    memset(t->load_l, 0, sizeof *t->load_l * (size_t)(m->moe->E * m->L));
    t->dispatch.bytes_sent = 0, t->dispatch.seconds = 0, t->dispatch.calls = 0;
}

void mt_train_moe_after_micro(mt_train_moe_t *t, const mt_model_t *m)
{
    if (!t->on)
        return;
    const mt_moe_t *x = m->moe;
    t->aux_sum += x->aux;
    for (int l = 0; l < m->L; l++)
        if (x->sparse[l])
            t->dropped += x->dropped[l];
    for (int l = 0; l < m->L; l++)
        if (x->sparse[l])
            for (int64_t e = 0; e < x->E; e++) {
                t->load[e] += x->counts[l * x->E + e];
                t->load_l[l * x->E + e] += x->counts[l * x->E + e];
            }
}

mt_status_t mt_train_moe_grad_sumsq(mt_train_moe_t *t, mt_model_t *m, double *sumsq)
{
    *sumsq = 0;
    if (!t->on)
        return MT_OK;
    mt_moe_t *x = m->moe;
    double local;
    if (t->sharded) { /* reduce-scattered: every rank of dp holds distinct rows */
        MT_TRY(mt_fsdp_finish(&t->fsdp));
        local = mt_grad_sumsq(&t->view, t->seg, t->nseg);
        MT_TRY(mt_allreduce(&local, sumsq, 1, MPI_DOUBLE, MPI_SUM, t->dp));
        return MT_OK;
    }
    int nrep = 1;
    MPI_Comm_size(t->rep, &nrep);
    /* one message per step: the expert arena is contiguous */
    for (int64_t o = 0; nrep > 1 && o < x->numel; o += 1 << 30) {
        int n = (int)(x->numel - o < (1 << 30) ? x->numel - o : 1 << 30);
        MT_TRY(mt_allreduce(MPI_IN_PLACE, x->grad_mem + o, n, MPI_FLOAT, MPI_SUM, t->rep));
    }
    local = m->be->sum_squares(x->grad_mem, x->numel);
    if (t->ep > 1)
        MT_TRY(mt_allreduce(&local, sumsq, 1, MPI_DOUBLE, MPI_SUM, t->ep_comm));
    else
        *sumsq = local;
    return MT_OK;
}

mt_status_t mt_train_moe_update(mt_train_moe_t *t, mt_model_t *m, double coef,
                                const mt_optimizer_config_t *oc, double lr)
{
    (void)m;
    if (!t->on)
        return MT_OK;
    if (coef < 1.0)
        mt_grad_scale(&t->view, t->seg, t->nseg, (float)coef);
    mt_adamw_step(&t->opt, &t->view, t->seg, t->nseg, oc, lr);
    if (t->sharded) { /* and nothing left in flight (a prefetch of an empty unit) */
        MT_TRY(mt_fsdp_after_update(&t->fsdp));
        MT_TRY(mt_fsdp_sync(&t->fsdp));
    }
    return MT_OK;
}

mt_status_t mt_train_moe_step_stats(mt_train_moe_t *t, mt_model_t *m, MPI_Comm dp,
                                    MPI_Comm world)
{
    if (!t->on)
        return MT_OK;
    double aux = 0;
    MT_TRY(mt_allreduce(&t->aux_sum, &aux, 1, MPI_DOUBLE, MPI_SUM, dp));
    t->aux = aux / (double)t->micro;
    MT_TRY(mt_allreduce(MPI_IN_PLACE, t->load, (int)t->E, MPI_INT64_T, MPI_SUM, dp));
    MT_TRY(mt_allreduce(MPI_IN_PLACE, &t->dropped, 1, MPI_INT64_T, MPI_SUM, dp));
    if (t->bias_rate > 0) {
        MT_TRY(mt_allreduce(MPI_IN_PLACE, t->load_l, (int)(m->L * t->E), MPI_INT64_T, MPI_SUM,
                            dp));
        mt_moe_update_bias(m, t->load_l, t->bias_rate);
    }
    int64_t total = 0;
    t->load_min = t->load_max = t->load[0];
    for (int64_t e = 0; e < t->E; e++) {
        total += t->load[e];
        t->load_min = t->load[e] < t->load_min ? t->load[e] : t->load_min;
        t->load_max = t->load[e] > t->load_max ? t->load[e] : t->load_max;
    }
    t->imbalance = total > 0 ? (double)t->load_max * (double)t->E / (double)total : 0;
    MT_TRY(mt_allreduce(&t->dispatch.seconds, &t->a2a_seconds, 1, MPI_DOUBLE, MPI_MAX, world));
    MT_TRY(mt_allreduce(&t->dispatch.bytes_sent, &t->a2a_bytes, 1, MPI_INT64_T, MPI_SUM, world));
    return MT_OK;
}

void mt_train_moe_log(const mt_train_moe_t *t, char *line, size_t lcap, char *json, size_t jcap)
{
    line[0] = json[0] = '\0';
    if (!t->on)
        return;
    int n = snprintf(line, lcap, " | aux %.4f | expert load %lld..%lld imbalance %.2f", t->aux,
                     (long long)t->load_min, (long long)t->load_max, t->imbalance);
    if (t->capacity && n > 0 && (size_t)n < lcap)
        snprintf(line + n, lcap - (size_t)n, " dropped %lld", (long long)t->dropped);
    snprintf(json, jcap, ", \"aux_loss\": %.9g, \"expert_load_min\": %lld, "
             "\"expert_load_max\": %lld, \"expert_load_imbalance\": %.6f, "
             "\"tokens_dropped\": %lld, \"a2a_bytes\": %lld, \"a2a_s\": %.6f",
             t->aux, (long long)t->load_min, (long long)t->load_max, t->imbalance,
             (long long)t->dropped, (long long)t->a2a_bytes, t->a2a_seconds);
}

void mt_train_moe_bytes(const mt_train_moe_t *t, const mt_model_t *m, double *params_own,
                        double *params_work, double *grads_own, double *grads_work,
                        double *activations)
{
    if (!t->on)
        return;
    *activations += 4.0 * (double)mt_moe_act_numel(m);
    if (!t->sharded) {
        *params_own += 4.0 * (double)t->view.numel, *grads_own += 4.0 * (double)t->view.numel;
        return;
    }
    double ps, pw, gs, gw;
    mt_fsdp_bytes(&t->fsdp, &ps, &pw, &gs, &gw);
    *params_own += ps, *params_work += pw, *grads_own += gs, *grads_work += gw;
}
