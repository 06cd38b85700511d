/* tc_emulate.h: just enough of CUDA to run src/cuda_attention_tc.cu's
 * kernels on the host (compiled with MT_TC_EMULATE by a C++ compiler, no
 * nvcc, no GPU), for tests/emu/tc_emulate.cc.
 *
 * A thread block runs as blockDim.x fibers (ucontext), one per CUDA
 * thread; a fiber runs until it reaches a barrier (__syncthreads,
 * __syncthreads_or, __syncwarp, or a shuffle, which is two warp
 * barriers), and the scheduler resumes the runnable fibers in a random
 * order each round, so two runs with different seeds differ when the
 * kernel has a race between barriers.  A barrier that can never be
 * released (a warp split between a warp and a block barrier, a block
 * barrier some threads exited before) stops the program.
 *
 * WMMA: each lane holds the WHOLE 16x16 fragment (x[r*16 + c]), computed
 * redundantly, so element-wise code that is correct for any element
 * mapping is correct here too; loads and stores check the ldm rule
 * (a multiple of 8 for 16-bit, 4 for 32-bit elements), the 32-byte
 * alignment of the pointer and that the 16x16 footprint lies inside the
 * block's dynamic shared memory.  mma is an fp32 loop: the tensor cores'
 * rounding is not modelled.  Not modelled either: shared-memory banks,
 * timing, static __shared__ variables (the kernels use only the dynamic
 * buffer, TC_DECLARE_SMEM). */
#ifndef MT_TC_EMULATE_H
#define MT_TC_EMULATE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <type_traits>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)

struct emu_dim3 {
    unsigned x, y, z;
};
static emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

struct float4 {
    float x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w)
{
    float4 r = {x, y, z, w};
    return r;
}

struct __nv_bfloat16 {
    uint16_t u;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    __nv_bfloat16 h = {(uint16_t)(u >> 16)};
    return h;
}
static inline float __bfloat162float(__nv_bfloat16 h)
{
    const uint32_t u = (uint32_t)h.u << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
    __nv_bfloat162 r = {__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
    return r;
}

/* ------------------------------------------------------------------ fibers */

enum { EMU_RUN, EMU_WARP, EMU_BLOCK, EMU_DONE };
struct emu_thread_t {
    ucontext_t ctx;
    int state, flag;
    char *stack;
};
static emu_thread_t *emu_th;
static int emu_n, emu_cur, emu_or;
static float emu_mail[1024];
static ucontext_t emu_main;
static unsigned char *emu_smem;
static size_t emu_smem_bytes;
static uint64_t emu_seed = 1;

static inline void emu_fail(const char *what)
{
    fprintf(stderr, "tc_emulate: block (%u,%u,%u) thread %d: %s\n", blockIdx.x, blockIdx.y,
            blockIdx.z, emu_cur, what);
    exit(1);
}

static inline void emu_yield(int state)
{
    emu_th[emu_cur].state = state;
    swapcontext(&emu_th[emu_cur].ctx, &emu_main);
}

static inline void __syncthreads(void) { emu_th[emu_cur].flag = 0, emu_yield(EMU_BLOCK); }
static inline int __syncthreads_or(int p)
{
    emu_th[emu_cur].flag = p != 0;
    emu_yield(EMU_BLOCK);
    return emu_or;
}
static inline void __syncwarp(void) { emu_yield(EMU_WARP); }
static inline float __shfl_xor_sync(unsigned mask, float v, int m)
{
    (void)mask;
    emu_mail[emu_cur] = v;
    emu_yield(EMU_WARP);
    const float r = emu_mail[(emu_cur & ~31) | ((emu_cur & 31) ^ m)];
    emu_yield(EMU_WARP);
    return r;
}

#define TC_DECLARE_SMEM(name) unsigned char *name = emu_smem

/* ------------------------------------------------------------------ WMMA */

namespace wm {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    enum { num_elements = 256 };
    float x[256];
};

static inline void emu_check(const void *p, unsigned ldm, size_t esize)
{
    const unsigned char *c = (const unsigned char *)p;
    if (ldm % (esize == 2 ? 8 : 4))
        emu_fail("wmma: ldm is not a multiple of 16 bytes");
    if ((uintptr_t)c % 32)
        emu_fail("wmma: pointer not 32-byte aligned");
    if (c < emu_smem || c + (15 * (size_t)ldm + 16) * esize > emu_smem + emu_smem_bytes)
        emu_fail("wmma: 16x16 footprint outside the dynamic shared memory");
}

template <typename Use, typename L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, L> &f,
                                    const __nv_bfloat16 *p, unsigned ldm)
{
    emu_check(p, ldm, 2);
    const bool rm = std::is_same<L, row_major>::value;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = __bfloat162float(rm ? p[r * ldm + c] : p[c * ldm + r]);
}

