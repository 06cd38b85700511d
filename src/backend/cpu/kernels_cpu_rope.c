/* kernels_cpu_rope.c: rotary position embedding (RoPE) of the CPU backend,
 * in place, forward and backward, Hugging Face rotate_half pairing:
 *
 *   out_i        = s (x_i cos a_i - x_{i+h} sin a_i)   (i < h = head_dim/2)
 *   out_{i+h}    = s (x_{i+h} cos a_i + x_i sin a_i),  a_i = pos * inv_freq[i]
 *
 * with s the caller's scale folded into cos and sin (transformers'
 * attention_scaling: yarn's attention factor, 1 otherwise), and the
 * backward applies the transpose to the gradient (the inverse rotation,
 * times s).  The inverse frequencies are the caller's table (the model's,
 * model_rope.c: the RoPE scaling lives there, not here).  The angle is
 * formed in double and s cos / s sin are taken in double, then rounded to
 * float: Hugging Face forms pos * inv_freq in float32, which at position
 * 8192 is already ~5e-4 rad off, so expect small differences from a
 * PyTorch run at long positions.  Nothing is cached between calls: cos/sin
 * are recomputed per token, so the result depends only on the arguments.
 * It does not support odd head_dim (there is no rotate_half pairing). */
#include <math.h>

#include "kernels_cpu_internal.h"

/* cos/sin per token on the stack: head_dim is at most this. */
#define ROPE_MAX_HEAD_DIM 4096

/* sign = +1 rotates by +a (forward), -1 by -a (backward: R(a)^T = R(-a)). */
static void rope_apply(float *restrict x, const int32_t *restrict pos, int64_t n_tokens,
                       int64_t n_heads, int64_t head_dim, const double *restrict inv_freq,
                       double scale, double sign, bool round, const char *kernel)
{
    MT_CPU_REQUIRE(head_dim > 0 && head_dim % 2 == 0 && head_dim <= ROPE_MAX_HEAD_DIM, kernel,
                   "head_dim=%lld must be even and <= %d", (long long)head_dim,
                   ROPE_MAX_HEAD_DIM);
    MT_CPU_REQUIRE(inv_freq != NULL && isfinite(scale), kernel, "inv_freq=%p scale=%g",
                   (const void *)inv_freq, scale);
    const int64_t half = head_dim / 2, row = n_heads * head_dim;
    /* +-scale: exactly +-1 without scaling, so cos and sin keep their bits */
    const double cscale = scale, sscale = sign * scale;

#pragma omp parallel for schedule(static) if (n_tokens * row > MT_CPU_PAR_MIN)
    for (int64_t t = 0; t < n_tokens; t++) {
        float cs[ROPE_MAX_HEAD_DIM / 2], sn[ROPE_MAX_HEAD_DIM / 2];
        const double p = (double)pos[t];
        for (int64_t i = 0; i < half; i++) {
            const double a = p * inv_freq[i];
            cs[i] = (float)(cscale * cos(a));
            sn[i] = (float)(sscale * sin(a));
        }
        for (int64_t h = 0; h < n_heads; h++) {
            float *restrict x1 = x + t * row + h * head_dim;
            float *restrict x2 = x1 + half;
            if (round) { /* twice, so the plain loop carries no rounding work */
#pragma omp simd
                for (int64_t i = 0; i < half; i++) {
                    const float a = x1[i], b = x2[i];
                    x1[i] = mt_cpu_bf16_if(a * cs[i] - b * sn[i], 1);
                    x2[i] = mt_cpu_bf16_if(b * cs[i] + a * sn[i], 1);
                }
            } else {
#pragma omp simd
                for (int64_t i = 0; i < half; i++) {
                    const float a = x1[i], b = x2[i];
                    x1[i] = a * cs[i] - b * sn[i];
                    x2[i] = b * cs[i] + a * sn[i];
                }
            }
        }
    }
}

void mt_cpu_rope_forward(float *x, const int32_t *pos, int64_t n_tokens, int64_t n_heads,
                         int64_t head_dim, const double *inv_freq, double scale, bool round)
{
    rope_apply(x, pos, n_tokens, n_heads, head_dim, inv_freq, scale, 1.0, round,
               "rope_forward");
}

void mt_cpu_rope_backward(float *dx, const int32_t *pos, int64_t n_tokens, int64_t n_heads,
                          int64_t head_dim, const double *inv_freq, double scale, bool round)
{
    rope_apply(dx, pos, n_tokens, n_heads, head_dim, inv_freq, scale, -1.0, round,
               "rope_backward");
}
