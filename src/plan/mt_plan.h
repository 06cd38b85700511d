/* mt_plan.h: what a configuration will cost, before any rank starts.
 *
 * From a validated config: parameter counts, a per-rank memory estimate
 * (parameters, gradients, optimizer state, activations; the formulas are
 * in doc/plan.md) and the pipeline bubble fraction of the schedule.  Pure
 * arithmetic, no MPI: meshtrain-plan runs it for any world size. */
#ifndef MT_PLAN_H
#define MT_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "mt_config.h"
#include "mt_pp_schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One schedule of meshtrain-plan's comparison table. */
typedef struct {
    mt_pp_schedule_t schedule;
    int v;                  /* stages per rank it was simulated with */
    bool valid, chosen;     /* valid: the generator accepts these sizes */
    double bubble_fraction, bubble_ratio;
    int peak_held;          /* rank 0's stage-microbatches holding activations */
    char note[200];         /* why not valid */
} mt_plan_pp_row_t;

typedef struct {
    /* logical parameter counts (unsharded, padded vocabulary) */
    int64_t params_total;
    int64_t params_embedding;   /* embed_tokens */
    int64_t params_head;        /* final norm + lm_head (0 for lm_head when tied) */
    int64_t params_layer_max;   /* the largest decoder layer */

    /* per-rank estimate for the worst pipeline rank, in bytes */
    int worst_pp_rank;
    int64_t layers_on_worst;    /* decoder layers held by that rank */
    double bytes_params, bytes_grads, bytes_optim, bytes_activations, bytes_total;
    double inflight_microbatches; /* stage-microbatches alive on the worst rank */
    bool bf16_storage;          /* the estimate is for bf16 storage (MT_PLAN_BF16_STORAGE) */

    /* distributed.device cuda (doc/plan.md): device memory beside the
     * arenas above, on the same worst rank, included in bytes_total: the
     * backend's workspace (cuBLASLt workspace and kernel scratch) and, when
     * NCCL may carry the collectives (collectives auto or nccl, one GPU per
     * rank), its wire buffers: the pipeline's message buffers and the fsdp,
     * ddp and tensor-parallel pads.  0 on the CPU. */
    double bytes_device_workspace, bytes_device_nccl;

    double bubble_fraction;     /* idle share of the pipeline schedule, 0..1 */
    double bubble_ratio;        /* idle over compute: the (p-1)/m convention */
    const char *bubble_formula; /* how it was obtained, for the report */

    /* Every schedule simulated for this p and m (pp_size > 1): v is the
     * config's stages per rank for the multi-stage schedules when the chosen
     * one is multi-stage, else 2.  Schedules the generator refuses for these
     * sizes have valid = false and the reason in note. */
    int pp_table_len;
    mt_plan_pp_row_t pp_table[MT_PP_NUM_SCHEDULES];
} mt_plan_t;

/* Estimate for a validated config.  _ex takes flags: MT_PLAN_BF16_STORAGE
 * for bf16 storage (MESHTRAIN_BF16_STORAGE=1 under bf16 mixed precision,
 * doc/mixed-precision.md), whose arenas hold bf16 bits. */
enum { MT_PLAN_BF16_STORAGE = 1 };
mt_status_t mt_plan_compute(const mt_config_t *cfg, mt_plan_t *plan);
mt_status_t mt_plan_compute_ex(const mt_config_t *cfg, unsigned flags, mt_plan_t *plan);

/* What the plan puts in the trainer's device pool: the total less the
 * backend's workspace (taken from the reservation before the pool); the
 * trainer prints it beside the pool's peak. */
double mt_plan_device_pool_bytes(const mt_plan_t *plan);

/* The smallest GPU (bytes) whose training reservation holds a rank of
 * this plan, one rank per GPU: the reservation (workspace and pool) is
 * MT_CUDA_MEMORY_SHARE of the GPU's memory (mt_cuda_setup). */
double mt_plan_gpu_bytes_needed(const mt_plan_t *plan);

/* Decoder layers held by pipeline rank r (all stages of that rank). */
int64_t mt_plan_layers_on_rank(const mt_config_t *cfg, int64_t pp_rank);

/* Human report: sizes, groups (max_groups per axis, <= 0 all), memory, bubble. */
void mt_plan_write_text(const mt_config_t *cfg, const mt_plan_t *plan, FILE *out,
                        int64_t max_groups);

/* The same as one JSON object (every group listed). */
void mt_plan_write_json(const mt_config_t *cfg, const mt_plan_t *plan, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
