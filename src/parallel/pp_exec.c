/* pp_exec.c: runs a rank's pipeline action list (mt_pp_exec.h).
 *
 * Slots.  A stage-microbatch takes a slot at its forward (or at the
 * receive of its input) and gives it back after its last backward pass
 * (BW, or W when the backward is split).  A slot's buffers are laid out
 * for the chunk that holds it (mt_model_use_slot), so the executor lays
 * the slot out again before every action.  Stages next to each other on
 * this rank (the bottom of v_schedule's V) pass the activation and the
 * gradient by copying from one slot into the other right after the
 * producing pass, while both are held.
 *
 * A MoE model's messages carry the micro-batch's routing totals
 * (mt_model_t.route, doubles as pairs of floats) after the activation or
 * gradient: partial sums forward, the totals the last stage formed back. */
/* MPICH annotates MPI_STATUSES_IGNORE arguments with access sizes that
 * GCC 12 misreads as an overflow of a zero-sized region. */
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#include <config.h>

#include "mt_pp_exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mt_clock.h"
#include "mt_comm.h"
#include "pp_link.h"
#ifdef MT_HAVE_CUDA
#include "cuda_internal.h"
#endif

void mt_pp_stage_layers(const mt_config_t *cfg, int s, int *lo, int *hi)
{
    int64_t L = cfg->model.num_hidden_layers, S = cfg->derived.num_stages;
    const mt_opt_int_t *k = &cfg->distributed.pipeline.layers_per_stage;
    if (S <= 1) {
        *lo = 0, *hi = (int)L;
    } else if (cfg->distributed.pipeline.balanced_split) {
        int64_t base = L / S, extra = L % S;
        *lo = (int)(s * base + (s < extra ? s : extra));
        *hi = *lo + (int)base + (s < extra ? 1 : 0);
    } else if (k->set) {
        *lo = (int)(s * k->value);
        *hi = s == S - 1 ? (int)L : (int)((s + 1) * k->value);
    } else {
        *lo = (int)(s * (L / S)), *hi = (int)((s + 1) * (L / S));
    }
}

mt_status_t mt_pp_exec_init(mt_pp_exec_t *x, const mt_config_t *cfg, MPI_Comm pp)
{
    memset(x, 0, sizeof *x);
    x->pp = pp;
    MT_MPI_TRY(MPI_Comm_rank(pp, &x->rank));
    const mt_pipeline_config_t *pl = &cfg->distributed.pipeline;
    int p = (int)cfg->distributed.pp_size, v = (int)cfg->derived.stages_per_rank;
    int M = (int)cfg->derived.num_microbatches;
    MT_TRY(mt_pp_schedule_build(pl->pp_schedule, p, v, M, &x->sched));
    int S = x->sched.num_stages;
    x->chunk_of_stage = malloc(sizeof(int) * (size_t)S);
    x->stage_of_chunk = malloc(sizeof(int) * (size_t)S);
    x->layer_lo = malloc(sizeof(int) * (size_t)S);
    x->layer_hi = malloc(sizeof(int) * (size_t)S);
    int cap = S * M + 1;
    x->slot_of = malloc(sizeof(int) * (size_t)(S * M));
    x->slot_busy = calloc((size_t)cap, sizeof(bool));
    if (!x->chunk_of_stage || !x->stage_of_chunk || !x->layer_lo || !x->layer_hi ||
        !x->slot_of || !x->slot_busy)
        MT_FAIL(MT_ERR_NOMEM, "pipeline tables");
    for (int s = 0; s < S; s++) {
        x->chunk_of_stage[s] = -1;
        if (mt_pp_stage_rank(pl->pp_schedule, p, s) != x->rank)
            continue;
        x->chunk_of_stage[s] = x->nchunks;
        x->stage_of_chunk[x->nchunks] = s;
        mt_pp_stage_layers(cfg, s, &x->layer_lo[x->nchunks], &x->layer_hi[x->nchunks]);
        x->nchunks++;
    }

    /* Count the slots: the bookkeeping of a run, without compute. */
    for (int i = 0; i < S * M; i++)
        x->slot_of[i] = -1;
    int held = 0, peak = 0;
    for (int i = 0; i < x->sched.num_actions[x->rank]; i++) {
        const mt_pp_action_t *a = &x->sched.actions[x->rank][i];
        int c = x->chunk_of_stage[a->stage], idx = c * M + a->microbatch;
        bool next_local = a->stage + 1 < S && x->chunk_of_stage[a->stage + 1] >= 0;
        if ((a->kind == MT_PP_FORWARD || a->kind == MT_PP_RECV_ACT) && x->slot_of[idx] < 0)
            x->slot_of[idx] = 1, held++;
        if (a->kind == MT_PP_FORWARD && next_local) {
            int idx2 = x->chunk_of_stage[a->stage + 1] * M + a->microbatch;
            if (x->slot_of[idx2] < 0)
                x->slot_of[idx2] = 1, held++;
        }
        if (held > peak)
            peak = held;
        if (a->kind == MT_PP_BACKWARD || a->kind == MT_PP_BACKWARD_WEIGHT)
            held--;
    }
    x->nslots = peak > 0 ? peak : 1;
    return MT_OK;
}

