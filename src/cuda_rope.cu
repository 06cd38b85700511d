/* cuda_rope.cu: rotary position embedding of the CUDA backend, in place,
 * forward (sign +1) and backward (sign -1: the inverse rotation), Hugging
 * Face rotate_half pairing (element i with i + head_dim/2).
 *
 * Like the CPU kernel, the inverse frequency and the angle are formed in
 * double and cos/sin taken in double, then rounded to float, so the two
 * backends agree to float rounding at any position.  One thread per
 * (token, head, pair); nothing is cached between calls.  With round (the
 * bf16 table) x is read as bf16 values and written rounded
 * (mt_backend_t.reads_bf16, rounds_bf16).  Double-precision
 * sin/cos cost more than a cached float table would: a table is a later
 * optimisation (doc/gpu.md). */
#include "cuda_common.cuh"

/* ------------------------------------------------------------------ kernels */

__global__ void mt_k_rope(float *x, const int32_t *pos, int64_t n_tokens, int64_t n_heads,
                          int64_t head_dim, double theta, double sign, bool round)
{
    const int64_t half = head_dim / 2;
    const int64_t total = n_tokens * n_heads * half;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e % half, th = e / half; /* th = token * n_heads + head */
        const int64_t t = th / n_heads;
        const double inv_freq = pow(theta, -2.0 * (double)i / (double)head_dim);
        double sa, ca;
        sincos((double)pos[t] * inv_freq, &sa, &ca);
        const float cs = (float)ca, sn = (float)(sign * sa);
        float *x1 = x + th * head_dim, *x2 = x1 + half;
        const float a = mt_bf16_if(x1[i], round), b = mt_bf16_if(x2[i], round);
        x1[i] = mt_bf16_if(a * cs - b * sn, round);
        x2[i] = mt_bf16_if(b * cs + a * sn, round);
    }
}

/* ------------------------------------------------------------------ launchers */

extern "C" void mt_cuda_launch_rope(cudaStream_t s, float *x, const int32_t *pos,
                                    int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                                    double theta, double sign, bool round)
{
    MT_CUDA_REQUIRE(head_dim > 0 && head_dim % 2 == 0 && n_tokens >= 0 && n_heads >= 0, "rope",
                    "head_dim=%lld (must be even) n_tokens=%lld n_heads=%lld",
                    (long long)head_dim, (long long)n_tokens, (long long)n_heads);
    MT_CUDA_REQUIRE(theta > 0.0, "rope", "theta=%g", theta);
    const int64_t total = n_tokens * n_heads * (head_dim / 2);
    if (total == 0)
        return;
    mt_k_rope<<<mt_cuda_blocks(total, 256), 256, 0, s>>>(x, pos, n_tokens, n_heads, head_dim,
                                                         theta, sign, round);
    MT_CUDA_LAUNCH_CHECK("rope");
}
