/* cuda_attention_tc.cu: causal grouped-query attention on tensor cores
 * through WMMA, forward and backward, and the launchers of both kinds,
 * for the bf16-numerics backend table (mt_backend_cuda_bf16,
 * doc/gpu.md): q, k, v, dout are float32 tensors
 * read as bf16 values: converting them to bf16 tiles in shared memory
 * rounds them to nearest even, exactly as round_bf16 would (v and dout
 * reach here unrounded from their GEMMs: mt_backend_t.reads_bf16), and
 * with round the fp32 row dots D = dout . out read both rounded too.
 * Same contract as
 * cuda_attention.cu and kernels_cpu_attention.c: lse [B, nh, T], scale
 * 1/sqrt(hd), query head h reads kv head h / (nh/nkv), doc_start mask.
 *
 * FlashAttention-2's arithmetic: S = Q K^T and O += P V (forward), and in
 * the backward S, dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q, all
 * as WMMA 16x16x16 bf16 products with fp32 accumulators; the online
 * softmax, P = exp(S - lse) and dS = P (dP - D) in fp32; P (for P V and
 * P^T dO) and dS (for dS K and dS^T Q) rounded to bf16 for the tensor
 * cores, as FlashAttention-2 does: the only roundings besides fp32 ones.
 * The row sum l of the forward adds the fp32 P, so lse is fp32-accurate.
 *
 * Tiles (BQ = BK = 64; blocks of 4 warps, a warp owns 16 rows):
 *   forward  a block per (64 query rows, head, batch row); key tiles of 64
 *            from the block's first visible key to its last row; a warp
 *            skips whole 16-key column fragments that none of its rows
 *            sees (above the diagonal, before its documents).  O stays in
 *            accumulator fragments; the per-row rescaling finds each
 *            fragment element's row with a probe fragment loaded once from
 *            a matrix of row numbers (the WMMA element mapping is
 *            unspecified but fixed per fragment type).
 *   dq       a block per 64 query rows: dQ += dS K over key tiles;
 *   dk/dv    a block per 64 KEY rows of kv head g: loops over the query
 *            heads of the group, in order, and the query tiles from the
 *            block's first key on (tiles none of whose queries' documents
 *            reach the block are skipped), dV += P^T dO, dK += dS^T Q.
 *   D = rowsum(dO * O) comes from cuda_attention.cu's rowdot kernel.
 * Every output element is summed by one warp in a fixed order, so both
 * passes are deterministic without atomics (the recomputation of S and dP
 * in both backward kernels is the price, as in the fp32 kernels).
 *
 * Shared memory: S, P (or dS) go through shared memory between the
 * products, because a WMMA accumulator cannot become an operand in
 * registers; operand tiles have a row pad of 8 bf16 (ldm a multiple of 8,
 * every fragment pointer 32-byte aligned).  Per block, hd 64 / 128:
 * forward 53 / 93 KiB, dq 79 / 127 KiB, dk/dv 89 / 137 KiB (opt-in above
 * 48 KiB).
 *
 * Not here: head dims other than 64 and 128 (the launchers fall back to
 * the fp32 kernels), devices below compute capability 8.0 or with less
 * opt-in shared memory than a kernel needs (fp32 fallback too), the
 * ring-attention block kernels (fp32 only), double-buffered loads.  The
 * same three kernels with S in registers on mma.sync are in
 * cuda_attention_mma.cu and are the default; the launchers here pick
 * (MESHTRAIN_ATTENTION_KERNEL, mt_cuda_attention_tc_select).  wgmma and
 * TMA (FlashAttention-3) are in neither.
 *
 * The host emulation of the CUDA kernels (tests/emu/cuda) runs them
 * with a model of WMMA, so their indexing, masks and barriers are checked
 * on machines without a GPU. */
#include <mma.h>
#include <stdlib.h>

#include "cuda_attention_tc.cuh"
/* (here, not in the header: the host emulation rewrites it in .cu files) */
#define TC_DECLARE_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
namespace wm = nvcuda::wmma;

typedef wm::fragment<wm::matrix_a, 16, 16, 16, tc_bf16, wm::row_major> tc_fa_t;
typedef wm::fragment<wm::matrix_b, 16, 16, 16, tc_bf16, wm::row_major> tc_fb_t;
/* B = X^T for X stored row-major [n][ld]: X's rows are B's columns */
typedef wm::fragment<wm::matrix_b, 16, 16, 16, tc_bf16, wm::col_major> tc_fbt_t;
typedef wm::fragment<wm::accumulator, 16, 16, 16, float> tc_fc_t;

