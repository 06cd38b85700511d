/* mt_pp_schedule.h: pipeline schedules as per-rank action lists, and a
 * simulator that checks and times them.
 *
 * One generator (mt_pp_schedule_build) writes every schedule of
 * mt_pp_schedule_t as, for each pipeline rank, the ordered list of what
 * that rank does: forward, backward (full, or split into the input-gradient
 * pass B and the weight-gradient pass W), and the point-to-point sends and
 * receives between stages.  The simulator (mt_pp_simulate) runs all lists
 * in virtual time with given costs, refuses lists that deadlock or leave a
 * message unmatched, and reports makespan, bubble and peak activations.
 *
 * No MPI and no model here: the executor that runs these lists over MPI,
 * and the split of the model into stages, live elsewhere.  doc/pipeline.md
 * describes the schedules and what the executor must honour. */
#ifndef MT_PP_SCHEDULE_H
#define MT_PP_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The schedules, as distributed.pipeline.pp_schedule names them (the
 * config layer parses the names; this layer owns what they mean). */
typedef enum {
    MT_PP_1F1B,
    MT_PP_GPIPE,
    MT_PP_INTERLEAVED_1F1B,
    MT_PP_LOOPED_BFS,
    MT_PP_DFS,
    MT_PP_V_SCHEDULE,
    MT_PP_ZERO_BUBBLE
} mt_pp_schedule_t;

#define MT_PP_NUM_SCHEDULES 7 /* members of mt_pp_schedule_t */

/* The canonical config name of s ("1f1b", "interleaved_1f1b", ...). */
const char *mt_pp_schedule_name(mt_pp_schedule_t s);
/* Schedules that place two or more stages on each rank. */
bool mt_pp_schedule_multi_stage(mt_pp_schedule_t s);

typedef enum {
    MT_PP_FORWARD,          /* F: forward of (stage, microbatch) */
    MT_PP_BACKWARD_INPUT,   /* B: gradient w.r.t. the stage input only */
    MT_PP_BACKWARD_WEIGHT,  /* W: weight gradients; after B of the same pair */
    MT_PP_BACKWARD,         /* B and W in one pass (schedules that do not split) */
    MT_PP_SEND_ACT,         /* stage's output activation to the next stage */
    MT_PP_RECV_ACT,         /* stage's input activation from the previous stage */
    MT_PP_SEND_GRAD,        /* gradient of stage's input to the previous stage */
    MT_PP_RECV_GRAD         /* gradient of stage's output from the next stage */
} mt_pp_action_kind_t;

typedef struct {
    mt_pp_action_kind_t kind;
    int32_t stage;       /* the stage on this rank the action belongs to */
    int32_t microbatch;
    int32_t peer;        /* send/recv: the other pipeline rank; else -1 */
    int32_t peer_stage;  /* send/recv: the stage on the peer (stage +- 1); else -1 */
} mt_pp_action_t;

/* The lists of one schedule; built by mt_pp_schedule_build, freed by
 * mt_pp_sched_free.  actions[r][0 .. num_actions[r]-1] is rank r's list. */
typedef struct {
    mt_pp_schedule_t schedule;
    int p, v, m;            /* pipeline ranks, stages per rank, microbatches */
    int num_stages;         /* p * v */
    bool split_backward;    /* B and W separate (zero_bubble, v_schedule) */
    mt_pp_action_t **actions;
    int *num_actions;
} mt_pp_sched_t;

/* Stages per rank a schedule uses when the config does not say:
 * 1 for gpipe, 1f1b, zero_bubble; 2 for the others. */
int mt_pp_schedule_default_v(mt_pp_schedule_t s);

/* Pipeline rank holding stage s: s mod p, except v_schedule's V (rank r
 * holds stages r and 2p-1-r). */
int mt_pp_stage_rank(mt_pp_schedule_t s, int p, int stage);

/* Whether (schedule, p, v, m) can be generated; MT_ERR_CONFIG with a
 * message naming the rule otherwise. */
mt_status_t mt_pp_schedule_check(mt_pp_schedule_t s, int p, int v, int m);

/* Generate every rank's list.  On failure *out is left empty. */
mt_status_t mt_pp_schedule_build(mt_pp_schedule_t s, int p, int v, int m, mt_pp_sched_t *out);
void mt_pp_sched_free(mt_pp_sched_t *sched);

/* "F", "B", "W", "BW", "SEND_ACT", ... */
const char *mt_pp_action_kind_name(mt_pp_action_kind_t k);

/* One action as text: "F s2 mb3", "SEND_ACT s2 mb3 -> rank 3 (s3)". */
void mt_pp_action_format(const mt_pp_action_t *a, char *buf, size_t cap);

