/* pp_simulate.c: runs every rank's pipeline action list in virtual time
 * (mt_pp_simulate in mt_pp_schedule.h).
 *
 * The model is the one the executor will implement: compute actions run one
 * at a time per rank; a send is non-blocking (issued when its rank reaches
 * it, the buffer kept until delivered); a receive blocks its rank until the
 * matching send was issued plus cost_comm.  Times follow from dependencies
 * only, so the order in which ranks are advanced here does not matter.
 * It checks lists, it does not repair them: anything stuck or unmatched is
 * an error that names the ranks and actions. */
#include "mt_pp_schedule.h"
#include "pp_sched_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOT_YET (-1.0)
#define NTIMES 7  /* f, b, w, send_act, recv_act, send_grad, recv_grad */
#define NCOUNTS 8 /* nf, nb, nbw, nw, nsend_act, nrecv_act, nsend_grad, nrecv_grad */

typedef struct {
    const mt_pp_sched_t *sc;
    int S, m;
    double cf, cb, cw, cc;
    /* [S*m] finishing (sends: issue) times, NOT_YET until done */
    double *f, *b, *w, *send_act, *recv_act, *send_grad, *recv_grad;
    /* [S*m] how often each happened */
    int *nf, *nb, *nbw, *nw, *nsend_act, *nrecv_act, *nsend_grad, *nrecv_grad;
    int *pc, *inflight, *held;
    double *clock;
    mt_pp_sim_result_t *res;
} sim_t;

enum { BLOCKED, DONE, BAD };

static int bad(const sim_t *z, int r, const mt_pp_action_t *a, const char *why)
{
    char buf[96];
    mt_pp_action_format(a, buf, sizeof buf);
    mt_error_set(MT_ERR_INTERNAL, __FILE__, __LINE__,
                 "%s p=%d v=%d m=%d: rank %d action %d (%s): %s",
                 mt_pp_schedule_name(z->sc->schedule), z->sc->p, z->sc->v, z->sc->m, r, z->pc[r],
                 buf, why);
    return BAD;
}

static double later(double a, double b) { return a > b ? a : b; }

static void compute(sim_t *z, int r, double ready, double cost)
{
    double start = later(z->clock[r], ready);
    z->clock[r] = start + cost;
    z->res->busy[r] += cost;
}

static void track(sim_t *z, int r, int d_inflight, int d_held)
{
    z->inflight[r] += d_inflight, z->held[r] += d_held;
    if (z->inflight[r] > z->res->peak_inflight[r])
        z->res->peak_inflight[r] = z->inflight[r];
    if (z->held[r] > z->res->peak_held[r])
        z->res->peak_held[r] = z->held[r];
}

