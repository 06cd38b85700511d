/* fsdp.c: sharded data parallelism over the model's units (mt_fsdp.h).
 *
 * Working buffers.  With resharding, gathered parameters live in a ring of
 * two slots, each the size of the largest unit: unit u uses slot u % 2, so
 * the unit computing and the one prefetched next (u + 1 in forward, u - 1
 * in backward) never share a slot, and the slot's previous tenant has been
 * freed by then.  A tied embedding is also the lm_head, used at both ends
 * of the step, so it gets a third slot of its own and stays gathered from
 * the first forward to its backward.  Without resharding every unit keeps
 * its place in a full-size buffer until its backward.  Unit gradients use
 * the same ring (a slot is reused only after its reduce-scatter is waited
 * for), except when accumulation is deferred: then the unsharded
 * gradients of every unit accumulate in a full-size buffer and are
 * reduce-scattered on the last micro-step only.
 *
 * Shards and working buffers are the backend's memory (device_alloc).  On
 * a backend whose memory is not host memory the collectives are staged
 * (mt_stage.h): a unit's operand is copied to its own region of a host
 * buffer when its collective starts and the result copied back after the
 * wait that completes it, so prefetching and overlapped reductions keep
 * their order.  On the CPU backend MPI works on the buffers directly.
 *
 * bf16 messages (gather_bf16, reduce_bf16) are rounded into their own host
 * regions (w_param, w_grad, w_own, laid out like the staging buffers) when
 * the collective starts, from the backend's memory through the staging
 * buffer when it needs staging, and widened back after the wait, so every
 * request in flight still owns its buffer until it completes.  Under bf16
 * storage (mt_fsdp.h) the widening is a copy of the bits, and a unit's
 * place in p_work or the arena is counted in bf16 elements (mt_act_at). */
/* MPICH annotates MPI_STATUSES_IGNORE arguments with access sizes that
 * GCC 12 misreads as an overflow of a zero-sized region. */
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#include <config.h>

#include "mt_fsdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt_comm.h"
#include "mt_stage.h"
#ifdef MT_HAVE_NCCL
#include "mt_cuda.h"
#include "mt_nccl.h"
#define CS ((cudaStream_t)mt_cuda_stream())
#endif

enum { RELEASED, GATHERING, READY };

/* Slot of a unit in the ring: 0 or 1, or 2 for a tied embedding. */
static int slot_of(int u, bool tied) { return tied && u == 0 ? 2 : u % 2; }

static int64_t unit_numel(const mt_fsdp_t *f, int u)
{
    return f->model->unit_lo[u + 1] - f->model->unit_lo[u];
}