void mt_pp_exec_free(mt_pp_exec_t *x)
{
    mt_pp_link_free(x);
#ifdef MT_HAVE_CUDA
    for (int i = 0; i < x->nev; i++)
        cudaEventDestroy((cudaEvent_t)x->ev[i]);
#endif
    free(x->ev);
    mt_pp_sched_free(&x->sched);
    free(x->chunk_of_stage), free(x->stage_of_chunk), free(x->layer_lo), free(x->layer_hi);
    free(x->slot_of), free(x->slot_busy), free(x->handoff);
    memset(x, 0, sizeof *x);
}

void mt_pp_exec_part(const mt_pp_exec_t *x, mt_model_part_t *part)
{
    memset(part, 0, sizeof *part);
    part->nchunks = x->nchunks;
    part->layer_lo = x->layer_lo;
    part->layer_hi = x->layer_hi;
    part->embed = x->chunk_of_stage[0] >= 0;
    part->head = x->chunk_of_stage[x->sched.num_stages - 1] >= 0;
    part->nslots = x->nslots;
    part->split_backward = x->sched.split_backward;
}

/* The slot of (chunk c, microbatch mb), handing out a free one if it has
 * none. */
static mt_status_t acquire(mt_pp_exec_t *x, int c, int mb, int *slot)
{
    int idx = c * x->sched.m + mb;
    if (x->slot_of[idx] >= 0) {
        *slot = x->slot_of[idx];
        return MT_OK;
    }
    for (int k = 0; k < x->nslots; k++) {
        if (x->slot_busy[k])
            continue;
        x->slot_busy[k] = true;
        x->slot_of[idx] = *slot = k;
        return MT_OK;
    }
    MT_FAIL(MT_ERR_INTERNAL, "pipeline: no free activation slot of %d for stage %d microbatch %d",
            x->nslots, x->stage_of_chunk[c], mb);
}

/* Give the slot back; slot_of keeps naming it for a send that follows. */
static void release(mt_pp_exec_t *x, int c, int mb)
{
    x->slot_busy[x->slot_of[c * x->sched.m + mb]] = false;
}

/* Lay out and return the slot that (c, mb) holds. */
static int use(mt_pp_exec_t *x, mt_model_t *m, int c, int mb)
{
    int k = x->slot_of[c * x->sched.m + mb];
    mt_model_use_slot(m, k, c);
    return k;
}

/* The routing totals of the slot in use into the slot of (c, mb), which
 * the caller then lays out. */
static void pass_route(mt_model_t *m, const void *from)
{
    if (m->nroute > 0)
        memcpy(m->route, from, sizeof(double) * (size_t)m->nroute);
}