/* acc = A B^T over HD for a warp's 16 rows of A (bf16 [.][HD+8], from
 * row a0) and 16 rows of B (from row b0): one 16x16 score fragment */
template <int HD>
__device__ __forceinline__ void tc_dot_tile(tc_fc_t &acc, const tc_bf16 *A, const tc_bf16 *Bm)
{
    const int LD = HD + 8;
    wm::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < HD / 16; kk++) {
        tc_fa_t a;
        tc_fbt_t bt;
        wm::load_matrix_sync(a, A + kk * 16, LD);
        wm::load_matrix_sync(bt, Bm + kk * 16, LD);
        wm::mma_sync(acc, a, bt, acc);
    }
}

/* acc[n] += P X for the warp: P bf16 [16][ldp] columns cf0*16..cf1*16,
 * X bf16 [.][HD+8] rows cf0*16..cf1*16, all HD/16 output fragments */
template <int HD>
__device__ __forceinline__ void tc_accum(tc_fc_t *acc, const tc_bf16 *P, int ldp,
                                         const tc_bf16 *X, int cf0, int cf1)
{
    const int LD = HD + 8;
    for (int cf = cf0; cf < cf1; cf++) {
        tc_fa_t a;
        wm::load_matrix_sync(a, P + cf * 16, ldp);
        for (int n = 0; n < HD / 16; n++) {
            tc_fb_t bx;
            wm::load_matrix_sync(bx, X + cf * 16 * LD + n * 16, LD);
            wm::mma_sync(acc[n], a, bx, acc[n]);
        }
    }
}

/* Warp: store its 16 x HD accumulators into the fp32 staging rows W
 * [16][lds] and write them to global rows dst + r*stride (r < nrows),
 * times s (or divided by rdiv[r] when rdiv), rounded to bf16 when rnd,
 * coalesced row by row */
template <int HD, typename T>
__device__ __forceinline__ void tc_store_rows(T *dst, int64_t stride, int nrows,
                                              const tc_fc_t *acc, float *W, int lds, float s,
                                              const float *rdiv, bool rnd)
{
    for (int n = 0; n < HD / 16; n++)
        wm::store_matrix_sync(W + n * 16, acc[n], lds, wm::mem_row_major);
    __syncwarp();
    const int lane = threadIdx.x % 32;
    for (int r = 0; r < nrows && r < 16; r++) {
        const float f = rdiv ? 1.0f / rdiv[r] : s;
        for (int c = lane; c < HD; c += 32)
            mt_st(dst, r * stride + c, mt_bf16_if(W[r * lds + c] * f, rnd));
    }
    __syncwarp();
}

/* ------------------------------------------------------------------ kernels */

/* shared: Qs, Ks, Vs bf16 [64][HD+8]; Sf fp32 [64][LDS] (scores, then the
 * output staging); Pb bf16 [64][72]; sRow fp32 [64] (corr, then l) */
