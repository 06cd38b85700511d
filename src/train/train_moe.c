/* train_moe.c: the training loop's MoE glue (train_moe.h).
 *
 * The router and the shared experts are ordinary layer parameters and
 * follow the data-parallel strategy (fsdp2 over dp_shard, or ddp); under
 * tensor parallelism they are whole on every TP rank, each of which routes
 * its own tokens, so their gradients are summed over TP with the other
 * partial ones (tp_partial_grad).  The experts live in their own arena
 * (model_moe.h): each rank holds num_experts / ep_size of them.  The
 * ranks holding the same experts (rep: the same pipeline stage and EP
 * index, i.e. ep_shard = dp x cp / ep of them times tp) each route
 * different tokens, so the expert gradients are summed over rep once per
 * step, by ddp.c's buckets over a model-like view of the expert arena
 * (below), each started once backward is done with its layers (the last
 * micro-step; a pipeline's after the schedule).  Under fsdp2 with rep larger than one rank the
 * experts are instead FSDP-sharded over rep by a second mt_fsdp
 * over a model-like view of the expert arena whose units mirror the
 * model's, driven by the model's own unit events (chain_hook): gathered
 * before a MoE layer's forward and backward, gradients reduce-scattered
 * after its backward (under a pipeline: gathered at first use, reduced
 * after the schedule, as the model's).
 *
 * The load-balancing loss needs each micro-batch's routing totals over
 * all its tokens and MoE layers: the pipeline carries them between
 * stages (pp_exec.c), and route_sum adds them up over the cp x tp ranks
 * that hold the micro-batch's other tokens.
 *
 * Off the plain CPU backend the expert arena is the backend's memory: the
 * replicated experts' buckets go through NCCL or stage through host
 * copies (ddp.c),
 * the sharded experts' collectives are fsdp.c's (staged there), the
 * dispatch stages its rows (moe_dispatch.c); the routing totals and the
 * load counters are host memory by design (model_moe.h). */
#include <config.h>

#include "train_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_moe.h"
#include "moe_layout.h"
#include "mt_comm.h"
#include "mt_fsdp.h"
#ifdef MT_HAVE_NCCL
#include "mt_nccl.h"
#endif

mt_status_t mt_train_moe_check(const mt_config_t *cfg, int world)
{
    const mt_distributed_config_t *d = &cfg->distributed;
    if (cfg->model.num_experts == 0)
        return MT_OK;
    if (d->moe.reshard_after_forward && !mt_moe_experts_sharded(cfg))
        MT_FAIL(MT_ERR_UNSUPPORTED, "distributed.moe.reshard_after_forward: the experts are not "
                "sharded here (they are sharded under fsdp2 over the %lld ranks that hold the "
                "same experts, when there is more than one), so there is nothing to reshard; "
                "set it to false", (long long)mt_moe_expert_replicas(cfg));
    if (d->moe.ignore_router_for_ac && !d->activation_checkpointing)
        MT_FAIL(MT_ERR_CONFIG, "distributed.moe.ignore_router_for_ac keeps the router out of "
                "activation checkpointing, which is off: set "
                "distributed.activation_checkpointing true, or this to false");
    /* moe.wrap_outer_model: the outer module of a decoder has no
     * parameters of its own (the embedding, every layer and the head are
     * units of their own either way), so both values shard alike. */
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

/* m->route_sum: mid-forward, the peers cannot be told, so a failure aborts */
static void route_sum(void *ctx, double *buf, int64_t n)
{
    mt_train_moe_t *t = ctx;
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_SUM, t->tokens);
    if (rc != MPI_SUCCESS)
        mt_comm_fatal(t->tokens, rc, "MoE routing totals (all-reduce over cp x tp)");
}