/* The pass an action is: 0 F, 1 B, 2 W, 3 BW, -1 a transfer. */
static int pass_of(mt_pp_action_kind_t k)
{
    return k == MT_PP_FORWARD ? 0 : k == MT_PP_BACKWARD_INPUT ? 1 : k == MT_PP_BACKWARD_WEIGHT ? 2
         : k == MT_PP_BACKWARD ? 3 : -1;
}

/* Pass timing.  On the CPU a pass's host time is its compute.  A CUDA
 * backend's host only enqueues (with NCCL it never waits), so there each
 * pass is timed by a pair of events on the compute stream, read when the
 * run's work is done. */
static bool device_timed(const mt_backend_t *be)
{
#ifdef MT_HAVE_CUDA
    return be->device_alloc == mt_backend_cuda()->device_alloc; /* either CUDA table, or a
                                                                  * copy (bf16_passes) */
#else
    (void)be;
    return false;
#endif
}

static mt_status_t timing_events(mt_pp_exec_t *x)
{
    int need = 2 * x->sched.num_actions[x->rank];
    if (x->nev >= need)
        return MT_OK;
    void **e = realloc(x->ev, sizeof *e * (size_t)need);
    if (!e)
        MT_FAIL(MT_ERR_NOMEM, "pipeline timing events");
    x->ev = e;
#ifdef MT_HAVE_CUDA
    for (; x->nev < need; x->nev++)
        MT_CUDA_TRY(cudaEventCreate((cudaEvent_t *)&x->ev[x->nev]));
#endif
    return MT_OK;
}

static void time_mark(mt_pp_exec_t *x, int i)
{
#ifdef MT_HAVE_CUDA
    cudaEventRecord((cudaEvent_t)x->ev[i], (cudaStream_t)mt_cuda_stream());
#else
    (void)x, (void)i;
#endif
}

/* After the run's work: each pass's time from its events. */
static mt_status_t time_collect(mt_pp_exec_t *x)
{
#ifdef MT_HAVE_CUDA
    MT_TRY(mt_cuda_synchronize());
    for (int i = 0; i < x->sched.num_actions[x->rank]; i++) {
        int pass = pass_of(x->sched.actions[x->rank][i].kind);
        float ms = 0;
        if (pass < 0)
            continue;
        MT_CUDA_TRY(cudaEventElapsedTime(&ms, (cudaEvent_t)x->ev[2 * i],
                                         (cudaEvent_t)x->ev[2 * i + 1]));
        x->t_pass[pass] += 1e-3 * ms, x->n_pass[pass]++;
    }
#else
    (void)x;
#endif
    return MT_OK;
}

