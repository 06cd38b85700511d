/* cuda_rope.cu: rotary position embedding of the CUDA backend, in place,
 * forward (sign +1) and backward (sign -1: the inverse rotation), Hugging
 * Face rotate_half pairing (element i with i + head_dim/2).
 *
 * Like the CPU kernel, the inverse frequency and the angle are formed in
 * double and cos/sin taken in double, then rounded to float, so the two
 * backends agree to float rounding at any position.  And like the CPU
 * kernel, a token's cos/sin are formed once and serve all its heads: one
 * block per token (grid-stride), whose threads first fill a shared table
 * of head_dim/2 (cos, sin) pairs, then rotate the token's n_heads *
 * head_dim/2 pairs from it.  Double-precision pow and sincos are the
 * kernel's expensive part: per (token, head, pair), as this kernel first
 * did, they made it compute-bound at the 1B shape (32 query heads); per
 * (token, pair) they are 1/n_heads of that, and the rotation is a pass
 * over x at memory speed.  Same values, same bits: each pair's angle,
 * cos and sin are the same expressions.  Nothing is cached between calls.
 * With round (the bf16 table) x is read as bf16 values and written
 * rounded (mt_backend_t.reads_bf16, rounds_bf16). */
#include <limits.h>

#include "cuda_common.cuh"

#define ROPE_THREADS 256

/* ------------------------------------------------------------------ kernels */

/* dynamic shared memory: cs[half] then sn[half].  T: float (round: the
 * rounding table), or __nv_bfloat16 (bf16 storage, round true: the same
 * bits) */
template <typename T>
__global__ void mt_k_rope(T *x, const int32_t *pos, int64_t n_tokens, int n_heads,
                          int head_dim, double theta, double sign, bool round)
{
    extern __shared__ float sm[];
    const int half = head_dim / 2, pairs = n_heads * half;
    float *cs = sm, *sn = sm + half;
    for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
        const double p = (double)pos[t];
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            const double inv_freq = pow(theta, -2.0 * (double)i / (double)head_dim);
            double sa, ca;
            sincos(p * inv_freq, &sa, &ca);
            cs[i] = (float)ca;
            sn[i] = (float)(sign * sa);
        }
        __syncthreads();
        T *xt = x + t * (int64_t)n_heads * head_dim;
        for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
            const int h = e / half, i = e - h * half;
            T *x1 = xt + h * head_dim, *x2 = x1 + half;
            const float a = mt_bf16_if(mt_ld(x1, i), round), b = mt_bf16_if(mt_ld(x2, i), round);
            mt_st(x1, i, mt_bf16_if(a * cs[i] - b * sn[i], round));
            mt_st(x2, i, mt_bf16_if(b * cs[i] + a * sn[i], round));
        }
        __syncthreads(); /* the table is the next token's */
    }
}

/* ------------------------------------------------------------------ launchers */

template <typename T>
static void rope(cudaStream_t s, T *x, const int32_t *pos, int64_t n_tokens, int64_t n_heads,
                 int64_t head_dim, double theta, double sign, bool round)
{
    /* head_dim/2 (cos, sin) pairs in 48 KiB of shared memory, n_heads *
     * head_dim/2 in an int */
    MT_CUDA_REQUIRE(head_dim > 0 && head_dim % 2 == 0 && head_dim <= 8192 && n_tokens >= 0 &&
                        n_heads >= 0 && n_heads * head_dim <= INT_MAX,
                    "rope", "head_dim=%lld (must be even, at most 8192) n_tokens=%lld n_heads=%lld",
                    (long long)head_dim, (long long)n_tokens, (long long)n_heads);
    MT_CUDA_REQUIRE(theta > 0.0, "rope", "theta=%g", theta);
    if (n_tokens == 0 || n_heads == 0)
        return;
    const unsigned blocks = n_tokens < 65535 * 16 ? (unsigned)n_tokens : 65535 * 16;
    const size_t smem = sizeof(float) * (size_t)head_dim; /* cs and sn, half each */
    mt_k_rope<T><<<blocks, ROPE_THREADS, smem, s>>>(x, pos, n_tokens, (int)n_heads, (int)head_dim,
                                                    theta, sign, round);
    MT_CUDA_LAUNCH_CHECK("rope");
}

extern "C" void mt_cuda_launch_rope(cudaStream_t s, float *x, const int32_t *pos,
                                    int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                                    double theta, double sign, bool round)
{
    rope(s, x, pos, n_tokens, n_heads, head_dim, theta, sign, round);
}

/* bf16 storage: the same kernel on bf16 bits */
extern "C" void mt_cuda_launch_rope_bf16s(cudaStream_t s, uint16_t *x, const int32_t *pos,
                                          int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                                          double theta, double sign)
{
    rope(s, (__nv_bfloat16 *)x, pos, n_tokens, n_heads, head_dim, theta, sign, true);
}
