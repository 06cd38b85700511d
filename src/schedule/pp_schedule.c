/* pp_schedule.c: the generator of every pipeline schedule's per-rank
 * action lists (mt_pp_schedule.h; doc/pipeline.md has the schedules).
 *
 * Each generator writes only the compute order of each rank (F, B, W or
 * full backward); add_comm() then places a receive right before the compute
 * that needs remote input and a send right after the compute that produces
 * it, so every schedule gets its messages from one rule.  gpipe, 1f1b,
 * interleaved_1f1b, looped_bfs, dfs and zero_bubble (ZB-H1) are
 * closed-form orders; v_schedule (ZB-V) is built by a greedy list scheduler
 * in unit time under a memory cap, as in the zero-bubble paper.  Timing and
 * checks are pp_simulate.c's; nothing here talks to MPI. */
#include "mt_pp_schedule.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    mt_pp_action_t *a;
    int n, cap;
} alist_t;

static mt_status_t push(alist_t *l, mt_pp_action_kind_t kind, int stage, int mb, int peer,
                        int peer_stage)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        mt_pp_action_t *a = realloc(l->a, sizeof *a * (size_t)cap);
        if (!a)
            MT_FAIL(MT_ERR_NOMEM, "pipeline action list of %d entries", cap);
        l->a = a, l->cap = cap;
    }
    l->a[l->n++] = (mt_pp_action_t){kind, stage, mb, peer, peer_stage};
    return MT_OK;
}

#define PUSH(l, kind, s, i) MT_TRY(push((l), (kind), (s), (i), -1, -1))

const char *mt_pp_schedule_name(mt_pp_schedule_t s)
{
    switch (s) {
    case MT_PP_1F1B: return "1f1b";
    case MT_PP_GPIPE: return "gpipe";
    case MT_PP_INTERLEAVED_1F1B: return "interleaved_1f1b";
    case MT_PP_LOOPED_BFS: return "looped_bfs";
    case MT_PP_DFS: return "dfs";
    case MT_PP_V_SCHEDULE: return "v_schedule";
    case MT_PP_ZERO_BUBBLE: return "zero_bubble";
    }
    return "?";
}

bool mt_pp_schedule_multi_stage(mt_pp_schedule_t s)
{
    return s == MT_PP_INTERLEAVED_1F1B || s == MT_PP_LOOPED_BFS || s == MT_PP_DFS ||
           s == MT_PP_V_SCHEDULE;
}

int mt_pp_schedule_default_v(mt_pp_schedule_t s)
{
    return mt_pp_schedule_multi_stage(s) ? 2 : 1;
}

int mt_pp_stage_rank(mt_pp_schedule_t s, int p, int stage)
{
    if (s == MT_PP_V_SCHEDULE)
        return stage < p ? stage : 2 * p - 1 - stage; /* down the ranks and back up */
    return stage % p;
}

mt_status_t mt_pp_schedule_check(mt_pp_schedule_t s, int p, int v, int m)
{
    const char *name = mt_pp_schedule_name(s);
    if (p < 1 || v < 1 || m < 1)
        MT_FAIL(MT_ERR_CONFIG, "%s: pp_size %d, stages per rank %d and microbatches %d must be >= 1",
                name, p, v, m);
    if (s == MT_PP_V_SCHEDULE && v != 2)
        MT_FAIL(MT_ERR_CONFIG, "v_schedule needs exactly 2 stages per rank, got %d", v);
    if (mt_pp_schedule_multi_stage(s) && v < 2)
        MT_FAIL(MT_ERR_CONFIG, "%s needs at least 2 stages per rank, got %d", name, v);
    if (!mt_pp_schedule_multi_stage(s) && v != 1)
        MT_FAIL(MT_ERR_CONFIG, "%s runs 1 stage per rank, got %d", name, v);
    /* Megatron's interleaved order walks microbatches in rounds of p. */
    if (s == MT_PP_INTERLEAVED_1F1B && m % p)
        MT_FAIL(MT_ERR_CONFIG, "interleaved_1f1b needs the number of microbatches (%d = "
                "local_batch_size / pp_microbatch_size) to be a multiple of pp_size %d; "
                "dfs and looped_bfs take any number", m, p);
    return MT_OK;
}

/* ---- closed-form orders ---- */

