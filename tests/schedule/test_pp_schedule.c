/* test_pp_schedule: the pipeline schedule generator and simulator.
 * Every schedule over p in {2, 4, 8}, several m and v, simulated with
 * uniform and uneven costs; the bubbles against the closed forms of the
 * schedules' papers (F = B = W = 1, so a full backward costs 2F); peak
 * activations; the NCCL message buffers' counts and the check that
 * reusing them cannot deadlock; and corrupted lists that the simulator
 * must refuse. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mt_pp_schedule.h"
#include "mt_test.h"

static const mt_pp_schedule_t all[MT_PP_NUM_SCHEDULES] = {
    MT_PP_GPIPE, MT_PP_1F1B, MT_PP_INTERLEAVED_1F1B, MT_PP_LOOPED_BFS, MT_PP_DFS,
    MT_PP_ZERO_BUBBLE, MT_PP_V_SCHEDULE};

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1.0, fabs(b)); }

static int max_of(const int *x, int n)
{
    int best = x[0];
    for (int i = 1; i < n; i++)
        best = x[i] > best ? x[i] : best;
    return best;
}

/* Send and receive of one message carry the same tag; no tag twice per pair. */
static void check_tags(const mt_pp_sched_t *sc)
{
    int sends = 0, recvs = 0;
    for (int r = 0; r < sc->p; r++)
        for (int k = 0; k < sc->num_actions[r]; k++) {
            const mt_pp_action_t *a = &sc->actions[r][k];
            bool send = a->kind == MT_PP_SEND_ACT || a->kind == MT_PP_SEND_GRAD;
            bool recv = a->kind == MT_PP_RECV_ACT || a->kind == MT_PP_RECV_GRAD;
            if (!send && !recv)
                continue;
            sends += send, recvs += recv;
            if (!send)
                continue;
            mt_pp_action_kind_t want = a->kind == MT_PP_SEND_ACT ? MT_PP_RECV_ACT : MT_PP_RECV_GRAD;
            int same = 0, match = 0, tag = mt_pp_action_tag(sc, a);
            for (int j = 0; j < sc->num_actions[a->peer]; j++) {
                const mt_pp_action_t *b = &sc->actions[a->peer][j];
                if ((b->kind != MT_PP_RECV_ACT && b->kind != MT_PP_RECV_GRAD) || b->peer != r ||
                    mt_pp_action_tag(sc, b) != tag)
                    continue;
                same++;
                match += b->kind == want && b->stage == a->peer_stage &&
                         b->microbatch == a->microbatch;
            }
            CHECK(same == 1 && match == 1, "%s p=%d v=%d m=%d: tag %d of rank %d: %d receives",
                  mt_pp_schedule_name(sc->schedule), sc->p, sc->v, sc->m, tag, r, same);
        }
    CHECK(sends == recvs, "%d sends, %d receives", sends, recvs);
}

/* Every channel is received in the order it is sent (the executor's
 * untagged transports rely on it), and names each send's pair. */
static void check_channels(const mt_pp_sched_t *sc)
{
    mt_pp_channel_t *ch;
    int n;
    mt_status_t st = mt_pp_sched_channels(sc, &ch, &n);
    CHECK(st == MT_OK, "channels %s p=%d v=%d m=%d: %s", mt_pp_schedule_name(sc->schedule), sc->p,
          sc->v, sc->m, mt_error_message());
    if (st != MT_OK)
        return;
    for (int r = 0; r < sc->p; r++)
        for (int k = 0; k < sc->num_actions[r]; k++) {
            const mt_pp_action_t *a = &sc->actions[r][k];
            if (a->kind < MT_PP_SEND_ACT)
                continue;
            mt_pp_channel_t c = mt_pp_action_channel(a, r);
            int found = 0;
            for (int i = 0; i < n; i++)
                found += ch[i].from == c.from && ch[i].to == c.to && ch[i].grad == c.grad;
            CHECK(found == 1 && c.from != c.to, "rank %d action %d: channel %d->%d listed %d times",
                  r, k, c.from, c.to, found);
        }
    /* one pipeline: each neighbour pair, both ways */
    if (sc->v == 1)
        CHECK(n == 2 * (sc->p - 1), "%s p=%d: %d channels", mt_pp_schedule_name(sc->schedule),
              sc->p, n);
    free(ch);
}

