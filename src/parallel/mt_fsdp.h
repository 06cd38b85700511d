/* mt_fsdp.h: sharded data parallelism over the model's units, for
 * strategy fsdp2 (with HSDP) and megatron_fsdp zero_dp_strategy 1, 2, 3.
 *
 * Each unit (mt_model.h: the embedding, each decoder layer, the final norm
 * with lm_head) is a contiguous range of the flat parameter order.  It is
 * split over the shard group at row boundaries, as evenly as rows allow,
 * so every rank owns one contiguous run of rows of each unit (and so of
 * each tensor): the same rows a checkpoint hyperslab names.  What a rank
 * keeps of its units decides the strategy:
 *
 *   optimizer state        always its rows only (zero 1 and up, fsdp2)
 *   gradients              its rows (zero 2, 3, fsdp2): each unit's full
 *                          gradient is reduce-scattered as soon as the
 *                          unit's backward ends; else all-reduced in place
 *   parameters             its rows (zero 3, fsdp2): a unit is all-gathered
 *                          before its forward and again before its
 *                          backward, the next unit's gather is prefetched,
 *                          and the gathered copy is freed after use; else
 *                          the whole model, all-gathered after each update
 *
 * With HSDP the shard group is dp_shard and the reduce-scattered gradient
 * shards are then all-reduced across dp_replicate.  doc/training.md has
 * the buffer layout and the memory it costs.
 *
 * Wire dtypes (mt_comm_bf16.h): with gather_bf16 the sharded parameters
 * are all-gathered as bf16 and the gathered units hold float32 copies of
 * bf16 values (the owned float32 shard, the master, is not touched); with
 * reduce_bf16 every gradient reduction (reduce-scatter, zero 1 all-reduce,
 * HSDP replicate all-reduce) sends bf16 and sums in bf16, and the results
 * are float32 copies of bf16 values.
 *
 * bf16 storage (the model's bf16_storage, doc/mixed-precision.md): the
 * gathered units (p_work) and an unsharded model's parameter arena hold
 * bf16 bits, 2 bytes an element, so a gather lands the wire's bits as
 * they are, and unsharded parameters (zero 1 and 2, masters apart) send
 * their own rows as they are.  Owned shards and every gradient buffer
 * stay float32. */
#ifndef MT_FSDP_H
#define MT_FSDP_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "mt_comm_bf16.h"
#include "mt_model.h"
#include "mt_optim.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    bool shard_grads, shard_params;
    bool reshard_after_forward; /* free a gathered unit after its forward */
    bool prefetch;              /* gather the next unit while this one runs */
    bool overlap_reduce;        /* reduce a unit's gradients when its backward ends */
    bool overlap_gather;        /* unsharded parameters: the post-update
                                 * all-gather finishes during the next forward */
    bool defer_grad_sync;       /* with accumulation, keep unsharded gradients
                                 * and reduce on the last micro-step only */
    int64_t accum;              /* micro-steps per step */
    bool pipeline;              /* pipeline parallelism: a unit runs once per
                                 * microbatch in the schedule's order, so
                                 * it stays gathered from its first use to
                                 * the end of the step, its gradient
                                 * accumulates unsharded, and everything is
                                 * reduced in mt_fsdp_finish */
    bool gather_bf16;           /* parameter all-gathers in bf16 (param_dtype
                                 * bfloat16); needs shard_params or
                                 * masters_apart */
    bool masters_apart;         /* unsharded parameters whose float32 master
                                 * weights the caller keeps elsewhere (the
                                 * trainer's train_mp.c under bf16), so the
                                 * rows gathered are bf16 values already */
    bool reduce_bf16;           /* gradient reductions in bf16 (reduce_dtype
                                 * bfloat16) */
} mt_fsdp_options_t;