static mt_status_t gen_gpipe(int p, int m, int r, alist_t *l)
{
    (void)p;
    for (int i = 0; i < m; i++)
        PUSH(l, MT_PP_FORWARD, r, i);
    for (int i = 0; i < m; i++)
        PUSH(l, MT_PP_BACKWARD, r, i);
    return MT_OK;
}

/* Megatron 1F1B: p-r-1 warm-up forwards, then one forward one backward. */
static mt_status_t gen_1f1b(int p, int m, int r, alist_t *l)
{
    int warm = p - r - 1 < m ? p - r - 1 : m;
    for (int i = 0; i < warm; i++)
        PUSH(l, MT_PP_FORWARD, r, i);
    for (int i = 0; i < m - warm; i++) {
        PUSH(l, MT_PP_FORWARD, r, warm + i);
        PUSH(l, MT_PP_BACKWARD, r, i);
    }
    for (int i = m - warm; i < m; i++)
        PUSH(l, MT_PP_BACKWARD, r, i);
    return MT_OK;
}

/* Megatron interleaved 1F1B: the k-th forward (backward) of a rank is
 * microbatch (k / pv)·p + k % p in chunk (k % pv) / p (counted from the
 * last chunk for backward); 2(p-r-1) + (v-1)p warm-up forwards. */
static mt_status_t gen_interleaved(int p, int v, int m, int r, alist_t *l)
{
    int n = m * v, pv = p * v;
    int warm = 2 * (p - r - 1) + (v - 1) * p;
    if (warm > n)
        warm = n;
#define MB(k) (((k) / pv) * p + (k) % p)
#define FSTAGE(k) ((((k) % pv) / p) * p + r)
#define BSTAGE(k) ((v - 1 - ((k) % pv) / p) * p + r)
    for (int k = 0; k < warm; k++)
        PUSH(l, MT_PP_FORWARD, FSTAGE(k), MB(k));
    for (int k = 0; k < n - warm; k++) {
        PUSH(l, MT_PP_FORWARD, FSTAGE(warm + k), MB(warm + k));
        PUSH(l, MT_PP_BACKWARD, BSTAGE(k), MB(k));
    }
    for (int k = n - warm; k < n; k++)
        PUSH(l, MT_PP_BACKWARD, BSTAGE(k), MB(k));
#undef MB
#undef FSTAGE
#undef BSTAGE
    return MT_OK;
}

/* Breadth-first: every microbatch through a local stage before the next
 * local stage; backward in the reverse stage order. */
static mt_status_t gen_looped_bfs(int p, int v, int m, int r, alist_t *l)
{
    for (int c = 0; c < v; c++)
        for (int i = 0; i < m; i++)
            PUSH(l, MT_PP_FORWARD, c * p + r, i);
    for (int c = v - 1; c >= 0; c--)
        for (int i = 0; i < m; i++)
            PUSH(l, MT_PP_BACKWARD, c * p + r, i);
    return MT_OK;
}

/* Depth-first: rounds of p microbatches go through all local stages before
 * the next round (the last round may be short); all forwards, then the
 * backwards round by round from the last local stage down. */
static mt_status_t gen_dfs(int p, int v, int m, int r, alist_t *l)
{
    for (int g = 0; g < m; g += p)
        for (int c = 0; c < v; c++)
            for (int i = g; i < m && i < g + p; i++)
                PUSH(l, MT_PP_FORWARD, c * p + r, i);
    for (int g = 0; g < m; g += p)
        for (int c = v - 1; c >= 0; c--)
            for (int i = g; i < m && i < g + p; i++)
                PUSH(l, MT_PP_BACKWARD, c * p + r, i);
    return MT_OK;
}

/* ZB-H1: 1F1B's order with the backward split; rank r holds back its W
 * passes by r slots, so the later ranks fill their end-of-step bubble with
 * weight gradients.  Rank r then holds p-r-1 warm-up + 1 + r = p
 * microbatches at most: 1F1B's peak (rank 0's) on every rank. */
