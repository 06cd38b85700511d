/* emu_kernel.h: what the .cu kernels use, for the host (tests/emu/cuda;
 * doc/gpu.md, "Host emulation of the CUDA kernels").  C++ only; the
 * runtime behind it is emu_kernels.cc.
 *
 * A launch runs its grid once the work queued on its stream is done, one
 * block after another in a random order.  A block runs as one fiber per
 * CUDA thread.  A fiber runs until it reaches a barrier: __syncthreads,
 * __syncthreads_or, __syncwarp, or a shuffle or ballot (each is two warp
 * barriers around a mailbox).  The schedule is drawn per block (a new one
 * every launch; MT_EMU_SEED changes them all):
 *  - interleaved: each round every runnable fiber runs, in a random order;
 *  - warp priority: warps in a random order of priority; one warp runs
 *    ahead to its next block barrier before the next one moves.
 * A race between two barriers then gives different bits under different
 * schedules.  These stop the program, naming the kernel, block and thread:
 *  - a block barrier some threads exited before;
 *  - a warp split between a warp barrier and a block barrier;
 *  - a full-mask shuffle in a warp where some lanes have exited, a
 *    partial mask, a width other than 32;
 *  - a pointer argument that is not device memory (cudaMalloc or
 *    cudaMallocHost), where the device would fault;
 *  - a cp.async whose destination is not 16-byte aligned dynamic shared
 *    memory, or whose source is not 16-byte aligned device memory;
 *  - a fault (SIGSEGV, SIGBUS): an access past the dynamic shared memory
 *    (a guard page follows it), a misaligned float4, a wild pointer;
 *  - __trap().
 *
 * Shared memory:
 *  - `__shared__` arrays become function statics, one per kernel
 *    instantiation, shared by the fibers of the running block, and
 *    filled with 0xff bytes in every block by the first thread that
 *    reaches the declaration (rewrite.pl adds the call);
 *  - the dynamic buffer (`extern __shared__`, which rewrite.pl turns into
 *    a pointer to emu_smem) is filled with 0xff bytes (NaN) for every
 *    block, so a read of memory no thread wrote shows up.
 *  - a cp.async copy lands only when its thread waits for it
 *    (cp.async.wait_all, or cp.async.wait_group n once its group is
 *    older than the n newest), the latest moment the device allows: a
 *    read of the tile without that wait and a barrier after it finds the
 *    fill.
 *
 * A launch is checked as the device checks it:
 *  - block size at most 1024;
 *  - grid y and z at most 65535;
 *  - dynamic shared memory above 48 KiB only after cudaFuncSetAttribute
 *    raised the kernel's limit, and never above the H100/H200 opt-in
 *    maximum (227 KiB).
 *
 * Not modelled: timing, bank conflicts, the hardware's fragment layouts
 * and tensor-core rounding (mma.h), FMA contraction, memory ordering
 * (a shuffle orders memory here; on the device only __syncwarp and the
 * block barriers do), lost updates (a thread runs uninterrupted between
 * barriers, so two non-atomic += to one word cannot interleave), the
 * __launch_bounds__ and static shared-memory limits. */
#ifndef MT_EMU_KERNEL_H
#define MT_EMU_KERNEL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

/* 16-byte aligned as on the device: a float4 load from a misaligned
 * address may fault here too (aligned SSE moves) */
struct alignas(16) float4 {
    float x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w)
{
    float4 r = {x, y, z, w};
    return r;
}

/* the running block's dynamic shared memory */
extern unsigned char *emu_smem;
extern size_t emu_smem_bytes;

/* a static __shared__ variable (rewrite.pl): filled with 0xff bytes by the
 * first thread of each block that reaches its declaration */
void emu_poison_shared(void *p, size_t bytes);

/* stop the program, naming the kernel, block and thread */
[[noreturn]] void emu_kernel_fail(const char *what);

void __syncthreads(void);
int __syncthreads_or(int p);
void __syncwarp(unsigned mask = 0xffffffffu);

/* a shuffle's exchange: every lane of the warp posts `mine`, then reads
 * lane src's post (two warp barriers); the mask must be the full warp */