/* Build and simulate; with F = B = W = 1 fills *res (caller frees). */
static int run(mt_pp_schedule_t s, int p, int v, int m, mt_pp_sim_result_t *res)
{
    mt_pp_sched_t sc;
    mt_status_t st = mt_pp_schedule_build(s, p, v, m, &sc);
    CHECK(st == MT_OK, "build %s p=%d v=%d m=%d: %s", mt_pp_schedule_name(s), p, v, m,
          mt_error_message());
    if (st != MT_OK)
        return 0;
    check_tags(&sc);
    check_channels(&sc);
    /* uneven costs and a communication delay must not deadlock either */
    st = mt_pp_simulate(&sc, 1.0, 2.3, 0.7, 0.25, res);
    CHECK(st == MT_OK, "simulate uneven %s p=%d v=%d m=%d: %s", mt_pp_schedule_name(s), p, v, m,
          mt_error_message());
    mt_pp_sim_result_free(res);
    st = mt_pp_simulate(&sc, 1, 1, 1, 0, res);
    CHECK(st == MT_OK, "simulate %s p=%d v=%d m=%d: %s", mt_pp_schedule_name(s), p, v, m,
          mt_error_message());
    mt_pp_sched_free(&sc);
    return st == MT_OK;
}

static void test_closed_forms(void)
{
    const int ps[] = {2, 4, 8};
    for (size_t pi = 0; pi < 3; pi++) {
        int p = ps[pi];
        const int ms[] = {1, 2, p - 1 > 0 ? p - 1 : 1, p, p + 1, 2 * p, 3 * p, 4 * p + 3};
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            int m = ms[mi];
            double f1b = 0;
            for (int si = 0; si < MT_PP_NUM_SCHEDULES; si++) {
                mt_pp_schedule_t s = all[si];
                const char *sn = mt_pp_schedule_name(s);
                bool multi = mt_pp_schedule_multi_stage(s);
                int vs[] = {1, 0}, nv = 1;
                if (multi && s != MT_PP_V_SCHEDULE)
                    vs[0] = 2, vs[1] = 4, nv = 2;
                else if (multi)
                    vs[0] = 2;
                for (int vi = 0; vi < nv; vi++) {
                    int v = vs[vi];
                    mt_pp_sim_result_t r;
                    if (s == MT_PP_INTERLEAVED_1F1B && m % p) {
                        CHECK(mt_pp_schedule_check(s, p, v, m) == MT_ERR_CONFIG,
                              "interleaved m=%d p=%d must be refused", m, p);
                        CHECK_CONTAINS(mt_error_message(), "multiple of pp_size");
                        mt_error_clear();
                        continue;
                    }
                    if (!run(s, p, v, m, &r))
                        continue;
                    double busy = 3.0 * v * m; /* per rank: F + B + W per stage-microbatch */
                    CHECK(near(r.busy[0], busy), "%s busy %.1f", sn, r.busy[0]);
                    CHECK(near(r.bubble_fraction, 1 - r.busy_total / (p * r.makespan)) &&
                          near(r.bubble_ratio, (p * r.makespan - r.busy_total) / r.busy_total),
                          "%s: bubble definitions", sn);
                    /* the closed forms, in both conventions: idle over the
                     * step (makespan) and idle over the ideal compute */
                    double want = -1, want_ratio = -1;
                    if (s == MT_PP_GPIPE || s == MT_PP_1F1B)
                        want = (p - 1.0) / (m + p - 1.0), want_ratio = (p - 1.0) / m;
                    else if (s == MT_PP_INTERLEAVED_1F1B || (s == MT_PP_DFS && m % p == 0) ||
                             (s == MT_PP_LOOPED_BFS && m >= p))
                        want = (p - 1.0) / (v * m + p - 1.0), want_ratio = (p - 1.0) / (v * m);
                    else if (s == MT_PP_ZERO_BUBBLE && m >= p)
                        want = (p - 1.0) / (3.0 * m + p - 1.0), want_ratio = (p - 1.0) / (3.0 * m);
                    else if (s == MT_PP_V_SCHEDULE && m >= 2 * p) /* only the p-1 stage ramp */
                        want = (p - 1.0) / (6.0 * m + p - 1.0), want_ratio = (p - 1.0) / (6.0 * m);
                    if (want >= 0) {
                        CHECK(near(r.bubble_fraction, want), "%s p=%d v=%d m=%d: bubble %.6f, "
                              "closed form %.6f", sn, p, v, m, r.bubble_fraction, want);
                        CHECK(near(r.bubble_ratio, want_ratio), "%s p=%d v=%d m=%d: ratio %.6f, "
                              "closed form %.6f", sn, p, v, m, r.bubble_ratio, want_ratio);
                    }
                    if (s == MT_PP_1F1B) {
                        f1b = r.bubble_fraction;
                        CHECK(r.peak_inflight[0] == (m < p ? m : p), "1f1b p=%d m=%d in flight %d",
                              p, m, r.peak_inflight[0]);
                        CHECK(max_of(r.peak_held, p) <= p, "1f1b held");
                    }
                    if (s == MT_PP_GPIPE)
                        CHECK(r.peak_inflight[0] == m, "gpipe in flight %d, m %d",
                              r.peak_inflight[0], m);
                    if (s == MT_PP_LOOPED_BFS || s == MT_PP_DFS)
                        CHECK(r.peak_inflight[0] == m * v, "%s in flight %d", sn, r.peak_inflight[0]);
                    if (s == MT_PP_INTERLEAVED_1F1B) {
                        int lim = 2 * (p - 1) + (v - 1) * p + 1;
                        CHECK(r.peak_inflight[0] == (m * v < lim ? m * v : lim),
                              "interleaved p=%d v=%d m=%d in flight %d", p, v, m, r.peak_inflight[0]);
                    }
                    if (s == MT_PP_ZERO_BUBBLE) { /* ZB-H1: below 1F1B, same memory */
                        CHECK(r.bubble_fraction < f1b, "zb-h1 %.4f vs 1f1b %.4f (p=%d m=%d)",
                              r.bubble_fraction, f1b, p, m);
                        CHECK(max_of(r.peak_held, p) <= p, "zb-h1 holds %d > p", max_of(r.peak_held, p));
                    }
                    if (s == MT_PP_V_SCHEDULE) { /* 2p half stages = 1F1B's memory */
                        CHECK(max_of(r.peak_held, p) <= 2 * p, "zb-v holds %d", max_of(r.peak_held, p));
                        CHECK(r.bubble_fraction < f1b, "zb-v below 1f1b");
                    }
                    mt_pp_sim_result_free(&r);
                }
            }
        }
    }
}