static mt_status_t run_list(mt_pp_exec_t *x, mt_model_t *m, const int32_t *tokens,
                            const int32_t *targets, const int32_t *pos, const int32_t *docs,
                            float grad_scale, double *loss, int64_t *count)
{
    int M = x->sched.m, S = x->sched.num_stages, r = x->rank;
    int64_t N = m->N, act = m->Ns * m->H, nr = m->nroute;
    if (4 * act + 8 * nr > 2147483647LL)
        MT_FAIL(MT_ERR_UNSUPPORTED, "pipeline messages of %lld elements need 64-bit MPI counts",
                (long long)act);
    for (int i = 0; i < S * M; i++)
        x->slot_of[i] = -1;
    for (int k = 0; k < x->nslots; k++)
        x->slot_busy[k] = false;
    mt_pp_link_begin(x);
    bool dev = device_timed(m->be);
    if (dev)
        MT_TRY(timing_events(x));
    double t_start = mt_now_s();
    for (int i = 0; i < x->sched.num_actions[r]; i++) {
        const mt_pp_action_t *a = &x->sched.actions[r][i];
        int pass = pass_of(a->kind);
        double t0 = mt_now_s();
        if (dev && pass >= 0)
            time_mark(x, 2 * i);
        int c = x->chunk_of_stage[a->stage], mb = a->microbatch, k;
        const int32_t *tok = tokens + mb * N, *tgt = targets + mb * N;
        int next = a->stage + 1 < S ? x->chunk_of_stage[a->stage + 1] : -1;
        int prev = a->stage > 0 ? x->chunk_of_stage[a->stage - 1] : -1;
        if (pos && (a->kind == MT_PP_FORWARD || a->kind == MT_PP_BACKWARD ||
                    a->kind == MT_PP_BACKWARD_INPUT || a->kind == MT_PP_BACKWARD_WEIGHT))
            mt_model_set_packing(m, pos + mb * N, docs ? docs + mb * N : NULL);
        switch (a->kind) {
        case MT_PP_RECV_ACT:
            MT_TRY(acquire(x, c, mb, &k));
            use(x, m, c, mb);
            MT_TRY(mt_pp_link_transfer(x, m->be, a, mt_model_stage_input(m, c), act, m->route, nr));
            break;
        case MT_PP_FORWARD: {
            int64_t cnt = 0;
            MT_TRY(acquire(x, c, mb, &k));
            use(x, m, c, mb);
            *loss += mt_model_forward_chunk(m, c, tok, tgt, true, grad_scale, &cnt);
            *count += cnt;
            if (next >= 0) { /* the next stage is here too: hand the output over */
                float *out = m->x_final;
                const double *route = m->route;
                MT_TRY(acquire(x, next, mb, &k));
                use(x, m, next, mb);
                m->be->copy(mt_model_stage_input(m, next), out, mt_act_bytes(m, act));
                pass_route(m, route);
            }
            break;
        }
        case MT_PP_SEND_ACT:
            use(x, m, c, mb);
            MT_TRY(mt_pp_link_transfer(x, m->be, a, m->x_final, act, m->route, nr));
            break;
        case MT_PP_RECV_GRAD:
            use(x, m, c, mb);
            MT_TRY(mt_pp_link_transfer(x, m->be, a, m->dres, act, m->route, nr));
            break;
        case MT_PP_BACKWARD:
        case MT_PP_BACKWARD_INPUT:
            use(x, m, c, mb);
            mt_model_backward_chunk(m, c, tok, a->kind == MT_PP_BACKWARD_INPUT);
            if (prev >= 0) { /* the previous stage is here: hand the input gradient over */
                float *g = m->dres;
                const double *route = m->route;
                use(x, m, prev, mb);
                m->be->copy(m->dres, g, mt_act_bytes(m, act));
                pass_route(m, route);
            }
            if (a->kind == MT_PP_BACKWARD)
                release(x, c, mb);
            break;
        case MT_PP_BACKWARD_WEIGHT:
            use(x, m, c, mb);
            mt_model_weight_chunk(m, c);
            release(x, c, mb);
            break;
        case MT_PP_SEND_GRAD:
            /* right after its B: the slot (even if a BW gave it back) is untouched */
            use(x, m, c, mb);
            MT_TRY(mt_pp_link_transfer(x, m->be, a, m->dres, act, m->route, nr));
            break;
        }
        if (dev && pass >= 0)
            time_mark(x, 2 * i + 1);
        else if (pass >= 0)
            x->t_pass[pass] += mt_now_s() - t0, x->n_pass[pass]++;
        if (x->nsend > 0) { /* move the sends along */
            int flag;
            MPI_Testall(x->nsend, x->send_req, &flag, MPI_STATUSES_IGNORE);
        }
    }
    mt_status_t st = x->nsend > 0 ? mt_wait_all(x->nsend, x->send_req) : MT_OK;
    if (st == MT_OK && dev)
        st = time_collect(x);
    x->t_run += mt_now_s() - t_start;
    x->runs++;
    return st;
}

mt_status_t mt_pp_exec_run(mt_pp_exec_t *x, mt_model_t *m, const int32_t *tokens,
                           const int32_t *targets, const int32_t *pos, const int32_t *docs,
                           float grad_scale, double *loss, int64_t *count)
{
    mt_status_t s = run_list(x, m, tokens, targets, pos, docs, grad_scale, loss, count);
    if (s != MT_OK) /* transfers may be left pending: the teardown does not wait for them */
        x->failed = true;
    return s;
}

