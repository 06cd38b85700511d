/* fsdp_layout.c: the sharded state of mt_fsdp (mt_fsdp.h): the
 * options a config implies, how large the working buffers are (the ring
 * of slots fsdp.c's opening comment describes), the shard layout of every
 * unit (cut at row starts), the buffers themselves and NCCL's pad, and
 * the initial weights of the shards.  It starts no collective: gathering
 * and reducing the units, step by step, are fsdp.c's. */
#include <config.h>

#include "mt_fsdp.h"
#include "fsdp_internal.h"

#include <stdlib.h>
#include <string.h>

#include "mt_stage.h"
#ifdef MT_HAVE_NCCL
#include "mt_nccl.h"
#endif

static int64_t ring_slot_numel(const int64_t *unit_lo, int nunits, bool tied)
{
    int64_t big = 0;
    for (int u = 0; u < nunits; u++)
        if (mt_fsdp_slot(u, tied) < 2 && unit_lo[u + 1] - unit_lo[u] > big)
            big = unit_lo[u + 1] - unit_lo[u];
    return big;
}

static bool grads_in_ring(const mt_fsdp_options_t *o)
{
    return o->shard_grads && !o->pipeline && !(o->defer_grad_sync && o->accum > 1);
}

void mt_fsdp_work_numel(const int64_t *unit_lo, int nunits, bool tied,
                        const mt_fsdp_options_t *o, int64_t owned, int64_t *p_work,
                        int64_t *g_work, int64_t *rs_tmp)
{
    int64_t numel = unit_lo[nunits];
    int64_t ring = 2 * ring_slot_numel(unit_lo, nunits, tied) + (tied ? unit_lo[1] : 0);
    *p_work = !o->shard_params ? 0 : o->reshard_after_forward && !o->pipeline ? ring : numel;
    *g_work = !o->shard_grads ? 0 : grads_in_ring(o) ? ring : numel;
    *rs_tmp = grads_in_ring(o) && o->accum > 1 ? owned : 0;
}

bool mt_fsdp_options_from_config(const mt_config_t *cfg, mt_fsdp_options_t *o)
{
    const mt_distributed_config_t *d = &cfg->distributed;
    memset(o, 0, sizeof *o);
    o->accum = cfg->derived.grad_accum_steps;
    o->reshard_after_forward = true;
    bool sharded = false;
    if (d->strategy == MT_STRATEGY_FSDP2) {
        o->shard_grads = o->shard_params = true;
        o->reshard_after_forward = d->reshard_after_forward;
        o->prefetch = o->overlap_reduce = o->overlap_gather = true;
        o->defer_grad_sync = d->defer_fsdp_grad_sync;
        sharded = cfg->derived.dp_shard * d->cp_size > 1;
    } else if (d->strategy == MT_STRATEGY_MEGATRON_FSDP) {
        o->shard_grads = d->zero_dp_strategy >= 2;
        o->shard_params = d->zero_dp_strategy >= 3;
        o->prefetch = o->overlap_gather = d->overlap_param_gather;
        o->overlap_reduce = d->overlap_grad_reduce;
        sharded = d->zero_dp_strategy >= 1 && cfg->derived.dp_size * d->cp_size > 1;
    }
    /* bf16 compute: the trainer keeps the fp32 master weights of unsharded
     * parameters apart from the arena (train_mp.c), so every gather carries
     * bf16 values: sharded ones from the fp32 shards, rounded on the way */
    bool bf16 = d->mp_policy.param_dtype == MT_DTYPE_BFLOAT16;
    o->masters_apart = bf16 && !o->shard_params;
    o->gather_bf16 = bf16;
    o->reduce_bf16 = d->mp_policy.reduce_dtype == MT_DTYPE_BFLOAT16;
    return sharded;
}

/* Smallest row start at or after flat offset t. */
static int64_t row_start_at_or_after(const mt_model_t *m, int64_t t)
{
    for (int i = 0; i < m->nparams; i++) {
        const mt_param_t *p = &m->params[i];
        int64_t cols = p->ndim > 1 ? p->shape[1] : 1;
        if (t < p->offset + p->numel) {
            int64_t row = t <= p->offset ? 0 : (t - p->offset + cols - 1) / cols;
            return p->offset + row * cols;
        }
    }
    return m->numel;
}