static void test_layout(void)
{
    CHECK(mt_pp_stage_rank(MT_PP_INTERLEAVED_1F1B, 4, 6) == 2, "interleaved stage 6 on rank 2");
    CHECK(mt_pp_stage_rank(MT_PP_V_SCHEDULE, 4, 0) == 0 && mt_pp_stage_rank(MT_PP_V_SCHEDULE, 4, 7) == 0 &&
          mt_pp_stage_rank(MT_PP_V_SCHEDULE, 4, 4) == 3, "V layout");
    CHECK(mt_pp_schedule_check(MT_PP_V_SCHEDULE, 4, 3, 8) == MT_ERR_CONFIG, "v_schedule v=3");
    CHECK(mt_pp_schedule_check(MT_PP_1F1B, 4, 2, 8) == MT_ERR_CONFIG, "1f1b v=2");
    CHECK(mt_pp_schedule_check(MT_PP_DFS, 4, 1, 8) == MT_ERR_CONFIG, "dfs v=1");
    CHECK(mt_pp_schedule_check(MT_PP_GPIPE, 4, 1, 0) == MT_ERR_CONFIG, "m=0");
    mt_error_clear();
    /* one pipeline rank: no messages, no bubble */
    mt_pp_sched_t sc;
    mt_pp_sim_result_t r;
    if (mt_pp_schedule_build(MT_PP_1F1B, 1, 1, 3, &sc) == MT_OK) {
        CHECK(sc.num_actions[0] == 6, "p=1: %d actions", sc.num_actions[0]);
        CHECK(mt_pp_simulate(&sc, 1, 1, 1, 0, &r) == MT_OK && r.bubble_fraction == 0, "p=1 bubble");
        mt_pp_sim_result_free(&r);
        mt_pp_sched_free(&sc);
    }
    /* V: stages p-1 and p share rank p-1, so no message between them */
    if (mt_pp_schedule_build(MT_PP_V_SCHEDULE, 2, 2, 4, &sc) == MT_OK) {
        for (int k = 0; k < sc.num_actions[1]; k++)
            CHECK(sc.actions[1][k].peer != 1, "V: rank 1 messages itself");
        mt_pp_sched_free(&sc);
    }
}