static int64_t ring_slot_numel(const int64_t *unit_lo, int nunits, bool tied)
{
    int64_t big = 0;
    for (int u = 0; u < nunits; u++)
        if (slot_of(u, tied) < 2 && unit_lo[u + 1] - unit_lo[u] > big)
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

/* An MPI failure inside a unit hook: the other ranks are already in the
 * next collective, so there is no agreeing; abort the job with the reason. */
static void note_error(mt_fsdp_t *f, int rc, const char *what, int unit)
{
    char msg[160];
    snprintf(msg, sizeof msg, "%s of unit %d", what, unit);
    mt_comm_fatal(f->shard, rc, msg);
}

/* Point the model's parameters (or gradients) of unit u at base, the
 * unit's first element; NULL detaches them. */
static void point(mt_fsdp_t *f, int u, float *base, bool grads)
{
    mt_model_t *m = f->model;
    int64_t lo = m->unit_lo[u], hi = m->unit_lo[u + 1];
    for (int i = 0; i < m->nparams; i++) {
        mt_param_t *p = &m->params[i];
        if (p->offset < lo || p->offset >= hi)
            continue;
        if (grads) /* (float32 always; parameters bf16 bits under bf16 storage) */
            p->grad = base ? base + (p->offset - lo) : NULL;
        else
            p->data = base ? mt_act_at(m, base, p->offset - lo) : NULL;
    }
}

/* ---- parameters ---- */

static void gather(mt_fsdp_t *f, int u)
{
    if (u < 0 || u >= f->nunits || f->p_state[u] != RELEASED)
        return;
    const mt_segment_t *s = &f->seg[u];
    int64_t lo = f->model->unit_lo[u], mine = lo + f->displs[u * f->nshard + f->rank];
    int rc;
#ifdef MT_HAVE_NCCL
    if (f->nccl) { /* on device memory, the unit's parts padded to equal counts */
        /* under bf16 storage the unit takes the wire's bits, and unsharded
         * parameters send their own rows' bits as they are */
        int how = f->opt.gather_bf16 ? MT_NCCL_BF16 : 0;
        if (how && f->model->bf16_storage)
            how |= MT_NCCL_UNIT_BITS | (f->opt.shard_params ? 0 : MT_NCCL_MINE_BITS);
        if (mt_nccl_all_gatherv(f->nccl, s->param, f->p_at[u], f->counts + u * f->nshard,
                                f->displs + u * f->nshard, f->pad, how, CS) != MT_OK)
            note_error(f, MPI_ERR_OTHER, "parameter all-gather (NCCL)", u);
        f->p_ev[u] = mt_nccl_last_event(f->nccl);
        f->p_state[u] = GATHERING;
        return;
    }
#endif
    if (f->w_param) { /* this rank's part, rounded, into its place in the unit's bf16 region */
        if (f->model->bf16_storage && !f->opt.shard_params) /* the arena's bits already */
            f->be->copy_to_host(f->w_param + mine, s->param, sizeof(uint16_t) * (size_t)s->count);
        else
            mt_bf16_pack_from(f->be, f->w_param + mine, s->param,
                              f->h_param ? f->h_param + mine : NULL, s->count);
        rc = MPI_Iallgatherv(MPI_IN_PLACE, (int)s->count, f->bf16.type, f->w_param + lo,
                             f->counts + u * f->nshard, f->displs + u * f->nshard, f->bf16.type,
                             f->shard, &f->p_req[u]);
        if (rc != MPI_SUCCESS)
            note_error(f, rc, "parameter all-gather (bf16)", u);
        f->p_state[u] = GATHERING;
        return;
    }
    void *send = f->opt.shard_params ? (void *)s->param : MPI_IN_PLACE;
    float *recv = f->p_at[u];
    if (f->h_param) { /* this rank's part into its place in the unit's host region */
        recv = f->h_param + lo;
        f->be->copy_to_host(f->h_param + mine, s->param, sizeof(float) * (size_t)s->count);
        send = MPI_IN_PLACE;
    }
    rc = MPI_Iallgatherv(send, (int)s->count, MPI_FLOAT, recv, f->counts + u * f->nshard,
                             f->displs + u * f->nshard, MPI_FLOAT, f->shard, &f->p_req[u]);
    if (rc != MPI_SUCCESS)
        note_error(f, rc, "parameter all-gather", u);
    f->p_state[u] = GATHERING;
}

static void wait_gathered(mt_fsdp_t *f, int u)
{
    if (f->p_state[u] == RELEASED)
        gather(f, u);
    if (f->p_state[u] == GATHERING) {
#ifdef MT_HAVE_NCCL
        if (f->nccl) { /* the compute stream waits for this gather, not the host */
            if (mt_nccl_join_event(f->p_ev[u], CS) != MT_OK)
                note_error(f, MPI_ERR_OTHER, "waiting for the parameter all-gather (NCCL)", u);
            f->p_state[u] = READY;
            if (f->opt.shard_params)
                point(f, u, f->p_at[u], false);
            return;
        }
#endif
        if (mt_wait_all(1, &f->p_req[u]) != MT_OK)
            note_error(f, MPI_ERR_OTHER, "waiting for the parameter all-gather", u);
        int64_t lo = f->model->unit_lo[u];
        if (f->w_param && f->model->bf16_storage) /* bf16 bits where they belong */
            f->be->copy_to_device(f->p_at[u], f->w_param + lo,
                                  sizeof(uint16_t) * (size_t)unit_numel(f, u));
        else if (f->w_param)
            mt_bf16_unpack_to(f->be, f->p_at[u], f->w_param + lo,
                              f->h_param ? f->h_param + lo : NULL, unit_numel(f, u));
        else if (f->h_param)
            f->be->copy_to_device(f->p_at[u], f->h_param + f->model->unit_lo[u],
                                  sizeof(float) * (size_t)unit_numel(f, u));
        f->p_state[u] = READY;
        if (f->opt.shard_params)
            point(f, u, f->p_at[u], false);
    }
}

static void release(mt_fsdp_t *f, int u)
{
    if (!f->opt.shard_params || f->p_state[u] != READY)
        return;
    f->p_state[u] = RELEASED;
    point(f, u, NULL, false);
}

/* ---- gradients ---- */

/* Where unit u's reduce-scatter result belongs: its gradient shard, or
 * rs_tmp when later micro-steps add onto the shard. */
static float *reduced_at(const mt_fsdp_t *f, int u)
{
    const mt_segment_t *s = &f->seg[u];
    return f->g_into_tmp[u] ? f->rs_tmp + s->state : s->grad;
}

static void reduce(mt_fsdp_t *f, int u)
{
    const mt_segment_t *s = &f->seg[u];
    float *g = f->g_at[u];
    int rc;
#ifdef MT_HAVE_NCCL
    if (f->nccl) {
        mt_status_t st;
        if (!f->opt.shard_grads) {
            st = mt_nccl_all_reduce_f32(f->nccl, g, (size_t)unit_numel(f, u), f->pad,
                                        f->opt.reduce_bf16, CS);
        } else {
            f->g_into_tmp[u] = f->ring && f->micro > 0;
            st = mt_nccl_reduce_scatterv(f->nccl, g, reduced_at(f, u), f->counts + u * f->nshard,
                                         f->displs + u * f->nshard, f->pad, f->opt.reduce_bf16,
                                         CS);
        }
        if (st != MT_OK)
            note_error(f, MPI_ERR_OTHER, "gradient reduction (NCCL)", u);
        f->g_ev[u] = mt_nccl_last_event(f->nccl);
        f->g_pending[u] = true;
        /* HSDP: when the shard is final (the last micro-step, nothing to add
         * onto it), its all-reduce over the replicas follows on their stream
         * right away, behind the rest of backward; the unit's wait joins it */
        if (st == MT_OK && f->opt.shard_grads && f->nccl_rep && !f->g_into_tmp[u] &&
            f->micro == f->opt.accum - 1) {
            mt_nccl_group_t *rep = f->nccl_rep;
            const mt_segment_t *s = &f->seg[u];
            st = mt_nccl_join_event(f->g_ev[u], rep->stream);
            if (st == MT_OK)
                st = mt_nccl_all_reduce_f32(rep, s->grad, (size_t)s->count, f->rep_pad,
                                            f->opt.reduce_bf16, NULL);
            if (st != MT_OK)
                note_error(f, MPI_ERR_OTHER, "gradient shard all-reduce over dp_replicate (NCCL)",
                           u);
            f->g_ev[u] = mt_nccl_last_event(rep);
            f->rep_early[u] = true;
        }
        return;
    }
#endif
    if (f->w_grad) { /* the unit's gradients are final: round them out */
        int64_t lo = f->model->unit_lo[u];
        uint16_t *w = f->w_grad + lo;
        mt_bf16_pack_from(f->be, w, g, f->h_grad ? f->h_grad + lo : NULL, unit_numel(f, u));
        if (!f->opt.shard_grads) {
            rc = MPI_Iallreduce(MPI_IN_PLACE, w, (int)unit_numel(f, u), f->bf16.type, f->bf16.sum,
                                f->shard, &f->g_req[u]);
        } else {
            f->g_into_tmp[u] = f->ring && f->micro > 0;
            rc = MPI_Ireduce_scatter(w, f->w_own + s->state, f->counts + u * f->nshard,
                                     f->bf16.type, f->bf16.sum, f->shard, &f->g_req[u]);
        }
        if (rc != MPI_SUCCESS)
            note_error(f, rc, f->opt.shard_grads ? "gradient reduce-scatter (bf16)"
                                                 : "gradient all-reduce (bf16)", u);
        f->g_pending[u] = true;
        return;
    }
    if (f->h_grad) { /* the unit's gradients are final: copy them out */
        g = f->h_grad + f->model->unit_lo[u];
        f->be->copy_to_host(g, f->g_at[u], sizeof(float) * (size_t)unit_numel(f, u));
    }
    if (!f->opt.shard_grads) { /* zero 1: every rank keeps the whole sum */
        rc = MPI_Iallreduce(MPI_IN_PLACE, g, (int)unit_numel(f, u), MPI_FLOAT, MPI_SUM, f->shard,
                            &f->g_req[u]);
    } else {
        f->g_into_tmp[u] = f->ring && f->micro > 0;
        float *dst = f->h_own ? f->h_own + s->state : reduced_at(f, u);
        rc = MPI_Ireduce_scatter(g, dst, f->counts + u * f->nshard, MPI_FLOAT, MPI_SUM, f->shard,
                                 &f->g_req[u]);
    }
    if (rc != MPI_SUCCESS)
        note_error(f, rc, f->opt.shard_grads ? "gradient reduce-scatter" : "gradient all-reduce", u);
    f->g_pending[u] = true;
}

static void wait_reduced(mt_fsdp_t *f, int u)
{
    if (!f->g_pending[u])
        return;
    const mt_segment_t *s = &f->seg[u];
#ifdef MT_HAVE_NCCL
    if (f->nccl) {
        if (mt_nccl_join_event(f->g_ev[u], CS) != MT_OK)
            note_error(f, MPI_ERR_OTHER, "waiting for the gradient reduction (NCCL)", u);
        f->g_pending[u] = false;
        if (f->g_into_tmp[u])
            f->model->be->add_f32(s->grad, f->rs_tmp + s->state, s->count);
        return;
    }
#endif
    if (mt_wait_all(1, &f->g_req[u]) != MT_OK)
        note_error(f, MPI_ERR_OTHER, "waiting for the gradient reduction", u);
    f->g_pending[u] = false;
    if (f->w_grad && !f->opt.shard_grads)
        mt_bf16_unpack_to(f->be, f->g_at[u], f->w_grad + f->model->unit_lo[u],
                          f->h_grad ? f->h_grad + f->model->unit_lo[u] : NULL, unit_numel(f, u));
    else if (f->w_own)
        mt_bf16_unpack_to(f->be, reduced_at(f, u), f->w_own + s->state,
                          f->h_own ? f->h_own + s->state : NULL, s->count);
    else if (f->h_grad && !f->opt.shard_grads)
        f->be->copy_to_device(f->g_at[u], f->h_grad + f->model->unit_lo[u],
                              sizeof(float) * (size_t)unit_numel(f, u));
    else if (f->h_own)
        f->be->copy_to_device(reduced_at(f, u), f->h_own + f->seg[u].state,
                              sizeof(float) * (size_t)f->seg[u].count);
    if (f->g_into_tmp[u]) /* later micro-steps add onto the shard */
        f->model->be->add_f32(f->seg[u].grad, f->rs_tmp + f->seg[u].state, f->seg[u].count);
}

/* A ring slot's gradient buffer for unit u: wait until the slot's last
 * tenant is reduced, then zero it. */
static void grads_ready(mt_fsdp_t *f, int u)
{
    bool tied = f->model->tied;
    for (int v = 0; v < f->nunits; v++)
        if (v != u && slot_of(v, tied) == slot_of(u, tied))
            wait_reduced(f, v);
    wait_reduced(f, u);
    f->be->zero(f->g_at[u], sizeof(float) * (size_t)unit_numel(f, u));
    point(f, u, f->g_at[u], true);
}

static void poke(mt_fsdp_t *f)
{
    int flag;
    MPI_Testall(f->nunits, f->p_req, &flag, MPI_STATUSES_IGNORE);
    MPI_Testall(f->nunits, f->g_req, &flag, MPI_STATUSES_IGNORE);
}

static void hook(void *ctx, int u, mt_unit_event_t ev)
{
    mt_fsdp_t *f = ctx;
    int head = f->nunits - 1;
    bool tied = f->model->tied, sp = f->opt.shard_params;
    if (f->opt.pipeline) { /* gather on first use; mt_fsdp_finish does the rest */
        if (ev == MT_UNIT_PRE_FORWARD || ev == MT_UNIT_PRE_BACKWARD) {
            wait_gathered(f, u);
            if (sp && f->opt.prefetch)
                gather(f, ev == MT_UNIT_PRE_FORWARD ? u + 1 : u - 1);
        }
        poke(f);
        return;
    }
    switch (ev) {
    case MT_UNIT_PRE_FORWARD:
        wait_gathered(f, u);
        if (sp && f->opt.prefetch)
            gather(f, u + 1);
        if (tied && u == head)
            wait_gathered(f, 0);
        break;
    case MT_UNIT_POST_FORWARD:
        if (u == head) /* forward only (validation): free everything */
            for (int v = 0; v < f->nunits; v++)
                release(f, v);
        else if (f->opt.reshard_after_forward && !(tied && u == 0))
            release(f, u);
        break;
    case MT_UNIT_PRE_BACKWARD:
        wait_gathered(f, u);
        if (sp && f->opt.prefetch)
            gather(f, u - 1);
        if (f->ring && !(tied && u == 0))
            grads_ready(f, u);
        if (f->ring && tied && u == head) /* the lm_head's gradient is unit 0's */
            grads_ready(f, 0);
        break;
    case MT_UNIT_POST_BACKWARD:
        release(f, u);
        if (f->reduce_now && f->opt.overlap_reduce)
            reduce(f, u);
        else if (f->reduce_now && f->ring) { /* not overlapped: reduce before the slot moves on */
            reduce(f, u);
            wait_reduced(f, u);
        }
        break;
    }
    poke(f);
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
        f->p_req[u] = f->g_req[u] = MPI_REQUEST_NULL;
        int64_t slot_at = (int64_t)slot_of(u, m->tied) * ring;
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
        /* Unsharded parameters are whole already; deferred gradients sit
         * in place for the whole step. */
        f->p_state[u] = opt->shard_params ? RELEASED : READY;
        if (opt->shard_params)
            point(f, u, NULL, false);
        if (opt->shard_grads)
            point(f, u, f->ring ? NULL : f->g_at[u], true);
    }
    m->unit_hook = hook;
    m->hook_ctx = f;
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

mt_status_t mt_fsdp_begin(mt_fsdp_t *f, int64_t micro)
{
    for (int u = 0; u < f->nunits; u++)
        wait_reduced(f, u);
    f->micro = micro;
    bool last = micro == f->opt.accum - 1;
    /* zero 1 and deferred fsdp2 reduce on the last micro-step only; the
     * ring must reduce every micro-step (there is nowhere to keep more) */
    f->reduce_now = !f->opt.pipeline && (f->ring || last);
    if (micro == 0) {
        if (f->g_shard)
            f->be->zero(f->g_shard, sizeof(float) * (size_t)(f->owned > 0 ? f->owned : 1));
        if (f->opt.shard_grads && !f->ring)
            f->be->zero(f->g_work, sizeof(float) * (size_t)f->g_work_numel);
    }
    return MT_OK;
}

mt_status_t mt_fsdp_finish(mt_fsdp_t *f)
{
    if ((!f->opt.overlap_reduce || f->opt.pipeline) && !f->ring)
        for (int u = f->nunits - 1; u >= 0; u--)
            reduce(f, u);
    for (int u = 0; u < f->nunits; u++)
        wait_reduced(f, u);
#ifdef MT_HAVE_NCCL
    if (f->opt.shard_grads && f->nrep > 1 && f->nccl_rep) { /* HSDP over NCCL */
        for (int u = 0; u < f->nunits; u++) /* those not issued with their reduce-scatter */
            if (!f->rep_early[u])
                MT_TRY(mt_nccl_all_reduce_f32(f->nccl_rep, f->seg[u].grad,
                                              (size_t)f->seg[u].count, f->rep_pad,
                                              f->opt.reduce_bf16, CS));
        MT_TRY(mt_nccl_join(f->nccl_rep, CS));
        memset(f->rep_early, 0, sizeof *f->rep_early * (size_t)f->nunits);
    } else
#endif
    if (f->opt.shard_grads && f->nrep > 1) { /* HSDP: sum the shards across replicas */
        /* one all-reduce per unit: each count fits an int, the whole shard
         * need not */
        for (int u = 0; u < f->nunits; u++) {
            const mt_segment_t *s = &f->seg[u];
            float *g = s->grad;
            int rc;
            if (f->w_own) {
                uint16_t *w = f->w_own + s->state;
                mt_bf16_pack_from(f->be, w, s->grad, f->h_own ? f->h_own + s->state : NULL,
                                  s->count);
                rc = MPI_Iallreduce(MPI_IN_PLACE, w, (int)s->count, f->bf16.type, f->bf16.sum,
                                    f->replicate, &f->g_req[u]);
                if (rc != MPI_SUCCESS)
                    mt_comm_fatal(f->replicate, rc,
                                  "gradient shard all-reduce (bf16) over dp_replicate");
                continue;
            }
            if (f->h_own) {
                g = f->h_own + s->state;
                f->be->copy_to_host(g, s->grad, sizeof(float) * (size_t)s->count);
            }
            rc = MPI_Iallreduce(MPI_IN_PLACE, g, (int)s->count, MPI_FLOAT, MPI_SUM,
                                f->replicate, &f->g_req[u]);
            if (rc != MPI_SUCCESS)
                mt_comm_fatal(f->replicate, rc, "gradient shard all-reduce over dp_replicate");
        }
        MT_TRY(mt_wait_all(f->nunits, f->g_req));
        for (int u = 0; f->w_own && u < f->nunits; u++)
            mt_bf16_unpack_to(f->be, f->seg[u].grad, f->w_own + f->seg[u].state,
                              f->h_own ? f->h_own + f->seg[u].state : NULL, f->seg[u].count);
        for (int u = 0; f->h_own && !f->w_own && u < f->nunits; u++)
            f->be->copy_to_device(f->seg[u].grad, f->h_own + f->seg[u].state,
                                  sizeof(float) * (size_t)f->seg[u].count);
    }
    if (f->opt.pipeline) /* the update changes them: gather again next step */
        for (int u = 0; u < f->nunits; u++) {
            if (f->p_state[u] == GATHERING)
                wait_gathered(f, u);
            release(f, u);
        }
    return MT_OK;
}

mt_status_t mt_fsdp_after_update(mt_fsdp_t *f)
{
    if (f->opt.shard_params)
        return MT_OK;
    for (int u = 0; u < f->nunits; u++) {
        f->p_state[u] = RELEASED;
        gather(f, u);
    }
    if (!f->opt.overlap_gather)
        MT_TRY(mt_fsdp_sync(f));
    return MT_OK;
}

mt_status_t mt_fsdp_sync(mt_fsdp_t *f)
{
    for (int u = 0; u < f->nunits; u++)
        if (f->p_state[u] == GATHERING)
            wait_gathered(f, u);
    return MT_OK;
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
