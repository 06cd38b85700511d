/* cuda_attention_tc.cuh: what the two tensor-core attention files share
 * (cuda_attention_tc.cu, WMMA; cuda_attention_mma.cu, mma.sync): the
 * geometry, the tiles, the bf16 tile loaders, the first visible keys of
 * document masking, and the mma.sync entry points (doc/gpu.md). */
#ifndef MT_CUDA_ATTENTION_TC_CUH
#define MT_CUDA_ATTENTION_TC_CUH

#include <string.h>

#include "cuda_common.cuh"


#define TC_BQ 64 /* query rows per block (forward, dq) and per query tile (dk/dv) */
#define TC_BK 64 /* keys per key tile (forward, dq) and per block (dk/dv) */
#define TC_WARPS 4
#define TC_THREADS (TC_WARPS * 32)

typedef struct {
    int64_t B, T, nh, nkv, group, qstride, kvstride;
    float scale; /* 1/sqrt(hd) > 0: the mma.sync forward takes maxima of unscaled S */
    int vec;   /* every row start aligned: 0 no, 1 to 4 elements (float4 loads of
                * float32, 8-byte ones of bf16), 2 bf16 to 16 bytes (cp.async) */
    int round; /* the outputs rounded to bf16 as they are stored */
    const int32_t *doc_start;
} tc_geom_t;

typedef __nv_bfloat16 tc_bf16;