static mt_status_t partition(mt_fsdp_t *f)
{
    mt_model_t *m = f->model;
    int n = f->nshard, U = f->nunits;
    f->counts = malloc(sizeof(int) * (size_t)(U * n));
    f->displs = malloc(sizeof(int) * (size_t)(U * n));
    f->seg = calloc((size_t)U, sizeof *f->seg);
    if (!f->counts || !f->displs || !f->seg)
        MT_FAIL(MT_ERR_NOMEM, "shard layout");
    f->owned = 0;
    for (int u = 0; u < U; u++) {
        int64_t lo = m->unit_lo[u], hi = m->unit_lo[u + 1], prev = lo;
        if (hi - lo > 2147483647LL)
            MT_FAIL(MT_ERR_UNSUPPORTED, "unit %d has %lld elements: sharding it needs 64-bit MPI "
                    "counts (MPI-4 large counts), not in this release", u, (long long)(hi - lo));
        for (int r = 0; r < n; r++) {
            int64_t end = r == n - 1 ? hi : row_start_at_or_after(m, lo + (hi - lo) * (r + 1) / n);
            if (end > hi)
                end = hi;
            if (end < prev)
                end = prev;
            f->displs[u * n + r] = (int)(prev - lo);
            f->counts[u * n + r] = (int)(end - prev);
            if (r == f->rank) {
                f->seg[u].offset = prev;
                f->seg[u].count = end - prev;
                f->seg[u].state = f->owned;
                f->owned += end - prev;
            }
            prev = end;
        }
    }
    return MT_OK;
}

#ifdef MT_HAVE_NCCL
/* NCCL when the shard group (and under HSDP the replicate group) has a
 * communicator: device memory only, no host buffers; the pad holds one
 * unit's parts padded to its largest, in the wire's element (2 bytes when
 * every use is bf16: the gathers, and the reductions, zero 1's fp32
 * all-reduce running in place). */
static mt_status_t use_nccl(mt_fsdp_t *f, MPI_Comm shard, MPI_Comm replicate)
{
    const mt_fsdp_options_t *opt = &f->opt;
    if (f->nshard == 1 || !mt_nccl_for(shard) ||
        (f->nrep > 1 && !mt_nccl_for(replicate)))
        return MT_OK;
    f->nccl = mt_nccl_for(shard);
    f->nccl_rep = f->nrep > 1 ? mt_nccl_for(replicate) : NULL;
    int U = f->nunits;
    size_t most = 1, shard_most = 1;
    for (int i = 0; i < U * f->nshard; i++) /* nshard x the largest part of a unit */
        most = (size_t)f->counts[i] * (size_t)f->nshard > most
                   ? (size_t)f->counts[i] * (size_t)f->nshard : most;
    for (int u = 0; u < U; u++)
        shard_most = (size_t)f->seg[u].count > shard_most ? (size_t)f->seg[u].count : shard_most;
    size_t el = opt->gather_bf16 && (opt->reduce_bf16 || !opt->shard_grads) ? 2 : 4;
    f->p_ev = calloc((size_t)U, sizeof *f->p_ev), f->g_ev = calloc((size_t)U, sizeof *f->g_ev);
    f->rep_early = calloc((size_t)U, sizeof *f->rep_early);
    f->pad_bytes = el * most;
    if (!f->p_ev || !f->g_ev || !f->rep_early || !(f->pad = f->be->device_alloc(f->pad_bytes)) ||
        (f->nccl_rep && opt->reduce_bf16 &&
         !(f->rep_pad = f->be->device_alloc(sizeof(uint16_t) * shard_most))))
        MT_FAIL(MT_ERR_NOMEM, "device space for the NCCL collectives: %zu bytes", f->pad_bytes);
    return MT_OK;
}
#else
static mt_status_t use_nccl(mt_fsdp_t *f, MPI_Comm shard, MPI_Comm replicate)
{
    (void)f, (void)shard, (void)replicate;
    return MT_OK;
}
#endif

