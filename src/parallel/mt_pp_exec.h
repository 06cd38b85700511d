/* mt_pp_exec.h: the pipeline executor.  It runs one rank's action list of
 * an mt_pp_sched_t (mt_pp_schedule.h) on this rank's part of the model,
 * moving activations and gradients between stages over point-to-point
 * channels (mt_pp_sched_channels): each (sender, receiver, kind) has a
 * two-rank MPI communicator of its own, and on GPUs with NCCL an NCCL
 * communicator over it, so messages match in channel order, without tags
 * (NCCL has none), and the two directions never queue behind each other.
 *
 * Each stage-microbatch between its forward and the end of its backward
 * holds one activation slot of the model (mt_model_use_slot); the executor
 * hands slots out, and mt_pp_exec_init counts how many the list needs by
 * running its bookkeeping without compute.  An outgoing activation or
 * gradient is copied into a send buffer of its own, so nothing ever waits
 * for a send: a rank blocks only on a receive, whose send the simulator
 * has shown to come (doc/pipeline.md, "The executor").  Send buffers are
 * reused once their send completed; the pool grows in the first step to
 * the most messages the list has in flight at once.
 *
 * Through NCCL (mt_pp_exec_connect with nccl) a send copies the message
 * into a device buffer of its own on the compute stream and is enqueued on
 * the channel's stream; a receive is enqueued early into a device buffer
 * of its own and the compute stream waits for it on the device, then
 * copies it into the slot: the host waits for neither, and the transfers
 * overlap compute (pp_link.c, doc/gpu.md).  A MoE model's routing totals
 * (host doubles) travel beside them over the channel's MPI communicator.
 * On a CUDA backend the passes are timed with events on the compute
 * stream (the host only enqueues them). */
#ifndef MT_PP_EXEC_H
#define MT_PP_EXEC_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "mt_config.h"
#include "mt_model.h"
#include "mt_pp_schedule.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Global layers [*lo, *hi) of stage s: layers_per_stage each (the last
 * stage takes the remainder), or an even split. */
void mt_pp_stage_layers(const mt_config_t *cfg, int s, int *lo, int *hi);

/* A channel this rank is an end of. */
typedef struct {
    mt_pp_channel_t ch;
    MPI_Comm comm;  /* its two ranks: the sender is rank 0 */
    int peer;       /* the other end's rank in comm */
    void *nccl;     /* its NCCL group (mt_nccl.h), or NULL: MPI */
    char name[48];  /* "pp activations 0->1", for NCCL's messages */
} mt_pp_link_t;

/* Device buffers of the NCCL transfers, each with the event after which
 * it is free again (cudaEvent_t), taken in turn from next. */
typedef struct {
    void **buf;
    void **free_ev;
    int n, next;
} mt_pp_dbufs_t;

typedef struct {
    mt_pp_sched_t sched;
    MPI_Comm pp;
    int rank;                 /* in pp */
    int nchunks;
    int *chunk_of_stage;      /* [num_stages]: local chunk, or -1 */
    int *stage_of_chunk;      /* [nchunks] */
    int *layer_lo, *layer_hi; /* [nchunks] */
    int nslots;
    /* run state */
    int *slot_of;             /* [nchunks * m]: slot of (chunk, microbatch), or -1 */
    bool *slot_busy;          /* [nslots] */
    char **send_buf;          /* [nsend]: outgoing messages (host), each the
                               * activation (Ns * H floats, or bf16 padded to 8
                               * bytes) then the MoE routing totals
                               * (mt_model_t.route) */
    char *recv_buf;           /* an incoming message, unless received in place */
    float *scratch;           /* Ns * H floats: staging of bf16 messages */
    MPI_Request *send_req;    /* [nsend]: their sends (NULL request: free) */
    int nsend;
    float *handoff;           /* forward-only passes: a message's staging */
    mt_pp_link_t *links;      /* [nlinks] (mt_pp_exec_connect) */
    int nlinks;
    const mt_backend_t *be;   /* owner of the device send buffers */
    bool bf16;                /* activations and gradients travel as bf16 */
    bool bits;                /* ... and are bf16 bits already (bf16 storage) */
    bool failed;              /* a run failed: transfers may be pending */
    mt_pp_dbufs_t dsend, drecv; /* NCCL sends' and receives' device buffers */
    void **ev;                /* cuda: timing events of a run's passes, 2 per action */
    int nev;
    /* measured over every run: seconds and counts of F, B, W and BW passes
     * (the compute), and the runs' wall time */
    double t_pass[4];
    int64_t n_pass[4];
    double t_run;
    int64_t runs;
    double bytes_sent;        /* of the transfers' messages, every run */
} mt_pp_exec_t;

/* Build the schedule for cfg and this pipeline rank; count its slots.
 * Collective over nothing; pp is kept for mt_pp_exec_run. */
mt_status_t mt_pp_exec_init(mt_pp_exec_t *x, const mt_config_t *cfg, MPI_Comm pp);

/* Make the channels this rank is an end of, before the first run:
 * collective over pp.  With nccl (device memory, NCCL active: mt_nccl.h)
 * each gets an NCCL communicator too, connected, and the device buffers
 * of a run's messages of act floats (one per send and receive of this
 * rank's list) are made; be is the model's backend.  bf16: the
 * activations and gradients are bf16 values (bf16 compute) and travel as
 * bf16, half the bytes, exactly. */
mt_status_t mt_pp_exec_connect(mt_pp_exec_t *x, const mt_backend_t *be, bool nccl, bool bf16,
                               int64_t act);
void mt_pp_exec_free(mt_pp_exec_t *x);

/* The part of the model this rank builds (pointers into x). */
void mt_pp_exec_part(const mt_pp_exec_t *x, mt_model_part_t *part);

/* Run the list once: microbatch i uses tokens/targets + i * N (and pos,
 * docs + i * N for packed rows, pos alone under context parallelism, else
 * NULL).  Adds the loss sum and
 * counted targets of the microbatches whose last stage is here to *loss
 * and *count.  Gradients accumulate as mt_model_step's. */
mt_status_t mt_pp_exec_run(mt_pp_exec_t *x, mt_model_t *m, const int32_t *tokens,
                           const int32_t *targets, const int32_t *pos, const int32_t *docs,
                           float grad_scale, double *loss, int64_t *count);

/* The measured idle share of the pipeline ranks' time in the runs so far
 * (1 - compute / wall time, over every rank of pp), and the simulator's
 * bubble fraction for the same lists with the measured mean F, B and W
 * costs and no transfer time; *mb_run: the megabytes a pipeline rank sent
 * in a run (activations, gradients, routing totals), the mean over pp.
 * Collective over pp. */
mt_status_t mt_pp_exec_idle(mt_pp_exec_t *x, double *measured, double *simulated,
                            double cost[3], double *mb_run);

/* Forward only (validation) of one microbatch through every stage in
 * order; the loss sum and count come back on every pipeline rank. */
mt_status_t mt_pp_exec_forward(mt_pp_exec_t *x, mt_model_t *m, const int32_t *tokens,
                               const int32_t *targets, double *loss, int64_t *count);

#ifdef __cplusplus
}
#endif
#endif
