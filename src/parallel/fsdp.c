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
 * place in p_work or the arena is counted in bf16 elements (mt_act_at).
 *
 * This file runs the units' collectives through a step (the model's unit
 * hook, begin, finish, the gathers after an update); the options, the
 * buffers' sizes and the shard layout are fsdp_layout.c's. */
/* MPICH annotates MPI_STATUSES_IGNORE arguments with access sizes that
 * GCC 12 misreads as an overflow of a zero-sized region. */
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#include <config.h>

#include "mt_fsdp.h"
#include "fsdp_internal.h"

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

static int64_t unit_numel(const mt_fsdp_t *f, int u)
{
    return f->model->unit_lo[u + 1] - f->model->unit_lo[u];
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
        if (v != u && mt_fsdp_slot(v, tied) == mt_fsdp_slot(u, tied))
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

void mt_fsdp_attach(mt_fsdp_t *f)
{
    for (int u = 0; u < f->nunits; u++) {
        f->p_req[u] = f->g_req[u] = MPI_REQUEST_NULL;
        /* Unsharded parameters are whole already; deferred gradients sit
         * in place for the whole step. */
        f->p_state[u] = f->opt.shard_params ? RELEASED : READY;
        if (f->opt.shard_params)
            point(f, u, NULL, false);
        if (f->opt.shard_grads)
            point(f, u, f->ring ? NULL : f->g_at[u], true);
    }
    f->model->unit_hook = hook;
    f->model->hook_ctx = f;
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