uint64_t emu_exchange(unsigned mask, uint64_t mine, int src);
int emu_lane(void);

template <typename T> static inline T emu_shfl(unsigned mask, T v, int src)
{
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    u = emu_exchange(mask, u, src);
    T r;
    memcpy(&r, &u, sizeof r);
    return r;
}
/* sub-warp widths are not modelled: they stop the run */
static inline void emu_width(int width)
{
    if (width != 32)
        emu_kernel_fail("shuffle with a width other than 32 (not modelled)");
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32)
{
    emu_width(width);
    return emu_shfl(mask, v, emu_lane() ^ m);
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    emu_width(width);
    return emu_shfl(mask, v, src & 31);
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d,
                                                      int width = 32)
{
    emu_width(width);
    const int l = emu_lane();
    return emu_shfl(mask, v, l + (int)d < 32 ? l + (int)d : l);
}
unsigned __ballot_sync(unsigned mask, int pred);
/* the kernels' mma.sync m16n8k16 bf16 (src/backend/cuda/cuda_attention_tc.cuh,
 * mt_mma_bf16_16816), a warp-wide exchange of the fragments: the PTX
 * ISA's fragment layout, fp32 sums in k order (emu_kernels.cc) */
#define MT_CUDA_EMULATED 1
void emu_mma_bf16_16816(float c[4], const uint32_t a[4], const uint32_t b[2]);
/* and their ldmatrix m8n8 b16: num matrices (1, 2, 4), transposed or not */
void emu_ldmatrix(uint32_t *r, int num, int trans, const void *p);
/* and their cp.async of 16 bytes (src_bytes 16, or 0: zeros), held back
 * until the thread's cp.async.wait_all (emu_kernels.cc) */
void emu_cp_async16(void *dst, const void *src, int src_bytes);
void emu_cp_async_wait_all(void);
/* cp.async.commit_group and cp.async.wait_group n */
void emu_cp_async_commit(void);
void emu_cp_async_wait_group(int n);
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
/* a device-side assertion: the emulation stops there */
[[noreturn]] static inline void __trap(void) { emu_kernel_fail("__trap (a device-side check failed)"); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }

/* ------------------------------------------------------------------ launch */

/* cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n) */
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
cudaError_t emu_func_set_smem(const void *kernel, int bytes);
template <typename F> static inline cudaError_t cudaFuncSetAttribute(F *kernel,
                                                                     cudaFuncAttribute a, int v)
{
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return cudaErrorInvalidValue;
    return emu_func_set_smem((const void *)kernel, v);
}

/* stop the run when p is not device memory (emu_kernels.cc) */
void emu_check_pointer(const char *kernel, int arg, const void *p);

/* run body() for every thread of every block of the grid (emu_kernels.cc) */
void emu_grid(dim3 grid, dim3 block, size_t smem, cudaStream_t s, const void *kernel,
              const char *name, const std::function<void()> &body);

/* what build.sh makes of `kernel<<<grid, block, smem, stream>>>(args)` */
struct emu_launch {
    dim3 g, b;
    size_t smem;
    cudaStream_t s;
    const char *name;
    emu_launch(const char *name_, dim3 g_, dim3 b_, size_t smem_ = 0, cudaStream_t s_ = 0)
        : g(g_), b(b_), smem(smem_), s(s_), name(name_)
    {
    }
    template <typename... P, typename... A> void go(void (*k)(P...), A &&...a)
    {
        std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
        check(args, std::index_sequence_for<P...>());
        emu_grid(g, b, smem, s, (const void *)k, name, [&] { std::apply(k, args); });
    }
    /* every pointer argument NULL or device memory (a host pointer would
     * fault on the device) */
    template <typename T> void check_arg(int i, const T &v)
    {
        if constexpr (std::is_pointer<T>::value)
            if (v)
                emu_check_pointer(name, i, (const void *)v);
    }
    template <typename Tu, size_t... I> void check(const Tu &t, std::index_sequence<I...>)
    {
        (check_arg((int)I, std::get<I>(t)), ...);
    }
};

#endif
