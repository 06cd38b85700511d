/* train_moe.h: what the training loop does for MoE models (train_moe.c):
 * the expert parameters' own reduction, norm, optimizer and checkpoint
 * entries, the load-balancing loss's scale, and the per-step expert load.
 * Not installed. */
#ifndef MT_TRAIN_MOE_H
#define MT_TRAIN_MOE_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "moe_dispatch.h"
#include "mt_ddp.h"
#include "mt_fsdp.h"
#include "mt_config.h"
#include "mt_mesh.h"
#include "mt_model.h"
#include "mt_optim.h"
#include "train_internal.h"
#include "train_mp.h"

typedef struct {
    bool on;                  /* the model has MoE layers */
    int ep;
    int64_t E, L;             /* experts; layers of the whole model */
    bool *sparse;             /* [L]: global layer g is a MoE layer */
    int dp_rank;              /* index in dp (bias checkpoint writer) */
    MPI_Comm rep;             /* ranks holding the same experts: the same pipeline
                               * stage and EP index (ep_shard x tp ranks; every
                               * dp x cp x tp rank of the stage when ep is 1) */
    MPI_Comm tokens;          /* ranks holding the same micro-batches' other tokens:
                               * the same stage and dp index (cp x tp ranks), for
                               * the routing totals (m->route_sum) */
    MPI_Comm world;           /* the mesh's communicator */
    MPI_Comm ep_comm;         /* the EP group (ep > 1) or MPI_COMM_NULL */
    mt_moe_dispatch_t dispatch;
    mt_ddp_t ddp;             /* replicated over more than one rank: their gradient
                               * buckets over rep, started as backward goes on */
    bool ddp_on;
    bool reduce_bf16;         /* their sum in bf16 (mp_policy.reduce_dtype) */
    mt_adamw_t opt;           /* expert optimizer state, laid out like seg */
    bool sharded;             /* experts FSDP-sharded over rep (else replicated) */
    mt_model_t view;          /* the experts as a model (mt_moe_param_view) */
    int64_t *unit_lo;         /* its units: the model's, holding the experts */
    mt_fsdp_t fsdp;           /* sharded: the experts' fsdp */
    mt_segment_t whole;       /* replicated: the whole expert arena */
    const mt_segment_t *seg;  /* what this rank updates */
    int nseg;
    void (*dense_hook)(void *ctx, int unit, mt_unit_event_t ev); /* chained */
    void *dense_ctx;
    double coef;              /* router_aux_loss_coef */
    float post_scale;         /* the step's scale of the reduced gradients (pipelines
                               * without scale_grads_in_schedule), else 1 */
    int64_t micro;            /* micro-batches of a step: grad_accum x pipeline
                               * microbatches x dp */
    bool counts_aux;          /* this rank's aux losses count in the step's figure
                               * (the first rank of its token group) */
    double bias_rate;         /* model.moe_router_bias_update_rate */
    bool capacity;            /* a capacity factor is set */
    /* the step's figures, over every rank (mt_train_moe_step_stats) */
    double aux;
    int64_t *load;            /* [L * E]: tokens per expert by global layer */
    int64_t dropped;          /* (token, slot) pairs over capacity */
    int64_t load_min, load_max; /* per expert, over the MoE layers */
    double imbalance;
    mt_train_mp_t mp;         /* bf16 compute: the experts' fp32 master weights */
    double a2a_seconds;       /* this step's all-to-all time, max over ranks */
    int64_t a2a_bytes;        /* this step's all-to-all bytes sent, summed over ranks */
} mt_train_moe_t;

/* What this release refuses for MoE training, with a message each. */
mt_status_t mt_train_moe_check(const mt_config_t *cfg, int world);

/* After the model is built (ep rank from the mesh): groups, the dispatch
 * hook, expert weights, optimizer state. */
mt_status_t mt_train_moe_init(mt_train_moe_t *t, mt_model_t *m, const mt_config_t *cfg,
                              const mt_mesh_t *mesh);
void mt_train_moe_free(mt_train_moe_t *t);

/* After a checkpoint load: the experts' bf16 compute copy of their master
 * weights (nothing unless bf16 keeps the masters apart). */
mt_status_t mt_train_moe_after_load(mt_train_moe_t *t);

/* Append the expert tensors (every expert's names; rows only for this
 * rank's experts) to the checkpoint lists, after mt_train_ckpt_writers:
 * the first of the ranks holding the same experts writes them. */
mt_status_t mt_train_moe_ckpt(mt_train_moe_t *t, mt_train_ckpt_t *c, const mt_model_t *m);

/* Before micro-step `micro` (the experts' fsdp); last: the replicated
 * experts' buckets reduce during this backward (the last micro-step,
 * without a pipeline, as mt_ddp_begin's sync). */
mt_status_t mt_train_moe_begin_micro(mt_train_moe_t *t, int64_t micro, bool last);

/* Before a step's micro-batches.  in_schedule: each micro-batch's loss
 * gradient is scaled by 1 / tokens inside backward (else the reduced
 * gradients are scaled by grad_scale = 1 / tokens afterwards, and the
 * aux loss's gradient is raised by 1 / grad_scale to come out right). */
void mt_train_moe_begin_step(mt_train_moe_t *t, mt_model_t *m, bool in_schedule,
                             float grad_scale);

/* Finish the expert gradients (all-reduce over the replicas, or the
 * sharded reductions, then the step's post_scale), then the experts' share of the squared global
 * gradient norm (summed over the ranks holding distinct parts). */
mt_status_t mt_train_moe_grad_sumsq(mt_train_moe_t *t, mt_model_t *m, double *sumsq);

/* Clip by coef (< 1) and apply AdamW to the experts (not when !apply: a
 * skipped step), then the sharded experts' all-gather either way. */
mt_status_t mt_train_moe_update(mt_train_moe_t *t, mt_model_t *m, double coef,
                                const mt_optimizer_config_t *oc, double lr, bool apply);

/* The step's aux loss (mean over micro-batches) and expert load, over
 * every rank; fills the figures above, and moves the balancing bias
 * (after the update: it steers the next step).  Collective over the mesh. */
mt_status_t mt_train_moe_step_stats(mt_train_moe_t *t, mt_model_t *m);

/* Add the experts' bytes on this rank (own parameters and gradients,
 * and the sharded experts' working buffers) to the memory line's figures. */
void mt_train_moe_bytes(const mt_train_moe_t *t, const mt_model_t *m, double *params_own,
                        double *params_work, double *grads_own, double *grads_work,
                        double *activations);

/* " | aux ... | load ..." for the step line, and ", \"aux_loss\": ..." for
 * metrics.jsonl (empty strings when not a MoE run). */
void mt_train_moe_log(const mt_train_moe_t *t, char *line, size_t lcap, char *json, size_t jcap);

#endif
