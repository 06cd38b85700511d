/* mt_optim.h: AdamW over segments of the model's flat parameter order, global-norm
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

/* A range of the flat parameter order that this rank updates, and where
 * its parameters and gradients live: flat element offset + i is param[i]
 * and grad[i], and optimizer-state element state + i.  One segment covers
 * the whole model when nothing is sharded; a sharded strategy has one per
 * unit (mt_fsdp.h).  work: NULL, or (mixed precision with the master
 * weights apart, train_mp.h) where the bf16 compute copy of param lives,
 * which the update then writes in the same pass (adamw_bf16_copy). */
typedef struct {
    int64_t offset, count;
    float *param, *grad;
    int64_t state;
    float *work;
} mt_segment_t;

typedef struct {
    float *exp_avg, *exp_avg_sq; /* numel elements, in segment order */
    int64_t numel;
    int64_t step;                /* updates applied */
    const mt_backend_t *be;      /* whose memory the moments are in */
} mt_adamw_t;

/* The whole model as one segment (parameter and gradient arenas). */
mt_segment_t mt_segment_whole(const mt_model_t *m);

/* State for numel parameter elements (the sum of this rank's segments),
 * zeroed, in be's memory (beside the parameters it updates). */
mt_status_t mt_adamw_init(mt_adamw_t *opt, const mt_backend_t *be, int64_t numel);
void mt_adamw_free(mt_adamw_t *opt);

/* One update of the parameters in the segments with learning rate lr and
 * the gradients times gscale (the clipping coefficient, 1 for none:
 * the same bits as mt_grad_scale first, without its pass; the stored
 * gradients are left unscaled); no weight decay on norm weights.  A
 * segment with work also gets its bf16 compute copy there. */
void mt_adamw_step(mt_adamw_t *opt, const mt_model_t *m, const mt_segment_t *seg, int nseg,
                   const mt_optimizer_config_t *oc, double lr, float gscale);

/* Learning rate for update number `step` (1-based): linear warm-up to
 * optimizer.lr over lr_warmup_steps, then cosine or linear decay to min_lr
 * at max_steps, or constant. */
double mt_lr_at(const mt_config_t *cfg, int64_t step);

/* Sum of squared gradients over the segments (deterministic). */
double mt_grad_sumsq(const mt_model_t *m, const mt_segment_t *seg, int nseg);

/* Multiply the segments' gradients by c (clipping). */
void mt_grad_scale(const mt_model_t *m, const mt_segment_t *seg, int nseg, float c);

/* Clip coefficient for a global norm: min(1, max_norm / (norm + 1e-6));
 * 1 when max_norm is 0 (clipping off). */
double mt_clip_coef(double norm, double max_norm);

#ifdef __cplusplus
}
#endif
#endif