mt_status_t mt_fsdp_init(mt_fsdp_t *f, mt_model_t *m, MPI_Comm shard, MPI_Comm replicate,
                         const mt_fsdp_options_t *opt)
{
    memset(f, 0, sizeof *f);
    f->model = m, f->opt = *opt, f->shard = shard, f->replicate = replicate;
    if (opt->pipeline)
        f->opt.reshard_after_forward = false;
    f->nunits = m->nunits;
    f->nrep = 1;
    MT_MPI_TRY(MPI_Comm_size(shard, &f->nshard));
    MT_MPI_TRY(MPI_Comm_rank(shard, &f->rank));
    if (replicate != MPI_COMM_NULL)
        MT_MPI_TRY(MPI_Comm_size(replicate, &f->nrep));
    if (opt->shard_params && !opt->shard_grads)
        MT_FAIL(MT_ERR_RANGE, "sharded parameters need sharded gradients");
    if ((m->param_mem != NULL) == opt->shard_params || (m->grad_mem != NULL) == opt->shard_grads)
        MT_FAIL(MT_ERR_RANGE, "the model's arenas do not match the sharding (mt_model_init_ex)");
    if (opt->gather_bf16 && !opt->shard_params && !opt->masters_apart)
        MT_FAIL(MT_ERR_RANGE, "bf16 parameter all-gathers need sharded parameters: unsharded, "
                "the gathered rows are the float32 master weights themselves");
    f->ring = grads_in_ring(opt);
    MT_TRY(partition(f));

    int U = f->nunits;
    mt_fsdp_work_numel(m->unit_lo, U, m->tied, opt, f->owned, &f->p_work_numel, &f->g_work_numel,
                       &f->rs_tmp_numel);
    size_t own = (size_t)(f->owned > 0 ? f->owned : 1);
    f->be = m->be;
    if (opt->shard_params)
        f->p_shard = f->be->device_alloc(sizeof(float) * own);
    if (opt->shard_grads)
        f->g_shard = f->be->device_alloc(sizeof(float) * own);
    if (f->p_work_numel) /* gathered units: bf16 bits under bf16 storage */
        f->p_work = f->be->device_alloc(mt_act_bytes(m, f->p_work_numel));
    if (f->g_work_numel)
        f->g_work = f->be->device_alloc(sizeof(float) * (size_t)f->g_work_numel);
    if (f->rs_tmp_numel)
        f->rs_tmp = f->be->device_alloc(sizeof(float) * (size_t)f->rs_tmp_numel);
    MT_TRY(use_nccl(f, shard, replicate));
    if (mt_stage_needed(f->be) && !f->nccl) {
        size_t whole = sizeof(float) * (size_t)(m->numel > 0 ? m->numel : 1);
        if (!(f->h_param = malloc(whole)) || !(f->h_grad = malloc(whole)) ||
            (opt->shard_grads && !(f->h_own = malloc(sizeof(float) * own))))
            MT_FAIL(MT_ERR_NOMEM, "host staging buffers for the sharded collectives: 2 x %lld "
                    "+ %lld floats", (long long)m->numel, (long long)f->owned);
    }
    if ((opt->gather_bf16 || opt->reduce_bf16) && !f->nccl) {
        size_t whole = sizeof(uint16_t) * (size_t)(m->numel > 0 ? m->numel : 1);
        MT_TRY(mt_bf16_comm_init(&f->bf16));
        if ((opt->gather_bf16 && !(f->w_param = malloc(whole))) ||
            (opt->reduce_bf16 && !(f->w_grad = malloc(whole))) ||
            (opt->reduce_bf16 && opt->shard_grads && !(f->w_own = malloc(sizeof(uint16_t) * own))))
            MT_FAIL(MT_ERR_NOMEM, "host buffers for the bf16 collectives: %lld + %lld bf16 values",
                    (long long)m->numel, (long long)f->owned);
    }
    f->p_at = calloc((size_t)U, sizeof *f->p_at);
    f->g_at = calloc((size_t)U, sizeof *f->g_at);
    f->p_state = calloc((size_t)U, sizeof *f->p_state);
    f->g_pending = calloc((size_t)U, sizeof *f->g_pending);
    f->g_into_tmp = calloc((size_t)U, sizeof *f->g_into_tmp);
    f->p_req = malloc(sizeof *f->p_req * (size_t)U);
    f->g_req = malloc(sizeof *f->g_req * (size_t)U);
    if ((opt->shard_params && !f->p_shard) || (opt->shard_grads && !f->g_shard) ||
        (f->p_work_numel && !f->p_work) || (f->g_work_numel && !f->g_work) ||
        (f->rs_tmp_numel && !f->rs_tmp) || !f->p_at || !f->g_at || !f->p_state ||
        !f->g_pending || !f->g_into_tmp || !f->p_req || !f->g_req)
        MT_FAIL(MT_ERR_NOMEM, "sharded state: %lld owned elements, %lld + %lld working",
                (long long)f->owned, (long long)f->p_work_numel, (long long)f->g_work_numel);

    int64_t ring = ring_slot_numel(m->unit_lo, U, m->tied);
    for (int u = 0; u < U; u++) {
        mt_segment_t *s = &f->seg[u];
        int64_t lo = m->unit_lo[u];
        int64_t slot_at = (int64_t)mt_fsdp_slot(u, m->tied) * ring;
        if (!opt->shard_params)
            f->p_at[u] = mt_act_at(m, m->param_mem, lo);
        else
            f->p_at[u] = mt_act_at(m, f->p_work, f->opt.reshard_after_forward ? slot_at : lo);
        if (!opt->shard_grads)
            f->g_at[u] = m->grad_mem + lo;
        else
            f->g_at[u] = f->g_work + (f->ring ? slot_at : lo);
        s->param = opt->shard_params ? f->p_shard + s->state
                                     : mt_act_at(m, m->param_mem, s->offset);
        s->grad = opt->shard_grads ? f->g_shard + s->state : m->grad_mem + s->offset;
    }
    mt_fsdp_attach(f);
    return MT_OK;
}