/* ---- corrupted lists ---- */

static mt_pp_sched_t fresh(mt_pp_schedule_t s, int p, int v, int m)
{
    mt_pp_sched_t sc;
    mt_status_t st = mt_pp_schedule_build(s, p, v, m, &sc);
    CHECK(st == MT_OK, "build: %s", mt_error_message());
    return sc;
}

static int find(const mt_pp_sched_t *sc, int r, mt_pp_action_kind_t kind, int from)
{
    for (int k = from; k < sc->num_actions[r]; k++)
        if (sc->actions[r][k].kind == kind)
            return k;
    return -1;
}

static void drop(mt_pp_sched_t *sc, int r, int k)
{
    memmove(&sc->actions[r][k], &sc->actions[r][k + 1],
            sizeof(mt_pp_action_t) * (size_t)(sc->num_actions[r] - k - 1));
    sc->num_actions[r]--;
}

/* Simulation must fail with a message containing `needle`. */
static void expect_refused(mt_pp_sched_t *sc, const char *what, const char *needle)
{
    mt_pp_sim_result_t r;
    mt_status_t st = mt_pp_simulate(sc, 1, 1, 1, 0, &r);
    CHECK(st == MT_ERR_INTERNAL, "%s: simulator accepted a corrupted list", what);
    if (st != MT_OK)
        CHECK_CONTAINS(mt_error_message(), needle);
    else
        mt_pp_sim_result_free(&r);
    mt_error_clear();
    mt_pp_sched_free(sc);
}

static void test_corrupted(void)
{
    mt_pp_sched_t sc;

    sc = fresh(MT_PP_1F1B, 4, 1, 8); /* a dropped receive leaves its forward waiting */
    drop(&sc, 2, find(&sc, 2, MT_PP_RECV_ACT, 0));
    expect_refused(&sc, "dropped RECV_ACT", "rank 2 waits at action 0 (F s2 mb0)");

    sc = fresh(MT_PP_1F1B, 2, 1, 4); /* rank 0 waits for a gradient before it sends */
    {
        int k = find(&sc, 0, MT_PP_RECV_GRAD, 0);
        mt_pp_action_t a = sc.actions[0][k];
        memmove(&sc.actions[0][1], &sc.actions[0][0], sizeof a * (size_t)k);
        sc.actions[0][0] = a;
    }
    expect_refused(&sc, "receive moved first", "deadlock");

    sc = fresh(MT_PP_ZERO_BUBBLE, 4, 1, 8); /* W before its own B */
    {
        int b = find(&sc, 3, MT_PP_BACKWARD_INPUT, 0), w = find(&sc, 3, MT_PP_BACKWARD_WEIGHT, 0);
        mt_pp_action_t t = sc.actions[3][b];
        sc.actions[3][b] = sc.actions[3][w], sc.actions[3][w] = t;
    }
    expect_refused(&sc, "W before B", "rank 3 waits at action");

    sc = fresh(MT_PP_GPIPE, 2, 1, 3); /* a dropped send */
    drop(&sc, 1, find(&sc, 1, MT_PP_SEND_GRAD, 0));
    expect_refused(&sc, "dropped SEND_GRAD", "RECV_GRAD s0 mb0 <- rank 1 (s1)");

    sc = fresh(MT_PP_ZERO_BUBBLE, 2, 1, 3); /* a missing W */
    drop(&sc, 0, sc.num_actions[0] - 1);
    expect_refused(&sc, "dropped W", "0 W");

    sc = fresh(MT_PP_GPIPE, 2, 1, 3); /* a forward twice */
    sc.actions[0][2] = sc.actions[0][0];
    expect_refused(&sc, "duplicated F", "second forward");

    sc = fresh(MT_PP_INTERLEAVED_1F1B, 2, 2, 2); /* an action for a stage on another rank */
    sc.actions[1][0].stage = 0;
    expect_refused(&sc, "wrong rank", "held by another rank");

    sc = fresh(MT_PP_1F1B, 2, 1, 4); /* receives swapped: the channel is out of order */
    {
        int a = find(&sc, 1, MT_PP_RECV_ACT, 0), b = find(&sc, 1, MT_PP_RECV_ACT, a + 1);
        mt_pp_action_t t = sc.actions[1][a];
        sc.actions[1][a] = sc.actions[1][b], sc.actions[1][b] = t;
        mt_pp_channel_t *ch;
        int n;
        CHECK(mt_pp_sched_channels(&sc, &ch, &n) == MT_ERR_INTERNAL && !ch && n == 0,
              "an out-of-order channel was accepted");
        CHECK_CONTAINS(mt_error_message(), "activation channel from rank 0 to rank 1 is not in "
                       "order: rank 0 sends SEND_ACT s0 mb0");
        mt_error_clear();
        mt_pp_sched_free(&sc);
    }

    sc = fresh(MT_PP_GPIPE, 2, 1, 2); /* a send to the wrong peer */
    sc.actions[0][find(&sc, 0, MT_PP_SEND_ACT, 0)].peer = 0;
    expect_refused(&sc, "wrong peer", "peer is not the rank");
}

