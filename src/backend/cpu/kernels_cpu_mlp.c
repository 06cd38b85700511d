/* kernels_cpu_mlp.c: the SwiGLU activation of the CPU backend, forward and
 * backward, elementwise over n values:
 *
 *   out   = silu(g) u,  silu(g) = g sigmoid(g)
 *   dg    = dout u sigmoid(g) (1 + g (1 - sigmoid(g)))
 *   du    = dout silu(g)
 *
 * The backward may run in place (dgate == gate, dup == up, exactly; not
 * partially overlapping): each element is read before it is written, so
 * the pointers that may alias are not restrict.  The gate/up projections
 * around it are plain matmuls and live in the model, not here. */
#include "kernels_cpu_internal.h"

static inline float sigmoidf_(float g)
{
    /* mt_cpu_expf(-g) is +inf for g < -88, giving exactly 0 */
    return 1.0f / (1.0f + mt_cpu_expf(-g));
}

void mt_cpu_swiglu_forward(float *restrict out, const float *restrict gate,
                           const float *restrict up, int64_t n)
{
#pragma omp parallel for simd schedule(static) if (n > MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = (g * sigmoidf_(g)) * up[i];
    }
}

void mt_cpu_swiglu_backward(float *dgate, float *dup, const float *restrict dout,
                            const float *gate, const float *up, int64_t n)
{
    /* omp simd asserts no loop-carried dependence, which holds even when
     * dgate == gate and dup == up: lane i reads index i, then writes it. */
#pragma omp parallel for simd schedule(static) if (n > MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i], u = up[i], d = dout[i];
        const float s = sigmoidf_(g);
        const float silu = g * s;
        dgate[i] = d * u * (s * (1.0f + g * (1.0f - s)));
        dup[i] = d * silu;
    }
}
