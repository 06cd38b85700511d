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
#include <string.h>

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

/* ---- packs: the elementwise and row kernels' loads and stores.  One
 * element a thread (2 bytes under bf16 storage) leaves too few bytes in
 * flight to fill HBM: at 2048 threads an SM, two 2-byte loads each, about
 * 1 MB over an H200's 132 SMs, where its 4.8 TB/s at some 600 ns of
 * latency needs about 3 MB (Little's law).  A pack is W consecutive
 * elements a thread takes together.  W fixes which thread does what, so
 * the sums a thread forms; VEC only how the pack moves: in 16-byte
 * accesses (VEC, W * sizeof(T) a multiple of 16, the pointer 16-byte
 * aligned: mt_aligned16), else element by element.  A kernel's bits so
 * do not depend on its pointers' alignment. */
template <typename T, int W> struct mt_pack_t {
    T e[W];
};

template <int W, bool VEC, typename T>
__device__ __forceinline__ mt_pack_t<T, W> mt_ld_pack(const T *p)
{
    mt_pack_t<T, W> r;
    if constexpr (VEC && sizeof(T) * W % 16 == 0) {
#pragma unroll
        for (int c = 0; c < (int)(sizeof(T) * W / 16); c++) {
            const float4 u = ((const float4 *)p)[c]; /* the bits, whatever T is */
            memcpy((char *)&r + 16 * c, &u, sizeof u);
        }
    } else {
#pragma unroll
        for (int k = 0; k < W; k++)
            r.e[k] = p[k];
    }
    return r;
}

template <int W, bool VEC, typename T>
__device__ __forceinline__ void mt_st_pack(T *p, const mt_pack_t<T, W> &x)
{
    if constexpr (VEC && sizeof(T) * W % 16 == 0) {
#pragma unroll
        for (int c = 0; c < (int)(sizeof(T) * W / 16); c++) {
            float4 u;
            memcpy(&u, (const char *)&x + 16 * c, sizeof u);
            ((float4 *)p)[c] = u;
        }
    } else {
#pragma unroll
        for (int k = 0; k < W; k++)
            p[k] = x.e[k];
    }
}

template <int W> struct mt_width_t {
    static constexpr int value = W;
};

/* Elements [0, n) in packs of W, this thread's share: f(i,
 * mt_width_t<W>()) for the packs i = W (first + stride k) below
 * n - n % W, then f(i, mt_width_t<1>()) for the last n % W elements,
 * i = n - n % W + first + stride k.  f takes its run as one pack (a run
 * of 1 moves element-wise). */
template <int W, typename F>
__device__ __forceinline__ void mt_packs(int64_t n, int64_t first, int64_t stride, F f)
{
    const int64_t np = n / W;
    for (int64_t v = first; v < np; v += stride)
        f(v * W, mt_width_t<W>());
    if constexpr (W > 1)
        for (int64_t i = np * W + first; i < n; i += stride)
            f(i, mt_width_t<1>());
}

/* over a whole tensor, grid-stride */
template <int W, typename F> __device__ __forceinline__ void mt_for_packs(int64_t n, F f)
{
    mt_packs<W>(n, blockIdx.x * (int64_t)blockDim.x + threadIdx.x,
                (int64_t)gridDim.x * blockDim.x, f);
}

/* over a row, block-wide */
template <int W, typename F> __device__ __forceinline__ void mt_row_packs(int64_t n, F f)
{
    mt_packs<W>(n, threadIdx.x, blockDim.x, f);
}

/* whether every pointer is 16-byte aligned (a kernel's 16-byte accesses) */
static inline bool mt_aligned16(void) { return true; }
template <typename... P> static inline bool mt_aligned16(const void *p, P... rest)
{
    return (uintptr_t)p % 16 == 0 && mt_aligned16(rest...);
}

/* blocks of 256 threads for n elements in packs of w */
static inline unsigned mt_pack_blocks(int64_t n, int w)
{
    return mt_cuda_blocks((n + w - 1) / w, 256);
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