mt_status_t mt_pp_exec_forward(mt_pp_exec_t *x, mt_model_t *m, const int32_t *tokens,
                               const int32_t *targets, double *loss, int64_t *count)
{
    int S = x->sched.num_stages, p = x->sched.p;
    mt_pp_schedule_t sch = x->sched.schedule;
    int64_t act = m->Ns * m->H, nr = m->nroute, nf = act + 2 * nr;
    double part[2] = {0, 0}, sum[2];
    if (!x->handoff && !(x->handoff = calloc((size_t)nf, sizeof(float))))
        MT_FAIL(MT_ERR_NOMEM, "pipeline hand-off buffer");
    /* Stage by stage in order: a rank waits only for the stage before.
     * Every message goes through handoff: the activation, then the
     * routing totals. */
    for (int s = 0; s < S; s++) {
        int c = x->chunk_of_stage[s];
        if (c < 0)
            continue;
        mt_model_use_slot(m, 0, c);
        if (s > 0) {
            int from = mt_pp_stage_rank(sch, p, s - 1);
            if (from != x->rank)
                MT_MPI_TRY(MPI_Recv(x->handoff, (int)nf, MPI_FLOAT, from, s, x->pp,
                                    MPI_STATUS_IGNORE));
            m->be->copy_to_device(mt_model_stage_input(m, c), x->handoff, mt_act_bytes(m, act));
            pass_route(m, x->handoff + act); /* not aligned for doubles */
        }
        int64_t cnt = 0;
        double l = mt_model_forward_chunk(m, c, tokens, targets, false, 0.0f, &cnt);
        if (s == S - 1) {
            part[0] = l, part[1] = (double)cnt;
        } else {
            int to = mt_pp_stage_rank(sch, p, s + 1);
            m->be->copy_to_host(x->handoff, m->x_final, mt_act_bytes(m, act));
            if (nr > 0)
                memcpy(x->handoff + act, m->route, sizeof(double) * (size_t)nr);
            if (to != x->rank)
                MT_MPI_TRY(MPI_Send(x->handoff, (int)nf, MPI_FLOAT, to, s + 1, x->pp));
        }
    }
    MT_TRY(mt_allreduce(part, sum, 2, MPI_DOUBLE, MPI_SUM, x->pp));
    *loss = sum[0];
    *count = (int64_t)sum[1];
    return MT_OK;
}

mt_status_t mt_pp_exec_idle(mt_pp_exec_t *x, double *measured, double *simulated,
                            double cost[3], double *mb_run)
{
    /* [0..3] pass seconds, [4..7] pass counts, [8] wall time, [9] bytes per run */
    double mine[10], sum[10];
    for (int k = 0; k < 4; k++)
        mine[k] = x->t_pass[k], mine[4 + k] = (double)x->n_pass[k];
    mine[8] = x->t_run;
    mine[9] = x->runs > 0 ? x->bytes_sent / (double)x->runs : 0.0;
    MT_TRY(mt_allreduce(mine, sum, 10, MPI_DOUBLE, MPI_SUM, x->pp));
    *mb_run = sum[9] / (double)x->sched.p / 1e6;
    double busy = sum[0] + sum[1] + sum[2] + sum[3];
    *measured = sum[8] > 0 ? 1.0 - busy / sum[8] : 0.0;
    /* mean costs; without split passes only B + W = BW matters to the
     * simulator, so BW is split 2:1 for the report */
    double f = sum[4] > 0 ? sum[0] / sum[4] : 0, b, w;
    if (sum[5] > 0 && sum[6] > 0) {
        b = sum[1] / sum[5], w = sum[2] / sum[6];
    } else {
        double bw = sum[7] > 0 ? sum[3] / sum[7] : 0;
        b = bw * 2.0 / 3.0, w = bw / 3.0;
    }
    cost[0] = f, cost[1] = b, cost[2] = w;
    mt_pp_sim_result_t res;
    MT_TRY(mt_pp_simulate(&x->sched, f, b, w, 0.0, &res));
    *simulated = res.bubble_fraction;
    mt_pp_sim_result_free(&res);
    return MT_OK;
}
