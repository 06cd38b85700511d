/* train_mp.h: mixed precision's master weights in the trainer
 * (train_mp.c, doc/mixed-precision.md).  Not installed.
 *
 * With distributed.mp_policy.param_dtype bfloat16 the model computes with
 * bf16 parameter values held in its float32 parameter arena, and the
 * optimizer updates float32 master weights.  Where the optimizer's
 * segments are the arena itself (DDP and one rank, megatron_fsdp zero 1
 * and 2), the master weights are a separate copy of this rank's segments;
 * where they are FSDP's own shards (fsdp2, zero 3), the shards are the
 * master weights already and the all-gather delivers bf16 values. */
#ifndef MT_TRAIN_MP_H
#define MT_TRAIN_MP_H

#include <stdbool.h>
#include <stdint.h>

#include "mt_model.h"
#include "mt_optim.h"
#include "mt_status.h"

typedef struct {
    const mt_backend_t *be;
    const mt_segment_t *work; /* the caller's segments: params in the arena */
    mt_segment_t *seg;        /* the same with params in `master` */
    int nseg;
    float *master;            /* this rank's segments, fp32, backend memory */
    bool storage;             /* bf16 storage: the arena holds bf16 bits (work too) */
} mt_train_mp_t;

/* Called once the model's weights are initialised.  For a float32 model,
 * or when in_arena is false (the segments are shards apart from the
 * arena): nothing, and *use stays seg.  Otherwise the master copy of the
 * segments, the arena rounded to bf16 values (all of it: under zero 1
 * and 2 every rank holds the whole initial model), and *use = segments
 * whose params are the master copy and whose work is the arena: the
 * optimizer's update writes the bf16 compute copy itself (mt_segment_t).
 * Under bf16 storage (mt_model_t.bf16_storage) the arena holds only the
 * weights' bf16 bits, so the master copy comes from seed instead (the
 * values mt_model_init_weights rounded into the arena). */
mt_status_t mt_train_mp_init(mt_train_mp_t *mp, const mt_model_t *m, const mt_segment_t *seg,
                             int nseg, int64_t owned, bool in_arena, uint64_t seed,
                             const mt_segment_t **use);

/* After a checkpoint load of the master weights: this rank's segments of
 * the arena = the master rounded to bf16 (after an optimizer update the
 * update has written them).  (A megatron_fsdp zero 1/2 all-gather then
 * spreads them.)  Nothing when off. */
void mt_train_mp_refresh(const mt_train_mp_t *mp);

/* Optimizer-state bytes of numel elements: AdamW's two moments, and the
 * master copy when mp keeps one. */
static inline double mt_train_mp_optim_bytes(const mt_train_mp_t *mp, int64_t numel)
{
    return (mp->master ? 12.0 : 8.0) * (double)numel;
}

void mt_train_mp_free(mt_train_mp_t *mp);

#endif
