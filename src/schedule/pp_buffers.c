/* pp_buffers.c: how many device message buffers a pipeline rank's NCCL
 * transfers keep (mt_pp_sched_buffers in mt_pp_schedule.h), and the check
 * that reusing them cannot deadlock (mt_pp_sched_check_buffers).
 * doc/pipeline.md "Message buffers" has the argument.
 *
 * The executor (pp_link.c) never blocks its host for a buffer: the k-th
 * send of a run converts into buffer k mod n_send once the device has
 * seen the send that used it before complete, and a receive waits (on its
 * channel's stream) for the copy out of the receive before it.  Whether
 * the lists still complete is a question about the device's order, and
 * this file answers it for the strictest timing the executor allows: a
 * rank's host posts a receive and issues a send only when its compute
 * stream has finished everything before them in its list (the host never
 * ahead of the device).  Every wait of a real run is one this timing has
 * too (a host ahead of its device only posts receives sooner; where a host
 * blocks, on its own compute stream or on an MPI routing message, this
 * timing has already waited), so lists that complete here complete under
 * any timing.  In that timing a receive's buffer wait is always met
 * already (the copy out it waits for came earlier in the same list), so
 * only the send counts matter.  Across runs the buffers' events carry
 * over: a run's first use of a buffer waits for the previous run's last,
 * which completes because that run's lists did, none of its device work
 * waiting for anything issued later. */
#include "mt_pp_schedule.h"
#include "pp_sched_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const mt_pp_sched_t *sc;
    const int *cap;     /* [p] send buffers */
    mt_pp_channel_t *ch;
    int nch;
    int *chan;          /* [sum of list lengths]: action's channel, or -1 */
    int *first;         /* [p]: rank r's actions start at chan[first[r]] */
    int *sent, *posted; /* [nch]: sends issued, receives posted, per channel */
    int *pc;            /* [p]: next action */
    bool *waiting;      /* [p]: the receive at pc is posted, its message not here */
    int *ring_ch, *ring_k, *nsent; /* [p * maxcap]: channel and index of the send in
                                    * each buffer (-1: none yet); [p]: sends so far */
    int maxcap;
} bufsim_t;

static int channel_index(const bufsim_t *z, const mt_pp_action_t *a, int r)
{
    mt_pp_channel_t c = mt_pp_action_channel(a, r);
    for (int i = 0; i < z->nch; i++)
        if (z->ch[i].from == c.from && z->ch[i].to == c.to && z->ch[i].grad == c.grad)
            return i;
    return -1;
}

/* Rank r's next action: true when done. */
static bool advance(bufsim_t *z, int r)
{
    const mt_pp_action_t *a = &z->sc->actions[r][z->pc[r]];
    int c = z->chan[z->first[r] + z->pc[r]];
    if (a->kind == MT_PP_SEND_ACT || a->kind == MT_PP_SEND_GRAD) {
        int b = z->nsent[r] % z->cap[r], *bc = &z->ring_ch[r * z->maxcap + b];
        int *bk = &z->ring_k[r * z->maxcap + b];
        /* the buffer's previous message completes once it is received */
        if (*bc >= 0 && z->posted[*bc] <= *bk)
            return false;
        *bc = c, *bk = z->sent[c]++;
        z->nsent[r]++;
        return true;
    }
    if (a->kind == MT_PP_RECV_ACT || a->kind == MT_PP_RECV_GRAD) {
        if (!z->waiting[r])
            z->posted[c]++, z->waiting[r] = true;
        if (z->sent[c] < z->posted[c]) /* rendezvous in channel order */
            return false;
        z->waiting[r] = false;
        return true;
    }
    return true; /* compute: its inputs are messages received before it */
}

