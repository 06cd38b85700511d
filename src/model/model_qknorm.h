/* model_qknorm.h: the q/k RMSNorms of the attention block, per head
 * (Qwen3) or over the whole projection (OLMoE), in the model's single-device
 * code; under tensor parallelism the whole-projection norm adds its row
 * sums over the TP group through the model's tp_allreduce hook. */
#ifndef MT_MODEL_QKNORM_H
#define MT_MODEL_QKNORM_H

#include "mt_model.h"

/* heads: the projection's head count on this rank (nh or nkv). */
void mt_model_qk_norm_forward(const mt_model_t *m, float *out, float *rstd, const float *x,
                              const float *w, int64_t heads);
void mt_model_qk_norm_backward(const mt_model_t *m, float *dx, float *dw, const float *dout,
                               const float *x, const float *w, const float *rstd,
                               int64_t heads);

#endif
