/* cuda_adamw.cu: AdamW of the CUDA backend on fp32 master weights, with
 * an optional working copy of the parameters written in the same pass (the
 * copy the bf16 forward reads under mixed precision): as bf16 bits, or
 * as float32 holding bf16 values (adamw_bf16_copy, train_mp.c).
 *
 * The bias corrections are formed in double on the host, as on the CPU,
 * and the per-element arithmetic is the CPU's, operation for operation,
 * in fp32: the results agree to a float ulp or so (sqrtf and division are
 * IEEE-rounded on both; nvcc may contract a*b+c into an FMA, which the CPU
 * build does not: that is the difference). */
#include <math.h>

#include "cuda_common.cuh"

/* ------------------------------------------------------------------ kernels */

__global__ void mt_k_adamw(float *p, __nv_bfloat16 *p_bf16, float *p_work, const float *g,
                           float gscale, float *m, float *v, int64_t n, float b1, float b2,
                           float one_b1, float one_b2, float eps, float decay, float step,
                           float inv_sqrt_bc2)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float gi = g[i] * gscale; /* clipping: the bits of a scale pass first */
        const float mi = b1 * m[i] + one_b1 * gi;
        const float vi = b2 * v[i] + one_b2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        const float denom = sqrtf(vi) * inv_sqrt_bc2 + eps;
        const float pi = p[i];
        const float pn = pi - decay * pi - step * (mi / denom);
        p[i] = pn;
        if (p_bf16)
            p_bf16[i] = __float2bfloat16_rn(pn);
        if (p_work)
            p_work[i] = mt_bf16_if(pn, true);
    }
}

/* ------------------------------------------------------------------ launchers */

extern "C" void mt_cuda_launch_adamw(cudaStream_t s, float *p, uint16_t *p_bf16, float *p_work,
                                     const float *g, float gscale, float *m, float *v, int64_t n,
                                     float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    MT_CUDA_REQUIRE(t >= 1 && n >= 0, "adamw", "step t=%lld (steps count from 1), n=%lld",
                    (long long)t, (long long)n);
    if (n == 0)
        return;
    const double bc1 = 1.0 - pow((double)b1, (double)t);
    const double bc2 = 1.0 - pow((double)b2, (double)t);
    const float step = (float)((double)lr / bc1);
    const float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    mt_k_adamw<<<mt_cuda_blocks(n, 256), 256, 0, s>>>(p, (__nv_bfloat16 *)p_bf16, p_work, g,
                                                      gscale, m, v, n, b1, b2, 1.0f - b1,
                                                      1.0f - b2, eps, lr * wd, step,
                                                      inv_sqrt_bc2);
    MT_CUDA_LAUNCH_CHECK("adamw");
}