/* uniform send-buffer counts (at most each rank's sends) */
static mt_status_t check_uniform(const mt_pp_sched_t *sc, int n)
{
    int caps[8];
    for (int r = 0; r < sc->p; r++) {
        int ns, nr;
        mt_pp_sched_transfers(sc, r, &ns, &nr);
        caps[r] = n < ns ? n : ns;
    }
    return mt_pp_sched_check_buffers(sc, caps);
}

/* mt_pp_sched_buffers: a few per rank, independent of m (but for
 * looped_bfs, which holds every microbatch anyway), never more than the
 * list's transfers, and deadlock-free by mt_pp_sched_check_buffers, which
 * must refuse counts that do deadlock. */
static void test_buffers(void)
{
    for (int si = 0; si < MT_PP_NUM_SCHEDULES; si++)
        for (int p = 2; p <= 8; p *= 2) {
            mt_pp_schedule_t s = all[si];
            int v = mt_pp_schedule_default_v(s), prev[8][2], ms[2] = {16, 64};
            const char *sn = mt_pp_schedule_name(s);
            for (int mi = 0; mi < 2; mi++) {
                mt_pp_sched_t sc;
                if (mt_pp_schedule_build(s, p, v, ms[mi], &sc) != MT_OK) {
                    CHECK(0, "build %s p=%d m=%d: %s", sn, p, ms[mi], mt_error_message());
                    continue;
                }
                int caps[8], sends[8], recvs[8];
                CHECK(mt_pp_sched_buffers(&sc, sends, recvs) == MT_OK, "%s p=%d: %s", sn, p,
                      mt_error_message());
                for (int r = 0; r < p; r++) {
                    int ns, nr, bs = sends[r], br = recvs[r];
                    mt_pp_sched_transfers(&sc, r, &ns, &nr);
                    CHECK(bs >= (ns > 0) && bs <= ns && br >= (nr > 0) && br <= nr,
                          "%s p=%d m=%d rank %d: %d/%d send and %d/%d receive buffers", sn, p,
                          ms[mi], r, bs, ns, br, nr);
                    if (s != MT_PP_LOOPED_BFS && mi == 1)
                        CHECK(bs == prev[r][0] && br == prev[r][1], "%s p=%d rank %d: %d and %d "
                              "buffers at m=64, %d and %d at m=16", sn, p, r, bs, br, prev[r][0],
                              prev[r][1]);
                    if (s == MT_PP_1F1B || s == MT_PP_GPIPE || s == MT_PP_ZERO_BUBBLE)
                        CHECK(bs <= 2 && br <= 3, "%s p=%d rank %d: %d, %d buffers", sn, p, r, bs,
                              br);
                    prev[r][0] = bs, prev[r][1] = br, caps[r] = bs > 0 ? bs : 1;
                }
                CHECK(mt_pp_sched_check_buffers(&sc, caps) == MT_OK, "%s p=%d m=%d: %s", sn, p,
                      ms[mi], mt_error_message());
                mt_pp_sched_free(&sc);
            }
        }

    mt_pp_sched_t sc;
    /* 1f1b sends nothing its peer does not post a receive for in time: one
     * buffer each is enough */
    mt_pp_schedule_build(MT_PP_1F1B, 4, 1, 16, &sc);
    CHECK(check_uniform(&sc, 1) == MT_OK, "1f1b with 1 send buffer: %s", mt_error_message());
    mt_pp_sched_free(&sc);
    /* looped_bfs p=2: rank 1 returns stage 1's outputs before rank 0 posts
     * their receives (after all of stage 0), so rank 0's stage-0 sends need
     * buffers to wait in */
    mt_pp_schedule_build(MT_PP_LOOPED_BFS, 2, 2, 8, &sc);
    CHECK(check_uniform(&sc, 1) == MT_ERR_INTERNAL, "looped_bfs with 1 send buffer: no deadlock");
    CHECK_CONTAINS(mt_error_message(), "message buffers deadlock");
    CHECK_CONTAINS(mt_error_message(), "(1 send buffers) waits at action");
    mt_error_clear();
    CHECK(check_uniform(&sc, 4) == MT_OK, "looped_bfs p=2 m=8, 4 buffers: %s", mt_error_message());
    mt_pp_sched_free(&sc);
    /* the V: 7 each is the least that works at p=4 m=8 */
    mt_pp_schedule_build(MT_PP_V_SCHEDULE, 4, 2, 8, &sc);
    CHECK(check_uniform(&sc, 6) == MT_ERR_INTERNAL, "v_schedule with 6 send buffers: no deadlock");
    mt_error_clear();
    CHECK(check_uniform(&sc, 7) == MT_OK, "v_schedule with 7: %s", mt_error_message());
    int zero[4] = {0, 1, 1, 1};
    CHECK(mt_pp_sched_check_buffers(&sc, zero) == MT_ERR_RANGE, "0 send buffers accepted");
    mt_error_clear();
    mt_pp_sched_free(&sc);

    /* gpipe p=2, F = B = W = 1: each message is received when it is sent */
    mt_pp_sim_result_t r;
    mt_pp_schedule_build(MT_PP_GPIPE, 2, 1, 4, &sc);
    CHECK(mt_pp_simulate(&sc, 1, 1, 1, 0, &r) == MT_OK, "gpipe: %s", mt_error_message());
    CHECK(r.peak_msgs_out[0] == 1 && r.peak_msgs_in[1] == 1 && r.peak_msgs_out[1] == 1 &&
          r.peak_msgs_in[0] == 1, "gpipe p=2 messages at once: out %d %d, in %d %d",
          r.peak_msgs_out[0], r.peak_msgs_out[1], r.peak_msgs_in[0], r.peak_msgs_in[1]);
    mt_pp_sim_result_free(&r);
    /* ... and with a delay of 2.5 forwards, three are on their way at once */
    CHECK(mt_pp_simulate(&sc, 1, 1, 1, 2.5, &r) == MT_OK, "gpipe: %s", mt_error_message());
    CHECK(r.peak_msgs_out[0] == 3 && r.peak_msgs_in[1] == 3, "gpipe p=2 delayed: out %d, in %d",
          r.peak_msgs_out[0], r.peak_msgs_in[1]);
    mt_pp_sim_result_free(&r);
    mt_pp_sched_free(&sc);
}

int main(void)
{
    test_layout();
    test_closed_forms();
    test_buffers();
    test_corrupted();
    return mt_test_exit("test_pp_schedule");
}