static mt_status_t gen_zb_h1(int p, int m, int r, alist_t *l)
{
    int warm = p - r - 1 < m ? p - r - 1 : m, w = 0;
    for (int i = 0; i < warm; i++)
        PUSH(l, MT_PP_FORWARD, r, i);
    for (int k = 0; k < m; k++) {
        if (warm + k < m)
            PUSH(l, MT_PP_FORWARD, r, warm + k);
        PUSH(l, MT_PP_BACKWARD_INPUT, r, k);
        if (k >= r)
            PUSH(l, MT_PP_BACKWARD_WEIGHT, r, w++);
    }
    while (w < m)
        PUSH(l, MT_PP_BACKWARD_WEIGHT, r, w++);
    return MT_OK;
}

/* ---- greedy unit-time list scheduler (ZB-V) ----
 * Every F, B, W costs one unit.  A free rank takes, in this order: a ready
 * B (lowest microbatch, then the deeper stage); a ready F if fewer than
 * `cap` of its stage-microbatches hold activations (F done, W not); the
 * oldest pending W.  Per stage, F, B and W each go in microbatch order.
 * Deferring W into the gaps is what removes the bubble; the cap keeps peak
 * memory at 1F1B's (p microbatches of a full rank's layers). */
typedef struct {
    int S, m;
    int *fdone, *bdone, *wdone; /* [S*m] unit finishing time, INT_MAX if not done */
    int *next_f, *next_b, *next_w; /* [S] */
} greedy_t;

static int greedy_pick(greedy_t *g, const int *stages, int v, int t, bool can_f,
                       mt_pp_action_kind_t *kind)
{
    int best = -1, best_i = INT_MAX;
    for (int c = 0; c < v; c++) { /* B */
        int s = stages[c], i = g->next_b[s];
        if (i >= g->m || g->fdone[s * g->m + i] > t)
            continue;
        if (s < g->S - 1 && g->bdone[(s + 1) * g->m + i] > t)
            continue;
        if (i < best_i || (i == best_i && s > best))
            best = s, best_i = i;
    }
    if (best >= 0)
        return *kind = MT_PP_BACKWARD_INPUT, best;
    for (int c = 0; can_f && c < v; c++) { /* F */
        int s = stages[c], i = g->next_f[s];
        if (i >= g->m || (s > 0 && g->fdone[(s - 1) * g->m + i] > t))
            continue;
        if (i < best_i || (i == best_i && s > best))
            best = s, best_i = i;
    }
    if (best >= 0)
        return *kind = MT_PP_FORWARD, best;
    for (int c = 0; c < v; c++) { /* W */
        int s = stages[c], i = g->next_w[s];
        if (i >= g->m || g->bdone[s * g->m + i] > t)
            continue;
        if (i < best_i || (i == best_i && s > best))
            best = s, best_i = i;
    }
    if (best >= 0)
        *kind = MT_PP_BACKWARD_WEIGHT;
    return best;
}

static mt_status_t gen_greedy(mt_pp_schedule_t sched, int p, int v, int m, int cap, alist_t *lists)
{
    int S = p * v;
    mt_status_t st = MT_OK;
    greedy_t g = {S, m, NULL, NULL, NULL, NULL, NULL, NULL};
    int *stages = malloc(sizeof *stages * (size_t)S);
    int *busy = calloc((size_t)p, sizeof *busy), *held = calloc((size_t)p, sizeof *held);
    g.fdone = malloc(sizeof(int) * (size_t)(3 * S * m));
    g.next_f = calloc((size_t)(3 * S), sizeof(int));
    if (!stages || !busy || !held || !g.fdone || !g.next_f) {
        st = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "greedy pipeline scheduler");
        goto out;
    }
    g.bdone = g.fdone + S * m, g.wdone = g.bdone + S * m;
    g.next_b = g.next_f + S, g.next_w = g.next_b + S;
    for (int k = 0; k < 3 * S * m; k++)
        g.fdone[k] = INT_MAX;
    for (int r = 0; r < p; r++) /* rank r's stages, by chunk */
        for (int s = 0, c = 0; s < S; s++)
            if (mt_pp_stage_rank(sched, p, s) == r)
                stages[r * v + c++] = s;

    long left = 3L * S * m, limit = 4L * (3L * v * m + S) + 16;
    for (int t = 0; left > 0; t++) {
        if (t > limit) {
            st = mt_error_set(MT_ERR_INTERNAL, __FILE__, __LINE__,
                              "greedy %s scheduler stalled (p %d, v %d, m %d)",
                              mt_pp_schedule_name(sched), p, v, m);
            goto out;
        }
        for (int r = 0; r < p; r++) {
            if (busy[r] > t)
                continue;
            mt_pp_action_kind_t kind;
            int s = greedy_pick(&g, stages + r * v, v, t, held[r] < cap, &kind);
            if (s < 0)
                continue;
            int *next = kind == MT_PP_FORWARD ? g.next_f : kind == MT_PP_BACKWARD_INPUT ? g.next_b
                                                                                        : g.next_w;
            int *done = kind == MT_PP_FORWARD ? g.fdone : kind == MT_PP_BACKWARD_INPUT ? g.bdone
                                                                                       : g.wdone;
            int i = next[s]++;
            done[s * m + i] = t + 1;
            busy[r] = t + 1, left--;
            held[r] += kind == MT_PP_FORWARD ? 1 : kind == MT_PP_BACKWARD_WEIGHT ? -1 : 0;
            if ((st = push(&lists[r], kind, s, i, -1, -1)) != MT_OK)
                goto out;
        }
    }