mt_status_t mt_pp_sched_check_buffers(const mt_pp_sched_t *sc, const int *sends)
{
    int p = sc->p, total = 0;
    bufsim_t z = {.sc = sc, .cap = sends};
    for (int r = 0; r < p; r++) {
        total += sc->num_actions[r];
        if (sends[r] < 1)
            MT_FAIL(MT_ERR_RANGE, "pipeline rank %d: %d send buffers (at least 1)", r, sends[r]);
        z.maxcap = sends[r] > z.maxcap ? sends[r] : z.maxcap;
    }
    MT_TRY(mt_pp_sched_channels(sc, &z.ch, &z.nch));
    size_t nc = (size_t)(z.nch > 0 ? z.nch : 1), ring = (size_t)p * (size_t)z.maxcap;
    z.chan = malloc(sizeof(int) * ((size_t)total + 4 * (size_t)p + 2 * nc + 2 * ring + 1));
    z.waiting = calloc((size_t)p, sizeof *z.waiting);
    mt_status_t st = MT_OK;
    if (!z.chan || !z.waiting) {
        st = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "pipeline buffer check");
        goto out;
    }
    z.first = z.chan + total, z.pc = z.first + p, z.nsent = z.pc + p;
    z.sent = z.nsent + p, z.posted = z.sent + nc;
    z.ring_ch = z.posted + nc, z.ring_k = z.ring_ch + ring;
    memset(z.pc, 0, sizeof(int) * (2 * (size_t)p + 2 * nc));
    for (size_t i = 0; i < ring; i++)
        z.ring_ch[i] = -1, z.ring_k[i] = 0;
    for (int r = 0, at = 0; r < p; r++) {
        z.first[r] = at;
        for (int i = 0; i < sc->num_actions[r]; i++, at++) {
            mt_pp_action_kind_t k = sc->actions[r][i].kind;
            bool msg = k == MT_PP_SEND_ACT || k == MT_PP_SEND_GRAD || k == MT_PP_RECV_ACT ||
                       k == MT_PP_RECV_GRAD;
            z.chan[at] = msg ? channel_index(&z, &sc->actions[r][i], r) : -1;
            if (msg && z.chan[at] < 0) {
                st = mt_error_set(MT_ERR_INTERNAL, __FILE__, __LINE__, "pipeline rank %d "
                                  "action %d: a message of no channel", r, i);
                goto out;
            }
        }
    }
    for (bool progress = true; progress;) {
        progress = false;
        for (int r = 0; r < p; r++)
            while (z.pc[r] < sc->num_actions[r] && advance(&z, r))
                z.pc[r]++, progress = true;
    }
    for (int r = 0; r < p; r++)
        if (z.pc[r] < sc->num_actions[r]) {
            st = mt_pp_sched_stuck(sc, z.pc, sends, "the pipeline's NCCL message buffers "
                                   "deadlock", __FILE__, __LINE__);
            break;
        }
out:
    free(z.ch), free(z.chan), free(z.waiting);
    return st;
}

/* The send counts with every rank's at least `floor` (and at most its
 * sends): whether they deadlock. */
static mt_status_t try_floor(const mt_pp_sched_t *sc, const int *want, const int *ns, int floor,
                             int *cap)
{
    for (int q = 0; q < sc->p; q++) {
        int c = want[q] > floor ? want[q] : floor;
        cap[q] = c < ns[q] ? c : ns[q] > 0 ? ns[q] : 1;
    }
    mt_status_t st = mt_pp_sched_check_buffers(sc, cap);
    if (st != MT_OK)
        mt_error_clear();
    return st;
}

mt_status_t mt_pp_sched_buffers(const mt_pp_sched_t *sc, int *sends, int *recvs)
{
    int p = sc->p, most = 1;
    mt_pp_sim_result_t res;
    MT_TRY(mt_pp_simulate(sc, 1.0, 1.0, 1.0, 0.0, &res));
    int *ns = calloc(3 * (size_t)p, sizeof *ns);
    if (!ns) {
        mt_pp_sim_result_free(&res);
        MT_FAIL(MT_ERR_NOMEM, "pipeline buffer counts");
    }
    int *nr = ns + p, *want = nr + p;
    for (int q = 0; q < p; q++) {
        mt_pp_sched_transfers(sc, q, &ns[q], &nr[q]);
        want[q] = res.peak_msgs_out[q] + 1;
        recvs[q] = res.peak_msgs_in[q] + 1 < nr[q] ? res.peak_msgs_in[q] + 1 : nr[q];
        most = ns[q] > most ? ns[q] : most;
    }
    mt_pp_sim_result_free(&res);
    /* The smallest floor under every rank's count that does not deadlock:
     * 1, 2, 3, 4, 8, ... until one passes, then bisected down (the last
     * floor tried passes).  At `most` no buffer is ever reused, which is
     * the lists' own order: that fails only for lists that are not valid. */
    int fail = 0, pass = 1;
    while (try_floor(sc, want, ns, pass, sends) != MT_OK) {
        fail = pass;
        if (pass >= most) {
            free(ns);
            return mt_pp_sched_check_buffers(sc, sends); /* the error again, kept */
        }
        pass = pass < 4 ? pass + 1 : 2 * pass < most ? 2 * pass : most;
    }
    while (pass - fail > 1) {
        int mid = fail + (pass - fail) / 2;
        if (try_floor(sc, want, ns, mid, sends) == MT_OK)
            pass = mid;
        else
            fail = mid;
    }
    mt_status_t st = try_floor(sc, want, ns, pass, sends);
    for (int q = 0; q < p; q++)
        sends[q] = ns[q] > 0 ? sends[q] : 0;
    free(ns);
    return st;
}