/* MPI tag for a send/recv pair: the same on both sides, unique per
 * (boundary between two stages, microbatch, direction) within a step. */
int mt_pp_action_tag(const mt_pp_sched_t *sched, const mt_pp_action_t *a);

/* A point-to-point channel: the messages of one kind (activations, or
 * input gradients) that one pipeline rank sends another.  The executor
 * gives each channel a transport of its own without tags (a two-rank MPI
 * communicator, and an NCCL communicator on a GPU: NCCL has no tags), so a
 * channel's messages must be received in the order they are sent. */
typedef struct {
    int32_t from, to; /* pipeline ranks: sender, receiver */
    bool grad;        /* SEND_GRAD/RECV_GRAD; else SEND_ACT/RECV_ACT */
} mt_pp_channel_t;

/* The channel of a send or receive action of rank r. */
mt_pp_channel_t mt_pp_action_channel(const mt_pp_action_t *a, int r);

/* Every channel the lists use, in one order that every rank computes
 * alike (rank 0's sends in list order, then rank 1's, ...): *out
 * (malloc'd, NULL when none) and *n.  Fails with MT_ERR_INTERNAL, naming
 * the channel and the first message out of order, when a channel's
 * receiver would take its messages in another order than the sender sends
 * them. */
mt_status_t mt_pp_sched_channels(const mt_pp_sched_t *sched, mt_pp_channel_t **out, int *n);

/* Rank r's sends (*sends) and receives (*recvs) in its list. */
void mt_pp_sched_transfers(const mt_pp_sched_t *sched, int r, int *sends, int *recvs);

/* The device message buffers of every rank's NCCL transfers (pp_link.c;
 * what meshtrain-plan counts): sends[r] for rank r's sends, recvs[r] for
 * its receives ([p] each), each at most the list's count (pp_buffers.c,
 * doc/pipeline.md "Message buffers").  A buffer is reused in turn (the
 * k-th send of a run takes buffer k mod sends[r]), the device waiting for
 * its previous transfer: a send for the one before to complete, a receive
 * for the one before to be copied out.  The counts are what the timed
 * simulation (F = B = W = 1) has in flight at once plus one, the sends'
 * raised to the smallest common floor with which mt_pp_sched_check_buffers
 * finds no deadlock.  Fails with MT_ERR_INTERNAL for lists that are not
 * valid, MT_ERR_NOMEM when out of memory. */
mt_status_t mt_pp_sched_buffers(const mt_pp_sched_t *sched, int *sends, int *recvs);

/* Whether every list completes when rank q's sends take sends[q] device
 * buffers in turn, under the strictest timing the executor allows: a rank
 * posts a receive, and issues a send, only once its compute stream has
 * finished everything before it in its list; a send completes with its
 * receive (rendezvous, in channel order) and its buffer is free then.
 * MT_ERR_INTERNAL naming where each rank waits when they deadlock. */
mt_status_t mt_pp_sched_check_buffers(const mt_pp_sched_t *sched, const int *sends);

/* Every rank's list, one action per line (for tests and doc/pipeline.md). */
void mt_pp_sched_write(const mt_pp_sched_t *sched, FILE *out);

typedef struct {
    double makespan;          /* end of the last action */
    double busy_total;        /* compute time summed over ranks */
    double bubble_fraction;   /* idle / (p * makespan) */
    double bubble_ratio;      /* idle / busy: the (p-1)/m convention */
    int p;
    double *busy;             /* [p] compute time per rank */
    int *peak_inflight;       /* [p] most stage-microbatches with F done, B not */
    int *peak_held;           /* [p] ... with F done, backward not complete (W) */
    /* [p] most messages at once, each from its send's issue to its
     * receive's completion (both ends inclusive): sent by the rank
     * (peak_msgs_out) and sent to it (peak_msgs_in) */
    int *peak_msgs_out, *peak_msgs_in;
} mt_pp_sim_result_t;

/* Run every list in virtual time.  A compute action starts when its rank is
 * free and its inputs exist; a receive completes cost_comm after the
 * matching send was issued; sends do not block the sender.  BACKWARD costs
 * cost_b + cost_w.  Fails with MT_ERR_INTERNAL, naming ranks and actions,
 * on deadlock, an unmatched or duplicated message, an action for a stage
 * another rank holds, or a (stage, microbatch) without exactly one forward
 * and one complete backward. */
mt_status_t mt_pp_simulate(const mt_pp_sched_t *sched, double cost_f, double cost_b, double cost_w,
                           double cost_comm, mt_pp_sim_result_t *res);
void mt_pp_sim_result_free(mt_pp_sim_result_t *res);

#ifdef __cplusplus
}
#endif
#endif
