/* cuda_common.cuh: device-side helpers shared by the .cu kernel files
 * (C++ only): grid sizing, bf16 loads and stores, and block reductions
 * whose combine order is fixed by the block size alone, so a kernel that
 * uses them gives the same bits on every run. */
#ifndef MT_CUDA_COMMON_CUH
#define MT_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda_internal.h"

#define MT_WARP 32

/* blocks of `threads` covering n, capped (grid-stride loops do the rest) */
static inline unsigned mt_cuda_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b < 1)
        b = 1;
    return (unsigned)(b > 65535 * 16 ? 65535 * 16 : b);
}

__device__ __forceinline__ float mt_ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float mt_ld(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ void mt_st(float *p, int64_t i, float x) { p[i] = x; }
__device__ __forceinline__ void mt_st(__nv_bfloat16 *p, int64_t i, float x)
{
    p[i] = __float2bfloat16_rn(x);
}

/* x, or with r the bf16 value nearest x (ties to even; NaN stays NaN):
 * round_bf16's rounding, in the store of a kernel on the rounding table
 * (mt_backend_t.rounds_bf16) */
__device__ __forceinline__ float mt_bf16_if(float x, bool r)
{
    return r ? __bfloat162float(__float2bfloat16_rn(x)) : x;
}

/* A float32 element read and written as a bf16 value: mt_ld and mt_st
 * round (kernels templated on the element type take it for the rounding
 * table's float32 tensors) */
typedef struct {
    float v;
} mt_f32_as_bf16;
__device__ __forceinline__ float mt_ld(const mt_f32_as_bf16 *p, int64_t i)
{
    return mt_bf16_if(p[i].v, true);
}
__device__ __forceinline__ void mt_st(mt_f32_as_bf16 *p, int64_t i, float x)
{
    p[i].v = mt_bf16_if(x, true);
}

template <typename T> __device__ __forceinline__ T mt_warp_sum(T x)
{
    for (int o = MT_WARP / 2; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float mt_warp_max(float x)
{
    for (int o = MT_WARP / 2; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the result.  buf: 32 elements of shared memory.  The tree
 * depends only on blockDim.x. */
template <typename T> __device__ T mt_block_sum(T x, T *buf)
{
    const int lane = threadIdx.x % MT_WARP, warp = threadIdx.x / MT_WARP;
    const int nwarps = blockDim.x / MT_WARP;
    x = mt_warp_sum(x);
    __syncthreads(); /* buf may still be read by a previous call */
    if (lane == 0)
        buf[warp] = x;
    __syncthreads();
    x = lane < nwarps ? buf[lane] : (T)0;
    return mt_warp_sum(x);
}

__device__ __forceinline__ float mt_block_max(float x, float *buf)
{
    const int lane = threadIdx.x % MT_WARP, warp = threadIdx.x / MT_WARP;
    const int nwarps = blockDim.x / MT_WARP;
    x = mt_warp_max(x);
    __syncthreads();
    if (lane == 0)
        buf[warp] = x;
    __syncthreads();
    x = lane < nwarps ? buf[lane] : -INFINITY;
    return mt_warp_max(x);
}

#endif