/* Execute rank r's next action if its inputs exist: DONE, BLOCKED or BAD. */
static int step(sim_t *z, int r)
{
    const mt_pp_sched_t *sc = z->sc;
    const mt_pp_action_t *a = &sc->actions[r][z->pc[r]];
    int s = a->stage, i = a->microbatch, S = z->S, m = z->m;
    if (s < 0 || s >= S || i < 0 || i >= m)
        return bad(z, r, a, "stage or microbatch out of range");
    if (mt_pp_stage_rank(sc->schedule, sc->p, s) != r)
        return bad(z, r, a, "the stage is held by another rank");
    int k = s * m + i;
    bool prev_local = s > 0 && mt_pp_stage_rank(sc->schedule, sc->p, s - 1) == r;
    bool next_local = s < S - 1 && mt_pp_stage_rank(sc->schedule, sc->p, s + 1) == r;
    switch (a->kind) {
    case MT_PP_FORWARD: {
        double in = s == 0 ? 0 : prev_local ? z->f[k - m] : z->recv_act[k];
        if (z->nf[k])
            return bad(z, r, a, "second forward of this stage and microbatch");
        if (in == NOT_YET)
            return BLOCKED;
        compute(z, r, in, z->cf);
        z->f[k] = z->clock[r], z->nf[k]++;
        track(z, r, 1, 1);
        return DONE;
    }
    case MT_PP_BACKWARD_INPUT:
    case MT_PP_BACKWARD: {
        bool full = a->kind == MT_PP_BACKWARD;
        double g = s == S - 1 ? 0 : next_local ? z->b[k + m] : z->recv_grad[k];
        if (z->nb[k] || z->nbw[k])
            return bad(z, r, a, "second backward of this stage and microbatch");
        if (z->f[k] == NOT_YET || g == NOT_YET)
            return BLOCKED;
        compute(z, r, later(z->f[k], g), full ? z->cb + z->cw : z->cb);
        z->b[k] = z->clock[r];
        if (full)
            z->w[k] = z->clock[r], z->nbw[k]++;
        else
            z->nb[k]++;
        track(z, r, -1, full ? -1 : 0);
        return DONE;
    }
    case MT_PP_BACKWARD_WEIGHT:
        if (z->nw[k] || z->nbw[k])
            return bad(z, r, a, "second weight gradient of this stage and microbatch");
        if (z->nb[k] == 0)
            return BLOCKED; /* needs its own B (a full backward does not count) */
        compute(z, r, z->b[k], z->cw);
        z->w[k] = z->clock[r], z->nw[k]++;
        track(z, r, 0, -1);
        return DONE;
    case MT_PP_SEND_ACT:
    case MT_PP_SEND_GRAD: {
        bool act = a->kind == MT_PP_SEND_ACT;
        int to = act ? s + 1 : s - 1;
        if (to < 0 || to >= S || a->peer_stage != to ||
            a->peer != mt_pp_stage_rank(sc->schedule, sc->p, to) || a->peer == r)
            return bad(z, r, a, "peer is not the rank of the neighbouring stage");
        int *n = act ? z->nsend_act : z->nsend_grad;
        double *t = act ? z->send_act : z->send_grad, src = act ? z->f[k] : z->b[k];
        if (n[k])
            return bad(z, r, a, "sent twice");
        if (src == NOT_YET)
            return BLOCKED;
        t[k] = later(z->clock[r], src), n[k]++;
        return DONE;
    }
    case MT_PP_RECV_ACT:
    case MT_PP_RECV_GRAD: {
        bool act = a->kind == MT_PP_RECV_ACT;
        int from = act ? s - 1 : s + 1;
        if (from < 0 || from >= S || a->peer_stage != from ||
            a->peer != mt_pp_stage_rank(sc->schedule, sc->p, from) || a->peer == r)
            return bad(z, r, a, "peer is not the rank of the neighbouring stage");
        int *n = act ? z->nrecv_act : z->nrecv_grad;
        double *t = act ? z->recv_act : z->recv_grad;
        double sent = act ? z->send_act[from * m + i] : z->send_grad[from * m + i];
        if (n[k])
            return bad(z, r, a, "received twice");
        if (sent == NOT_YET)
            return BLOCKED;
        z->clock[r] = later(z->clock[r], sent + z->cc);
        t[k] = z->clock[r], n[k]++;
        return DONE;
    }
    }
    return bad(z, r, a, "unknown action kind");
}

/* Every (stage, microbatch) done once, every message received once. */
static mt_status_t final_checks(const sim_t *z)
{
    const char *sn = mt_pp_schedule_name(z->sc->schedule);
    for (int s = 0; s < z->S; s++)
        for (int i = 0; i < z->m; i++) {
            int k = s * z->m + i;
            if (z->nf[k] != 1)
                MT_FAIL(MT_ERR_INTERNAL, "%s: stage %d microbatch %d has %d forwards", sn, s, i,
                        z->nf[k]);
            if (!(z->nbw[k] == 1 && z->nb[k] == 0 && z->nw[k] == 0) &&
                !(z->nbw[k] == 0 && z->nb[k] == 1 && z->nw[k] == 1))
                MT_FAIL(MT_ERR_INTERNAL, "%s: stage %d microbatch %d: %d full backward, %d B, "
                        "%d W (want one full backward, or one B and one W)", sn, s, i, z->nbw[k],
                        z->nb[k], z->nw[k]);
            if (s < z->S - 1 && z->nsend_act[k] != z->nrecv_act[k + z->m])
                MT_FAIL(MT_ERR_INTERNAL, "%s: activation of stage %d microbatch %d sent %d, "
                        "received %d times", sn, s, i, z->nsend_act[k], z->nrecv_act[k + z->m]);
            if (s > 0 && z->nsend_grad[k] != z->nrecv_grad[k - z->m])
                MT_FAIL(MT_ERR_INTERNAL, "%s: input gradient of stage %d microbatch %d sent %d, "
                        "received %d times", sn, s, i, z->nsend_grad[k], z->nrecv_grad[k - z->m]);
        }
    return MT_OK;
}