static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                                    unsigned ldm, layout_t l)
{
    emu_check(p, ldm, 4);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                                     unsigned ldm, layout_t l)
{
    emu_check(p, ldm, 4);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * 16 + c];
}

template <typename Use, typename T, typename L>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, float v)
{
    for (int i = 0; i < 256; i++)
        f.x[i] = v;
}

template <typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c)
{
    float out[256];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = c.x[r * 16 + n];
            for (int k = 0; k < 16; k++)
                s += a.x[r * 16 + k] * b.x[k * 16 + n];
            out[r * 16 + n] = s;
        }
    memcpy(d.x, out, sizeof out);
}
} /* namespace wm */

/* ------------------------------------------------------------------ launch */

static void (*emu_body)(void);
static void emu_entry(void)
{
    emu_body();
    emu_th[emu_cur].state = EMU_DONE;
    swapcontext(&emu_th[emu_cur].ctx, &emu_main);
}

static inline uint64_t emu_rand(void)
{
    emu_seed ^= emu_seed << 13, emu_seed ^= emu_seed >> 7, emu_seed ^= emu_seed << 17;
    return emu_seed;
}

/* run body() as one block of `threads` fibers with `smem` bytes of
 * dynamic shared memory (filled with NaN bytes: reads of unset memory
 * show up) */
static void emu_run_block(void (*body)(void), int threads, size_t smem)
{
    const size_t stack = (size_t)256 << 10;
    static emu_thread_t th[1024];
    emu_th = th, emu_n = threads, emu_body = body;
    emu_smem_bytes = smem;
    emu_smem = (unsigned char *)aligned_alloc(128, (smem + 127) / 128 * 128);
    memset(emu_smem, 0xff, smem);
    blockDim.x = (unsigned)threads, blockDim.y = blockDim.z = 1;
    for (int i = 0; i < threads; i++) {
        if (!th[i].stack)
            th[i].stack = (char *)malloc(stack);
        getcontext(&th[i].ctx);
        th[i].ctx.uc_stack.ss_sp = th[i].stack;
        th[i].ctx.uc_stack.ss_size = stack;
        th[i].ctx.uc_link = &emu_main;
        makecontext(&th[i].ctx, emu_entry, 0);
        th[i].state = EMU_RUN, th[i].flag = 0;
    }
    int order[1024];
    for (;;) {
        int n = 0;
        for (int i = 0; i < threads; i++)
            if (th[i].state == EMU_RUN)
                order[n++] = i;
        for (int i = n - 1; i > 0; i--) { /* random order each round */
            const int j = (int)(emu_rand() % (uint64_t)(i + 1)), t = order[i];
            order[i] = order[j], order[j] = t;
        }
        for (int i = 0; i < n; i++) {
            emu_cur = order[i];
            threadIdx.x = (unsigned)emu_cur, threadIdx.y = threadIdx.z = 0;
            swapcontext(&emu_main, &th[emu_cur].ctx);
        }
        int done = 0, atblock = 0;
        for (int i = 0; i < threads; i++)
            done += th[i].state == EMU_DONE, atblock += th[i].state == EMU_BLOCK;
        if (done == threads)
            break;
        bool released = false;
        for (int w = 0; w < threads / 32; w++) { /* a warp whose live lanes all wait */
            int wait = 0, live = 0;
            for (int l = 0; l < 32; l++) {
                const int s = th[w * 32 + l].state;
                live += s != EMU_DONE, wait += s == EMU_WARP;
            }
            if (wait && wait == live) {
                for (int l = 0; l < 32; l++)
                    th[w * 32 + l].state = th[w * 32 + l].state == EMU_WARP ? EMU_RUN : EMU_DONE;
                released = true;
            }
        }
        if (!released && atblock == threads) {
            emu_or = 0;
            for (int i = 0; i < threads; i++)
                emu_or |= th[i].flag, th[i].state = EMU_RUN;
            released = true;
        }
        if (!released) {
            emu_cur = -1;
            emu_fail(atblock && done ? "__syncthreads after some threads exited"
                                     : "deadlock: a warp waits at two different barriers");
        }
    }
    free(emu_smem);
    emu_smem = NULL;
}

#endif