void mt_fsdp_free(mt_fsdp_t *f)
{
    if (f->model && f->model->hook_ctx == f) {
        f->model->unit_hook = NULL;
        f->model->hook_ctx = NULL;
    }
    free(f->counts), free(f->displs), free(f->seg);
    if (f->be) {
        f->be->device_free(f->p_shard), f->be->device_free(f->g_shard);
        f->be->device_free(f->p_work), f->be->device_free(f->g_work);
        f->be->device_free(f->rs_tmp);
        f->be->device_free(f->pad), f->be->device_free(f->rep_pad);
    }
    free(f->p_ev), free(f->g_ev), free(f->rep_early);
    free(f->h_param), free(f->h_grad), free(f->h_own);
    free(f->w_param), free(f->w_grad), free(f->w_own);
    mt_bf16_comm_free(&f->bf16);
    free(f->p_at), free(f->g_at), free(f->p_state), free(f->g_pending), free(f->g_into_tmp);
    free(f->p_req), free(f->g_req);
    memset(f, 0, sizeof *f);
}

void mt_fsdp_init_weights(mt_fsdp_t *f, uint64_t seed)
{
    if (!f->opt.shard_params) {
        mt_model_init_weights(f->model, seed);
        return;
    }
    for (int u = 0; u < f->nunits; u++)
        mt_model_init_range_device(f->model, seed, f->seg[u].offset,
                                   f->seg[u].offset + f->seg[u].count, f->seg[u].param);
}

void mt_fsdp_bytes(const mt_fsdp_t *f, double *params_shard, double *params_work,
                   double *grads_shard, double *grads_work)
{
    double numel = (double)f->model->numel, own = (double)f->owned;
    double el = f->model->bf16_storage ? 2.0 : 4.0; /* the arena's and the gathered units' */
    *params_shard = f->opt.shard_params ? 4.0 * own : el * numel;
    /* NCCL's pad is not a parameter buffer: meshtrain-plan counts it with
     * the device's NCCL wire buffers, and the pool's peak has it */
    *params_work = el * (double)f->p_work_numel;
    *grads_shard = 4.0 * (f->opt.shard_grads ? own : numel);
    *grads_work = 4.0 * (double)(f->g_work_numel + f->rs_tmp_numel);
}
