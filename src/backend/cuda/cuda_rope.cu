/* cuda_rope.cu: rotary position embedding of the CUDA backend, in place,
 * forward (sign +1) and backward (sign -1: the inverse rotation), Hugging
 * Face rotate_half pairing (element i with i + head_dim/2).
 *
 * Like the CPU kernel, the angle is pos times the caller's inverse
 * frequency (inv_freq [head_dim/2], device memory: the model's table,
 * model_rope.c), formed in double, and scale * cos, scale * sin are taken
 * in double, then rounded to float, so the two backends agree to float
 * rounding at any position.  And like the CPU kernel, a token's cos/sin
 * are formed once and serve all its heads: a block takes a group of
 * tokens (grid-stride), its threads first fill a shared table of
 * head_dim/2 (cos, sin) pairs per token of the group, then rotate the
 * group's n_heads * head_dim/2 pairs a token from it.  Double-precision
 * sincos is the kernel's expensive part: per (token, head, pair) it made
 * the kernel compute-bound at the 1B shape (32 query heads); per (token,
 * pair) it is 1/n_heads of that.  The group (ROPE_THREADS / (head_dim/2)
 * tokens, 8 at head_dim 64) keeps every thread busy in the table's pass:
 * with one token a block, 32 of 256 threads waited out the
 * double-precision latency while the rest idled, and the table was a
 * block's critical path, about as long as its rotation.  Same values, same
 * bits: each pair's angle, cos and sin are the same expressions, whatever
 * the group.
 * Nothing is cached between calls.
 * With round (the bf16 table) x is read as bf16 values and written
 * rounded (mt_backend_t.reads_bf16, rounds_bf16). */
#include <limits.h>

#include "cuda_common.cuh"

#define ROPE_THREADS 256

/* ------------------------------------------------------------------ kernels */

/* tokens a block takes at once: enough table entries for every thread
 * (head_dim/2 a token), at most ROPE_GROUP_MAX */
#define ROPE_GROUP_MAX 16
static inline int rope_group(int64_t head_dim)
{
    const int64_t g = ROPE_THREADS / (head_dim / 2);
    return g < 1 ? 1 : g > ROPE_GROUP_MAX ? ROPE_GROUP_MAX : (int)g;
}

/* dynamic shared memory: cs[group * half] then sn[group * half].  T:
 * float (round: the rounding table), or __nv_bfloat16 (bf16 storage,
 * round true: the same bits) */
template <typename T>
__global__ void mt_k_rope(T *x, const int32_t *pos, int64_t n_tokens, int n_heads,
                          int head_dim, int group, const double *inv_freq, double cscale,
                          double sscale, bool round)
{
    extern __shared__ float sm[];
    const int half = head_dim / 2, pairs = n_heads * half;
    float *cs = sm, *sn = sm + group * half;
    for (int64_t t0 = (int64_t)blockIdx.x * group; t0 < n_tokens;
         t0 += (int64_t)gridDim.x * group) {
        const int nt = n_tokens - t0 < group ? (int)(n_tokens - t0) : group;
        for (int k = threadIdx.x; k < nt * half; k += blockDim.x) {
            const int i = k % half;
            const double p = (double)pos[t0 + k / half];
            double sa, ca;
            sincos(p * inv_freq[i], &sa, &ca);
            cs[k] = (float)(cscale * ca);
            sn[k] = (float)(sscale * sa);
        }
        __syncthreads();
        T *xg = x + t0 * (int64_t)pairs * 2;
        for (int64_t e = threadIdx.x; e < (int64_t)nt * pairs; e += blockDim.x) {
            const int tt = (int)(e / pairs), r = (int)(e - (int64_t)tt * pairs);
            const int h = r / half, i = r - h * half, k = tt * half + i;
            T *x1 = xg + ((int64_t)tt * n_heads + h) * head_dim, *x2 = x1 + half;
            const float a = mt_bf16_if(mt_ld(x1, i), round), b = mt_bf16_if(mt_ld(x2, i), round);
            mt_st(x1, i, mt_bf16_if(a * cs[k] - b * sn[k], round));
            mt_st(x2, i, mt_bf16_if(b * cs[k] + a * sn[k], round));
        }
        __syncthreads(); /* the table is the next group's */
    }
}

/* ------------------------------------------------------------------ launchers */

template <typename T>
static void rope(cudaStream_t s, T *x, const int32_t *pos, int64_t n_tokens, int64_t n_heads,
                 int64_t head_dim, const double *inv_freq, double scale, double sign,
                 bool round)
{
    /* head_dim/2 (cos, sin) pairs in 48 KiB of shared memory, n_heads *
     * head_dim/2 in an int */
    MT_CUDA_REQUIRE(head_dim > 0 && head_dim % 2 == 0 && head_dim <= 8192 && n_tokens >= 0 &&
                        n_heads >= 0 && n_heads * head_dim <= INT_MAX,
                    "rope", "head_dim=%lld (must be even, at most 8192) n_tokens=%lld n_heads=%lld",
                    (long long)head_dim, (long long)n_tokens, (long long)n_heads);
    MT_CUDA_REQUIRE(inv_freq != NULL && isfinite(scale), "rope", "inv_freq=%p scale=%g",
                    (const void *)inv_freq, scale);
    if (n_tokens == 0 || n_heads == 0)
        return;
    const int group = rope_group(head_dim);
    const int64_t groups = (n_tokens + group - 1) / group;
    const unsigned blocks = groups < 65535 * 16 ? (unsigned)groups : 65535 * 16;
    /* cs and sn, group * half each: at most 32 KiB (head_dim 8192: one token) */
    const size_t smem = sizeof(float) * (size_t)head_dim * (size_t)group;
    /* +-scale: exactly +-1 without scaling, so cos and sin keep their bits */
    mt_k_rope<T><<<blocks, ROPE_THREADS, smem, s>>>(x, pos, n_tokens, (int)n_heads, (int)head_dim,
                                                    group, inv_freq, scale, sign * scale, round);
    MT_CUDA_LAUNCH_CHECK("rope");
}

extern "C" void mt_cuda_launch_rope(cudaStream_t s, float *x, const int32_t *pos,
                                    int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                                    const double *inv_freq, double scale, double sign, bool round)
{
    rope(s, x, pos, n_tokens, n_heads, head_dim, inv_freq, scale, sign, round);
}

/* bf16 storage: the same kernel on bf16 bits */
extern "C" void mt_cuda_launch_rope_bf16s(cudaStream_t s, uint16_t *x, const int32_t *pos,
                                          int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                                          const double *inv_freq, double scale, double sign)
{
    rope(s, (__nv_bfloat16 *)x, pos, n_tokens, n_heads, head_dim, inv_freq, scale, sign, true);
}