/* A message's start (+1) or end (-1) at t, for rank's out or in count. */
typedef struct {
    double t;
    int d, rank, in;
} msg_event_t;

static int event_order(const void *a, const void *b)
{
    const msg_event_t *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return y->d - x->d; /* starts first: both ends are inclusive */
}

/* peak_msgs_out and peak_msgs_in: every message between two ranks, from
 * its send's issue to its receive's completion, swept in time order. */
static mt_status_t message_peaks(const sim_t *z)
{
    const mt_pp_sched_t *sc = z->sc;
    int S = z->S, m = z->m;
    msg_event_t *e = malloc(sizeof *e * (size_t)S * (size_t)m * 8 + 1);
    int *cur = calloc(2 * (size_t)sc->p, sizeof *cur);
    if (!e || !cur) {
        free(e), free(cur);
        MT_FAIL(MT_ERR_NOMEM, "pipeline simulation: message events");
    }
    size_t n = 0;
    for (int s = 0; s < S; s++)
        for (int dir = 0; dir < 2; dir++) { /* 0: activation to s+1, 1: gradient to s-1 */
            int to = dir ? s - 1 : s + 1;
            if (to < 0 || to >= S)
                continue;
            int from_r = mt_pp_stage_rank(sc->schedule, sc->p, s);
            int to_r = mt_pp_stage_rank(sc->schedule, sc->p, to);
            if (from_r == to_r)
                continue;
            for (int i = 0; i < m; i++) {
                double t0 = dir ? z->send_grad[s * m + i] : z->send_act[s * m + i];
                double t1 = dir ? z->recv_grad[to * m + i] : z->recv_act[to * m + i];
                e[n++] = (msg_event_t){t0, 1, from_r, 0};
                e[n++] = (msg_event_t){t1, -1, from_r, 0};
                e[n++] = (msg_event_t){t0, 1, to_r, 1};
                e[n++] = (msg_event_t){t1, -1, to_r, 1};
            }
        }
    qsort(e, n, sizeof *e, event_order);
    for (size_t k = 0; k < n; k++) {
        int *c = &cur[2 * e[k].rank + e[k].in];
        int *peak = e[k].in ? z->res->peak_msgs_in : z->res->peak_msgs_out;
        *c += e[k].d;
        if (*c > peak[e[k].rank])
            peak[e[k].rank] = *c;
    }
    free(e), free(cur);
    return MT_OK;
}

mt_status_t mt_pp_sched_stuck(const mt_pp_sched_t *sc, const int *pc, const int *caps,
                              const char *what, const char *file, int line)
{
    mt_error_set(MT_ERR_INTERNAL, file, line, "%s p=%d v=%d m=%d: %s; no rank can go on:",
                 mt_pp_schedule_name(sc->schedule), sc->p, sc->v, sc->m, what);
    for (int r = 0, shown = 0; r < sc->p; r++) {
        if (pc[r] >= sc->num_actions[r])
            continue;
        if (shown++ == 16) {
            mt_error_append(" ...");
            break;
        }
        char buf[96], bufs[32] = "";
        mt_pp_action_format(&sc->actions[r][pc[r]], buf, sizeof buf);
        if (caps)
            snprintf(bufs, sizeof bufs, " (%d send buffers)", caps[r]);
        mt_error_append(" rank %d%s waits at action %d (%s);", r, bufs, pc[r], buf);
    }
    return MT_ERR_INTERNAL;
}

