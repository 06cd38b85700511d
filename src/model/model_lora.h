/* model_lora.h: LoRA adapters on the frozen linears (model_lora.c,
 * doc/lora.md).  Not installed. */
#ifndef MT_MODEL_LORA_H
#define MT_MODEL_LORA_H

#include "mt_model.h"

/* The frozen base's arena and pointers, the gradient sink of its 1-D
 * tensors and the adapters' scratch (m->lora, after the tables). */
mt_status_t mt_lora_alloc(mt_model_t *m);

/* y[N, out] += scale * (x A^T) B^T for linear w with adapters, x [N, in]
 * this rank's input of w.  A row-parallel w's partial x A^T is summed
 * over TP first; y is then the whole (summed) output. */
void mt_lora_forward(const mt_model_t *m, float *y, const float *x, const mt_param_t *w);

/* The same for a row-parallel w whose output is the residual stream's
 * out [N, H] (o_proj, down_proj), which is then rounded as a complete
 * value under bf16 compute (the caller rounds the other linears' y). */
void mt_lora_forward_residual(const mt_model_t *m, float *out, const float *x,
                              const mt_param_t *w);

/* Its backward from dy [N, out], the gradient of w's output (this rank's
 * columns of a column-parallel w, whole for a row-parallel one):
 * dB += dy^T z, dA += (s dy B)^T x and dx [N, in] += (s dy B) A, with z =
 * s x A^T recomputed. */
void mt_lora_backward(const mt_model_t *m, float *dx, const float *dy, const float *x,
                      const mt_param_t *w);

#endif
