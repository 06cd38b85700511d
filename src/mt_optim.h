/* mt_optim.h: AdamW over the model's flat parameter arena, global-norm
 * gradient clipping and the learning-rate schedule.  The optimizer state
 * is laid out exactly like the parameters, so it shards with them. */
#ifndef MT_OPTIM_H
#define MT_OPTIM_H

#include <stdint.h>

#include "mt_config.h"
#include "mt_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float *exp_avg, *exp_avg_sq; /* element i is parameter arena offset lo + i */
    int64_t lo, hi;              /* the range of the arena this rank updates */
    int64_t numel;               /* hi - lo */
    int64_t step;                /* updates applied */
} mt_adamw_t;

/* State for parameter arena offsets [lo, hi): the whole arena, or this
 * rank's shard when the optimizer state is sharded (megatron_fsdp zero >= 1). */
mt_status_t mt_adamw_init(mt_adamw_t *opt, int64_t lo, int64_t hi);
void mt_adamw_free(mt_adamw_t *opt);

/* One update of the parameters in [lo, hi) with learning rate lr; no
 * weight decay on norm weights. */
void mt_adamw_step(mt_adamw_t *opt, mt_model_t *m, const mt_optimizer_config_t *oc, double lr);

/* Learning rate for update number `step` (1-based): linear warm-up to
 * optimizer.lr over lr_warmup_steps, then cosine or linear decay to min_lr
 * at max_steps, or constant. */
double mt_lr_at(const mt_config_t *cfg, int64_t step);

/* Sum of squared gradients of this rank's parameters (deterministic). */
double mt_grad_sumsq(const mt_model_t *m);

/* Clip coefficient for a global norm: min(1, max_norm / (norm + 1e-6));
 * 1 when max_norm is 0 (clipping off). */
double mt_clip_coef(double norm, double max_norm);

#ifdef __cplusplus
}
#endif
#endif
