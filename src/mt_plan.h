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

#ifdef __cplusplus
extern "C" {
#endif

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

    double bubble_fraction;     /* idle share of the pipeline schedule, 0..1 */
    const char *bubble_formula; /* the formula used, for the report */
} mt_plan_t;

/* Estimate for a validated config. */
mt_status_t mt_plan_compute(const mt_config_t *cfg, mt_plan_t *plan);

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