mt_status_t mt_train_moe_init(mt_train_moe_t *t, mt_model_t *m, const mt_config_t *cfg,
                              const mt_mesh_t *mesh)
{
    memset(t, 0, sizeof *t);
    t->rep = t->tokens = t->ep_comm = t->world = MPI_COMM_NULL;
    if (!m->moe)
        return MT_OK;
    t->on = true;
    t->world = mesh->comm;
    t->reduce_bf16 = cfg->distributed.mp_policy.reduce_dtype == MT_DTYPE_BFLOAT16;
    t->ep = (int)cfg->distributed.ep_size;
    int stage = mesh->group_rank[MT_GROUP_PP];
    int ep_idx = t->ep > 1 ? mesh->group_rank[MT_GROUP_EP] : 0;
    MT_MPI_TRY(MPI_Comm_split(mesh->comm, stage * t->ep + ep_idx, mesh->rank, &t->rep));
#ifdef MT_HAVE_NCCL
    /* with NCCL active the experts' reductions and FSDP over rep use it too */
    MT_TRY(mt_nccl_adopt(t->rep, "expert replicas"));
#endif
    MT_MPI_TRY(MPI_Comm_split(mesh->comm,
                              stage * mesh->group_size[MT_GROUP_DP] + mesh->group_rank[MT_GROUP_DP],
                              mesh->rank, &t->tokens));
    int ntok = 1, tok_rank = 0;
    MPI_Comm_size(t->tokens, &ntok);
    MPI_Comm_rank(t->tokens, &tok_rank);
    if (ntok > 1)
        m->route_sum = route_sum, m->route_ctx = t;
    t->counts_aux = tok_rank == 0;
    if (t->ep > 1) {
        t->ep_comm = mesh->group[MT_GROUP_EP];
        MT_TRY(mt_moe_dispatch_init(&t->dispatch, t->ep_comm, m->be, m->bf16));
        mt_moe_dispatch_attach(&t->dispatch, m);
    }
    t->coef = cfg->model.router_aux_loss_coef;
    t->capacity = cfg->model.moe_capacity_factor > 0;
    t->micro = cfg->derived.grad_accum_steps * mesh->group_size[MT_GROUP_DP] *
               (cfg->distributed.pp_size > 1 ? cfg->derived.num_microbatches : 1);
    t->E = m->moe->E;
    t->L = m->L_full;
    t->dp_rank = mesh->group_rank[MT_GROUP_DP];
    t->load = calloc((size_t)(t->E * t->L), sizeof *t->load);
    t->sparse = calloc((size_t)t->L, sizeof *t->sparse);
    t->bias_rate = cfg->model.moe_router_bias_update_rate;
    t->unit_lo = malloc(sizeof *t->unit_lo * (size_t)(m->L + 3));
    if (!t->load || !t->unit_lo || !t->sparse)
        MT_FAIL(MT_ERR_NOMEM, "expert load counters");
    for (int g = 0; g < t->L; g++)
        t->sparse[g] = mt_moe_is_sparse(cfg, g);
    t->view = mt_moe_param_view(m, t->unit_lo);
    int64_t owned = m->moe->numel;
    t->sharded = mt_moe_experts_sharded(cfg);
    if (t->sharded) {
        mt_fsdp_options_t fo;
        mt_fsdp_options_from_config(cfg, &fo);
        fo.reshard_after_forward = cfg->distributed.moe.reshard_after_forward;
        fo.pipeline = cfg->distributed.pp_size > 1;
        MT_TRY(mt_fsdp_init(&t->fsdp, &t->view, t->rep, MPI_COMM_NULL, &fo));
        mt_fsdp_init_weights(&t->fsdp, (uint64_t)cfg->rng.seed);
        t->seg = t->fsdp.seg, t->nseg = t->fsdp.nunits, owned = t->fsdp.owned;
    } else {
        mt_moe_init_weights(m, (uint64_t)cfg->rng.seed);
        t->whole = mt_segment_whole(&t->view);
        t->seg = &t->whole, t->nseg = 1;
        int nrep = 1;
        MPI_Comm_size(t->rep, &nrep);
        if (nrep > 1) { /* the dense ddp's buckets and rules (train.c) */
            MT_TRY(mt_ddp_init(&t->ddp, t->rep, &t->view,
                               (int64_t)(cfg->distributed.ddp_bucket_cap_mb * 1048576.0),
                               t->reduce_bf16));
            if (cfg->distributed.strategy == MT_STRATEGY_MEGATRON_FSDP)
                t->ddp.overlap = cfg->distributed.overlap_grad_reduce;
            t->ddp_on = true;
        }
    }
    if (t->sharded || t->ddp_on) { /* the view's hook runs behind the model's own */
        t->dense_hook = m->unit_hook, t->dense_ctx = m->hook_ctx;
        m->unit_hook = chain_hook, m->hook_ctx = t;
    }
    MT_TRY(mt_train_mp_init(&t->mp, &t->view, t->seg, t->nseg, owned,
                            !(t->sharded && t->fsdp.opt.shard_params), (uint64_t)cfg->rng.seed,
                            &t->seg));
    MT_TRY(mt_adamw_init(&t->opt, m->be, owned));
    return MT_OK;
}