__device__ __forceinline__ int64_t tc_min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t tc_max64(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ __forceinline__ int64_t tc_first_key(const tc_geom_t &G, int64_t b, int64_t t)
{
    return G.doc_start ? (int64_t)G.doc_start[b * G.T + t] : 0;
}

/* The first visible key of the block's nq query rows at q0 (*minlo, at
 * most qlast) and of the warp's 16 rows from wr0 (*wlo, at most wlast). */
__device__ __forceinline__ void tc_first_keys(const tc_geom_t &G, int64_t b, int64_t q0, int nq,
                                              int wr0, int64_t qlast, int64_t wlast,
                                              int64_t *minlo, int64_t *wlo)
{
    *minlo = qlast, *wlo = wlast;
    for (int r = 0; r < nq; r++) {
        const int64_t f = tc_first_key(G, b, q0 + r);
        *minlo = f < *minlo ? f : *minlo;
        if (r >= wr0 && r < wr0 + 16)
            *wlo = f < *wlo ? f : *wlo;
    }
}

/* four consecutive elements at p as floats: float32 (vec: one 16-byte
 * load), or bf16 bits (bf16 storage; vec: one 8-byte load), exact */
__device__ __forceinline__ float4 tc_load4(const float *p, int vec)
{
    return vec ? *(const float4 *)p : make_float4(p[0], p[1], p[2], p[3]);
}

/* the float of bf16 bits h (exact) */
__device__ __forceinline__ float tc_bits_f32(unsigned long long h)
{
    const unsigned int b = (unsigned int)(h & 0xffffu) << 16;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

__device__ __forceinline__ float4 tc_load4(const __nv_bfloat16 *p, int vec)
{
    if (vec) { /* element i in bits 16 i .. 16 i + 15 (little-endian) */
        const unsigned long long u = *(const unsigned long long *)p;
        return make_float4(tc_bits_f32(u), tc_bits_f32(u >> 16), tc_bits_f32(u >> 32),
                           tc_bits_f32(u >> 48));
    }
    return make_float4(__bfloat162float(p[0]), __bfloat162float(p[1]), __bfloat162float(p[2]),
                       __bfloat162float(p[3]));
}

/* cp.async.cg.shared.global, 16 bytes (sm_80 on): global src to shared
 * dst without passing through registers, src_bytes 16, or 0 to fill the
 * 16 bytes with zeros; both addresses 16-byte aligned.  Not visible, even
 * to the thread that issued it, before a wait that covers it:
 * mt_cp_async_wait_all, or mt_cp_async_wait_group<N> once the copy's
 * group (mt_cp_async_commit) is older than the N newest.  The host
 * emulation holds the copies back until then (emu_kernels.cc), so a read
 * that does not wait finds the 0xff fill. */
__device__ __forceinline__ void mt_cp_async16(void *dst, const void *src, int src_bytes)
{
#ifdef MT_CUDA_EMULATED
    emu_cp_async16(dst, src, src_bytes);
#else
    const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :
                 : "r"(a), "l"(src), "r"(src_bytes)
                 : "memory");
#endif
}

/* this thread's cp.async copies have landed (cp.async.wait_all) */
__device__ __forceinline__ void mt_cp_async_wait_all(void)
{
#ifdef MT_CUDA_EMULATED
    emu_cp_async_wait_all();
#else
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

/* this thread's cp.async copies since the last commit: a group
 * (cp.async.commit_group) */
__device__ __forceinline__ void mt_cp_async_commit(void)
{
#ifdef MT_CUDA_EMULATED
    emu_cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/* this thread's committed groups but the N newest have landed
 * (cp.async.wait_group N) */
template <int N> __device__ __forceinline__ void mt_cp_async_wait_group(void)
{
#ifdef MT_CUDA_EMULATED
    emu_cp_async_wait_group(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* The barrier after tile loads: every thread's copies have landed, then
 * the block may read the tiles. */
__device__ __forceinline__ void tc_tiles_ready(void)
{
    mt_cp_async_wait_all();
    __syncthreads();
}

/* Block-cooperative, in a block of TC_THREADS threads: rows 0..n of src
 * (row r at src + r*stride, HD elements, float32 or bf16 bits) into the
 * bf16 tile dst [R][HD + 8]; rows n..R are zeroed so products over them
 * give 0, never NaN.  The tile is the block's after tc_tiles_ready.
 *  - bf16 rows 16-byte aligned (vec 2): cp.async, 16 bytes a copy, every
 *    copy of the tile in flight at once;
 *  - else loads through registers, the loop unrolled by four for float32
 *    (whether ptxas hoists the guarded loads above the stores is its
 *    call: unchecked without a SASS disassembler). */
template <int HD, int R, typename T>
__device__ __forceinline__ void tc_load_tile(tc_bf16 *dst, const T *src, int64_t stride,
                                             int64_t n, int vec)
{
    const int LD = HD + 8;
    if constexpr (sizeof(T) == sizeof(tc_bf16)) {
        if (vec == 2) {
            /* thread i copies columns 8 (i % C8) .. + 8 of rows i / C8 + RS j */
            constexpr int C8 = HD / 8, RS = TC_THREADS / C8;
            static_assert(TC_THREADS % C8 == 0 && R % RS == 0, "a tile's copies split evenly");
            const int r0 = (int)threadIdx.x / C8, c = ((int)threadIdx.x % C8) * 8;
            tc_bf16 *d = dst + r0 * LD + c;
            const T *s = src + r0 * stride + c;
            const int64_t step = RS * stride;
#pragma unroll
            for (int j = 0; j < R / RS; j++, d += RS * LD, s += step) {
                const bool in = r0 + RS * j < n;
                mt_cp_async16(d, in ? s : src, in ? 16 : 0);
            }
            return;
        }
    }
    constexpr int C4 = HD / 4;
    static_assert(R * C4 % TC_THREADS == 0, "a tile's loads split evenly");
    constexpr int U = sizeof(T) == sizeof(float) ? 4 : 1; /* bf16 here: unaligned, rare */
#pragma unroll U
    for (int i = 0; i < R * C4 / TC_THREADS; i++) {
        const int e = (int)threadIdx.x + i * TC_THREADS, r = e / C4, c = (e % C4) * 4;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < n)
            x = tc_load4(src + r * stride + c, vec);
        __nv_bfloat162 *d = (__nv_bfloat162 *)(dst + r * LD + c);
        d[0] = __floats2bfloat162_rn(x.x, x.y);
        d[1] = __floats2bfloat162_rn(x.z, x.w);
    }
}

/* A forward or dq block: its 64 query rows of head h, batch row b (kv
 * head g) and its warp's 16, with their first visible keys */
struct tc_qblock_t {
    int64_t b, h, g;
    int64_t q0, qlast; /* the block's first and last rows */
    int nq;            /* its rows (64, or fewer in the last tile) */
    int wr0;           /* the warp's first row in the block */
    bool wactive;      /* the warp has rows */
    int64_t wlast;     /* the warp's last row */
    int64_t minlo, wlo; /* first visible key of the block's, the warp's rows */
};

__device__ __forceinline__ tc_qblock_t tc_qblock(const tc_geom_t &G)
{
    tc_qblock_t Q;
    Q.b = blockIdx.z, Q.h = blockIdx.y, Q.g = Q.h / G.group;
    const int64_t ntiles = (G.T + TC_BQ - 1) / TC_BQ;
    Q.q0 = (ntiles - 1 - (int64_t)blockIdx.x) * TC_BQ; /* longest rows first */
    Q.nq = (int)tc_min64(TC_BQ, G.T - Q.q0);
    Q.qlast = Q.q0 + Q.nq - 1;
    Q.wr0 = (int)(threadIdx.x / 32) * 16;
    Q.wactive = Q.wr0 < Q.nq;
    Q.wlast = Q.q0 + (Q.wr0 + 15 < Q.nq - 1 ? Q.wr0 + 15 : Q.nq - 1);
    tc_first_keys(G, Q.b, Q.q0, Q.nq, Q.wr0, Q.qlast, Q.wlast, &Q.minlo, &Q.wlo);
    return Q;
}

/* The 16-key column fragments [*f0, *f1) of the key tile at j0 (nj keys)
 * that the warp's rows see; false when none of them sees the tile
 * (warp-uniform: the warp skips it).  Forward and dq, both kinds. */
__device__ __forceinline__ bool tc_warp_frags(const tc_qblock_t &Q, int64_t j0, int nj, int *f0,
                                              int *f1)
{
    const int64_t cmin = tc_max64(Q.wlo - j0, 0), cmax = tc_min64(Q.wlast - j0, nj - 1);
    if (cmin > cmax)
        return false;
    *f0 = (int)(cmin / 16), *f1 = (int)(cmax / 16) + 1;
    return true;
}

/* The double-buffered tile loops' wait (the mma.sync dq and dk/dv
 * kernels): with a next tile (more), its copies issued into the other
 * buffer (load_next) and committed as a group, then this thread's copies
 * of the tile at hand waited for (all but the newest group); on the last
 * tile, everything.  The caller's barrier before it freed the other
 * buffer; its barrier after publishes the tile. */
template <typename F> __device__ __forceinline__ void tc_prefetch_wait(bool more, F load_next)
{
    if (more) {
        load_next();
        mt_cp_async_commit();
        mt_cp_async_wait_group<1>();
    } else {
        mt_cp_async_wait_all();
    }
}

/* dk/dv, block-collective (its barriers): whether any query of the tile
 * [q0, q0 + nq) of head h reaches back to keys up to klast (the document
 * masks), and if so its queries' lse, D and first visible keys into sL,
 * sD, sLo, which the caller publishes with a barrier.  The caller's
 * barrier before it freed sL, sD, sLo of the previous tile; this
 * thread's copies of the tile are waited for before it (the
 * __syncthreads_or publishes them). */
__device__ __forceinline__ bool tc_dkdv_tile_fill(const tc_geom_t &G, int64_t b, int64_t h,
                                                  int64_t q0, int nq, int64_t klast,
                                                  const float *lse, const float *D, float *sL,
                                                  float *sD, int *sLo)
{
    int reach = 0;
    for (int i = threadIdx.x; i < nq; i += blockDim.x)
        reach |= tc_first_key(G, b, q0 + i) <= klast;
    if (!__syncthreads_or(reach))
        return false; /* block-uniform */
    for (int i = threadIdx.x; i < nq; i += blockDim.x) {
        sL[i] = lse[(b * G.nh + h) * G.T + q0 + i];
        sD[i] = D[(b * G.nh + h) * G.T + q0 + i];
        sLo[i] = (int)tc_first_key(G, b, q0 + i);
    }
    return true;
}

/* the same, first the barrier that frees the previous query tile (the
 * first time: after the block's keys, loaded) */
__device__ __forceinline__ bool tc_dkdv_tile(const tc_geom_t &G, int64_t b, int64_t h,
                                             int64_t q0, int nq, int64_t klast,
                                             const float *lse, const float *D, float *sL,
                                             float *sD, int *sLo)
{
    tc_tiles_ready();
    return tc_dkdv_tile_fill(G, b, h, q0, nq, klast, lse, D, sL, sD, sLo);
}

/* opt in to the kernel's shared memory once per process */
template <typename K> static void tc_prepare(K kernel, size_t smem, bool *done)
{
    if (!*done) {
        MT_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        *done = true;
    }
}

/* ------------------------------------------------------------------ mma.sync */

/* d = a b + d for one warp: mma.sync.aligned.m16n8k16.row.col with bf16
 * A (16 x 16, 4 registers of two) and B (16 x 8, 2 registers), fp32 C
 * and D (4 per lane), in the PTX ISA's fragment layout: lane l, g = l / 4,
 * t = l % 4; A's register r holds row g + 8 (r & 1), columns
 * 8 (r >> 1) + 2 t + {0, 1}; B's register r rows 8 r + 2 t + {0, 1} of
 * column g; D rows g (d0, d1) and g + 8 (d2, d3), columns 2 t + {0, 1}.
 * The lower column (row of B) in the low half of a register.  The host
 * emulation runs the same layout (tests/emu/cuda/emu_kernels.cc). */
__device__ __forceinline__ void mt_mma_bf16_16816(float d[4], const uint32_t a[4],
                                                  const uint32_t b[2])
{
#ifdef MT_CUDA_EMULATED
    emu_mma_bf16_16816(d, a, b);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* r[0..4] = four 8x8 bf16 matrices from shared memory, as they are
 * (ldmatrix.sync.aligned.m8n8.x4.shared.b16) or transposed (TRANS:
 * .x4.trans).  Lane 8 j + i gives row i of matrix j (16 bytes, 16-byte
 * aligned); lane l gets in r[j] matrix j's elements [l / 4][2 (l % 4)]
 * and [l / 4][2 (l % 4) + 1], or with TRANS [2 (l % 4)][l / 4] and
 * [2 (l % 4) + 1][l / 4], the first in the low half.  So for a row-major
 * tile:
 *  - as they are, lane l giving row r0 + (l & 7) + 8 ((l >> 3) & 1) at
 *    column k0 + 8 (l >> 4): mma.sync's A fragment of rows r0..r0+16,
 *    columns k0..k0+16;
 *  - TRANS, lane l giving row k0 + (l & 15) at column n0 + 8 (l >> 4):
 *    the B fragments of rows k0..k0+16 by columns n0..n0+8 (r[0], r[1])
 *    and n0+8..n0+16 (r[2], r[3]). */
template <bool TRANS>
__device__ __forceinline__ void mt_ldmatrix_x4(uint32_t r[4], const __nv_bfloat16 *p)
{
#ifdef MT_CUDA_EMULATED
    emu_ldmatrix(r, 4, TRANS, p);
#else
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#endif
}

/* The mma.sync kernels (cuda_attention_mma.cu), for HD 64 and 128: the
 * WMMA kernels' contract (cuda_attention_tc.cu), D the rows' dout . out;
 * T float (bf16 values read from float32) or __nv_bfloat16 (storage).
 * mt_attention_mma_smem: the largest of the three kernels' shared memory. */
size_t mt_attention_mma_smem(int64_t hd);
template <typename T>
void mt_attention_mma_forward(cudaStream_t s, T *out, float *lse, const T *q, const T *k,
                              const T *v, const tc_geom_t &G, int64_t hd);
template <typename T>
void mt_attention_mma_backward(cudaStream_t s, T *dq, T *dk, T *dv, const T *dout,
                               const float *lse, const float *D, const T *q, const T *k,
                               const T *v, const tc_geom_t &G, int64_t hd);

#endif