out:
    free(stages), free(busy), free(held), free(g.fdone), free(g.next_f);
    return st;
}

/* ---- messages ---- */

/* Rank r's compute list with a receive before each compute that needs a
 * remote input and a send after each that feeds a remote stage. */
static mt_status_t add_comm(const mt_pp_sched_t *sc, int r, const alist_t *in, alist_t *out)
{
    int S = sc->num_stages;
    for (int k = 0; k < in->n; k++) {
        const mt_pp_action_t *a = &in->a[k];
        int s = a->stage, i = a->microbatch;
        int prev = s > 0 ? mt_pp_stage_rank(sc->schedule, sc->p, s - 1) : r;
        int next = s < S - 1 ? mt_pp_stage_rank(sc->schedule, sc->p, s + 1) : r;
        bool fwd = a->kind == MT_PP_FORWARD;
        bool bwd = a->kind == MT_PP_BACKWARD || a->kind == MT_PP_BACKWARD_INPUT;
        if (fwd && prev != r)
            MT_TRY(push(out, MT_PP_RECV_ACT, s, i, prev, s - 1));
        if (bwd && next != r)
            MT_TRY(push(out, MT_PP_RECV_GRAD, s, i, next, s + 1));
        MT_TRY(push(out, a->kind, s, i, -1, -1));
        if (fwd && next != r)
            MT_TRY(push(out, MT_PP_SEND_ACT, s, i, next, s + 1));
        if (bwd && prev != r)
            MT_TRY(push(out, MT_PP_SEND_GRAD, s, i, prev, s - 1));
    }
    return MT_OK;
}

static mt_status_t build_lists(mt_pp_sched_t *sc, alist_t *compute)
{
    int p = sc->p, v = sc->v, m = sc->m;
    switch (sc->schedule) {
    case MT_PP_V_SCHEDULE:  /* ZB-V: 2p half-size stage-microbatches = 1F1B's memory */
        return gen_greedy(sc->schedule, p, 2, m, 2 * p, compute);
    default:
        break;
    }
    for (int r = 0; r < p; r++) {
        switch (sc->schedule) {
        case MT_PP_GPIPE:
            MT_TRY(gen_gpipe(p, m, r, &compute[r]));
            break;
        case MT_PP_1F1B:
            MT_TRY(gen_1f1b(p, m, r, &compute[r]));
            break;
        case MT_PP_INTERLEAVED_1F1B:
            MT_TRY(gen_interleaved(p, v, m, r, &compute[r]));
            break;
        case MT_PP_LOOPED_BFS:
            MT_TRY(gen_looped_bfs(p, v, m, r, &compute[r]));
            break;
        case MT_PP_DFS:
            MT_TRY(gen_dfs(p, v, m, r, &compute[r]));
            break;
        case MT_PP_ZERO_BUBBLE:
            MT_TRY(gen_zb_h1(p, m, r, &compute[r]));
            break;
        default:
            MT_FAIL(MT_ERR_RANGE, "unknown pipeline schedule %d", (int)sc->schedule);
        }
    }
    return MT_OK;
}