mt_status_t mt_pp_simulate(const mt_pp_sched_t *sc, double cost_f, double cost_b, double cost_w,
                           double cost_comm, mt_pp_sim_result_t *res)
{
    memset(res, 0, sizeof *res);
    if (!sc || sc->p < 1 || !sc->actions || cost_f < 0 || cost_b < 0 || cost_w < 0 || cost_comm < 0)
        MT_FAIL(MT_ERR_RANGE, "mt_pp_simulate: no schedule, or a negative cost");
    int p = sc->p, S = sc->num_stages, m = sc->m;
    size_t n = (size_t)S * (size_t)m;
    sim_t z = {.sc = sc, .S = S, .m = m, .cf = cost_f, .cb = cost_b, .cw = cost_w,
               .cc = cost_comm, .res = res};
    double *times = malloc(sizeof *times * n * NTIMES);
    int *counts = calloc(n * NCOUNTS + 3 * (size_t)p, sizeof *counts);
    z.clock = calloc((size_t)p, sizeof *z.clock);
    res->p = p;
    res->busy = calloc((size_t)p, sizeof *res->busy);
    res->peak_inflight = calloc((size_t)p, sizeof *res->peak_inflight);
    res->peak_held = calloc((size_t)p, sizeof *res->peak_held);
    res->peak_msgs_out = calloc((size_t)p, sizeof *res->peak_msgs_out);
    res->peak_msgs_in = calloc((size_t)p, sizeof *res->peak_msgs_in);
    mt_status_t st = MT_OK;
    if (!times || !counts || !z.clock || !res->busy || !res->peak_inflight || !res->peak_held ||
        !res->peak_msgs_out || !res->peak_msgs_in) {
        st = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "pipeline simulation");
        goto out;
    }
    for (size_t k = 0; k < n * NTIMES; k++)
        times[k] = NOT_YET;
    double **tp[NTIMES] = {&z.f, &z.b, &z.w, &z.send_act, &z.recv_act, &z.send_grad, &z.recv_grad};
    int **cp[NCOUNTS] = {&z.nf, &z.nb, &z.nbw, &z.nw, &z.nsend_act, &z.nrecv_act, &z.nsend_grad,
                         &z.nrecv_grad};
    for (int j = 0; j < NTIMES; j++)
        *tp[j] = times + (size_t)j * n;
    for (int j = 0; j < NCOUNTS; j++)
        *cp[j] = counts + (size_t)j * n;
    z.pc = counts + n * NCOUNTS, z.inflight = z.pc + p, z.held = z.inflight + p;

    for (bool progress = true; progress;) {
        progress = false;
        for (int r = 0; r < p; r++)
            while (z.pc[r] < sc->num_actions[r]) {
                int rc = step(&z, r);
                if (rc == BAD) {
                    st = MT_ERR_INTERNAL;
                    goto out;
                }
                if (rc == BLOCKED)
                    break;
                z.pc[r]++, progress = true;
            }
    }
    for (int r = 0; r < p; r++)
        if (z.pc[r] < sc->num_actions[r]) {
            st = mt_pp_sched_stuck(sc, z.pc, NULL, "deadlock", __FILE__, __LINE__);
            goto out;
        }
    if ((st = final_checks(&z)) != MT_OK || (st = message_peaks(&z)) != MT_OK)
        goto out;
    for (int r = 0; r < p; r++) {
        res->makespan = later(res->makespan, z.clock[r]);
        res->busy_total += res->busy[r];
    }
    double idle = (double)p * res->makespan - res->busy_total;
    res->bubble_fraction = res->makespan > 0 ? idle / ((double)p * res->makespan) : 0;
    res->bubble_ratio = res->busy_total > 0 ? idle / res->busy_total : 0;
out:
    free(times), free(counts), free(z.clock);
    if (st != MT_OK) {
        mt_error_trace(__FILE__, __LINE__);
        mt_pp_sim_result_free(res);
    }
    return st;
}

void mt_pp_sim_result_free(mt_pp_sim_result_t *res)
{
    if (!res)
        return;
    free(res->busy), free(res->peak_inflight), free(res->peak_held);
    free(res->peak_msgs_out), free(res->peak_msgs_in);
    memset(res, 0, sizeof *res);
}