typedef struct {
    mt_model_t *model;
    mt_fsdp_options_t opt;
    MPI_Comm shard, replicate;  /* replicate: MPI_COMM_NULL without HSDP */
    int nshard, rank, nrep;
    int nunits;
    int *counts, *displs;       /* [unit * nshard + r]: rank r's part of a unit */
    mt_segment_t *seg;          /* [unit]: this rank's part (optimizer segments) */
    int64_t owned;              /* elements this rank owns */
    const mt_backend_t *be;     /* the model's: shards and buffers are its memory */
    float *p_shard, *g_shard;   /* packed owned parameters / gradients */
    float *p_work, *g_work;     /* gathered units / unsharded unit gradients */
    float *rs_tmp;              /* reduce-scatter landing zone after micro-step 0 */
    int64_t p_work_numel, g_work_numel, rs_tmp_numel;
    float **p_at, **g_at;       /* [unit]: where its full parameters / gradients go */
    int *p_state;               /* [unit]: 0 released, 1 gathering, 2 ready */
    bool *g_pending;            /* [unit]: reduction launched, not yet waited for */
    bool *g_into_tmp;           /* [unit]: that reduction lands in rs_tmp */
    MPI_Request *p_req, *g_req; /* [unit] */
    bool ring;                  /* gradients in ring slots (reduced every micro-step) */
    bool reduce_now;            /* this micro-step reduces */
    int64_t micro;              /* micro-step index within the step */
    /* Off host memory (mt_stage.h) the collectives run on host copies, one
     * region per unit so that every request in flight has its own: */
    float *h_param, *h_grad;    /* [model numel]: unit u's at unit_lo[u] */
    float *h_own;               /* [owned]: reduce-scatter results, HSDP sums */
    /* bf16 messages (gather_bf16, reduce_bf16), host memory laid out as
     * h_param, h_grad and h_own; NULL when that traffic is float32: */
    uint16_t *w_param, *w_grad; /* [model numel] */
    uint16_t *w_own;            /* [owned] */
    /* NCCL (distributed.collectives, doc/gpu.md): the mt_nccl_group_t of
     * shard (and of replicate under HSDP) when the collectives go through
     * NCCL on device memory, with no host buffers; pad: device space for
     * one unit's parts padded to equal counts (rep_pad: one shard, bf16) */
    void *nccl, *nccl_rep, *pad, *rep_pad;
    size_t pad_bytes;           /* of pad (counted with the unit buffers) */
    void **p_ev, **g_ev;        /* [nunits]: each unit's last gather / reduction
                                 * (mt_nccl_last_event), what its wait joins */
    bool *rep_early;            /* [nunits]: HSDP's replica all-reduce of the unit's
                                 * final shard already issued, chained to its
                                 * reduce-scatter (NCCL, overlapping backward) */
    mt_bf16_comm_t bf16;
} mt_fsdp_t;

/* Whether the config's strategy shards over data parallelism (fsdp2 with
 * dp_shard > 1, megatron_fsdp with zero_dp_strategy >= 1 and dp > 1), and
 * with which options.  The trainer and meshtrain-plan both decide here.
 * The wire dtypes come from distributed.mp_policy: gather_bf16 when
 * param_dtype is bfloat16 (zero 1 and 2 too, with masters_apart: the
 * trainer keeps their fp32 master weights outside the arena), reduce_bf16
 * when reduce_dtype is bfloat16. */
bool mt_fsdp_options_from_config(const mt_config_t *cfg, mt_fsdp_options_t *o);

/* Partition every unit of m over `shard`, allocate the shards and the
 * working buffers, and register the model's unit hook.  The model must
 * have been made with MT_MODEL_NO_PARAM_ARENA when shard_params and
 * MT_MODEL_NO_GRAD_ARENA when shard_grads.  replicate may be
 * MPI_COMM_NULL.  Collective over both groups. */
mt_status_t mt_fsdp_init(mt_fsdp_t *f, mt_model_t *m, MPI_Comm shard, MPI_Comm replicate,
                         const mt_fsdp_options_t *opt);
void mt_fsdp_free(mt_fsdp_t *f);

/* Initial weights of this rank's parameters (all of them when parameters
 * are not sharded), identical to the same elements of a one-rank model. */
void mt_fsdp_init_weights(mt_fsdp_t *f, uint64_t seed);

/* Before micro-step `micro` (0-based) of accum. */
mt_status_t mt_fsdp_begin(mt_fsdp_t *f, int64_t micro);

/* After the last micro-step's backward: every gradient reduction done
 * (HSDP replicate all-reduce included); seg[].grad hold this rank's rows of
 * the global gradient sum. */
mt_status_t mt_fsdp_finish(mt_fsdp_t *f);

/* After the optimizer updated seg[]: unsharded parameters are all-gathered
 * (waited for now, or in the next forward with overlap_gather). */
mt_status_t mt_fsdp_after_update(mt_fsdp_t *f);

/* Wait for every outstanding parameter all-gather (before a checkpoint). */
mt_status_t mt_fsdp_sync(mt_fsdp_t *f);

/* Bytes this rank holds: parameters and gradients, each split into the
 * owned shard and the working buffers (gathered units, unsharded unit
 * gradients, reduce-scatter landing zone). */
void mt_fsdp_bytes(const mt_fsdp_t *f, double *params_shard, double *params_work,
                   double *grads_shard, double *grads_work);

/* The working buffers' sizes (elements) for units [unit_lo[u],
 * unit_lo[u+1]) and `owned` owned elements: gathered parameters, unsharded
 * gradients and the reduce-scatter landing zone.  mt_fsdp_init allocates
 * exactly these; meshtrain-plan's estimate calls it too. */
void mt_fsdp_work_numel(const int64_t *unit_lo, int nunits, bool tied,
                        const mt_fsdp_options_t *o, int64_t owned, int64_t *p_work,
                        int64_t *g_work, int64_t *rs_tmp);

#ifdef __cplusplus
}
#endif
#endif