mt_status_t mt_pp_schedule_build(mt_pp_schedule_t s, int p, int v, int m, mt_pp_sched_t *out)
{
    memset(out, 0, sizeof *out);
    MT_TRY(mt_pp_schedule_check(s, p, v, m));
    mt_pp_sched_t sc = {s, p, v, m, p * v, s == MT_PP_ZERO_BUBBLE || s == MT_PP_V_SCHEDULE,
                        NULL, NULL};
    alist_t *compute = calloc((size_t)p, sizeof *compute);
    alist_t *full = calloc((size_t)p, sizeof *full);
    sc.actions = calloc((size_t)p, sizeof *sc.actions);
    sc.num_actions = calloc((size_t)p, sizeof *sc.num_actions);
    mt_status_t st = MT_OK;
    if (!compute || !full || !sc.actions || !sc.num_actions)
        st = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "pipeline schedule for %d ranks", p);
    if (st == MT_OK)
        st = build_lists(&sc, compute);
    for (int r = 0; st == MT_OK && r < p; r++)
        st = add_comm(&sc, r, &compute[r], &full[r]);
    for (int r = 0; r < p && compute; r++)
        free(compute[r].a);
    free(compute);
    if (st != MT_OK) {
        for (int r = 0; r < p && full; r++)
            free(full[r].a);
        free(full), free(sc.actions), free(sc.num_actions);
        mt_error_trace(__FILE__, __LINE__);
        return st;
    }
    for (int r = 0; r < p; r++)
        sc.actions[r] = full[r].a, sc.num_actions[r] = full[r].n;
    free(full);
    *out = sc;
    return MT_OK;
}

void mt_pp_sched_free(mt_pp_sched_t *sc)
{
    if (!sc)
        return;
    for (int r = 0; sc->actions && r < sc->p; r++)
        free(sc->actions[r]);
    free(sc->actions), free(sc->num_actions);
    memset(sc, 0, sizeof *sc);
}

const char *mt_pp_action_kind_name(mt_pp_action_kind_t k)
{
    switch (k) {
    case MT_PP_FORWARD: return "F";
    case MT_PP_BACKWARD_INPUT: return "B";
    case MT_PP_BACKWARD_WEIGHT: return "W";
    case MT_PP_BACKWARD: return "BW";
    case MT_PP_SEND_ACT: return "SEND_ACT";
    case MT_PP_RECV_ACT: return "RECV_ACT";
    case MT_PP_SEND_GRAD: return "SEND_GRAD";
    case MT_PP_RECV_GRAD: return "RECV_GRAD";
    }
    return "?";
}

void mt_pp_action_format(const mt_pp_action_t *a, char *buf, size_t cap)
{
    bool send = a->kind == MT_PP_SEND_ACT || a->kind == MT_PP_SEND_GRAD;
    if (a->peer < 0)
        snprintf(buf, cap, "%s s%d mb%d", mt_pp_action_kind_name(a->kind), (int)a->stage,
                 (int)a->microbatch);
    else
        snprintf(buf, cap, "%s s%d mb%d %s rank %d (s%d)", mt_pp_action_kind_name(a->kind),
                 (int)a->stage, (int)a->microbatch, send ? "->" : "<-", (int)a->peer,
                 (int)a->peer_stage);
}

int mt_pp_action_tag(const mt_pp_sched_t *sc, const mt_pp_action_t *a)
{
    /* boundary b sits between stages b and b+1 */
    int b = a->stage < a->peer_stage ? a->stage : a->peer_stage;
    bool grad = a->kind == MT_PP_SEND_GRAD || a->kind == MT_PP_RECV_GRAD;
    return (b * sc->m + a->microbatch) * 2 + (grad ? 1 : 0);
}

void mt_pp_sched_write(const mt_pp_sched_t *sc, FILE *out)
{
    char buf[96];
    fprintf(out, "# %s: p=%d v=%d m=%d\n", mt_pp_schedule_name(sc->schedule), sc->p, sc->v, sc->m);
    for (int r = 0; r < sc->p; r++) {
        fprintf(out, "rank %d:\n", r);
        for (int k = 0; k < sc->num_actions[r]; k++) {
            mt_pp_action_format(&sc->actions[r][k], buf, sizeof buf);
            fprintf(out, "  %s\n", buf);
        }
    }
}