mt_status_t mt_train_moe_after_load(mt_train_moe_t *t)
{
    if (!t->on || !t->mp.master)
        return MT_OK;
    mt_train_mp_refresh(&t->mp);
    if (t->sharded) { /* zero 1/2 experts: spread the refreshed shards */
        MT_TRY(mt_fsdp_after_update(&t->fsdp));
        MT_TRY(mt_fsdp_sync(&t->fsdp));
    }
    return MT_OK;
}

void mt_train_moe_free(mt_train_moe_t *t)
{
    if (!t->on) /* never initialised, or a dense model */
        return;
    if (t->ep > 1)
        mt_moe_dispatch_free(&t->dispatch);
    if (t->sharded)
        mt_fsdp_free(&t->fsdp);
    if (t->ddp_on)
        mt_ddp_free(&t->ddp);
    if (t->rep != MPI_COMM_NULL)
        MPI_Comm_free(&t->rep);
    if (t->tokens != MPI_COMM_NULL)
        MPI_Comm_free(&t->tokens);
    mt_adamw_free(&t->opt);
    mt_train_mp_free(&t->mp);
    free(t->load);
    free(t->sparse);
    free(t->unit_lo);
    memset(t, 0, sizeof *t);
}

mt_status_t mt_train_moe_begin_micro(mt_train_moe_t *t, int64_t micro, bool last)
{
    if (t->ddp_on)
        mt_ddp_begin(&t->ddp, last);
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

/* Local index of global layer g, or -1 when another stage holds it. */
static int local_layer(const mt_model_t *m, int g)
{
    for (int l = 0; l < m->L; l++)
        if (m->layer_id[l] == g)
            return l;
    return -1;
}

mt_status_t mt_train_moe_ckpt(mt_train_moe_t *t, mt_train_ckpt_t *c, const mt_model_t *m)
{
    if (!t->on)
        return MT_OK;
    int rep_rank = 0, tok_rank = 0;
    MPI_Comm_rank(t->rep, &rep_rank);
    MPI_Comm_rank(t->tokens, &tok_rank);
    /* sharded: every rank writes its own rows; replicated: the first replica */
    bool writer = t->sharded || rep_rank == 0;
    const mt_moe_t *x = m->moe;
    /* every MoE layer of the whole model, also those of other stages
     * (with no rows here), as for the model's own tensors */
    int nmoe = 0;
    for (int g = 0; g < t->L; g++)
        nmoe += t->sparse[g];
    /* model, exp_avg, exp_avg_sq of every expert tensor, and the biases */
    int add = 3 * 3 * nmoe * (int)x->E + (x->bias ? nmoe : 0);
    mt_ckpt_tensor_t *nt = realloc(c->t, sizeof *nt * (size_t)(c->n + add));
    if (!nt)
        MT_FAIL(MT_ERR_NOMEM, "checkpoint tensor list");
    c->t = nt;
    nt = realloc(c->t_save, sizeof *nt * (size_t)(c->n + add));
    if (!nt)
        MT_FAIL(MT_ERR_NOMEM, "checkpoint tensor list");
    c->t_save = nt;
    static const char *const kind[3] = {"/model/%s", "/optim/%s/exp_avg", "/optim/%s/exp_avg_sq"};
    int n = c->n;
    for (int g = 0; g < t->L; g++) {
        if (!t->sparse[g])
            continue;
        int l = local_layer(m, g);
        for (int64_t e = 0; e < x->E; e++)
            for (int k = 0; k < 3; k++) {
                char name[MT_PARAM_NAME_MAX], path[256];
                mt_moe_expert_name(x->arch, g, e, k, name, sizeof name);
                int64_t shape[2] = {k == 2 ? m->H : x->Im, k == 2 ? x->Im : m->H};
                /* this rank's rows of it: none unless it holds the expert; then
                 * the rows its segment covers (shards end on row boundaries) */
                int64_t first = 0, rows = 0;
                float *pd = NULL, *m1 = NULL, *m2 = NULL;
                if (l >= 0 && e >= x->e_lo && e < x->e_lo + x->El) {
                    const mt_param_t *p = &x->xp[x->xfirst[l] + 3 * (e - x->e_lo) + k];
                    for (int q = 0; q < t->nseg && rows == 0; q++) {
                        const mt_segment_t *sg = &t->seg[q];
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
    /* the balancing biases: the same on every rank of the stage; the first
     * dp rank of the first token-group rank writes */
    for (int g = 0; x->bias && g < t->L; g++) {
        if (!t->sparse[g])
            continue;
        int l = local_layer(m, g);
        char path[256];
        snprintf(path, sizeof path, "/model/model.layers.%d.mlp.gate.e_score_correction_bias", g);
        mt_ckpt_tensor_t *e = &c->t[n];
        memset(e, 0, sizeof *e);
        snprintf(e->path, sizeof e->path, "%s", path);
        e->ndim = 1;
        e->shape[0] = x->E, e->shape[1] = 1;
        e->row_count = l >= 0 ? x->E : 0;
        e->data = l >= 0 ? x->bias + l * x->E : NULL;
        c->t_save[n] = *e;
        if (!(t->dp_rank == 0 && tok_rank == 0))
            c->t_save[n].row_count = 0;
        n++;
    }
    c->n = n;
    return MT_OK;
}

void mt_train_moe_begin_step(mt_train_moe_t *t, mt_model_t *m, bool in_schedule,
                             float grad_scale)
{
    if (!t->on)
        return;
    mt_moe_t *x = m->moe;
    double s = t->coef / (double)t->micro;
    if (!in_schedule && grad_scale > 0) /* the reduced gradients are scaled by grad_scale */
        s /= (double)grad_scale;
    x->aux_scale = (float)s;
    t->post_scale = in_schedule ? 1.0f : grad_scale;
    x->aux_sum = 0;
    x->load_dropped = 0;
    memset(x->load, 0, sizeof *x->load * (size_t)(x->E * m->L_full));
    t->dispatch.bytes_sent = 0, t->dispatch.seconds = 0, t->dispatch.calls = 0;
}

mt_status_t mt_train_moe_grad_sumsq(mt_train_moe_t *t, mt_model_t *m, double *sumsq)
{
    *sumsq = 0;
    if (!t->on)
        return MT_OK;
    mt_moe_t *x = m->moe;
    double local;
    if (t->sharded) { /* reduce-scattered: every rank holds distinct rows */
        MT_TRY(mt_fsdp_finish(&t->fsdp));
        if (t->post_scale != 1.0f)
            mt_grad_scale(&t->view, t->seg, t->nseg, t->post_scale);
        local = mt_grad_sumsq(&t->view, t->seg, t->nseg);
        MT_TRY(mt_allreduce(&local, sumsq, 1, MPI_DOUBLE, MPI_SUM, t->world));
        return MT_OK;
    }
    int rep_rank = 0;
    MPI_Comm_rank(t->rep, &rep_rank);
    if (t->ddp_on) { /* the buckets backward has not started (all, after a pipeline) */
        if (!t->ddp.sync)
            mt_ddp_begin(&t->ddp, true);
        MT_TRY(mt_ddp_finish(&t->ddp));
    }
    if (t->post_scale != 1.0f)
        mt_grad_scale(&t->view, t->seg, t->nseg, t->post_scale);
    /* the replicas now agree: the first of them counts */
    local = rep_rank == 0 ? m->be->sum_squares(x->grad_mem, x->numel) : 0.0;
    MT_TRY(mt_allreduce(&local, sumsq, 1, MPI_DOUBLE, MPI_SUM, t->world));
    return MT_OK;
}

mt_status_t mt_train_moe_update(mt_train_moe_t *t, mt_model_t *m, double coef,
                                const mt_optimizer_config_t *oc, double lr, bool apply)
{
    (void)m;
    if (!t->on)
        return MT_OK;
    if (apply)
        mt_adamw_step(&t->opt, &t->view, t->seg, t->nseg, oc, lr, (float)coef);
    /* bf16 compute: the update wrote the master weights' bf16 copy too */
    if (t->sharded) { /* and nothing left in flight (a prefetch of an empty unit) */
        MT_TRY(mt_fsdp_after_update(&t->fsdp));
        MT_TRY(mt_fsdp_sync(&t->fsdp));
    }
    return MT_OK;
}

mt_status_t mt_train_moe_step_stats(mt_train_moe_t *t, mt_model_t *m)
{
    if (!t->on)
        return MT_OK;
    mt_moe_t *x = m->moe;
    /* every rank routed its own tokens: sums over all of them */
    double aux = t->counts_aux ? x->aux_sum : 0.0;
    MT_TRY(mt_allreduce(MPI_IN_PLACE, &aux, 1, MPI_DOUBLE, MPI_SUM, t->world));
    t->aux = aux / (double)t->micro;
    int64_t nl = t->L * t->E;
    MT_TRY(mt_allreduce(x->load, t->load, (int)nl, MPI_INT64_T, MPI_SUM, t->world));
    MT_TRY(mt_allreduce(&x->load_dropped, &t->dropped, 1, MPI_INT64_T, MPI_SUM, t->world));
    if (t->bias_rate > 0)
        mt_moe_update_bias(m, t->load, t->bias_rate);
    int64_t total = 0;
    for (int64_t e = 0; e < t->E; e++) {
        int64_t le = 0;
        for (int64_t g = 0; g < t->L; g++)
            le += t->load[g * t->E + e];
        total += le;
        t->load_min = e == 0 || le < t->load_min ? le : t->load_min;
        t->load_max = e == 0 || le > t->load_max ? le : t->load_max;
    }
    t->imbalance = total > 0 ? (double)t->load_max * (double)t->E / (double)total : 0;
    MT_TRY(mt_allreduce(&t->dispatch.seconds, &t->a2a_seconds, 1, MPI_DOUBLE, MPI_MAX, t->world));
    MT_TRY(mt_allreduce(&t->dispatch.bytes_sent, &t->a2a_bytes, 1, MPI_INT64_T, MPI_SUM,
                        t->world));
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
    /* metrics.jsonl must stay JSON: a non-finite figure is null */
    char aux[40] = "null", imb[40] = "null";
    if (isfinite(t->aux))
        snprintf(aux, sizeof aux, "%.9g", t->aux);
    if (isfinite(t->imbalance))
        snprintf(imb, sizeof imb, "%.6f", t->imbalance);
    snprintf(json, jcap, ", \"aux_loss\": %s, \"expert_load_min\": %lld, "
             "\"expert_load_max\": %lld, \"expert_load_imbalance\": %s, "
             "\"tokens_dropped\": %lld, \"a2a_bytes\": %lld, \"a2a_s\": %.6f",
             aux, (long long)t->load_min, (long long)t->load_max, imb,
             (long long)t->dropped, (long long)t->a2a_bytes, t->a2a_seconds);
}

void mt_train_moe_bytes(const mt_train_moe_t *t, const mt_model_t *m, double *params_own,
                        double *params_work, double *grads_own, double *grads_work,
                        double *activations)
{
    if (!t->on)
        return;
    *activations += 4.0 * (double)mt_moe_act_numel(m);
    if (t->ep > 1) /* the bf16 wire's row buffers (moe_dispatch.c; 0 before the first step) */
        *activations += 2.0 * (double)(t->dispatch.s16_cap + t->dispatch.r16_cap);
    if (!t->sharded) { /* the experts' arena: bf16 bits under bf16 storage */
        *params_own += (m->bf16_storage ? 2.0 : 4.0) * (double)t->view.numel;
        *grads_own += 4.0 * (double)t->view.numel;
        return;
    }
    double ps, pw, gs, gw;
    mt_fsdp_bytes(&t->fsdp, &ps, &pw, &gs, &gw);
    *params_own += ps, *params_work += pw, *grads_own += gs, *grads_work += gw;
}