template <int HD, typename T>
__global__ void __launch_bounds__(TC_THREADS)
    mt_k_attention_tc_forward(T *out, float *lse, const T *q, const T *k, const T *v,
                              tc_geom_t G)
{
    const int LDH = HD + 8, LDS = (TC_BK > HD ? TC_BK : HD) + 4, LDP = TC_BK + 8;
    TC_DECLARE_SMEM(smem);
    tc_bf16 *Qs = (tc_bf16 *)smem, *Ks = Qs + TC_BQ * LDH, *Vs = Ks + TC_BK * LDH;
    float *Sf = (float *)(Vs + TC_BK * LDH);
    tc_bf16 *Pb = (tc_bf16 *)(Sf + TC_BQ * LDS);
    float *sRow = (float *)(Pb + TC_BQ * LDP);

    const int lane = threadIdx.x % 32, half = lane & 1;
    /* the block's rows and the warp's, their first visible keys */
    const tc_qblock_t Q = tc_qblock(G);
    const int64_t b = Q.b, h = Q.h, q0 = Q.q0, qlast = Q.qlast;
    const int nq = Q.nq, wr0 = Q.wr0;
    /* the lane's softmax row (two lanes a row, alternate columns) */
    const int rr = wr0 + lane / 2;
    const bool rvalid = rr < nq;
    const int64_t t = q0 + rr, lo = rvalid ? tc_first_key(G, b, t) : 0;
    tc_load_tile<HD, TC_BQ>(Qs, q + (b * G.T + q0) * G.qstride + h * HD, G.qstride, nq, G.vec);

    /* the row of each accumulator element: load a matrix of row numbers */
    float *Sw = Sf + wr0 * LDS;
    for (int e = lane; e < 256; e += 32)
        Sw[(e / 16) * LDS + e % 16] = (float)(e / 16);
    __syncwarp();
    tc_fc_t probe;
    wm::load_matrix_sync(probe, Sw, LDS, wm::mem_row_major);
    __syncwarp();

    tc_fc_t o[HD / 16];
    for (int n = 0; n < HD / 16; n++)
        wm::fill_fragment(o[n], 0.0f);
    float m = -INFINITY, l = 0.0f;
    const int64_t kvbase = b * G.T * G.kvstride + Q.g * HD;

    for (int64_t j0 = Q.minlo; j0 <= qlast; j0 += TC_BK) {
        const int nj = (int)tc_min64(TC_BK, qlast + 1 - j0);
        __syncthreads(); /* the previous tile is no longer read */
        tc_load_tile<HD, TC_BK>(Ks, k + kvbase + j0 * G.kvstride, G.kvstride, nj, G.vec);
        tc_load_tile<HD, TC_BK>(Vs, v + kvbase + j0 * G.kvstride, G.kvstride, nj, G.vec);
        tc_tiles_ready(); /* (the first time: Qs too) */
        if (!Q.wactive)
            continue;
        int cf0, cf1;
        if (!tc_warp_frags(Q, j0, nj, &cf0, &cf1))
            continue; /* none of the warp's rows sees this tile (warp-uniform) */
        for (int cf = cf0; cf < cf1; cf++) {
            tc_fc_t s;
            tc_dot_tile<HD>(s, Qs + wr0 * LDH, Ks + cf * 16 * LDH);
            wm::store_matrix_sync(Sw + cf * 16, s, LDS, wm::mem_row_major);
        }
        __syncwarp();
        /* online softmax over the row's visible columns */
        float tmax = -INFINITY;
        for (int c = cf0 * 16 + half; c < cf1 * 16; c += 2) {
            const int64_t key = j0 + c;
            if (rvalid && c < nj && key >= lo && key <= t)
                tmax = fmaxf(tmax, Sf[rr * LDS + c] * G.scale);
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        const float mnew = fmaxf(m, tmax);
        const float corr = m == -INFINITY ? 0.0f : expf(m - mnew);
        float psum = 0.0f;
        for (int c = cf0 * 16 + half; c < cf1 * 16; c += 2) {
            const int64_t key = j0 + c;
            float p = 0.0f;
            if (rvalid && c < nj && key >= lo && key <= t)
                p = expf(Sf[rr * LDS + c] * G.scale - mnew);
            psum += p;
            Pb[rr * LDP + c] = __float2bfloat16_rn(p);
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        l = l * corr + psum;
        m = mnew;
        if (half == 0)
            sRow[rr] = corr;
        __syncwarp();
        for (int n = 0; n < HD / 16; n++)
            for (int i = 0; i < o[n].num_elements; i++)
                o[n].x[i] *= sRow[wr0 + (int)probe.x[i]];
        tc_accum<HD>(o, Pb + wr0 * LDP, LDP, Vs, cf0, cf1);
        __syncwarp(); /* Sf, Pb, sRow are rewritten by the next tile */
    }
    if (!Q.wactive)
        return; /* no barrier follows */
    if (half == 0)
        sRow[rr] = l;
    __syncwarp();
    tc_store_rows<HD>(out + (b * G.T + q0 + wr0) * G.qstride + h * HD, G.qstride, nq - wr0, o,
                      Sw, LDS, 1.0f, sRow + wr0, G.round);
    if (rvalid && half == 0)
        lse[(b * G.nh + h) * G.T + t] = m + logf(l);
}

/* dq of 64 query rows.  Shared: Qs, dOs, Ks, Vs bf16 [64][HD+8]; Sf fp32
 * [64][LDS] (scores, then the dq staging); dPf fp32 [64][68]; dSb bf16
 * [64][72] */
template <int HD, typename T>
__global__ void __launch_bounds__(TC_THREADS)
    mt_k_attention_tc_dq(T *dq, const T *dout, const float *lse, const float *D, const T *q,
                         const T *k, const T *v, tc_geom_t G)
{
    const int LDH = HD + 8, LDS = (TC_BK > HD ? TC_BK : HD) + 4, LDD = TC_BK + 4,
              LDP = TC_BK + 8;
    TC_DECLARE_SMEM(smem);
    tc_bf16 *Qs = (tc_bf16 *)smem, *dOs = Qs + TC_BQ * LDH, *Ks = dOs + TC_BQ * LDH,
            *Vs = Ks + TC_BK * LDH;
    float *Sf = (float *)(Vs + TC_BK * LDH), *dPf = Sf + TC_BQ * LDS;
    tc_bf16 *dSb = (tc_bf16 *)(dPf + TC_BQ * LDD);

    const int lane = threadIdx.x % 32, half = lane & 1;
    const tc_qblock_t Q = tc_qblock(G);
    const int64_t b = Q.b, h = Q.h, q0 = Q.q0, qlast = Q.qlast;
    const int nq = Q.nq, wr0 = Q.wr0;
    const int rr = wr0 + lane / 2;
    const bool rvalid = rr < nq;
    const int64_t t = q0 + rr, lo = rvalid ? tc_first_key(G, b, t) : 0;
    const float L = rvalid ? lse[(b * G.nh + h) * G.T + t] : 0.0f;
    const float Dr = rvalid ? D[(b * G.nh + h) * G.T + t] : 0.0f;
    const int64_t qoff = (b * G.T + q0) * G.qstride + h * HD;
    tc_load_tile<HD, TC_BQ>(Qs, q + qoff, G.qstride, nq, G.vec);
    tc_load_tile<HD, TC_BQ>(dOs, dout + qoff, G.qstride, nq, G.vec);

    tc_fc_t acc[HD / 16];
    for (int n = 0; n < HD / 16; n++)
        wm::fill_fragment(acc[n], 0.0f);
    const int64_t kvbase = b * G.T * G.kvstride + Q.g * HD;
    float *Sw = Sf + wr0 * LDS, *dPw = dPf + wr0 * LDD;

    for (int64_t j0 = Q.minlo; j0 <= qlast; j0 += TC_BK) {
        const int nj = (int)tc_min64(TC_BK, qlast + 1 - j0);
        __syncthreads();
        tc_load_tile<HD, TC_BK>(Ks, k + kvbase + j0 * G.kvstride, G.kvstride, nj, G.vec);
        tc_load_tile<HD, TC_BK>(Vs, v + kvbase + j0 * G.kvstride, G.kvstride, nj, G.vec);
        tc_tiles_ready();
        if (!Q.wactive)
            continue;
        int cf0, cf1;
        if (!tc_warp_frags(Q, j0, nj, &cf0, &cf1))
            continue; /* none of the warp's rows sees this tile */
        for (int cf = cf0; cf < cf1; cf++) {
            tc_fc_t s, dp;
            tc_dot_tile<HD>(s, Qs + wr0 * LDH, Ks + cf * 16 * LDH);
            wm::store_matrix_sync(Sw + cf * 16, s, LDS, wm::mem_row_major);
            tc_dot_tile<HD>(dp, dOs + wr0 * LDH, Vs + cf * 16 * LDH);
            wm::store_matrix_sync(dPw + cf * 16, dp, LDD, wm::mem_row_major);
        }
        __syncwarp();
        for (int c = cf0 * 16 + half; c < cf1 * 16; c += 2) {
            const int64_t key = j0 + c;
            float ds = 0.0f;
            if (rvalid && c < nj && key >= lo && key <= t) {
                const float p = expf(Sf[rr * LDS + c] * G.scale - L);
                ds = p * (dPf[rr * LDD + c] - Dr);
            }
            dSb[rr * LDP + c] = __float2bfloat16_rn(ds);
        }
        __syncwarp();
        tc_accum<HD>(acc, dSb + wr0 * LDP, LDP, Ks, cf0, cf1);
        __syncwarp();
    }
    if (!Q.wactive)
        return;
    tc_store_rows<HD>(dq + qoff + wr0 * G.qstride, G.qstride, nq - wr0, acc, Sw, LDS, G.scale,
                      NULL, G.round);
}

/* dk, dv of 64 key rows of kv head g.  Shared: Ks, Vs (own rows), Qs, dOs
 * (query tile) bf16 [64][HD+8]; St fp32 [64][LDS] (S^T, then the staging);
 * dPt fp32 [64][68]; Pt, dSt bf16 [64][72]; per query of the tile sL, sD
 * (fp32) and sLo (int) [64] */
template <int HD, typename T>
__global__ void __launch_bounds__(TC_THREADS)
    mt_k_attention_tc_dkdv(T *dk, T *dv, const T *dout, const float *lse, const float *D,
                           const T *q, const T *k, const T *v,
                           tc_geom_t G)
{
    const int LDH = HD + 8, LDS = (TC_BQ > HD ? TC_BQ : HD) + 4, LDD = TC_BQ + 4,
              LDP = TC_BQ + 8;
    TC_DECLARE_SMEM(smem);
    tc_bf16 *Ks = (tc_bf16 *)smem, *Vs = Ks + TC_BK * LDH, *Qs = Vs + TC_BK * LDH,
            *dOs = Qs + TC_BQ * LDH;
    float *St = (float *)(dOs + TC_BQ * LDH), *dPt = St + TC_BK * LDS;
    tc_bf16 *Pt = (tc_bf16 *)(dPt + TC_BK * LDD), *dSt = Pt + TC_BK * LDP;
    float *sL = (float *)(dSt + TC_BK * LDP), *sD = sL + TC_BQ;
    int *sLo = (int *)(sD + TC_BQ);

    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, half = lane & 1;
    const int64_t b = blockIdx.z, g = blockIdx.y;
    const int64_t j0 = (int64_t)blockIdx.x * TC_BK; /* longest columns first */
    const int nk = (int)tc_min64(TC_BK, G.T - j0);
    const int64_t klast = j0 + nk - 1;
    const int rk = w * 16 + lane / 2; /* the lane's key row */
    const int64_t key = j0 + rk;
    const int wk0 = w * 16;
    const bool wactive = wk0 < nk;
    const int64_t kvoff = (b * G.T + j0) * G.kvstride + g * HD;
    tc_load_tile<HD, TC_BK>(Ks, k + kvoff, G.kvstride, nk, G.vec);
    tc_load_tile<HD, TC_BK>(Vs, v + kvoff, G.kvstride, nk, G.vec);

    tc_fc_t adk[HD / 16], adv[HD / 16];
    for (int n = 0; n < HD / 16; n++) {
        wm::fill_fragment(adk[n], 0.0f);
        wm::fill_fragment(adv[n], 0.0f);
    }
    float *Sw = St + wk0 * LDS, *dPw = dPt + wk0 * LDD;

    for (int64_t hh = 0; hh < G.group; hh++) {
        const int64_t h = g * G.group + hh;
        for (int64_t q0 = j0; q0 < G.T; q0 += TC_BQ) { /* earlier queries see none of these keys */
            const int nq = (int)tc_min64(TC_BQ, G.T - q0);
            if (!tc_dkdv_tile(G, b, h, q0, nq, klast, lse, D, sL, sD, sLo))
                continue; /* block-uniform: no query of the tile reaches these keys */
            const int64_t qoff = (b * G.T + q0) * G.qstride + h * HD;
            tc_load_tile<HD, TC_BQ>(Qs, q + qoff, G.qstride, nq, G.vec);
            tc_load_tile<HD, TC_BQ>(dOs, dout + qoff, G.qstride, nq, G.vec);
            tc_tiles_ready();
            if (!wactive)
                continue;
            /* queries before the warp's first key see none of its keys */
            const int64_t cmin = tc_max64(j0 + wk0 - q0, 0);
            if (cmin > nq - 1)
                continue;
            const int cf0 = (int)(cmin / 16), cf1 = (nq - 1) / 16 + 1;
            for (int cf = cf0; cf < cf1; cf++) {
                tc_fc_t s, dp;
                tc_dot_tile<HD>(s, Ks + wk0 * LDH, Qs + cf * 16 * LDH);
                wm::store_matrix_sync(Sw + cf * 16, s, LDS, wm::mem_row_major);
                tc_dot_tile<HD>(dp, Vs + wk0 * LDH, dOs + cf * 16 * LDH);
                wm::store_matrix_sync(dPw + cf * 16, dp, LDD, wm::mem_row_major);
            }
            __syncwarp();
            for (int c = cf0 * 16 + half; c < cf1 * 16; c += 2) {
                float p = 0.0f, ds = 0.0f;
                if (rk < nk && c < nq && q0 + c >= key && sLo[c] <= key) {
                    p = expf(St[rk * LDS + c] * G.scale - sL[c]);
                    ds = p * (dPt[rk * LDD + c] - sD[c]);
                }
                Pt[rk * LDP + c] = __float2bfloat16_rn(p);
                dSt[rk * LDP + c] = __float2bfloat16_rn(ds);
            }
            __syncwarp();
            tc_accum<HD>(adv, Pt + wk0 * LDP, LDP, dOs, cf0, cf1);
            tc_accum<HD>(adk, dSt + wk0 * LDP, LDP, Qs, cf0, cf1);
            __syncwarp();
        }
    }
    if (!wactive)
        return;
    tc_store_rows<HD>(dv + kvoff + wk0 * G.kvstride, G.kvstride, nk - wk0, adv, Sw, LDS, 1.0f,
                      NULL, G.round);
    tc_store_rows<HD>(dk + kvoff + wk0 * G.kvstride, G.kvstride, nk - wk0, adk, Sw, LDS, G.scale,
                      NULL, G.round);
}

/* dynamic shared memory of the three kernels, bytes */
template <int HD> static size_t tc_smem_forward(void)
{
    const int LDH = HD + 8, LDS = (TC_BK > HD ? TC_BK : HD) + 4;
    return (size_t)(TC_BQ + 2 * TC_BK) * LDH * 2 + (size_t)TC_BQ * LDS * 4 +
           (size_t)TC_BQ * (TC_BK + 8) * 2 + (size_t)TC_BQ * 4;
}
template <int HD> static size_t tc_smem_dq(void)
{
    const int LDH = HD + 8, LDS = (TC_BK > HD ? TC_BK : HD) + 4;
    return (size_t)(2 * TC_BQ + 2 * TC_BK) * LDH * 2 + (size_t)TC_BQ * LDS * 4 +
           (size_t)TC_BQ * (TC_BK + 4) * 4 + (size_t)TC_BQ * (TC_BK + 8) * 2;
}
template <int HD> static size_t tc_smem_dkdv(void)
{
    const int LDH = HD + 8, LDS = (TC_BQ > HD ? TC_BQ : HD) + 4;
    return (size_t)(2 * TC_BQ + 2 * TC_BK) * LDH * 2 + (size_t)TC_BK * LDS * 4 +
           (size_t)TC_BK * (TC_BQ + 4) * 4 + (size_t)2 * TC_BK * (TC_BQ + 8) * 2 +
           (size_t)TC_BQ * 12;
}

/* ------------------------------------------------------------------ launchers */

/* The mma.sync kernels (cuda_attention_mma.cu), the default, or these
 * WMMA ones: MESHTRAIN_ATTENTION_KERNEL=mma|wmma, read once a process,
 * unless mt_cuda_attention_tc_select chose */
static int tc_selected = -1;

extern "C" void mt_cuda_attention_tc_select(int mma) { tc_selected = mma < 0 ? -1 : mma != 0; }

static bool tc_use_mma(void)
{
    static int env = -1;
    if (tc_selected >= 0)
        return tc_selected != 0;
    if (env < 0) {
        const char *e = getenv("MESHTRAIN_ATTENTION_KERNEL");
        MT_CUDA_REQUIRE(!e || !*e || !strcmp(e, "mma") || !strcmp(e, "wmma"), "attention_tc",
                        "MESHTRAIN_ATTENTION_KERNEL=%s: mma (the default) or wmma", e);
        env = !(e && !strcmp(e, "wmma"));
    }
    return env != 0;
}

/* Can this device run the kernels for head dim hd?  Needs compute
 * capability 8.0 (bf16 WMMA) and the largest kernel's shared memory as
 * opt-in; the answer is per process (one device per rank). */
static bool tc_usable(int64_t hd)
{
    static int major = -1, optin = 0;
    if (major < 0) {
        int dev = 0;
        MT_CUDA_CHECK(cudaGetDevice(&dev));
        MT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        MT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    }
    if (major < 8 || (hd != 64 && hd != 128))
        return false;
    if (tc_use_mma())
        return mt_attention_mma_smem(hd) <= (size_t)optin;
    if (hd == 64)
        return tc_smem_dkdv<64>() <= (size_t)optin && tc_smem_dq<64>() <= (size_t)optin;
    if (hd == 128)
        return tc_smem_dkdv<128>() <= (size_t)optin && tc_smem_dq<128>() <= (size_t)optin;
    return false;
}

static tc_geom_t tc_make_geom(const char *kernel, const int32_t *doc_start, int64_t B, int64_t T,
                              int64_t nh, int64_t nkv, int64_t hd, bool round,
                              const void *const *ptrs, int nptrs, int esize)
{
    MT_CUDA_REQUIRE(B > 0 && T > 0 && nh > 0 && nkv > 0 && nh % nkv == 0, kernel,
                    "B=%lld T=%lld nh=%lld nkv=%lld (nh must be a multiple of nkv)",
                    (long long)B, (long long)T, (long long)nh, (long long)nkv);
    MT_CUDA_REQUIRE(B <= 65535 && nh <= 65535 && (T + TC_BQ - 1) / TC_BQ <= 0x7fffffff, kernel,
                    "grid: B=%lld nh=%lld T=%lld", (long long)B, (long long)nh, (long long)T);
    tc_geom_t G;
    G.B = B, G.T = T, G.nh = nh, G.nkv = nkv, G.group = nh / nkv;
    G.qstride = nh * hd, G.kvstride = nkv * hd;
    G.scale = (float)(1.0 / sqrt((double)hd));
    G.doc_start = doc_start;
    G.round = round;
    uintptr_t bits = 0;
    for (int i = 0; i < nptrs; i++)
        bits |= (uintptr_t)ptrs[i];
    /* 4-element loads (16 bytes of float32, 8 of bf16), or bf16 rows on
     * 16 bytes (cp.async); the strides nh*hd, nkv*hd are multiples of 8
     * elements (hd 64 or 128 on these kernels) */
    G.vec = bits % (uintptr_t)(4 * esize) ? 0 : esize == 2 && bits % 16 == 0 ? 2 : 1;
    return G;
}

template <int HD, typename T>
static void tc_forward(cudaStream_t s, T *out, float *lse, const T *q, const T *k, const T *v,
                       const tc_geom_t &G)
{
    if (tc_use_mma()) {
        mt_attention_mma_forward(s, out, lse, q, k, v, G, HD);
        return;
    }
    static bool ready = false;
    const size_t smem = tc_smem_forward<HD>();
    tc_prepare(mt_k_attention_tc_forward<HD, T>, smem, &ready);
    dim3 grid((unsigned)((G.T + TC_BQ - 1) / TC_BQ), (unsigned)G.nh, (unsigned)G.B);
    mt_k_attention_tc_forward<HD, T><<<grid, TC_THREADS, smem, s>>>(out, lse, q, k, v, G);
    MT_CUDA_LAUNCH_CHECK("attention_tc_forward");
}

template <int HD, typename T>
static void tc_backward(cudaStream_t s, T *dq, T *dk, T *dv, const T *dout, const float *lse,
                        const float *D, const T *q, const T *k, const T *v, const tc_geom_t &G)
{
    if (tc_use_mma()) {
        mt_attention_mma_backward(s, dq, dk, dv, dout, lse, D, q, k, v, G, HD);
        return;
    }
    static bool ready_dq = false, ready_kv = false;
    const size_t smem_dq = tc_smem_dq<HD>(), smem_kv = tc_smem_dkdv<HD>();
    tc_prepare(mt_k_attention_tc_dq<HD, T>, smem_dq, &ready_dq);
    tc_prepare(mt_k_attention_tc_dkdv<HD, T>, smem_kv, &ready_kv);
    dim3 gq((unsigned)((G.T + TC_BQ - 1) / TC_BQ), (unsigned)G.nh, (unsigned)G.B);
    mt_k_attention_tc_dq<HD, T><<<gq, TC_THREADS, smem_dq, s>>>(dq, dout, lse, D, q, k, v, G);
    MT_CUDA_LAUNCH_CHECK("attention_tc_dq");
    dim3 gk((unsigned)((G.T + TC_BK - 1) / TC_BK), (unsigned)G.nkv, (unsigned)G.B);
    mt_k_attention_tc_dkdv<HD, T><<<gk, TC_THREADS, smem_kv, s>>>(dk, dv, dout, lse, D, q, k, v,
                                                                  G);
    MT_CUDA_LAUNCH_CHECK("attention_tc_dkdv");
}

extern "C" bool mt_cuda_attention_tc_supported(int64_t hd)
{
    return tc_usable(hd);
}

extern "C" void mt_cuda_launch_attention_tc_forward(cudaStream_t s, float *out, float *lse,
                                                    const float *q, const float *k,
                                                    const float *v, const int32_t *doc_start,
                                                    int64_t B, int64_t T, int64_t nh,
                                                    int64_t nkv, int64_t hd, bool round)
{
    if (!tc_usable(hd)) { /* other head dims, older devices: the fp32 kernel */
        mt_cuda_launch_attention_forward(s, out, lse, q, k, v, doc_start, B, T, nh, nkv, hd,
                                         round);
        if (round)
            mt_cuda_launch_round_bf16(s, out, B * T * nh * hd);
        return;
    }
    const void *ptrs[] = {out, q, k, v};
    const tc_geom_t G =
        tc_make_geom("attention_tc_forward", doc_start, B, T, nh, nkv, hd, round, ptrs, 4, 4);
    if (hd == 64)
        tc_forward<64>(s, out, lse, q, k, v, G);
    else
        tc_forward<128>(s, out, lse, q, k, v, G);
}

extern "C" void mt_cuda_launch_attention_tc_backward(
    cudaStream_t s, float *dq, float *dk, float *dv, const float *dout, const float *out,
    const float *lse, const float *q, const float *k, const float *v, const int32_t *doc_start,
    int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd, bool round)
{
    if (!tc_usable(hd)) {
        mt_cuda_launch_attention_backward(s, dq, dk, dv, dout, out, lse, q, k, v, doc_start, B,
                                          T, nh, nkv, hd, round);
        if (round) {
            mt_cuda_launch_round_bf16(s, dq, B * T * nh * hd);
            mt_cuda_launch_round_bf16(s, dk, B * T * nkv * hd);
            mt_cuda_launch_round_bf16(s, dv, B * T * nkv * hd);
        }
        return;
    }
    const void *ptrs[] = {dq, dk, dv, dout, q, k, v};
    const tc_geom_t G =
        tc_make_geom("attention_tc_backward", doc_start, B, T, nh, nkv, hd, round, ptrs, 7, 4);
    float *D = (float *)mt_cuda_scratch("attention_tc_backward",
                                        (size_t)(B * nh * T) * sizeof(float));
    mt_cuda_launch_attention_rowdot(s, D, dout, out, B, T, nh, hd, round);
    if (hd == 64)
        tc_backward<64>(s, dq, dk, dv, dout, lse, D, q, k, v, G);
    else
        tc_backward<128>(s, dq, dk, dv, dout, lse, D, q, k, v, G);
}

/* bf16 storage (mt_backend_t.stores_bf16): the same kernels on bf16 bits
 * (out, q, k, v, dout, dq, dk, dv; lse float32), rounding what they store:
 * the rounding table's bits.  Head dims the tensor-core kernels do not
 * serve (64 and 128 on compute capability 8.0 and up) take the CUDA-core
 * kernels on bf16 bits (cuda_attention.cu), as the float32 path does. */

extern "C" void mt_cuda_launch_attention_tc_forward_bf16s(cudaStream_t s, uint16_t *out,
                                                         float *lse, const uint16_t *q,
                                                         const uint16_t *k, const uint16_t *v,
                                                         const int32_t *doc_start, int64_t B,
                                                         int64_t T, int64_t nh, int64_t nkv,
                                                         int64_t hd)
{
    if (!tc_usable(hd)) {
        mt_cuda_launch_attention_forward_bf16s(s, out, lse, q, k, v, doc_start, B, T, nh, nkv,
                                               hd);
        return;
    }
    const void *ptrs[] = {out, q, k, v};
    const tc_geom_t G =
        tc_make_geom("attention_tc_forward", doc_start, B, T, nh, nkv, hd, true, ptrs, 4, 2);
    typedef __nv_bfloat16 bf;
    if (hd == 64)
        tc_forward<64>(s, (bf *)out, lse, (const bf *)q, (const bf *)k, (const bf *)v, G);
    else
        tc_forward<128>(s, (bf *)out, lse, (const bf *)q, (const bf *)k, (const bf *)v, G);
}

extern "C" void mt_cuda_launch_attention_tc_backward_bf16s(
    cudaStream_t s, uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout,
    const uint16_t *out, const float *lse, const uint16_t *q, const uint16_t *k,
    const uint16_t *v, const int32_t *doc_start, int64_t B, int64_t T, int64_t nh, int64_t nkv,
    int64_t hd)
{
    if (!tc_usable(hd)) {
        mt_cuda_launch_attention_backward_bf16s(s, dq, dk, dv, dout, out, lse, q, k, v, doc_start,
                                                B, T, nh, nkv, hd);
        return;
    }
    const void *ptrs[] = {dq, dk, dv, dout, q, k, v};
    const tc_geom_t G =
        tc_make_geom("attention_tc_backward", doc_start, B, T, nh, nkv, hd, true, ptrs, 7, 2);
    float *D = (float *)mt_cuda_scratch("attention_tc_backward",
                                        (size_t)(B * nh * T) * sizeof(float));
    mt_cuda_launch_attention_rowdot_bf16s(s, D, dout, out, B, T, nh, hd);
    typedef __nv_bfloat16 bf;
    if (hd == 64)
        tc_backward<64>(s, (bf *)dq, (bf *)dk, (bf *)dv, (const bf *)dout, lse, D, (const bf *)q,
                        (const bf *)k, (const bf *)v, G);
    else
        tc_backward<128>(s, (bf *)dq, (bf *)dk, (bf *)dv, (const bf *)dout, lse, D,
                         (const bf *)q, (const bf *)k, (const bf *)v, G);
}