mt_pp_channel_t mt_pp_action_channel(const mt_pp_action_t *a, int r)
{
    bool send = a->kind == MT_PP_SEND_ACT || a->kind == MT_PP_SEND_GRAD;
    mt_pp_channel_t c = {send ? r : a->peer, send ? a->peer : r,
                         a->kind == MT_PP_SEND_GRAD || a->kind == MT_PP_RECV_GRAD};
    return c;
}

static bool same_channel(mt_pp_channel_t a, mt_pp_channel_t b)
{
    return a.from == b.from && a.to == b.to && a.grad == b.grad;
}

/* The k-th message of channel c on rank r's list (sends when r is the
 * sender, receives otherwise), or -1 past the last. */
static int nth_message(const mt_pp_sched_t *sc, mt_pp_channel_t c, int r, int *at)
{
    mt_pp_action_kind_t kind = r == c.from ? (c.grad ? MT_PP_SEND_GRAD : MT_PP_SEND_ACT)
                                           : (c.grad ? MT_PP_RECV_GRAD : MT_PP_RECV_ACT);
    for (; *at < sc->num_actions[r]; (*at)++) {
        const mt_pp_action_t *a = &sc->actions[r][*at];
        if (a->kind == kind && a->peer == (r == c.from ? c.to : c.from))
            return (*at)++;
    }
    return -1;
}

void mt_pp_sched_transfers(const mt_pp_sched_t *sc, int r, int *sends, int *recvs)
{
    *sends = *recvs = 0;
    for (int i = 0; i < sc->num_actions[r]; i++) {
        mt_pp_action_kind_t k = sc->actions[r][i].kind;
        *sends += k == MT_PP_SEND_ACT || k == MT_PP_SEND_GRAD;
        *recvs += k == MT_PP_RECV_ACT || k == MT_PP_RECV_GRAD;
    }
}

mt_status_t mt_pp_sched_channels(const mt_pp_sched_t *sc, mt_pp_channel_t **out, int *n)
{
    *out = NULL, *n = 0;
    int cap = 0;
    for (int r = 0; r < sc->p; r++)
        for (int k = 0; k < sc->num_actions[r]; k++) {
            const mt_pp_action_t *a = &sc->actions[r][k];
            if (a->kind != MT_PP_SEND_ACT && a->kind != MT_PP_SEND_GRAD)
                continue;
            mt_pp_channel_t c = mt_pp_action_channel(a, r);
            int i = 0;
            while (i < *n && !same_channel((*out)[i], c))
                i++;
            if (i < *n)
                continue;
            if (*n == cap) {
                cap = cap ? 2 * cap : 8;
                mt_pp_channel_t *t = realloc(*out, sizeof *t * (size_t)cap);
                if (!t) {
                    free(*out), *out = NULL, *n = 0;
                    MT_FAIL(MT_ERR_NOMEM, "pipeline channel list");
                }
                *out = t;
            }
            (*out)[(*n)++] = c;
        }
    /* each channel: the i-th receive takes the i-th send's message */
    for (int i = 0; i < *n; i++) {
        mt_pp_channel_t c = (*out)[i];
        int at_s = 0, at_r = 0;
        for (;;) {
            int ks = nth_message(sc, c, c.from, &at_s), kr = nth_message(sc, c, c.to, &at_r);
            if (ks < 0 && kr < 0)
                break;
            const mt_pp_action_t *s = ks >= 0 ? &sc->actions[c.from][ks] : NULL;
            const mt_pp_action_t *q = kr >= 0 ? &sc->actions[c.to][kr] : NULL;
            if (s && q && s->stage == q->peer_stage && q->stage == s->peer_stage &&
                s->microbatch == q->microbatch)
                continue;
            char sa[96] = "nothing", ra[96] = "nothing";
            if (s)
                mt_pp_action_format(s, sa, sizeof sa);
            if (q)
                mt_pp_action_format(q, ra, sizeof ra);
            free(*out), *out = NULL, *n = 0;
            MT_FAIL(MT_ERR_INTERNAL, "%s p=%d v=%d m=%d: the %s channel from rank %d to rank %d "
                    "is not in order: rank %d sends %s where rank %d receives %s",
                    mt_pp_schedule_name(sc->schedule), sc->p, sc->v, sc->m,
                    c.grad ? "gradient" : "activation", c.from, c.to, c.from, sa, c.to, ra);
        }
    }
    return MT_OK;
}
